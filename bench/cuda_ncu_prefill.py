"""Kernel times of one prefill chunk under Nsight Compute:

    ncu --clock-control none --nvtx --nvtx-include "prefill/" --metrics gpu__time_duration.sum \\
        --csv --page raw python3 bench/cuda_ncu_prefill.py MODEL.gguf [TOKENS] [f32|q8_1|bf16] > chunk.csv
    python3 bench/cuda_ncu_decode.py --summary chunk.csv

The run prefills TOKENS random tokens (default 512) once unprofiled, resets the cache, then
prefills them again inside an NVTX range "prefill": only that chunk's kernels are profiled (f16
KV cache). The summary sums their times by kernel, largest first."""
from __future__ import annotations

import sys


def main() -> int:
    import numpy as np
    import torch

    import kcap

    path = sys.argv[1]
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    activations = sys.argv[3] if len(sys.argv) > 3 else "f32"
    model = kcap.load(path, backend="cuda", n_ctx=tokens + 256, kv_type="f16", activations=activations)
    ids = np.random.default_rng(0).integers(0, model.n_vocab, tokens).astype(np.int32)
    model.engine.eval(ids, False)
    model.engine.reset()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("prefill")
    model.engine.eval(ids, False)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
