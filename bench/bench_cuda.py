"""kcap CUDA vs llama.cpp CUDA on the same GGUF files, side by side in one run.

    python bench/bench_cuda.py --models /tmp/models --llama-bench PATH/llama-bench \
        --out results.json --table results.md

Models (made here with kcap.testing.synth, never carried): the exact layouts of Gemma 3 270M
(Q5_0/Q8_0/Q4_K/Q6_K/F32) and SmolLM2-135M (Q4_1/Q8_0/F32) with random weights, the
Llama-3-8B shape in llama.cpp's Q4_K_M mix, and the Qwen3-30B-A3B mixture of experts in the
same mix (qwen3_30b_a3b_q4_k_m; a suffix _<N>l keeps the first N of its 48 layers). Random weights run the same kernels on the same
bytes as trained ones; token ids are random (the files have no vocabulary).

Engines: kcap with exact f32 activations (the default), kcap with activations="q8_1" (matmuls
on int8-rounded activations, as llama.cpp's CUDA backend computes them), kcap with
activations="bf16" (a prefill's matmuls dequantized to bf16 and run on cuBLAS; tg128 and pp512
only: its decode is the exact one), llama.cpp.
Measured, for each engine and model:
  tg128   tokens/s generating 128 tokens from an empty context (kcap: decode_greedy, the
          captured decode graph replayed with the argmax on the device; llama.cpp: llama-bench -n 128)
  pp512   tokens/s of one 512-token prompt (llama-bench -p 512)
  tg128@D     tokens/s generating 128 tokens after a D-token context (llama-bench -d D -n 128);
              D is --depth, 4096 unless given
plus the device-to-device copy bandwidth (bytes read + written, torch) and, for decode, the
bytes one token must read (every weight once, one embedding row, the KV cache in use) over
the time per token, as a fraction of that copy bandwidth. kcap figures are medians of
repeats after a warm-up; llama-bench's are its averages over -r repeats.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
LAYOUTS = REPO / "tests" / "fixtures" / "layouts"


def log(*args):
    print(*args, flush=True)


def model_suffixes(name: str) -> tuple[str, dict]:
    """A model name's base and the synth arguments of its suffixes: _<N>l keeps the first N
    layers ("qwen3_30b_a3b_q4_k_m_12l"), _v<M> makes the vocabulary M ("gemma3_270m_v8192": the
    same layers with a small LM head, for tools that run the LM head slowly, like racecheck)."""
    changes = {}
    while True:
        base, _, tail = name.rpartition("_")
        if base and tail.endswith("l") and tail[:-1].isdigit():
            changes["n_layer"] = int(tail[:-1])
        elif base and tail.startswith("v") and tail[1:].isdigit():
            changes["n_vocab"] = int(tail[1:])
        else:
            return name, changes
        name = base


def make_models(directory: Path, which: list[str]) -> dict[str, str]:
    # synth needs only numpy and gguf: loaded by its path, it makes the files before the compiled
    # core is built (scripts/device_check.sh runs --make-only beside the build).
    import importlib.util
    spec = importlib.util.spec_from_file_location("kcap_synth", REPO / "python" / "kcap" / "testing" / "synth.py")
    synth = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(synth)

    makers = {"llama3_8b_q4_k_m": synth.llama3_8b_q4_k_m, "deepseek_v2_lite_q4_k_m": synth.deepseek2_q4_k_m,
              "qwen3_30b_a3b_q4_k_m": synth.qwen3moe_q4_k_m, "gpt_oss_20b_mxfp4": synth.gpt_oss_20b_mxfp4}
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in which:
        path = directory / f"{name}.gguf"
        if not path.exists():
            start = time.time()
            base, changes = model_suffixes(name)
            part = path.with_name(path.name + ".part")  # renamed when complete: no half-written file is used
            if base in makers:
                makers[base](str(part), **changes)
            else:
                layout = json.loads((LAYOUTS / f"{base}.json").read_text())
                if set(changes) - {"n_vocab"}:
                    raise SystemExit(f"{name}: a layout file's model takes only a _v<M> suffix")
                if "n_vocab" in changes:
                    layout = with_vocabulary(layout, changes["n_vocab"])
                synth.from_layout(layout, str(part))
            part.rename(path)
            log(f"made {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.time() - start:.0f} s")
        paths[name] = str(path)
    return paths


def with_vocabulary(layout: dict, n_vocab: int) -> dict:
    """A layout (synth.extract_layout) with its vocabulary made n_vocab: the token embedding and
    LM head tensors' rows and <arch>.vocab_size."""
    metadata = dict(layout["metadata"])
    metadata[f"{layout['architecture']}.vocab_size"] = n_vocab
    tensors = [(t_name, t_type, [shape[0], n_vocab] if t_name in ("token_embd.weight", "output.weight") else shape)
               for t_name, t_type, shape in layout["tensors"]]
    return {**layout, "metadata": metadata, "tensors": tensors}


def copy_bandwidth() -> dict:
    import torch

    n = 2 << 30  # 2 GiB each way: far past the 60 MB L2
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    x.random_(0, 255)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        y.copy_(x)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    seconds = statistics.median(times)
    del x, y
    torch.cuda.empty_cache()
    return {"bytes_read_plus_written": 2 * n, "seconds": seconds, "gb_per_s": 2 * n / seconds / 1e9}


def decode_bytes_per_token(path: str, context: int, kv_bytes: int = 4) -> float:
    """Bytes a decode step must read at least: every matrix once (the LM head included), one
    row of the embedding table, norms, and the KV cache of `context` positions; of a mixture of
    experts' stacked expert tensors, only the n_expert_used experts a token is routed to."""
    from kcap.arch import build_spec
    from kcap.gguf import GGUFFile

    g = GGUFFile(path)
    spec = build_spec(g)
    total = 0.0
    for name, info in g.tensors.items():
        nbytes = info.data.nbytes
        if name == spec.token_embd and spec.output != spec.token_embd:
            nbytes = nbytes / info.shape[1]  # one row
        if "_exps." in name:
            layer = spec.layers[int(name.split(".")[1])]
            nbytes = nbytes * layer.n_expert_used / layer.n_expert
        total += nbytes
    for layer in spec.layers:
        span = min(context, layer.sliding_window) if layer.sliding_window else context
        # a latent-attention layer caches its latent and rope key only
        values = (layer.kv_lora_rank + layer.rope_dim if layer.kv_lora_rank
                  else layer.n_head_kv * (layer.head_dim + layer.head_dim_v))
        total += span * values * kv_bytes
    return total


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


DEPTH = 4096  # the context of the deep decode figure (--depth)


def load_cuda(path: str, activations: str = "f32", profile: bool = False, excluded: tuple[str, ...] = ()):
    """The model on CUDA with a context of DEPTH + 256 tokens and an f16 KV cache (llama.cpp's default);
    activations "q8_1" allows the int8-activation matmul rows (llama.cpp's numerics), "bf16" the
    GEMM rows for batches; profile: per-stage times on stderr when the model is freed; excluded:
    rows the plan may not take (excluded_kernels)."""
    import kcap

    return kcap.load(path, backend="cuda", n_ctx=DEPTH + 256, kv_type="f16", activations=activations, profile=profile,
                     excluded_kernels=list(excluded))


def bench_kcap(path: str, name: str, full: bool = True, activations: str = "f32", prefill_only: bool = False) -> dict:
    # load_seconds: from the file to a model ready to run (weights uploaded once, the plan made);
    # the file is usually in the page cache already (it was just written or read by an earlier mode).
    start = time.perf_counter()
    model = load_cuda(path, activations)
    result = {"load_seconds": time.perf_counter() - start}
    engine = model.engine
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.n_vocab, DEPTH).astype(np.int32)

    def tg(n=128):
        engine.reset()
        engine.decode_greedy(int(ids[0]), n)

    tg(16)  # warm-up: captures the decode graph
    t = timed(tg, 5)
    result["tg128"] = 128 / statistics.median(t)
    if not full:
        return result

    def eval_loop(n=128):
        engine.reset()
        token = int(ids[0])
        for _ in range(n):
            token = int(np.argmax(engine.eval(np.array([token], dtype=np.int32), False)))

    if not prefill_only:
        eval_loop(8)
        result["tg128_eval_host_logits"] = 128 / statistics.median(timed(eval_loop, 3))

    def pp(n=512):
        engine.reset()
        engine.eval(ids[:n], False)

    pp()
    result["pp512"] = 512 / statistics.median(timed(pp, 5))
    if prefill_only:
        return result

    engine.reset()
    start = time.perf_counter()
    engine.eval(ids, False)
    result[f"pp{DEPTH}_seconds"] = time.perf_counter() - start

    def tg_deep():
        engine.truncate(DEPTH)
        engine.decode_greedy(int(ids[1]), 128)

    tg_deep()
    result[f"tg128_at_{DEPTH}"] = 128 / statistics.median(timed(tg_deep, 3))
    del engine, model
    return result


def bench_llama(llama_bench: str, path: str, timeout: int = 240) -> dict:
    # -fa 1: flash attention on, as the reference figures were taken.
    runs = {
        "pp512_tg128": ["-p", "512", "-n", "128", "-r", "5", "-fa", "1"],
        f"tg128_at_{DEPTH}": ["-p", "0", "-n", "128", "-d", str(DEPTH), "-r", "3", "-fa", "1"],
    }
    result = {"commands": {}}
    for label, args in runs.items():
        command = [llama_bench, "-m", path, "-ngl", "99", "-o", "json"] + args
        result["commands"][label] = " ".join(command)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            result[label + "_error"] = "timeout"
            continue
        if done.returncode != 0:
            result[label + "_error"] = done.stderr[-2000:]
            continue
        for row in json.loads(done.stdout):
            if row.get("n_prompt", 0) and not row.get("n_gen", 0):
                result["pp512"] = row["avg_ts"]
            elif row.get("n_gen", 0) and row.get("n_depth", 0):
                result[f"tg128_at_{row['n_depth']}"] = row["avg_ts"]
            elif row.get("n_gen", 0):
                result["tg128"] = row["avg_ts"]
            result.setdefault("build", row.get("build_commit"))
            result.setdefault("flash_attn", row.get("flash_attn"))
    return result


# kcap: exact f32 activations (the default); kcap_q8_1: activations="q8_1", the int8-activation
# rows, the numerics llama.cpp's CUDA matmuls use (x rounded to q8_1 per 32 values); kcap_bf16:
# activations="bf16", a prefill's matmuls on cuBLAS with weights and input rounded to bf16 (its
# decode runs the exact rows: tg128 and pp512 only).
ENGINES = ("kcap", "kcap_q8_1", "kcap_bf16", "llama.cpp")


def table(results: dict) -> str:
    deep = f"tg128_at_{DEPTH}"
    lines = [f"| model | engine | tg128 tok/s | pp512 tok/s | tg128 @ {DEPTH} tok/s | decode bandwidth (tg128 / tg@{DEPTH}) |",
             "| --- | --- | ---: | ---: | ---: | --- |"]
    copy = results.get("copy_bandwidth", {}).get("gb_per_s")
    for name, per in results["models"].items():
        for engine in ENGINES:
            r = per.get(engine, {})

            def f(key):
                return f"{r[key]:,.0f}" if isinstance(r.get(key), (int, float)) else "-"

            bw = "-"
            if engine in per and copy and isinstance(r.get("tg128"), (int, float)):
                b0 = per["bytes_per_token"]["context_0"] * r["tg128"] / 1e9
                if isinstance(r.get(deep), (int, float)):
                    b1 = per["bytes_per_token"][f"context_{DEPTH}"] * r[deep] / 1e9
                    bw = f"{b0:,.0f} / {b1:,.0f} GB/s ({b0 / copy:.0%} / {b1 / copy:.0%} of copy)"
                else:
                    bw = f"{b0:,.0f} GB/s ({b0 / copy:.0%} of copy) / -"
            lines.append(f"| {name} | {engine} | {f('tg128')} | {f('pp512')} | {f(deep)} | {bw} |")
        l = per.get("llama.cpp", {})
        for engine in ENGINES[:-1]:
            k = per.get(engine, {})
            ratios = [f"{key} {k[key] / l[key]:.2f}x" for key in ("tg128", "pp512", deep)
                      if isinstance(k.get(key), (int, float)) and isinstance(l.get(key), (int, float))]
            if ratios:
                lines.append(f"| {name} | {engine} / llama.cpp | {' · '.join(ratios)} | | | |")
    if copy:
        lines.append(f"\nDevice-to-device copy: {copy:,.0f} GB/s (bytes read + written).")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="/tmp/kcap_models")
    parser.add_argument("--which", default="gemma3_270m,smollm2_135m,llama3_8b_q4_k_m")
    parser.add_argument("--llama-bench", default=None, help="path to a CUDA llama-bench (skipped if absent)")
    parser.add_argument("--out", default="bench_cuda.json")
    parser.add_argument("--table", default=None)
    parser.add_argument("--skip-kcap", action="store_true")
    parser.add_argument("--merge", nargs="+", help="merge result files of earlier runs into --out / --table")
    parser.add_argument("--depth", type=int, default=4096, help="context before the deep decode figure")
    parser.add_argument("--make-only", action="store_true", help="make the --which files in --models, measure nothing")
    args = parser.parse_args(argv)
    if args.make_only:
        make_models(Path(args.models), args.which.split(","))
        return 0
    global DEPTH
    DEPTH = args.depth

    if args.merge:
        merged = {"models": {}}
        for path in args.merge:
            part = json.loads(Path(path).read_text())
            for key, value in part.items():
                if key != "models":
                    merged.setdefault(key, value)
            for name, per in part.get("models", {}).items():
                merged["models"].setdefault(name, {}).update({k: v for k, v in per.items() if v})
        Path(args.out).write_text(json.dumps(merged, indent=1))
        if args.table:
            Path(args.table).write_text(table(merged) + "\n")
        log(table(merged))
        return 0

    import torch

    results = {"device": torch.cuda.get_device_name(0), "models": {}, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    results["copy_bandwidth"] = copy_bandwidth()
    log(f"copy bandwidth: {results['copy_bandwidth']['gb_per_s']:.0f} GB/s")
    paths = make_models(Path(args.models), args.which.split(","))

    def save():
        Path(args.out).write_text(json.dumps(results, indent=1))
        if args.table:
            Path(args.table).write_text(table(results) + "\n")

    for name, path in paths.items():
        per = results["models"].setdefault(name, {})
        per["file_bytes"] = os.path.getsize(path)
        per["bytes_per_token"] = {"context_0": decode_bytes_per_token(path, 1, kv_bytes=2),
                                  f"context_{DEPTH}": decode_bytes_per_token(path, DEPTH, kv_bytes=2)}
        if not args.skip_kcap:
            try:
                per["kcap"] = bench_kcap(path, name)
                per["kcap_q8_1"] = bench_kcap(path, name, activations="q8_1")
                per["kcap_bf16"] = bench_kcap(path, name, activations="bf16", prefill_only=True)
            except Exception as exc:  # keep measuring the other engine and models
                per["kcap_error"] = repr(exc)
            log(name, "kcap", per.get("kcap"), "q8_1", per.get("kcap_q8_1"), "bf16", per.get("kcap_bf16"),
                per.get("kcap_error", ""))
            save()
    if args.llama_bench and Path(args.llama_bench).exists():
        for name, path in paths.items():
            per = results["models"][name]
            per["llama.cpp"] = bench_llama(args.llama_bench, path)
            log(name, "llama.cpp", per["llama.cpp"])
            save()
    else:
        results["llama.cpp"] = f"not run: no llama-bench at {args.llama_bench}"
    save()
    log(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
