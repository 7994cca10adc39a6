"""Long context on CUDA: each model decodes to the last position of a 32,768-token context, its
device memory is held against the plan, and its logits at a few positions against the CPU's.

    python bench/cuda_long_context.py run --models DIR --out DIR [--configs NAME:KV,...]
        (on the GPU machine) for each config: the synthetic file (made in DIR if missing), then on
        CUDA a prefill of 32,704 random ids in chunks that end at the checked positions, two
        decode steps with logits (the captured graph), decode_greedy to two short of the end,
        two more steps with logits, the last at position 32,767; the cache is then full.
        Writes DIR/long_context_<config>.npz (every id, the checked positions and their
        logits) and DIR/long_context_cuda.json (times, memory, the file's sha256).
    python bench/cuda_long_context.py cpu-check --models DIR --results DIR [--threads N] [--configs ...]
        (anywhere) the CPU engine on the same ids, chunked the same way, logits compared at the
        checked positions; remakes each file (the synthetic files are deterministic: same
        sha256 checked) and writes DIR/long_context_cpu.json and DIR/cuda_h200_long_context.md.
    python bench/cuda_long_context.py make DIR NAME...
        the files only (printing their paths), for scripts that run other work on them.

Configs: gemma3_270m (the exact layout of Gemma 3 270M: 18 layers, 5 of each 6 with a 512-key
window, 262,144 vocabulary) with an f16 and an f32 cache; llama3_8b_q4_k_m_32k (Llama-3-8B in
llama.cpp's Q4_K_M mix, 32 layers, GQA 32/8) with f16; llama3_8b_q4_k_m_2l_32k (its first 2
layers, every shape and format kept: the 8B's long-context path at a size the CPU can check).
Random weights and random ids: the checks are about the long-context path, not about text.

Memory, for each config: what cudaMemGetInfo lost over the load and after the whole run, the
engine's device_bytes (every cudaMalloc of the backend), the plan's KV cache (2 x layers with
their own cache x n_ctx x n_head_kv x head_dim x element) and the referenced weights' bytes.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

N_CTX = 32_768
DECODED = 64  # the last positions: decode steps (two with logits, decode_greedy, two with logits)
SEED = 20261201
DEFAULT_CONFIGS = "gemma3_270m:f16,gemma3_270m:f32,llama3_8b_q4_k_m_32k:f16,llama3_8b_q4_k_m_2l_32k:f16"
# The CPU checks every config but the 32-layer 8B: 32,768 of its tokens are about 5e14
# multiply-adds, hours on a few cores (its 2-layer slice stands in for it).
CPU_CONFIGS = "gemma3_270m:f16,gemma3_270m:f32,llama3_8b_q4_k_m_2l_32k:f16"
MIB = 1 << 20


def log(*args):
    print(*args, flush=True)


def model_file(models: Path, name: str) -> str:
    """The synthetic file of a model, made once (deterministic: the same bytes anywhere):
    bench_cuda.make_models' names, and the Llama-3-8B Q4_K_M shape with a 32,768-token context
    (llama3_8b_q4_k_m_32k; the benchmark's file declares 8,192, which bounds n_ctx) or its first 2
    layers (llama3_8b_q4_k_m_2l_32k: every format of the mix, Q4_K and Q6_K attn_v / ffn_down)."""
    from kcap.testing import synth

    path = models / f"{name}.gguf"
    if not path.exists():
        models.mkdir(parents=True, exist_ok=True)
        start = time.time()
        if name in ("llama3_8b_q4_k_m_32k", "llama3_8b_q4_k_m_2l_32k"):
            synth.llama3_8b_q4_k_m(str(path), n_layer=2 if "_2l" in name else 32, context_length=N_CTX)
        else:
            import bench_cuda

            bench_cuda.make_models(models, [name])
        log(f"made {path} in {time.time() - start:.0f} s")
    return str(path)


def make(argv) -> int:
    """`make DIR NAME...`: the files, for a script that runs other work on them."""
    for name in argv[1:]:
        print(model_file(Path(argv[0]), name), flush=True)
    return 0


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(16 * MIB), b""):
            h.update(block)
    return h.hexdigest()


def kv_plan_bytes(spec, n_ctx: int, kv_type: str) -> int:
    """The KV cache the plan reserves on CUDA: every layer with its own cache (a kv_shared layer
    reads another's) holds n_ctx rows of K and of V, sliding-window layers too."""
    elem = 2 if kv_type == "f16" else 4
    return sum(n_ctx * layer.n_head_kv * (layer.head_dim + layer.head_dim_v) * elem
               for layer in spec.layers if layer.kv_source_layer < 0)


def weight_bytes(model) -> int:
    """Bytes of the file tensors the model references (what the backend uploads)."""
    from kcap.model import referenced_tensors

    return sum(model.gguf.tensors[name].data.nbytes for name in referenced_tensors(model.spec))


def chunk_ends(n_ctx: int) -> tuple[int, ...]:
    """Where the prefill's calls end: past the first window (512), half-way, the prefill's end;
    the logits of each call's last position are checked."""
    return tuple(sorted({512, n_ctx // 2, n_ctx - DECODED}))


def prompt(n_vocab: int, n: int) -> np.ndarray:
    return np.random.default_rng(SEED).integers(0, n_vocab, n).astype(np.int32)


def free_device_bytes(backend: str) -> int:
    from kcap import _core

    return _core.cuda_mem_info()[0] if backend == "cuda" else 0


def run_one(path: str, kv_type: str, backend: str = "cuda", n_ctx: int = N_CTX) -> tuple[dict, dict]:
    """One config to the end of its context: (record, arrays for the npz). backend "cpu" (and a
    small n_ctx) tries the script itself on a machine without a GPU."""
    import kcap

    free0 = free_device_bytes(backend)  # the CUDA context exists from here on
    start = time.perf_counter()
    model = kcap.load(path, backend=backend, n_ctx=n_ctx, kv_type=kv_type)
    engine = model.engine
    rec = {"backend": backend, "load_seconds": round(time.perf_counter() - start, 2), "n_ctx": engine.n_ctx}
    free_loaded = free_device_bytes(backend)
    rec["memory"] = {
        "device_bytes": engine.device_bytes,
        "kv_plan": kv_plan_bytes(model.spec, n_ctx, kv_type),
        "weights": weight_bytes(model),
        "taken_after_load": free0 - free_loaded,
    }
    ends = chunk_ends(n_ctx)
    ids = prompt(model.n_vocab, ends[-1])
    seq = [int(t) for t in ids]
    logits = {}
    begin = 0
    start = time.perf_counter()
    for end in ends:
        logits[end - 1] = engine.eval(ids[begin:end])
        begin = end
    rec["prefill_tokens"] = len(ids)
    rec["prefill_seconds"] = round(time.perf_counter() - start, 2)
    free_prefilled = free_device_bytes(backend)

    def step(token: int) -> int:  # one decode step with logits (the captured graph)
        seq.append(token)
        logits[len(seq) - 1] = engine.eval(np.array([token], np.int32))
        return int(np.argmax(logits[len(seq) - 1]))

    token = int(np.argmax(logits[ends[-1] - 1]))
    token = step(token)
    token = step(token)
    start = time.perf_counter()
    n = n_ctx - 2 - len(seq)
    out = engine.decode_greedy(token, n)
    rec["decode_greedy"] = {"steps": n, "seconds": round(time.perf_counter() - start, 3)}
    seq.extend([token] + [int(t) for t in out[:-1]])
    token = step(int(out[-1]))
    step(token)
    assert len(seq) == n_ctx == engine.n_past, (len(seq), engine.n_past)
    free_end = free_device_bytes(backend)
    rec["memory"].update({
        "taken_after_prefill": free0 - free_prefilled,
        "taken_at_end": free0 - free_end,
        "device_bytes_at_end": engine.device_bytes,
    })
    positions = sorted(logits)
    rec["positions"] = positions
    rec["finite"] = bool(all(np.isfinite(logits[p]).all() for p in positions))
    arrays = {"ids": np.array(seq, np.int32), "positions": np.array(positions, np.int64),
              "logits": np.stack([logits[p].astype(np.float32) for p in positions])}
    del engine, model
    return rec, arrays


def run(args) -> int:
    import gc

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = {}
    for config in args.configs.split(","):
        name, kv_type = config.split(":")
        path = model_file(Path(args.models), name)
        log(f"== {config}")
        rec, arrays = run_one(path, kv_type, args.backend, args.n_ctx)
        gc.collect()
        rec["file"] = {"name": Path(path).name, "bytes": Path(path).stat().st_size, "sha256": sha256(path)}
        records[config] = rec
        np.savez(out / f"long_context_{name}_{kv_type}.npz", **arrays)
        m = rec["memory"]
        log(f"  load {rec['load_seconds']} s, prefill {rec['prefill_tokens']} tokens {rec['prefill_seconds']} s, "
            f"decode_greedy {rec['decode_greedy']['steps']} steps {rec['decode_greedy']['seconds']} s, finite {rec['finite']}")
        log(f"  device_bytes {m['device_bytes'] / MIB:.1f} MiB (weights {m['weights'] / MIB:.1f} + KV plan "
            f"{m['kv_plan'] / MIB:.1f} + other {(m['device_bytes'] - m['weights'] - m['kv_plan']) / MIB:.1f}); "
            f"cudaMemGetInfo lost {m['taken_after_load'] / MIB:.1f} MiB after load, "
            f"{m['taken_after_prefill'] / MIB:.1f} after the prefill, {m['taken_at_end'] / MIB:.1f} at the end; "
            f"device_bytes at the end {m['device_bytes_at_end'] / MIB:.1f} MiB")
    (out / "long_context_cuda.json").write_text(json.dumps(records, indent=1) + "\n")
    return 0


def cpu_check(args) -> int:
    import kcap

    results = Path(args.results)
    cuda = json.loads((results / "long_context_cuda.json").read_text())
    report = {}
    for config in args.configs.split(","):
        if config not in cuda:
            continue
        name, kv_type = config.split(":")
        path = model_file(Path(args.models), name)
        digest = sha256(path)
        if digest != cuda[config]["file"]["sha256"]:
            log(f"{config}: this file's sha256 differs from the device's; not compared")
            report[config] = {"skipped": "sha256 differs"}
            continue
        data = np.load(results / f"long_context_{name}_{kv_type}.npz")
        ids, positions, got = data["ids"], [int(p) for p in data["positions"]], data["logits"]
        model = kcap.load(path, backend="cpu", n_ctx=len(ids), kv_type=kv_type, n_threads=args.threads)
        log(f"== {config}: CPU over {len(ids)} ids, {args.threads} threads")
        rows = []
        begin = 0
        start = time.perf_counter()
        for i, p in enumerate(positions):
            ref = model.engine.eval(ids[begin:p + 1])
            begin = p + 1
            diff = float(np.abs(got[i].astype(np.float64) - ref).max() / ref.std())
            cuda_argmax, cpu_argmax = int(np.argmax(got[i])), int(np.argmax(ref))
            rows.append({"position": p, "max_abs_diff_over_std": diff, "argmax_same": cuda_argmax == cpu_argmax,
                         "cuda_argmax": cuda_argmax, "cpu_argmax": cpu_argmax})
            log(f"  position {p}: max |Δ| = {diff:.3g} x std, argmax cuda {cuda_argmax} cpu {cpu_argmax} "
                f"({time.perf_counter() - start:.0f} s)")
        report[config] = {"cpu_seconds": round(time.perf_counter() - start, 1), "threads": args.threads,
                          "positions": rows}
        del model
    (results / "long_context_cpu.json").write_text(json.dumps(report, indent=1) + "\n")
    (results / "cuda_h200_long_context.md").write_text(table(cuda, report))
    log(table(cuda, report))
    return 0


def table(cuda: dict, cpu: dict) -> str:
    lines = ["| config | load s | prefill s | decode_greedy | device_bytes MiB | weights + KV plan + other MiB | "
             "cudaMemGetInfo lost MiB (load / prefill / end) | CPU check: max abs diff / std (argmax same) |",
             "| --- | ---: | ---: | --- | ---: | --- | --- | --- |"]
    for config, rec in cuda.items():
        m = rec["memory"]
        other = m["device_bytes"] - m["weights"] - m["kv_plan"]
        checks = cpu.get(config, {})
        if "positions" in checks:
            check = ", ".join(f"{r['position']}: {r['max_abs_diff_over_std']:.2g}{'' if r['argmax_same'] else ' (argmax differs)'}"
                              for r in checks["positions"])
        else:
            check = checks.get("skipped", "not run")
        lines.append(
            f"| {config} | {rec['load_seconds']} | {rec['prefill_seconds']} | {rec['decode_greedy']['steps']} steps "
            f"{rec['decode_greedy']['seconds']} s | {m['device_bytes'] / MIB:.1f} | {m['weights'] / MIB:.1f} + "
            f"{m['kv_plan'] / MIB:.1f} + {other / MIB:.1f} | {m['taken_after_load'] / MIB:.1f} / "
            f"{m['taken_after_prefill'] / MIB:.1f} / {m['taken_at_end'] / MIB:.1f} | {check} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["make"]:
        return make(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run")
    r.add_argument("--models", default="/tmp/kcap_models")
    r.add_argument("--out", required=True)
    r.add_argument("--configs", default=DEFAULT_CONFIGS)
    r.add_argument("--backend", default="cuda", help="cpu: a dry run of the script (with a small --n-ctx)")
    r.add_argument("--n-ctx", type=int, default=N_CTX)
    c = sub.add_parser("cpu-check")
    c.add_argument("--models", default="/tmp/kcap_models")
    c.add_argument("--results", required=True)
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--configs", default=CPU_CONFIGS)
    args = parser.parse_args(argv)
    return run(args) if args.mode == "run" else cpu_check(args)


if __name__ == "__main__":
    sys.exit(main())
