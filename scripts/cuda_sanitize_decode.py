"""A short CUDA workload of one model file, small enough to run under compute-sanitizer
(scripts/cuda_sanitize.sh): every path a generation takes, each a few times.

    python scripts/cuda_sanitize_decode.py MODEL.gguf [--kv f16,f32] [--activations f32,q8_1] [--prefill N]
        [--short] [--backend cpu]

For each KV type and activation mode: load (n_ctx 256), a prefill of N tokens (default 40) with
every position's logits (the batched rows, the tensor-core tiles from 16 tokens, the LM head on
all rows; racecheck, which follows every shared-memory access, takes fewer), a 23-token prefill with the last logits only, three one-token steps with logits (the
captured decode graph: capture, then replays), decode_greedy of 4 (the greedy graph, argmax on
the device), decode_sample of 3 where the device samples (the sampling graph), then a
prefill past what the cache holds after a truncate (positions rewritten). --short (racecheck,
which follows every shared-memory access) runs each kernel once or twice: the prefill, one step
with logits, decode_greedy of 2 and decode_sample of 1. The model is freed before the next, so a
leak check sees every allocation returned. Prints one line per mode and exits 1 if a logit is not
finite.
"""
from __future__ import annotations

import argparse
import gc
import sys

import numpy as np

import kcap


def workload(path: str, kv_type: str, activations: str, backend: str = "cuda", prefill: int = 40,
             short: bool = False) -> bool:
    model = kcap.load(path, backend=backend, n_ctx=256, kv_type=kv_type, activations=activations)
    engine = model.engine
    rng = np.random.default_rng(7)
    ids = rng.integers(0, model.n_vocab, prefill + 23).astype(np.int32)
    finite = bool(np.isfinite(engine.eval(ids[:prefill], all_logits=True)).all())
    if not short:
        finite &= bool(np.isfinite(engine.eval(ids[prefill:])).all())
    token = int(ids[-1])
    for _ in range(1 if short else 3):
        logits = engine.eval(np.array([token], np.int32))
        finite &= bool(np.isfinite(logits).all())
        token = int(np.argmax(logits))
    greedy = engine.decode_greedy(token, 2 if short else 4)
    sampled = []
    if engine.samples_on_device:
        sampled = engine.decode_sample(int(greedy[-1]), 1 if short else 3, temperature=0.8, top_k=20, top_p=0.9,
                                       seed=1).tolist()
    if not short:
        engine.truncate(prefill + 10)
        finite &= bool(np.isfinite(engine.eval(ids[:20])).all())
    print(f"{path} kv {kv_type} activations {activations}: n_past {engine.n_past}, greedy {greedy.tolist()}, "
          f"sampled {sampled}, device_bytes {engine.device_bytes}, finite {finite}", flush=True)
    del engine, model
    gc.collect()
    return finite


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--kv", default="f16")
    parser.add_argument("--activations", default="f32")
    parser.add_argument("--prefill", type=int, default=40)
    parser.add_argument("--short", action="store_true", help="each kernel once or twice (for racecheck)")
    parser.add_argument("--backend", default="cuda", help="cpu: a dry run of the workload")
    args = parser.parse_args(argv)
    ok = True
    for kv_type in args.kv.split(","):
        for activations in args.activations.split(","):
            ok &= workload(args.model, kv_type, activations, args.backend, args.prefill, args.short)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
