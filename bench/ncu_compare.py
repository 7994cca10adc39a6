"""Per-kernel Nsight Compute figures of two builds side by side (scripts/device_ab.sh):

    ncu --csv --page raw --metrics gpu__time_duration.sum,smsp__inst_executed.sum,\\
        smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size \\
        ... > base.csv          (and the same for the changed build: new.csv)
    python3 bench/ncu_compare.py base.csv new.csv [--names A,B]

The two runs must launch the same kernels in the same order (the same workload: one
bench/cuda_ncu_step.py prefill and its decode steps); each launch gets one row: its kernel (the
template arguments kept, the namespaces dropped), grid, then per build the time (us), the
instructions executed (millions), the share of issue slots used and the registers per thread,
and new / base time. The last line sums the times. Launches whose names differ between the
runs are marked, so a change that adds or removes a launch shows where the lists part."""
from __future__ import annotations

import argparse
import csv
import re
import sys

TIME = "gpu__time_duration.sum"
INSTRUCTIONS = "smsp__inst_executed.sum"
ISSUE = "smsp__issue_active.avg.pct_of_peak_sustained_active"
REGISTERS = "launch__registers_per_thread"
GRID = "launch__grid_size"


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


US_PER_UNIT = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def read(path: str) -> list[dict]:
    """The launches of one `ncu --csv --page raw` output: name, grid, time in us (the row after
    the header gives the duration's unit) and the other metrics found."""
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{path}: no ncu CSV header (a line starting with \"ID\")")
    rows = list(csv.DictReader(lines[start:]))
    unit = (rows[0].get(TIME) or "").strip() if rows else ""
    if unit not in US_PER_UNIT:
        sys.exit(f"{path}: unknown unit {unit!r} for {TIME}")
    launches = []
    for row in rows[1:]:
        duration = number(row.get(TIME, ""))
        if duration is None:  # a launch without figures
            continue
        name = re.sub(r"\(anonymous namespace\)::|<unnamed>::|kcap::|cuda::|mma_tiles::|void ", "", row.get("Kernel Name", "?"))
        name = re.sub(r"\((?:bool|int)\)", "", name)
        name = re.sub(r"\(.*$", "", name) or name  # the template arguments stay, the parameters go
        launches.append({
            "name": name,
            "grid": row.get(GRID) or row.get("Grid Size", ""),
            "us": duration * US_PER_UNIT[unit],
            "minst": (number(row.get(INSTRUCTIONS, "")) or 0.0) / 1e6,
            "issue": number(row.get(ISSUE, "")) or 0.0,
            "regs": int(number(row.get(REGISTERS, "")) or 0),
        })
    return launches


def pair(x: dict | None, y: dict | None, key: str, fmt: str) -> str:
    """One metric of both builds' launch, 'base / new' ('-' for a launch one run lacks)."""
    return " / ".join(fmt.format(r[key]) if r else "-" for r in (x, y))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base")
    parser.add_argument("new")
    parser.add_argument("--names", default="base,new", help="the two builds' names")
    args = parser.parse_args()
    name_a, name_b = args.names.split(",")
    a, b = read(args.base), read(args.new)
    print(f"| # | kernel | grid | {name_a} us | {name_b} us | {name_b}/{name_a} | M instr | issue % | regs |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | --- | --- | --- |")
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        name = (x or y)["name"]
        if x and y and x["name"] != y["name"]:
            name = f"{x['name']} / {y['name']} (DIFFERENT)"
        ratio = f"{y['us'] / x['us']:.3f}" if x and y and x["us"] > 0 else "-"
        print(f"| {i} | {name} | {(x or y)['grid']} | {x['us'] if x else 0:.1f} | {y['us'] if y else 0:.1f} | {ratio} | "
              f"{pair(x, y, 'minst', '{:.1f}')} | {pair(x, y, 'issue', '{:.1f}')} | {pair(x, y, 'regs', '{}')} |")
    total_a, total_b = sum(r["us"] for r in a), sum(r["us"] for r in b)
    print(f"| | total | | {total_a:.1f} | {total_b:.1f} | {total_b / total_a if total_a else 0:.3f} | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
