"""kcap explain: the route of every stage, planned from the capability table alone (no
weights are read and no kernel runs, so any backend can be explained on any machine)."""
from __future__ import annotations

from kcap import _core
from kcap.arch import build_spec
from kcap.gguf import GGUFFile
from kcap.model import register_tensors


def explain_file(path: str, backend: str = "cpu", kv_type: str = "f32", n_ctx: int | None = None,
                 excluded_kernels=(), activations: str = "f32") -> list[dict]:
    gguf = GGUFFile(path)
    spec = build_spec(gguf)
    register_tensors(spec, gguf)
    return _core.explain_routes(spec, backend=backend, kv_type=kv_type, n_ctx=int(n_ctx or 0),
                                excluded_kernels=list(excluded_kernels), activations=activations)


def format_table(routes: list[dict]) -> str:
    columns = ["layer", "stage", "op", "formats", "dims", "features", "kernel", "backend"]
    rows = [[str(r["layer"] if r["layer"] >= 0 else "-")] + [str(r[c]) for c in columns[1:]] for r in routes]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in rows)
    return "\n".join(lines)
