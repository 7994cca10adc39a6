"""Kernel times of one decode step (the captured graph's kernel nodes) at a given context,
under Nsight Compute:

    ncu --clock-control none --nvtx --nvtx-include "decode/" --metrics gpu__time_duration.sum \\
        --csv --page raw python3 bench/cuda_ncu_decode.py MODEL.gguf [DEPTH] [f32|q8_1] > step.csv
    python3 bench/cuda_ncu_decode.py --summary step.csv

The run prefills DEPTH random tokens (at least 1), replays the decode graph once unprofiled,
then one decode step inside an NVTX range "decode": only that step's kernels are profiled.
--summary sums the step's kernel times by kernel (template arguments kept) and prints them
largest first with their launch counts, then the total: the time the GPU spends per token,
without the graph's launch gaps."""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path


def summary(path: str) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ncu_compare import read

    launches = read(path)
    by_name: dict[str, list[float]] = defaultdict(list)
    for launch in launches:
        by_name[launch["name"]].append(launch["us"])
    total = sum(launch["us"] for launch in launches)
    print(f"{'kernel':70s} {'us/step':>9s} {'share':>6s} {'launches':>8s} {'us each':>8s}")
    for name, times in sorted(by_name.items(), key=lambda kv: -sum(kv[1])):
        print(f"{name[:70]:70s} {sum(times):9.1f} {sum(times) / total:6.1%} {len(times):8d} {sum(times) / len(times):8.2f}")
    print(f"{'total':70s} {total:9.1f}  ({len(launches)} launches)")
    return 0


def main() -> int:
    import numpy as np
    import torch

    import kcap

    path = sys.argv[1]
    depth = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    activations = sys.argv[3] if len(sys.argv) > 3 else "f32"
    model = kcap.load(path, backend="cuda", n_ctx=max(depth, 64) + 256, kv_type="f16", activations=activations)
    ids = np.random.default_rng(0).integers(0, model.n_vocab, max(depth, 1)).astype(np.int32)
    model.engine.eval(ids, False)
    model.engine.eval(np.array([5], dtype=np.int32), False)  # captures and replays the decode graph
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("decode")
    model.engine.eval(np.array([6], dtype=np.int32), False)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    return 0


if __name__ == "__main__":
    sys.exit(summary(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[1] == "--summary" else main())
