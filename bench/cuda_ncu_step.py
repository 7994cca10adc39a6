"""A fixed workload to run under Nsight Compute (kernel durations of a prefill and decode steps):

    ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \\
        python3 bench/cuda_ncu_step.py MODEL.gguf [f32|q8_1] > kernels.csv

One 512-token prefill, then 3 decode steps (the decode steps replay the captured graph; ncu
profiles each kernel node of it), f16 KV cache, activations as given. bench/results/cuda_h200_profile.txt
sums the last decode step's kernels by name."""
import sys

import numpy as np

import kcap

path, activations = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "f32")
model = kcap.load(path, backend="cuda", n_ctx=1024, kv_type="f16", activations=activations)
ids = np.random.default_rng(0).integers(0, model.n_vocab, 512).astype(np.int32)
model.engine.eval(ids, False)
for t in range(3):
    model.engine.eval(np.array([5 + t], dtype=np.int32), False)
