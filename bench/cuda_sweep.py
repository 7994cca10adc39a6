"""Decode tokens/s of kcap's CUDA engine under measurement switches, one model at a time, in one
process: how a tuning constant was chosen (e.g. cuda_rows::kMatvecRows, the matvec split).

    python bench/cuda_sweep.py --models /tmp/kcap_models --which llama3_8b_q4_k_m \
        --variant base= --variant rows1=KCAP_MATVEC_ROWS=1 --variant warps32=KCAP_MATVEC_WARPS=32

Each variant loads the model with its environment (the backend reads the switches when it is
built), warms up, and times tg128 (decode_greedy: the captured graph) as the median of
--repeats runs; the base variant is timed first and last, so the spread of one setting shows
next to the differences between settings. Prints one table row per variant.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cuda import load_cuda, make_models  # noqa: E402


def tg128(path: str, env: dict[str, str], repeats: int, depth: int) -> float:
    model = load_cuda(path, env)
    engine = model.engine
    ids = np.random.default_rng(0).integers(0, model.n_vocab, max(depth, 1)).astype(np.int32)
    if depth:
        engine.eval(ids, False)

    def run(n=128):
        engine.truncate(depth) if depth else engine.reset()
        engine.decode_greedy(int(ids[0]), n)

    run(16)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    del engine, model
    gc.collect()
    return 128 / statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="/tmp/kcap_models")
    parser.add_argument("--which", default="gemma3_270m,llama3_8b_q4_k_m")
    parser.add_argument("--variant", action="append", default=[], help="NAME=VAR=VALUE[,VAR=VALUE]")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--depth", type=int, default=0, help="tokens of context before the 128 timed ones")
    args = parser.parse_args()
    variants = [("base", {})]
    for spec in args.variant:
        name, _, assignments = spec.partition("=")
        env = dict(a.split("=", 1) for a in assignments.split(",") if a)
        if name != "base":
            variants.append((name, env))
    variants.append(("base again", {}))
    paths = make_models(Path(args.models), args.which.split(","))
    rows = []
    for model, path in paths.items():
        for name, env in variants:
            rate = tg128(path, env, args.repeats, args.depth)
            rows.append((model, name, rate))
            print(f"{model:20s} {name:14s} {rate:8.1f} tok/s", flush=True)
    print(f"\n| model | variant | tg128{'@' + str(args.depth) if args.depth else ''} tok/s | vs base |")
    print("| --- | --- | --- | --- |")
    for model, name, rate in rows:
        base = next(r for m, n, r in rows if m == model and n == "base")
        print(f"| {model} | {name} | {rate:.1f} | {rate / base:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
