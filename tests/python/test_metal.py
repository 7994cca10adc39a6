"""Metal backend.

Runs everywhere (no Mac needed): the Metal rows are in the capability table with their entry
points, every entry point a row declares is a kernel of metal/*.metal (found by running the
C++ preprocessor over them with the Linux stand-in), `kcap explain --backend metal` routes
every stage of both real models to Metal rows, and backend="metal" without the backend or a
device is refused with BackendUnavailableError.

On a Mac with a Metal device (.github/workflows/macos.yml): the CUDA backend's parity tests
(tests/python/test_cuda.py), unchanged in substance, with backend "metal": per row (every
weight format's matmul and embedding row, on a tiny model of that format) and whole-model
(both real-model layouts: prefill, decode steps with f32 and f16 caches, greedy continuations
on the host and with the argmax on the device, a long context across the sliding window and
the split-K decode). Elsewhere they are skipped with the reason "no Metal device".

Tolerances, max |Δlogit| over the vocabulary relative to the std of the CPU logits (the Metal
rows are the exact f32 rows; there is no tensor-core row to loosen them):
  DECODE_TOLERANCE 1e-4   one-token steps (one command buffer per step)
  EXACT_TOLERANCE  1e-4   prefill chunks
No Metal result has been measured: nothing here has run on a Mac yet.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kcap
from kcap import _core
from kcap.explain import explain_file
from kcap.testing import synth

from test_cuda import MODELS, REQUIRED_WEIGHT_FORMATS, model_files, real_model_path  # noqa: F401

REPO = Path(__file__).resolve().parent.parent.parent
METAL = REPO / "metal"
DECODE_TOLERANCE = 1e-4
EXACT_TOLERANCE = 1e-4
BACKEND = "metal"


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory) -> str:
    return synth.tiny_llama(str(tmp_path_factory.mktemp("metal_tiny") / "tiny.gguf"))


def device_present(tiny_path) -> bool:
    try:
        kcap.load(tiny_path, backend=BACKEND, n_ctx=64)
        return True
    except kcap.BackendUnavailableError:
        return False


@pytest.fixture(scope="session")
def metal_device(tiny_path):
    if not device_present(tiny_path):
        pytest.skip("no Metal device")


def metal_rows() -> list[dict]:
    return [r for r in _core.capability_rows() if r["backend"] == BACKEND]


# --- no Mac needed --------------------------------------------------------------------------

# What CUDA rows take ahead of their Metal twins (the Metal launchers bind no sinks, expert-bias or
# choice-bias buffers yet, so Metal plans refuse such stages, naming the feature): op -> (features,
# the trailing operand slots that carry them).
CUDA_AHEAD_OF_METAL = {
    "attention": ({"sinks"}, 1),                    # operand 3, after a fused rope's three
    # the router's bias, and DeepSeek's sigmoid router with its choice bias and expert groups
    "moe_route": ({"bias", "expert_sigmoid", "expert_groups", "expert_choice_bias"}, 2),
    "moe_experts": ({"bias", "swiglu_oai"}, 3),     # the experts' gate, up and down biases
}


def test_metal_rows_mirror_the_shared_cuda_rows():
    rows = metal_rows()
    ops = {r["op"] for r in rows}
    assert {"embed", "norm", "matmul", "rope", "attention", "ffn_activation", "add", "softcap", "scale",
            "argmax", "add_norm", "gate_up", "per_layer_embed", "per_layer_gate"} <= ops
    cuda = {r["kernel"].removeprefix("cuda."): r for r in _core.capability_rows() if r["backend"] == "cuda"}
    for row in rows:
        twin = dict(cuda.get(row["kernel"].removeprefix("metal.")) or {})
        assert twin, f"{row['kernel']} has no CUDA twin over the same kernels/ body"
        if row["op"] in CUDA_AHEAD_OF_METAL:
            features, slots = CUDA_AHEAD_OF_METAL[row["op"]]
            extra = twin["operand_formats"][-slots:]
            assert features <= set(twin["features"].split(",")) and all(f in ([], ["F32"]) for f in extra), twin
            twin["features"] = ",".join(f for f in twin["features"].split(",") if f not in features)
            twin["operand_formats"] = twin["operand_formats"][:-slots]
            while twin["operand_formats"] and twin["operand_formats"][-1] == [] and \
                    len(twin["operand_formats"]) > len(row["operand_formats"]):
                twin["operand_formats"].pop()  # the empty slots before the sinks of a row without rope operands
        for field in ("op", "operand_formats", "kv_formats", "features", "k_multiple", "max_head_dim", "max_span"):
            assert row[field] == twin[field], (row["kernel"], field)
    for fmt in REQUIRED_WEIGHT_FORMATS:
        assert any(r["op"] == "matmul" and r["operand_formats"][0] == [fmt] for r in rows), fmt
        assert any(r["op"] == "embed" and r["operand_formats"][0] == [fmt] for r in rows), fmt


def test_metal_rows_are_compiled_only_with_a_device_build():
    if sys.platform != "darwin":
        assert not any(r["compiled"] for r in metal_rows()), "Metal kernels claimed outside an Apple build"
        assert _core.metal_device_available() is False
        assert kcap.default_backend() == "cpu"


def preprocessed_entry_names() -> set[str]:
    """host_name strings of every kernel in metal/*.metal, macros expanded as the Metal compiler would."""
    cxx = shutil.which("g++") or shutil.which("clang++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler to preprocess metal/*.metal")
    names = set()
    sources = sorted(METAL.glob("*.metal"))
    assert sources, "no metal/*.metal files"
    for source in sources:
        out = subprocess.run([cxx, "-std=c++17", "-x", "c++", "-E", "-P", "-D__METAL_VERSION__=310",
                              f"-I{METAL / 'check'}", f"-I{REPO}", str(source)],
                             capture_output=True, text=True, check=True).stdout
        names |= set(re.findall(r'host_name\("([A-Za-z0-9_]+)"\)', out))
    return names


def test_every_metal_row_entry_point_is_a_kernel_in_the_metal_sources():
    declared = _core.metal_entry_points()
    rows = {r["kernel"] for r in metal_rows()}
    assert set(declared) == rows, "rows and their entry point declarations disagree"
    defined = preprocessed_entry_names()
    missing = {kernel: [e for e in entries if e not in defined] for kernel, entries in declared.items()}
    missing = {k: v for k, v in missing.items() if v or not declared[k]}
    assert not missing, f"entry points declared by rows but not defined in metal/*.metal: {missing}"
    used = {e for entries in declared.values() for e in entries}
    assert not defined - used, f"kernels no row declares: {sorted(defined - used)}"


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_explain_routes_every_stage_to_metal(model_files, name, kv_type):
    path, _ = model_files[name]
    routes = explain_file(path, backend=BACKEND, kv_type=kv_type)
    assert routes
    wrong = [r for r in routes if r["backend"] != BACKEND or not r["kernel"].startswith("metal.")]
    assert not wrong, wrong[:3]


def test_explain_cli_json_for_metal(model_files):
    for name in sorted(MODELS):
        path, _ = model_files[name]
        out = subprocess.run([sys.executable, "-m", "kcap.cli", "explain", path, "--backend", BACKEND, "--json"],
                             capture_output=True, text=True, check=True).stdout
        routes = json.loads(out)
        assert routes and {r["backend"] for r in routes} == {BACKEND}, name


def test_metal_backend_refused_without_device(tiny_path):
    if device_present(tiny_path):
        pytest.skip("a Metal device is present: the refusal path cannot be reached here")
    with pytest.raises(kcap.BackendUnavailableError) as info:
        kcap.load(tiny_path, backend=BACKEND)
    message = str(info.value)
    assert "no Metal device" in message or "not compiled into this build" in message


def test_just_illegal_head_dim_is_refused_for_metal(tmp_path):
    path = synth.tiny_llama(str(tmp_path / "wide.gguf"), n_embd=1056, n_head=4, n_head_kv=2, n_ff=64)
    with pytest.raises(kcap.RoutingError, match="head_dim 264/264 exceeds 256"):
        explain_file(path, backend=BACKEND)


# --- per row: one tiny model per weight format (its matmul and embedding rows) -------------

FORMAT_ROWS = sorted({r["operand_formats"][0][0] for r in metal_rows() if r["op"] == "matmul"})


@pytest.fixture(scope="session")
def format_models(tmp_path_factory) -> dict:
    """format -> a tiny Llama whose every matrix is in that format (K = 256: any block size)."""
    folder = tmp_path_factory.mktemp("metal_formats")
    return {fmt: synth.tiny_llama(str(folder / f"{fmt}.gguf"), n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                                  weight_type=fmt) for fmt in FORMAT_ROWS}


@pytest.mark.parametrize("fmt", FORMAT_ROWS)
def test_format_model_routes_through_its_metal_rows(format_models, fmt):
    kernels = {r["kernel"] for r in explain_file(format_models[fmt], backend=BACKEND)}
    for row in ("matvec", "matmul_tokens", "embed"):
        assert f"metal.{row}.{fmt.lower()}" in kernels, (row, kernels)


def max_relative(got: np.ndarray, ref: np.ndarray) -> float:
    assert np.isfinite(got).all()
    return float(np.abs(got.astype(np.float64) - ref).max() / ref.std())


def prompt_ids(n_vocab: int, n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, n_vocab, n)]


@pytest.mark.parametrize("fmt", FORMAT_ROWS)
def test_format_rows_match_cpu(format_models, metal_device, fmt):
    cpu = kcap.load(format_models[fmt], backend="cpu", n_ctx=128)
    gpu = kcap.load(format_models[fmt], backend=BACKEND, n_ctx=128)
    ids = prompt_ids(cpu.n_vocab, 19, seed=8)  # prefill: the few-token walk; then matvec steps
    ref = cpu.eval(ids, all_logits=True)
    got = gpu.eval(ids, all_logits=True)
    worst = max(max_relative(got[p], ref[p]) for p in range(len(ids)))
    assert worst <= EXACT_TOLERANCE, f"{fmt} prefill: max |Δ| = {worst:.3g} × std"
    for token in prompt_ids(cpu.n_vocab, 4, seed=9):
        worst = max_relative(gpu.eval([token]), cpu.eval([token]))
        assert worst <= DECODE_TOLERANCE, f"{fmt} decode: max |Δ| = {worst:.3g} × std"


# --- whole models on a Metal device ---------------------------------------------------------

@pytest.mark.parametrize("name", sorted(MODELS))
def test_prefill_logits_match_cpu(model_files, metal_device, name):
    path, _ = model_files[name]
    cpu = kcap.load(path, backend="cpu", n_ctx=1024)
    gpu = kcap.load(path, backend=BACKEND, n_ctx=1024)
    ids = prompt_ids(cpu.n_vocab, 41, seed=1)
    ref = cpu.eval(ids, all_logits=True)
    got = gpu.eval(ids, all_logits=True)
    worst = max(max_relative(got[p], ref[p]) for p in range(len(ids)))
    assert worst <= EXACT_TOLERANCE, f"{name} prefill: max |Δ| = {worst:.3g} × std > {EXACT_TOLERANCE}"
    gpu.reset()
    assert max_relative(gpu.eval(ids), ref[-1]) <= EXACT_TOLERANCE


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_decode_steps_match_cpu(model_files, metal_device, name, kv_type):
    path, _ = model_files[name]
    cpu = kcap.load(path, backend="cpu", n_ctx=256, kv_type=kv_type)
    gpu = kcap.load(path, backend=BACKEND, n_ctx=256, kv_type=kv_type)
    for step, token in enumerate(prompt_ids(cpu.n_vocab, 24, seed=2)):
        worst = max_relative(gpu.eval([token]), cpu.eval([token]))
        assert worst <= DECODE_TOLERANCE, f"{name} kv {kv_type} step {step}: max |Δ| = {worst:.3g} × std"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_greedy_continuation_is_identical(model_files, metal_device, name):
    path, _ = model_files[name]
    cpu = kcap.load(path, backend="cpu", n_ctx=1024)
    gpu = kcap.load(path, backend=BACKEND, n_ctx=1024)
    for seed in (3, 4, 5):
        cpu.reset(), gpu.reset()
        ids = prompt_ids(cpu.n_vocab, 10, seed=seed)
        want = list(cpu.generate_ids(ids, max_tokens=32, ignore_eos=True))
        assert list(gpu.generate_ids(ids, max_tokens=32, ignore_eos=True)) == want, f"{name} seed {seed}"
        gpu.reset()
        gpu.eval(ids[:-1])
        on_device = gpu.engine.decode_greedy(ids[-1], 32).tolist()
        assert on_device == want, f"{name} seed {seed}: decode_greedy {on_device} != cpu {want}"


def test_long_context_crosses_the_window_and_splits(model_files, metal_device):
    path, _ = model_files["gemma3_270m"]
    cpu = kcap.load(path, backend="cpu", n_ctx=1024)
    gpu = kcap.load(path, backend=BACKEND, n_ctx=1024)
    ids = prompt_ids(cpu.n_vocab, 700, seed=6)
    assert max_relative(gpu.eval(ids), cpu.eval(ids)) <= EXACT_TOLERANCE
    for token in prompt_ids(cpu.n_vocab, 6, seed=7):
        worst = max_relative(gpu.eval([token]), cpu.eval([token]))
        assert worst <= DECODE_TOLERANCE, f"decode after a 700-token prefill: max |Δ| = {worst:.3g} × std"


def test_default_backend_is_metal_on_a_mac_with_a_device(tiny_path, metal_device):
    assert kcap.default_backend() == BACKEND
    assert kcap.load(tiny_path, n_ctx=64).backend == BACKEND
