"""Prefill time by chunk length on CUDA, to see where the planned rows change (kcap explain shows
which row takes which token range; a mixture-of-experts stage moves from the slot matvecs to the
grouped tiles at cuda_rows::kMoeGroupedMinTokens):

    python bench/cuda_moe_tokens.py MODEL.gguf [f32|q8_1|bf16] [N N ...]

For each N: the median over 5 runs of one eval of N tokens from an empty cache (ms, tok/s)."""
import sys
import time

import numpy as np

import kcap

path = sys.argv[1]
activations = sys.argv[2] if len(sys.argv) > 2 else "f32"
counts = [int(a) for a in sys.argv[3:]] or [8, 16, 24, 31, 32, 40, 48, 64, 96, 128, 256, 512]
model = kcap.load(path, backend="cuda", n_ctx=1024, kv_type="f16", activations=activations)
ids = np.random.default_rng(0).integers(0, model.n_vocab, max(counts)).astype(np.int32)
model.engine.eval(ids[:max(counts)], False)  # warm up every row
print(f"{'tokens':>6} {'ms':>8} {'tok/s':>9}  ({activations})", flush=True)
for n in counts:
    times = []
    for _ in range(5):
        model.engine.reset()
        start = time.perf_counter()
        model.engine.eval(ids[:n], False)
        times.append(time.perf_counter() - start)
    t = float(np.median(times))
    print(f"{n:6d} {t * 1e3:8.3f} {n / t:9.0f}", flush=True)
