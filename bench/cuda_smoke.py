"""Smoke check of the CUDA engine end to end on a tiny synthetic Llama, in seconds: explain,
load, prefill (all logits), decode steps through the captured graph, greedy decoding on the
device, each against the CPU backend. scripts/device_check.sh runs it first (under a
debugger, so a crash prints a native backtrace) before the long tests and benchmarks.

    python bench/cuda_smoke.py
    python bench/cuda_smoke.py --profile [--at=POSITION] [--activations=q8_1] [--prefill=N] [--repeats=R] MODEL.gguf ...
        (per-stage times: profile=True)
"""
from __future__ import annotations

import sys

import numpy as np

import kcap
from kcap.explain import explain_file
from kcap.testing.synth import tiny_llama


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b).max() / b.std())


def main() -> int:
    path = tiny_llama("/tmp/kcap_smoke.gguf", n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=96)
    print("explain cpu:", len(explain_file(path, backend="cpu")), "stages", flush=True)
    print("explain cuda:", len(explain_file(path, backend="cuda")), "stages", flush=True)
    cpu = kcap.load(path, backend="cpu", n_ctx=128)
    cuda = kcap.load(path, backend="cuda", n_ctx=128)
    print("loaded", flush=True)
    ids = list(range(1, 41))
    worst = rel(cuda.eval(ids, all_logits=True), cpu.eval(ids, all_logits=True))
    print(f"prefill 40 tokens, all logits: max |d| = {worst:.3g} x std", flush=True)
    steps = [rel(cuda.eval([t]), cpu.eval([t])) for t in (7, 8, 9, 10)]
    print("decode steps:", " ".join(f"{s:.3g}" for s in steps), flush=True)
    cpu.reset(), cuda.reset()
    want = list(cpu.generate_ids([5, 6, 7], max_tokens=16, ignore_eos=True))
    got = list(cuda.generate_ids([5, 6, 7], max_tokens=16, ignore_eos=True))
    cuda.reset()
    cuda.eval([5, 6])
    on_device = cuda.engine.decode_greedy(7, 16).tolist()
    print("greedy cpu   ", want, "\ngreedy cuda  ", got, "\ndecode_greedy", on_device, flush=True)
    ok = worst < 1e-2 and max(steps) < 1e-4 and want == got == on_device
    print("smoke", "ok" if ok else "MISMATCH", flush=True)
    return 0 if ok else 1


def profile(paths: list[str], at: int = 0, activations: str = "f32", prefill: int = 512, repeats: int = 1) -> int:
    """Prefill `prefill` tokens `repeats` times (from an empty cache each time), then decode 64
    from position `at` (after a prefill of `at` tokens), of each model with profile=True (stages
    timed one by one with CUDA events; the backend prints its tables to stderr when it is
    destroyed: the prefill table covers every prefill, the first one cold)."""
    import gc

    for path in paths:
        print(f"== profile {path}", file=sys.stderr, flush=True)
        model = kcap.load(path, backend="cuda", n_ctx=max(4096, at) + 256, kv_type="f16", activations=activations,
                          profile=True)
        ids = np.random.default_rng(0).integers(0, model.n_vocab, max(prefill, at)).astype(np.int32)
        for _ in range(repeats):
            model.engine.reset()
            model.engine.eval(ids[:prefill], False)
        model.engine.reset()
        if at:
            model.engine.eval(ids[:at], False)
        model.engine.decode_greedy(1, 64)
        del model
        gc.collect()
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--profile":
        args = sys.argv[2:]
        at, activations, prefill, repeats = 0, "f32", 512, 1
        while args[0].startswith("--"):
            if args[0].startswith("--at="):
                at = int(args[0].removeprefix("--at="))
            elif args[0].startswith("--activations="):
                activations = args[0].removeprefix("--activations=")
            elif args[0].startswith("--prefill="):
                prefill = int(args[0].removeprefix("--prefill="))
            elif args[0].startswith("--repeats="):
                repeats = int(args[0].removeprefix("--repeats="))
            args = args[1:]
        sys.exit(profile(args, at, activations, prefill, repeats))
    sys.exit(main())
