"""Metal backend.

Runs everywhere (no Mac needed): the Metal rows are in the capability table with their entry
points, every entry point a row declares is a kernel of metal/*.metal (found by running the
C++ preprocessor over them with the Linux stand-in), `kcap explain --backend metal` routes
every stage of both real models to Metal rows, each Metal row declares what its CUDA twin does
(the sinks, the routers' variants, the experts' biases and the latent attention that gpt-oss and
DeepSeek V2/V3 need included), and backend="metal" without the backend or a device is refused
with BackendUnavailableError.

On a Mac with a Metal device (.github/workflows/macos.yml): the CUDA backend's parity tests
(tests/python/test_cuda.py), unchanged in substance, with backend "metal": per row (every
weight format's matmul and embedding row, on a tiny model of that format) and whole-model
(both real-model layouts: prefill, decode steps with f32 and f16 caches, greedy continuations
on the host and with the argmax on the device, a long context across the sliding window and
the split-K decode), and the gpt-oss and DeepSeek V2/V3 fixtures against their transformers
goldens within the CPU's bounds. Elsewhere they are skipped with the reason "no Metal device".

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

def test_metal_rows_mirror_the_shared_cuda_rows():
    # Each Metal row runs the kernels/ body of a CUDA row of the same name and declares the same
    # formats, features and legal dims (the sinks, the routers' variants, the experts' biases and
    # clamped SwiGLU, the latent attention included): a feature one of them drops fails here.
    rows = metal_rows()
    ops = {r["op"] for r in rows}
    assert {"embed", "norm", "matmul", "rope", "attention", "attention_mla", "ffn_activation", "add", "softcap",
            "scale", "argmax", "add_norm", "gate_up", "per_layer_embed", "per_layer_gate", "moe_route", "moe_experts",
            "moe_shared_gate"} <= ops
    cuda = {r["kernel"].removeprefix("cuda."): r for r in _core.capability_rows() if r["backend"] == "cuda"}
    for row in rows:
        twin = cuda.get(row["kernel"].removeprefix("metal."))
        assert twin, f"{row['kernel']} has no CUDA twin over the same kernels/ body"
        for field in ("op", "operand_formats", "kv_formats", "features", "k_multiple", "max_head_dim", "max_span",
                      "tokens_min", "tokens_max", "priority", "requires_any", "requires_all", "launches"):
            assert row[field] == twin[field], (row["kernel"], field)
    for fmt in REQUIRED_WEIGHT_FORMATS:
        assert any(r["op"] == "matmul" and r["operand_formats"][0] == [fmt] for r in rows), fmt
        assert any(r["op"] == "embed" and r["operand_formats"][0] == [fmt] for r in rows), fmt


def test_metal_rows_take_what_gpt_oss_and_deepseek_need():
    # gpt-oss: attention sinks (operand 3 of both attention rows), the router's bias, the experts'
    # biases (operands 3-5) and clamped SwiGLU; DeepSeek V2/V3: the sigmoid router with its choice
    # bias and expert groups, the shared expert's sum, multi-head latent attention (both W_kv_b
    # layouts, any weight format for its up-projections, f32 and f16 latent caches).
    rows = metal_rows()
    attention = [r for r in rows if r["op"] == "attention"]
    assert {r["kernel"] for r in attention} == {"metal.attention_decode", "metal.attention_prefill"}
    for r in attention:
        assert "sinks" in r["features"].split(",") and r["operand_formats"][3] == ["F32"], r["kernel"]
    route = [r for r in rows if r["op"] == "moe_route"]
    assert [r["kernel"] for r in route] == ["metal.moe_route"]
    assert {"bias", "expert_softmax", "expert_sigmoid", "expert_groups", "expert_choice_bias",
            "expert_weights_norm"} <= set(route[0]["features"].split(","))
    assert route[0]["operand_formats"][2:] == [["F32"], ["F32"]]  # the router's bias, the choice bias
    experts = [r for r in rows if r["op"] == "moe_experts"]
    assert {r["operand_formats"][0][0] for r in experts} == set(FORMAT_ROWS)
    for r in experts:
        assert {"bias", "swiglu_oai", "gated", "shared_expert_sum"} <= set(r["features"].split(",")), r["kernel"]
        assert r["operand_formats"][3:] == [["F32"]] * 3, r["kernel"]
    mla = {r["kernel"]: r for r in rows if r["op"] == "attention_mla"}
    assert {k: (r["tokens_min"], r["tokens_max"]) for k, r in mla.items()} == {
        "metal.attention_mla_decode": (1, 1), "metal.attention_mla": (2, None)}
    weight_formats = sorted({r["operand_formats"][0][0] for r in experts})
    for r in mla.values():
        assert set(r["features"].split(",")) == {"rms_norm", "rope_normal", "rope_freq_factors", "mla_kv_b_combined"}
        assert r["kv_formats"] == ["F32", "F16"]
        assert sorted(r["operand_formats"][1]) == sorted(r["operand_formats"][2]) == weight_formats
        assert r["launches"] == ["mla_append_absorb", "mla_attend", "mla_combine", "mla_v_up"]
    entries = _core.metal_entry_points()
    for kernel in mla:  # the per-format entries of W_k_b's and W_v_b's launches, then the attend and combine
        assert {f"kcap_metal_mla_append_absorb_{f}" for f in weight_formats} | {
            "kcap_metal_mla_attend", "kcap_metal_mla_combine"} | {
            f"kcap_metal_mla_v_up_{f}" for f in weight_formats} == set(entries[kernel])


def test_metal_rows_are_compiled_only_with_a_device_build():
    if sys.platform != "darwin":
        assert not any(r["compiled"] for r in metal_rows()), "Metal kernels claimed outside an Apple build"
        assert _core.metal_device_available() is False
        # Off a Mac: CUDA where the build has it and a device is visible (the H200 runs), else the CPU.
        assert kcap.default_backend() == ("cuda" if _core.cuda_device_available() else "cpu")


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


# The fixtures whose Metal rows are the attention sinks, the routers' variants, the experts' biases
# and clamped SwiGLU, the shared expert's sum and the latent attention: against the same
# transformers goldens and bounds as on the CPU and CUDA (test_conformance_cuda.py).
SINKS_MOE_AND_LATENT_FAMILIES = ["deepseek2", "deepseek2-kvb", "deepseek3", "gpt-oss", "gpt-oss-mxfp4"]


@pytest.mark.parametrize("family", SINKS_MOE_AND_LATENT_FAMILIES)
def test_gpt_oss_and_deepseek_match_transformers(metal_device, family):
    from test_conformance import FAMILIES, FIXTURES, F32_TOLERANCE, golden, relative_error

    g = golden(family)
    model = kcap.load(FIXTURES / f"{family}-f32.gguf", backend=BACKEND)
    assert model.architecture == FAMILIES[family][0]
    ids = g["prompt_ids"].tolist()
    prefill = model.eval(ids, all_logits=True)
    assert np.isfinite(prefill).all()
    assert relative_error(prefill, g["logits"]) <= F32_TOLERANCE
    model.reset()
    stepped = np.stack([model.eval([t]) for t in ids])
    assert relative_error(stepped, g["logits"]) <= F32_TOLERANCE
    model.reset()
    greedy = list(model.generate_ids(ids, max_tokens=len(g["greedy_ids"]), ignore_eos=True))
    assert greedy == g["greedy_ids"].tolist()


def test_default_backend_is_metal_on_a_mac_with_a_device(tiny_path, metal_device):
    assert kcap.default_backend() == BACKEND
    assert kcap.load(tiny_path, n_ctx=64).backend == BACKEND
