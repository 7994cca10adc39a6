"""gpt-oss's pieces beyond the conformance fixture (test_conformance.py checks its logits against
transformers, whose clamped SwiGLU the CPU row matches there): it stays finite far past its clamp, the plan refuses backends whose
rows lack sinks or the experts' biases and activation, and bad expert biases name the tensor."""
from __future__ import annotations

import numpy as np
import pytest

import kcap
from kcap import _core
from kcap.arch import build_spec
from kcap.explain import explain_file
from kcap.gguf import GGUFFile
from kcap.model import register_tensors
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


def test_metal_refuses_gpt_oss_naming_what_it_lacks():
    # No Metal attention row has sinks yet, nor an experts row with biases and the clamped
    # SwiGLU: the plan is refused, naming the stage and the missing feature.
    with pytest.raises(kcap.RoutingError) as error:
        explain_file(str(GPT_OSS), backend="metal")
    message = str(error.value)
    assert "stage 'attention'" in message or "stage 'rope+attention'" in message or "ffn_moe" in message, message
    assert "sinks" in message or "swiglu_oai" in message or "bias" in message, message


@pytest.mark.parametrize("fixture", ["gpt-oss-f32", "gpt-oss-mxfp4-f32"])
def test_cuda_plan_keeps_every_gpt_oss_feature(fixture):
    # CUDA's SIMT attention rows take the sinks (the tensor-core prefill does not, so it is not
    # chosen), the router's row its bias, the decode-matvec experts row the biases and the
    # clamped SwiGLU at every token count (the grouped tiles have neither).
    routes = explain_file(str(FIXTURES / f"{fixture}.gguf"), backend="cuda")
    attention = [r for r in routes if r["stage"].endswith("attention")]
    assert attention and all("sinks" in r["features"].split(",") and "sinks=F32" in r["formats"] for r in attention)
    assert {r["kernel"] for r in attention} == {"cuda.attention_decode_rope", "cuda.attention_prefill_rope"}
    router = [r for r in routes if r["stage"] == "ffn_router"]
    assert router and all("bias" in r["features"].split(",") and r["kernel"] == "cuda.moe_route" for r in router)
    experts = [r for r in routes if r["stage"] == "ffn_moe"]
    assert experts and all(r["kernel"].startswith("cuda.moe_experts.") and r["tokens_max"] is None and
                           {"bias", "swiglu_oai"} <= set(r["features"].split(",")) for r in experts)


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
