"""Decode or prefill tokens/s of kcap's CUDA engine, one model at a time, in one process.

    python bench/cuda_sweep.py --models /tmp/kcap_models --which llama3_8b_q4_k_m [--pp] [--activations q8_1]
        [--exclude KERNEL[,KERNEL...]]...

Each model is loaded, warmed up, and timed as tg128 (decode_greedy: the captured graph; --depth
N after N tokens of context) or, with --pp, pp512 (one 512-token prefill), the median of
--repeats runs; it is timed twice ("base", "base again", separate loads), so the spread between
loads shows next to a difference between two builds measured the same way (scripts/device_ab.sh
runs this script in the base and the new tree). A tuning constant is measured by building each
value (the constants live next to their rows in cuda/rows.h); a row against the one the plan takes
without it, in the same build, with --exclude (the plan without that row, timed between the two
base runs).
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
import bench_cuda  # noqa: E402
from bench_cuda import load_cuda, make_models  # noqa: E402


def rate(path: str, repeats: int, depth: int, pp: bool, activations: str = "f32", pp_tokens: int = 512,
         excluded: tuple[str, ...] = ()) -> float:
    """tg128 (after `depth` tokens of context), or with pp a prefill of pp_tokens (pp512); the plan
    without the rows `excluded` names."""
    model = load_cuda(path, activations, excluded=excluded)
    engine = model.engine
    ids = np.random.default_rng(0).integers(0, model.n_vocab, max(depth, pp_tokens, 512)).astype(np.int32)
    if depth and not pp:
        engine.eval(ids[:depth], False)

    def run(n=128):
        if pp:
            engine.reset()
            engine.eval(ids[:pp_tokens], False)
            return
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
    return (pp_tokens if pp else 128) / statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="/tmp/kcap_models")
    parser.add_argument("--which", default="gemma3_270m,llama3_8b_q4_k_m")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--depth", type=int, default=0, help="tokens of context before the 128 timed ones")
    parser.add_argument("--pp", action="store_true", help="time pp512 (a 512-token prefill) instead of tg128")
    parser.add_argument("--pp-tokens", type=int, default=512, help="with --pp: the prefill's tokens (512: pp512)")
    parser.add_argument("--activations", default="f32", help="f32, q8_1 (the int8-activation rows) or bf16 (the GEMM rows)")
    parser.add_argument("--exclude", action="append", default=[], metavar="KERNEL[,KERNEL...]",
                        help="also time the plan without these rows (excluded_kernels), once per --exclude, "
                             "between the two base runs: a row against the one the plan takes without it")
    args = parser.parse_args()
    bench_cuda.DEPTH = max(bench_cuda.DEPTH, args.depth)  # load_cuda's context: the depth and the timed tokens
    variants = ["base"] + [f"without {e}" for e in args.exclude] + ["base again"]
    excluded = {f"without {e}": tuple(e.split(",")) for e in args.exclude}
    paths = make_models(Path(args.models), args.which.split(","))
    rows = []
    for model, path in paths.items():
        for name in variants:
            r = rate(path, args.repeats, args.depth, args.pp, args.activations, args.pp_tokens, excluded.get(name, ()))
            rows.append((model, name, r))
            print(f"{model:20s} {name:14s} {r:8.1f} tok/s", flush=True)
    what = f"pp{args.pp_tokens}" if args.pp else f"tg128{'@' + str(args.depth) if args.depth else ''}"
    print(f"\n| model | variant | {what} tok/s | vs base |")
    print("| --- | --- | --- | --- |")
    for model, name, r in rows:
        base = next(b for m, n, b in rows if m == model and n == "base")
        print(f"| {model} | {name} | {r:.1f} | {r / base:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
