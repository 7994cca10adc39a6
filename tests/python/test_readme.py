"""The README's support matrix is generated, never hand-edited: it must match the table."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def test_support_matrix_is_current():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "support_matrix.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
