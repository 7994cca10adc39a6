"""python -m kcap: the kcap command line."""
import sys

from kcap.cli import main

sys.exit(main())
