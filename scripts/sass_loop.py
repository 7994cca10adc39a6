#!/usr/bin/env python3
"""Counts the sm_90 SASS instructions of a CUDA kernel's main loop, per source line.

The tensor-core tiles are bound by instructions per mma (bench/results/cuda_h200_profile.txt),
so a change to them can be weighed here, on a machine without a GPU, before a device call:

    python3 scripts/sass_loop.py cuda/matmul_q8.cu 'mma_q8_kernelI8KcapQ4_KLb1ELi128'
    python3 scripts/sass_loop.py cuda/matmul_q8.cu 'mma_q8_kernel' --summary

The kernel is picked by a substring of its mangled name (--summary: one line per matching
kernel: registers, spill bytes, loop instructions, spill instructions in the loop, mma count).
The main loop is the longest backward branch; the counts are static (code that runs once per
several iterations, such as a raw chunk's staging, counts in full). Needs nvcc and nvdisasm
(not in every CUDA install: `pip download --no-deps nvidia-cuda-nvdisasm` and unzip it, then
pass --nvdisasm PATH or set NVDISASM).
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def find_nvdisasm(given):
    for candidate in (given, os.environ.get("NVDISASM"), shutil.which("nvdisasm")):
        if candidate and Path(candidate).is_file():
            return candidate
    sys.exit("nvdisasm not found: pip download --no-deps nvidia-cuda-nvdisasm, unzip it, and pass "
             "--nvdisasm .../nvidia/cu13/bin/nvdisasm (or set NVDISASM)")


def compile_cubin(source, arch, out_dir):
    cubin = Path(out_dir) / "kernel.cubin"
    command = ["nvcc", "-O3", "-std=c++17", f"--generate-code=arch=compute_{arch},code=sm_{arch}", "-lineinfo",
               "-DKCAP_WITH_CUDA", "-I", "cpp/include", "-I", "cpp", "-I", ".", "-Xptxas", "-v", "-cubin", "-o",
               str(cubin), str(source)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(run.stderr)
    return cubin, run.stderr


def ptxas_resources(log):
    """Mangled name -> (registers, spill store bytes, spill load bytes), from ptxas -v."""
    out, current = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            out.setdefault(current, [0, 0, 0])[1:] = [int(m.group(1)), int(m.group(2))]
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            out.setdefault(current, [0, 0, 0])[0] = int(m.group(1))
    return out


def functions(disassembly):
    """Mangled name -> its lines of nvdisasm -g -c output."""
    out, name = {}, None
    for line in disassembly.splitlines():
        m = re.match(r"//-+ \.text\.(\S+) -+", line)
        if m:
            name = m.group(1)
            out[name] = []
        elif name:
            out[name].append(line)
    return out


def main_loop(lines):
    """The instructions of the longest backward branch's body: (opcode, 'file:line') pairs."""
    instructions, labels, source, pending = [], {}, "?", None
    for line in lines:
        m = re.match(r'\s*//## File "(.*)", line (\d+)', line)
        if m:
            source = f"{Path(m.group(1)).name}:{m.group(2)}"
            continue
        m = re.match(r"(\.L_x_\d+):", line)
        if m:
            pending = m.group(1)
            continue
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P[0-9T] )?([A-Z][A-Z0-9]*)\S*\s*(.*)", line)
        if m:
            address = int(m.group(1), 16)
            if pending:
                labels[pending], pending = address, None
            instructions.append((address, m.group(2), m.group(3), source))
    best = None
    for address, op, operands, _ in instructions:
        m = re.search(r"(\.L_x_\d+)", operands) if op == "BRA" else None
        if m and labels.get(m.group(1), address) < address:
            span = (labels[m.group(1)], address)
            if best is None or span[1] - span[0] > best[1] - best[0]:
                best = span
    if best is None:
        return []
    return [(op, source) for address, op, _, source in instructions if best[0] <= address <= best[1]]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="a .cu file, relative to the repository root")
    parser.add_argument("kernel", help="a substring of the kernel's mangled name")
    parser.add_argument("--arch", default="90")
    parser.add_argument("--nvdisasm")
    parser.add_argument("--summary", action="store_true", help="one line per matching kernel")
    parser.add_argument("--lines", type=int, default=40, help="source lines to list")
    args = parser.parse_args()
    nvdisasm = find_nvdisasm(args.nvdisasm)
    with tempfile.TemporaryDirectory() as tmp:
        cubin, log = compile_cubin(args.source, args.arch, tmp)
        disassembly = subprocess.run([nvdisasm, "-g", "-c", str(cubin)], capture_output=True, text=True,
                                     check=True).stdout
    resources = ptxas_resources(log)
    matches = {name: lines for name, lines in functions(disassembly).items() if args.kernel in name}
    if not matches:
        sys.exit(f"no kernel's name contains {args.kernel!r}")
    for name, lines in sorted(matches.items()):
        loop = main_loop(lines)
        ops = collections.Counter(op for op, _ in loop)
        registers, spill_stores, spill_loads = resources.get(name, [0, 0, 0])
        mma = ops["HMMA"] + ops["IMMA"]
        print(f"{name}: {registers} registers, spills {spill_stores}/{spill_loads} bytes; loop {len(loop)} "
              f"instructions, {ops['STL'] + ops['LDL']} spill instructions, {mma} mma")
        if args.summary:
            continue
        print("  opcodes:", ", ".join(f"{op} {n}" for op, n in ops.most_common(14)))
        by_line = collections.Counter(source for _, source in loop)
        per_line_ops = collections.defaultdict(collections.Counter)
        for op, source in loop:
            per_line_ops[source][op] += 1
        for source, n in by_line.most_common(args.lines):
            detail = ", ".join(f"{op} {k}" for op, k in per_line_ops[source].most_common(4))
            print(f"  {n:5d}  {source:32s} {detail}")


if __name__ == "__main__":
    main()
