"""The README's support matrix is generated, never hand-edited: it must match the table."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent


def test_support_matrix_is_current():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "support_matrix.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_support_record_covers_every_cpu_family():
    # The CPU conformance suite runs in CI; the committed record must say every fixture family
    # passed there, so adding a fixture means recording a run (scripts/support_matrix.py).
    import json

    from test_conformance import FAMILIES

    record = json.loads((REPO / "tests" / "results" / "support.json").read_text())
    assert record["cpu"]["families"] == {family: "passed" for family in FAMILIES}
