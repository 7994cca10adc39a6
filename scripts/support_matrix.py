"""Generates the README's support matrix (family x backend) from the architecture registry
and the capability table: a cell says whether every stage of that family's conformance
fixtures (F32 and Q8_0) routes to rows of that backend, by planning them (no kernel runs).

    python scripts/support_matrix.py           # print the table
    python scripts/support_matrix.py --write   # rewrite it between the README markers
    python scripts/support_matrix.py --check   # exit 1 when the README is stale (tests use this)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import kcap
from kcap.arch import supported_architectures
from kcap.explain import explain_file

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "conformance"
RECORD = REPO / "tests" / "results" / "support.json"
BACKENDS = ("cpu", "cuda", "metal")
BEGIN, END = "<!-- support-matrix:begin -->", "<!-- support-matrix:end -->"


def fixtures_by_architecture() -> dict[str, list[Path]]:
    from kcap.gguf import GGUFFile

    found: dict[str, list[Path]] = {}
    for path in sorted(FIXTURES.glob("*.gguf")):
        found.setdefault(GGUFFile(path).architecture, []).append(path)
    return found


def record() -> dict:
    import json

    return json.loads(RECORD.read_text()) if RECORD.exists() else {}


def family_of(path: Path) -> str:
    """"gemma4-kvshare-f32.gguf" -> "gemma4-kvshare"."""
    return path.stem.rsplit("-", 1)[0]


def cell(paths: list[Path], backend: str, ran: dict) -> str:
    # Planning: the same whether or not this build compiled the backend.
    try:
        for path in paths:
            explain_file(str(path), backend=backend)
    except kcap.RoutingError as exc:
        return f"refused ({str(exc).split(':')[0]})"
    outcomes = {ran.get(backend, {}).get("families", {}).get(family_of(p), "not run") for p in paths}
    if "failed" in outcomes:
        return "failed"
    if outcomes == {"passed"}:
        return "yes"
    return "routes; not run"


def matrix() -> str:
    fixtures = fixtures_by_architecture()
    ran = record()
    lines = ["| architecture | fixtures | " + " | ".join(BACKENDS) + " |",
             "|---|---|" + "---|" * len(BACKENDS)]
    for arch in supported_architectures():
        paths = fixtures.get(arch, [])
        names = ", ".join(p.stem for p in paths) or "none"
        cells = [cell(paths, b, ran) if paths else "untested" for b in BACKENDS]
        lines.append(f"| {arch} | {names} | " + " | ".join(cells) + " |")
    for arch in sorted(set(fixtures) - set(supported_architectures())):
        lines.append(f"| {arch} | {', '.join(p.stem for p in fixtures[arch])} | " +
                     " | ".join("refused (no arch module)" for _ in BACKENDS) + " |")
    runs = ", ".join(f"{b} at {ran[b]['commit']} ({ran[b]['date']})" for b in BACKENDS if b in ran)
    lines.append("")
    lines.append(f"Conformance runs recorded (tests/results/support.json): {runs or 'none'}.")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    table = matrix()
    readme = (REPO / "README.md").read_text()
    head, _, rest = readme.partition(BEGIN)
    _, _, tail = rest.partition(END)
    updated = f"{head}{BEGIN}\n{table}\n{END}{tail}"
    if args.check:
        if updated != readme:
            print("README support matrix is stale: run python scripts/support_matrix.py --write", file=sys.stderr)
            return 1
        return 0
    if args.write:
        (REPO / "README.md").write_text(updated)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
