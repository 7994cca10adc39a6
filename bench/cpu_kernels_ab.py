"""CPU decode and prefill speed of one model, for an A/B on one machine: of the x86 kernels this
CPU allows (KCAP_CPU_KERNELS caps the choice), or of two builds (alternating PYTHONPATH):

    for k in avx512 avx2 avx512 avx2; do KCAP_CPU_KERNELS=$k python3 bench/cpu_kernels_ab.py MODEL.gguf [f32|q8_1]; done
    for p in OLD NEW OLD NEW; do PYTHONPATH=$p python3 bench/cpu_kernels_ab.py MODEL.gguf f32 512; done

Two threads; prefill: one eval of PROMPT (default 128) tokens; decode: 48 greedy tokens, one
eval per token, after an 8-token prompt (PROMPT given: after the PROMPT-token prompt); medians
of 5 after a warm-up. Random token ids."""
import statistics
import sys
import time

import numpy as np

import kcap
path, gen = sys.argv[1], 48
m = kcap.load(path, backend="cpu", n_threads=2, activations=(sys.argv[2] if len(sys.argv) > 2 else "f32"))
prompt = int(sys.argv[3]) if len(sys.argv) > 3 else 0
ids = list(np.random.default_rng(0).integers(0, m.n_vocab, prompt or 128))
def decode():
    m.reset(); m.eval(ids[:prompt or 8]); tok = int(ids[-1] if prompt else ids[8]); t0 = time.perf_counter()
    for _ in range(gen):
        tok = int(np.argmax(m.eval([tok])))
    return gen / (time.perf_counter() - t0)
def prefill():
    m.reset(); t0 = time.perf_counter(); m.eval(ids); return len(ids) / (time.perf_counter() - t0)
decode(); prefill()
d = [decode() for _ in range(5)]; p = [prefill() for _ in range(5)]
print(kcap._core.cpu_kernels(), f"decode {statistics.median(d):.1f} tok/s prefill {statistics.median(p):.1f} tok/s")
