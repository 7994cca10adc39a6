"""kcap explain: the route of every stage, planned from the capability table alone (no
weights are read and no kernel runs, so any backend can be explained on any machine).

Each stage is routed once per range of tokens per call (1 .. max_batch): a route says which
row runs the stage's calls of tokens_min .. tokens_max tokens (tokens_max None: no upper
bound). A GPU plan is made for a reference device here (explain_summary says which); an engine
(kcap.load) plans for its own device, and model.explain() returns its plan."""
from __future__ import annotations

from kcap import _core
from kcap.arch import build_spec
from kcap.gguf import GGUFFile
from kcap.model import register_tensors


def explain_file(path: str, backend: str = "cpu", kv_type: str = "f32", n_ctx: int | None = None,
                 excluded_kernels=(), activations: str = "f32", max_batch: int = 512) -> list[dict]:
    gguf = GGUFFile(path)
    spec = build_spec(gguf)
    register_tensors(spec, gguf)
    return _core.explain_routes(spec, backend=backend, kv_type=kv_type, n_ctx=int(n_ctx or 0),
                                excluded_kernels=list(excluded_kernels), activations=activations,
                                max_batch=int(max_batch))


def describe_tokens(route: dict) -> str:
    """'1', '2-15', '16+' or 'all' (a single route that covers every token count)."""
    lo, hi = route["tokens_min"], route["tokens_max"]
    if lo == 1 and hi is None:
        return "all"
    if hi is None:
        return f"{lo}+"
    return str(lo) if lo == hi else f"{lo}-{hi}"


def route_for(routes: list[dict], layer: int, stage: str, n_tokens: int) -> dict:
    """The route of (layer, stage) that runs a call of n_tokens tokens."""
    for r in routes:
        if r["layer"] == layer and r["stage"] == stage and r["tokens_min"] <= n_tokens and (
                r["tokens_max"] is None or n_tokens <= r["tokens_max"]):
            return r
    raise KeyError(f"no route of layer {layer} stage {stage!r} for {n_tokens} tokens")


def describe_dims(route: dict) -> str:
    """The stage's dims, and for an attention stage the bytes each token adds to its KV cache."""
    cache = route.get("kv_bytes_per_token", 0)
    return route["dims"] + (f" cache={cache}B/token" if cache else "")


def format_table(routes: list[dict]) -> str:
    """One line per stage when one row takes every token count; otherwise the stage's first
    line, then one line per further route with only its tokens and kernel."""
    columns = ["layer", "stage", "op", "formats", "dims", "features", "tokens", "kernel", "backend"]
    rows, previous = [], None
    for r in routes:
        key = (r["layer"], r["stage"])
        if key == previous:
            row = [""] * 6 + [describe_tokens(r), r["kernel"], ""]
        else:
            row = [str(r["layer"] if r["layer"] >= 0 else "-"), r["stage"], r["op"], r["formats"], describe_dims(r),
                   r["features"], describe_tokens(r), r["kernel"], r["backend"]]
        previous = key
        rows.append(row)
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows)
    return "\n".join(lines)


def format_header(backend: str, activations: str, kv_type: str, max_batch: int) -> str:
    """The plan's options, printed above the table."""
    summary = _core.explain_summary(backend=backend, max_batch=max_batch)
    line = f"backend {backend}, activations {activations}, kv_type {kv_type}, up to {summary['max_batch']} tokens per call"
    if backend == "cpu":
        # the dot_row build (x86 or NEON) every cpu row's products run on (the widest the CPU has, capped by
        # kcap.cap_cpu_kernels / KCAP_CPU_KERNELS)
        line += f"; cpu kernels {_core.cpu_kernels()}"
    if backend == "cuda":
        line += (f"; planned for {summary['device']} (sm_{summary['sm_version']}, {summary['sm_count']} multiprocessors, "
                 f"{summary['shared_optin_bytes'] // 1024} KB threadgroup memory): an engine plans for its own device")
    return line
