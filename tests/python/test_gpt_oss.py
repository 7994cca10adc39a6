"""gpt-oss's pieces beyond the conformance fixture (test_conformance.py checks its logits against
transformers, whose clamped SwiGLU the CPU row matches there): it stays finite far past its clamp, the CUDA and Metal
plans keep the sinks, the router's bias and the experts' biases and activation, and bad expert biases name the tensor."""
from __future__ import annotations

import numpy as np
import pytest

import kcap
from kcap import _core
from kcap.arch import build_spec
from kcap.explain import explain_file
from kcap.gguf import GGUFFile
from kcap.model import register_tensors
from kcap.testing import synth
from kcap.testing.synth import copy_with_changes

from test_conformance import FIXTURES

GPT_OSS = FIXTURES / "gpt-oss-f32.gguf"


def test_clamped_swiglu_is_finite_far_past_the_clamp(tmp_path):
    # Scale one expert's gate and up rows by 1e6 (F32 file): its pre-activations reach ~1e6,
    # far past the clamp of 7, where an unclamped SwiGLU would give ~1e12 (and f16 inf). The
    # logits stay finite and every stage's output is checked (check_finite).
    model = kcap.load(GPT_OSS, backend="cpu", check_finite=True)
    ids = [5, 9, 17, 3, 40, 41, 42, 43]
    base = model.logits(ids)
    assert np.isfinite(base).all()
    from gguf import GGUFReader

    names = ("blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight")
    big = [(t.name, "F32", tuple(int(d) for d in t.shape), np.asarray(t.data) * np.float32(1e6))
           for t in GGUFReader(str(GPT_OSS)).tensors if t.name in names]
    path = tmp_path / "big.gguf"
    copy_with_changes(str(GPT_OSS), str(path), drop_tensors=names, add_tensors=big)
    scaled = kcap.load(path, backend="cpu", check_finite=True).logits(ids)
    assert np.isfinite(scaled).all() and np.abs(scaled - base).max() > 0.01


@pytest.mark.parametrize("fixture,fmt", [("gpt-oss-f32", "f32"), ("gpt-oss-mxfp4-f32", "mxfp4"), ("gpt-oss-q8_0", "q8_0")])
@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_metal_plan_keeps_every_gpt_oss_feature(fixture, fmt, kv_type):
    # The Metal rows run CUDA's bodies (kernels/attention.h, kernels/moe.h) with the sinks, the
    # router's bias and the experts' biases and clamped SwiGLU bound (compile-checked only: no Apple
    # GPU here). No Metal attention row owns a rope, so the rope stays a stage of its own. A row
    # that lacked one of these features would leave its stage without a route, and the plan would
    # be refused.
    routes = explain_file(str(FIXTURES / f"{fixture}.gguf"), backend="metal", kv_type=kv_type)
    assert {r["backend"] for r in routes} == {"metal"}
    assert all(r["kernel"].startswith("metal.") for r in routes)
    attention = [r for r in routes if r["op"] == "attention"]
    assert attention and all("sinks" in r["features"].split(",") and "sinks=F32" in r["formats"] for r in attention)
    assert sorted({(r["kernel"], r["tokens_min"], r["tokens_max"]) for r in attention}) == [
        ("metal.attention_decode", 1, 1), ("metal.attention_prefill", 2, None)]
    windowed = {r["layer"] for r in attention if "sliding_window" in r["features"].split(",")}
    assert windowed == {0}, windowed  # the fixture's sliding-window layer keeps its window
    rope = [r for r in routes if r["op"] == "rope"]
    assert {r["layer"] for r in rope} == {r["layer"] for r in attention}
    assert all(r["kernel"] == "metal.rope" and "rope_neox" in r["features"].split(",") for r in rope)
    router = [r for r in routes if r["stage"] == "ffn_router"]
    assert router and all(r["kernel"] == "metal.moe_route" and "bias=F32" in r["formats"] and
                          {"bias", "expert_softmax"} <= set(r["features"].split(",")) for r in router)
    experts = [r for r in routes if r["stage"] == "ffn_moe"]
    assert experts and all({"bias", "swiglu_oai", "gated"} <= set(r["features"].split(",")) and
                           "gate_bias=F32 up_bias=F32 down_bias=F32" in r["formats"] for r in experts)
    assert {(r["kernel"], r["tokens_min"], r["tokens_max"]) for r in experts} == {(f"metal.moe_experts.{fmt}", 1, None)}


@pytest.mark.parametrize("fixture", ["gpt-oss-f32", "gpt-oss-mxfp4-f32"])
def test_cuda_plan_keeps_every_gpt_oss_feature(fixture):
    # Every CUDA attention row takes the sinks, the router's row its bias, both experts' rows the
    # biases and the clamped SwiGLU: the decode matvecs up to 15 tokens, the grouped tensor-core
    # tiles from 16 where the experts' format has tiles (MXFP4; F32 has none).
    routes = explain_file(str(FIXTURES / f"{fixture}.gguf"), backend="cuda")
    attention = [r for r in routes if r["stage"].endswith("attention")]
    assert attention and all("sinks" in r["features"].split(",") and "sinks=F32" in r["formats"] for r in attention)
    assert {r["kernel"] for r in attention} == {"cuda.attention_decode_rope", "cuda.attention_prefill_rope"}
    # The router with the add_norm before it fused in (one token: the clusters add and norm the
    # row themselves).
    router = [r for r in routes if r["stage"] == "attn_residual+ffn_norm+ffn_router"]
    assert router and all({"bias", "add_norm_input"} <= set(r["features"].split(",")) for r in router)
    assert {(r["kernel"], r["tokens_min"], r["tokens_max"]) for r in router} == {
        ("cuda.moe_route_cluster_norm", 1, 1), ("cuda.moe_route_cluster_add_norm", 2, 63),
        ("cuda.moe_route_tiled_add_norm", 64, None)}
    experts = [r for r in routes if r["stage"] == "ffn_moe"]
    assert experts and all({"bias", "swiglu_oai"} <= set(r["features"].split(",")) for r in experts)
    ranges = sorted({(r["kernel"], r["tokens_min"], r["tokens_max"]) for r in experts})
    if "mxfp4" in fixture:
        assert ranges == [("cuda.moe_experts.mxfp4", 1, 15), ("cuda.moe_experts_mma.mxfp4", 16, None)]
    else:
        assert ranges == [("cuda.moe_experts.f32", 1, None)]


def test_cuda_tensor_core_prefill_takes_the_sinks(tmp_path):
    # gpt-oss-20b's heads of 64 with an f16 cache: prompts run the tensor-core attention, which
    # adds each head's sink to its softmax denominator (test_cuda_rows checks it against the CPU).
    path = synth.gpt_oss_20b_mxfp4(str(tmp_path / "gpt-oss-small.gguf"), n_layer=2, n_embd=256, n_head=4,
                                   n_head_kv=2, n_expert=4, n_expert_used=2, n_ff_exp=256, n_vocab=512)
    routes = explain_file(path, backend="cuda", kv_type="f16")
    attention = sorted({(r["layer"], r["kernel"], r["tokens_min"]) for r in routes if r["stage"].endswith("attention")
                        and "sinks" in r["features"].split(",")})
    assert attention == [(0, "cuda.attention_decode_rope", 1), (0, "cuda.attention_mma_rope", 2),
                         (1, "cuda.attention_decode_rope", 1), (1, "cuda.attention_mma_rope", 2)]


def test_expert_bias_of_the_wrong_shape_is_named(tmp_path):
    gguf = GGUFFile(GPT_OSS)
    bad = tmp_path / "bad.gguf"
    copy_with_changes(str(GPT_OSS), str(bad), drop_tensors=["blk.1.ffn_up_exps.bias"])
    with pytest.raises(kcap.ModelError, match=r"missing tensor 'blk\.1\.ffn_up_exps\.bias'"):
        kcap.load(bad)
    assert gguf.tensors["blk.0.ffn_down_exps.bias"].shape == (64, 6)


def test_sinks_change_the_attention():
    # The plan's attention carries the sinks (operand and feature); without them (a sink of
    # -inf is no sink) the logits move by far more than the conformance tolerance.
    gguf = GGUFFile(GPT_OSS)
    spec = build_spec(gguf)
    register_tensors(spec, gguf)
    routes = [r for r in _core.explain_routes(spec, backend="cpu") if r["stage"] == "attention"]
    assert routes and all("sinks" in r["features"].split(",") and "sinks=F32" in r["formats"] for r in routes)
    ids = np.array([5, 9, 17, 3, 40, 41, 42, 43, 44, 45], dtype=np.int32)
    with_sinks = _core.Engine(spec, backend="cpu").eval(ids, True)
    layers = spec.layers
    for layer in layers:
        layer.attn_sinks = ""
    spec.layers = layers
    without = _core.Engine(spec, backend="cpu").eval(ids, True)
    assert np.abs(with_sinks - without).max() > 0.1


def test_mxfp4_experts_are_planned_as_mxfp4():
    # The MXFP4 fixture's experts stay MXFP4 in the plan (decoded by the CPU row, not converted).
    routes = kcap.load(FIXTURES / "gpt-oss-mxfp4-f32.gguf").explain()
    moe = [r for r in routes if r["stage"] == "ffn_moe"]
    assert moe and all("W_gate_exps=MXFP4 W_up_exps=MXFP4 W_down_exps=MXFP4" in r["formats"] for r in moe)
