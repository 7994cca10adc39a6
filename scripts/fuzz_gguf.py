#!/usr/bin/env python3
"""Fuzzes kcap's loading of GGUF files (kcap.testing.fuzz): mutants of a few seed files, each
loaded in a forked child with limits on time and address space. Prints the outcomes, the
exception types of the refusals, and every finding (an exception that is not a KcapError, a
MemoryError, a hang, a crash) with the ops that reproduce it; exits 1 if there is any.

    python scripts/fuzz_gguf.py [--inputs N] [--seed S] [--max-ops K] [--findings FILE]

.ci/run runs a fixed-seed budget through tests/python/test_fuzz.py; this script is the longer
run. A finding worth keeping goes into tests/fixtures/fuzz_corpus.json ({"seed", "ops",
"why"}), which the test replays on every run."""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from kcap.testing import fuzz  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-ops", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds per input")
    parser.add_argument("--findings", help="write the findings (seed file, ops, outcome) to this JSON file")
    args = parser.parse_args()
    start = time.time()
    fixtures = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "conformance"
    campaign = fuzz.fuzz(fuzz.seed_files(fixtures), args.inputs, args.seed, args.max_ops, args.time_limit,
                         log=lambda line: print(line, flush=True))
    print(campaign.summary())
    print(f"{time.time() - start:.0f} s")
    if args.findings:
        Path(args.findings).write_text(json.dumps(campaign.findings, indent=1))
    return 1 if campaign.findings else 0


if __name__ == "__main__":
    sys.exit(main())
