"""Architectures against Hugging Face transformers: tiny random models built with
transformers, converted to GGUF by llama.cpp's convert_hf_to_gguf.py (F32 and Q8_0), with
the original fp32 model's logits at every position as the reference
(scripts/make_conformance_fixtures.py regenerates fixtures and goldens).

Tolerances, relative to the std of the reference logits:
- F32 file vs the original model: 1e-3 (the issue's bound; measured ~4e-6).
- Q8_0 file vs transformers running the same Q8_0-dequantized weights
  (`logits_q8_0_weights`): 1e-3 as well, since then only summation order differs.
- Q8_0 file vs the original fp32 model: no larger than the quantized reference's own
  distance from fp32 (transformers on the Q8_0-dequantized weights) plus 1e-3. That distance
  is the weight-quantization error of the fixture (0.003-0.25 × std on these tiny random
  models), so the bound follows the fixture instead of a hand-picked number."""
import json
from pathlib import Path

import numpy as np
import pytest

import kcap
from kcap.arch import build_spec
from kcap.gguf import GGUFFile

TESTS = Path(__file__).resolve().parent.parent
FIXTURES = TESTS / "fixtures" / "conformance"
GOLDENS = TESTS / "goldens" / "conformance"
F32_TOLERANCE = 1e-3
Q8_SAME_WEIGHTS_TOLERANCE = 1e-3

# Fixture -> (GGUF architecture, stages whose features must show in `kcap explain`).
FAMILIES = {
    "llama3": ("llama", {"rope": "rope_freq_factors"}),
    "llama-tied": ("llama", {"rope": "rope_normal"}),
    "mistral": ("llama", {"rope": "rope_normal"}),
    "qwen2": ("qwen2", {"attn_q": "bias", "rope": "rope_neox"}),
    "qwen3": ("qwen3", {"attn_q_norm": "rms_norm", "attn_k_norm": "rms_norm"}),
    "gemma2": ("gemma2", {"attention": "softcap", "final_softcap": "", "post_ffw_norm": "rms_norm"}),
    "gemma3": ("gemma3", {"attention": "sliding_window", "attn_q_norm": "rms_norm"}),
    "gpt2": ("gpt2", {"token_embd": "position_embedding", "attn_norm": "layer_norm,bias", "attn_q": "bias"}),
    "starcoder2": ("starcoder2", {"attn_norm": "layer_norm,bias", "ffn_up": "bias", "ffn_act": "gelu_tanh"}),
    "gemma4": ("gemma4", {"per_layer_embd": "per_layer_embedding", "ple_act": "per_layer_embedding,gelu_tanh",
                          "attn_v_norm": "parameter_free_norm", "layer_output_scale": "layer_output_scale",
                          "rope": "rope_freq_factors", "attention": "sliding_window"}),
    "gemma4-kvshare": ("gemma4", {"attention": "kv_shared,sliding_window", "per_layer_embd": "per_layer_embedding",
                                  "attn_v_norm": "parameter_free_norm", "layer_output_scale": "layer_output_scale"}),
    # The larger models' full layers: V from the K projection (no attn_v), their own KV head count.
    "gemma4-kev": ("gemma4", {"attn_v_norm": "parameter_free_norm", "attention": "sliding_window",
                              "rope": "rope_freq_factors"}),
    "granite": ("granite", {"attn_residual": "residual_scale", "logit_scale": "", "token_embd": "embed_scale"}),
    "qwen2-swa": ("qwen2", {"attention": "sliding_window", "attn_q": "bias"}),
    "qwen3-swa": ("qwen3", {"attention": "sliding_window", "attn_q_norm": "rms_norm"}),
    "starcoder2-swa": ("starcoder2", {"attention": "sliding_window", "attn_norm": "layer_norm,bias"}),
    # YaRN rope scaling (no feature bit: every rope row takes its angles from dispatch/rope_table.h;
    # test_yarn_shows_in_explain checks the stage carries it).
    "qwen3-yarn": ("qwen3", {"attn_q_norm": "rms_norm"}),
    # Mixture of experts: the router (op moe_route) and the experts (op moe_experts) replace the
    # dense FFN; Qwen2-MoE adds the shared expert's sigmoid gate.
    "mixtral": ("llama", {"ffn_router": "expert_softmax,expert_weights_norm", "ffn_moe": "silu,gated",
                          "rope": "rope_normal"}),
    "qwen2moe": ("qwen2moe", {"ffn_router": "expert_softmax", "ffn_moe": "silu,gated",
                              "ffn_shexp_gate": "shared_expert_gate", "attn_q": "bias"}),
    "qwen3moe": ("qwen3moe", {"ffn_router": "expert_softmax,expert_weights_norm", "ffn_moe": "silu,gated",
                              "attn_q_norm": "rms_norm"}),
    # Gemma 4's expert block beside the dense FFN: the router's own norm of the residual, its
    # logit scale and per-expert scales, the experts' merged gate_up, the branch norms and sum.
    "gemma4-moe": ("gemma4", {"ffn_router_norm": "rms_norm",
                              "ffn_router": "expert_softmax,expert_weights_norm,expert_logit_scale,per_expert_scale",
                              "pre_ffw_norm_2": "rms_norm", "ffn_moe": "gelu_tanh,gated,expert_gate_up_merged",
                              "post_ffw_norm_1": "rms_norm", "post_ffw_norm_2": "rms_norm", "ffn_branch_add": "",
                              "per_layer_embd": "per_layer_embedding"}),
    # gpt-oss: sinks in the attention, YaRN with fractional bounds (no feature bit, as qwen3-yarn),
    # the router's bias, the experts' biases and clamped SwiGLU.
    "gpt-oss": ("gpt-oss", {"attention": "sliding_window,sinks", "attn_q": "bias", "attn_output": "bias",
                            "ffn_router": "bias,expert_softmax,expert_weights_norm",
                            "ffn_moe": "bias,swiglu_oai,gated"}),
    # The same with its experts in MXFP4, as OpenAI ships them and the converter repacks them.
    "gpt-oss-mxfp4": ("gpt-oss", {"attention": "sliding_window,sinks", "ffn_moe": "bias,swiglu_oai,gated"}),
    # DeepSeek V2 (no query low rank, softmax router, groups scored by their best expert, shared
    # experts without a gate, a dense first block) and V3 (the query's low-rank path, sigmoid
    # router with its choice bias, groups scored by their two best, renormalized weights): both
    # with multi-head latent attention over the compressed cache; deepseek2-kvb is deepseek2 in
    # the older converter's layout (one W_kv_b).
    "deepseek2": ("deepseek2", {"attention_mla": "rope_normal,rms_norm", "ffn_router": "expert_softmax,expert_groups",
                                "ffn_moe": "silu,gated,shared_expert_sum", "ffn_act": "silu,gated"}),
    "deepseek3": ("deepseek2", {"attn_q_a_norm": "rms_norm", "attention_mla": "rope_normal,rms_norm",
                                "ffn_router": "expert_sigmoid,expert_groups,expert_choice_bias,expert_weights_norm"}),
    "deepseek2-kvb": ("deepseek2", {"attention_mla": "mla_kv_b_combined,rope_normal,rms_norm",
                                    "ffn_router": "expert_softmax,expert_groups"}),
}
# Fixtures whose transformers model slides some layers' attention (the prompt is longer than the window).
SLIDING_WINDOW_FIXTURES = ("gemma2", "gemma3", "gemma4", "gemma4-kvshare", "gemma4-kev", "gemma4-moe", "qwen2-swa", "qwen3-swa", "starcoder2-swa",
                           "gpt-oss", "gpt-oss-mxfp4")


def golden(name):
    return np.load(GOLDENS / f"{name}.npz")


def relative_error(got, ref):
    return float(np.abs(got.astype(np.float64) - ref).max() / ref.std())


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    return request.param


def test_f32_prefill_decode_and_greedy_match_transformers(family):
    g = golden(family)
    model = kcap.load(FIXTURES / f"{family}-f32.gguf")
    assert model.architecture == FAMILIES[family][0]
    ids = g["prompt_ids"].tolist()
    prefill = model.eval(ids, all_logits=True)
    assert relative_error(prefill, g["logits"]) <= F32_TOLERANCE
    model.reset()
    stepped = np.stack([model.eval([t]) for t in ids])
    assert relative_error(stepped, g["logits"]) <= F32_TOLERANCE
    model.reset()
    greedy = list(model.generate_ids(ids, max_tokens=len(g["greedy_ids"]), ignore_eos=True))
    assert greedy == g["greedy_ids"].tolist()


def test_q8_0_matches_transformers(family):
    g = golden(family)
    model = kcap.load(FIXTURES / f"{family}-q8_0.gguf")
    got = model.eval(g["prompt_ids"].tolist(), all_logits=True)
    assert relative_error(got, g["logits_q8_0_weights"]) <= Q8_SAME_WEIGHTS_TOLERANCE
    quantization_error = relative_error(g["logits_q8_0_weights"], g["logits"])
    assert relative_error(got, g["logits"]) <= quantization_error + Q8_SAME_WEIGHTS_TOLERANCE


def test_explain_shows_feature_bearing_stages(family):
    routes = kcap.load(FIXTURES / f"{family}-f32.gguf").explain()
    by_stage = {}
    for r in routes:
        by_stage.setdefault(r["stage"], []).append(r)
    for stage, feature in FAMILIES[family][1].items():
        assert stage in by_stage, f"{family}: no stage {stage}"
        assert all(r["kernel"].startswith("cpu.") for r in by_stage[stage])
        for f in filter(None, feature.split(",")):
            # e.g. only the sliding layers' attention carries sliding_window
            assert any(f in r["features"].split(",") for r in by_stage[stage]), (family, stage, f)


@pytest.mark.parametrize("fixture,excluded,stage", [
    ("gemma2", "cpu.softcap", "final_softcap"),
    ("gemma2", "cpu.attention", "attention"),
    ("granite", "cpu.scale", "logit_scale"),
    ("gpt2", "cpu.embed.f32", "token_embd"),
    ("mixtral", ("cpu.moe_experts", "cpu.moe_experts_tiles"), "ffn_moe"),
    ("qwen2moe", "cpu.moe_shared_gate", "ffn_shexp_gate"),
    ("qwen3moe", "cpu.moe_route", "ffn_router"),
])
def test_feature_without_a_row_fails_to_load(fixture, excluded, stage):
    # excluded: a row, or every row of the op (the experts have one for one token and one for more)
    excluded = list(excluded) if isinstance(excluded, tuple) else [excluded]
    with pytest.raises(kcap.RoutingError, match=f"stage '{stage}'"):
        kcap.load(FIXTURES / f"{fixture}-f32.gguf", excluded_kernels=excluded)


@pytest.mark.parametrize("fixture,excluded,stage", [
    ("gemma4", "cpu.per_layer_embed", "per_layer_embd"),
    ("gemma4", "cpu.per_layer_gate", "ple_act"),
    ("gemma4", "cpu.scale", "layer_output_scale"),
    ("gemma4-kvshare", "cpu.attention", "attention"),
    ("gemma4-moe", "cpu.moe_route", "ffn_router"),
    ("gemma4-moe", ("cpu.moe_experts", "cpu.moe_experts_tiles"), "ffn_moe"),
])
def test_gemma4_feature_without_a_row_fails_to_load(fixture, excluded, stage):
    test_feature_without_a_row_fails_to_load(fixture, excluded, stage)


@pytest.mark.parametrize("fixture", ["gemma4-f32", "gemma4-kvshare-f32"])
def test_gemma4_without_cuda_ple_rows_is_refused_on_cuda(fixture):
    # CUDA has per-layer embedding rows now (test_conformance_cuda.py runs every fixture
    # there); with them excluded, planning Gemma 4 on CUDA must refuse, never run a partial model.
    from kcap.explain import explain_file

    ple_rows = [r["kernel"] for r in kcap._core.capability_rows() if r["kernel"].startswith("cuda.per_layer_embed.")]
    assert ple_rows
    with pytest.raises(kcap.RoutingError, match="stage 'per_layer_embd'.*no cuda row fits"):
        explain_file(str(FIXTURES / f"{fixture}.gguf"), backend="cuda", excluded_kernels=ple_rows)


@pytest.mark.parametrize("fixture", SLIDING_WINDOW_FIXTURES)
def test_sliding_layers_are_the_transformers_ones(fixture):
    # Each layer's window in the plan is the one transformers' config gives that layer
    # (layer_types, or every layer for a config without them, as Starcoder2).
    config = json.loads(str(golden(fixture)["meta"]))["hf_config"]
    types = config.get("layer_types") or ["sliding_attention"] * config["num_hidden_layers"]
    want = [config["sliding_window"] if t == "sliding_attention" else 0 for t in types]
    spec = build_spec(GGUFFile(FIXTURES / f"{fixture}-f32.gguf"))
    assert [layer.sliding_window for layer in spec.layers] == want
    assert 0 < config["sliding_window"] < len(golden(fixture)["prompt_ids"])


def test_gemma4_kv_sharing_geometry_is_checked():
    from kcap.model import register_tensors

    gguf = GGUFFile(FIXTURES / "gemma4-kvshare-f32.gguf")
    spec = build_spec(gguf)
    layers = spec.layers
    assert [layer.kv_source_layer for layer in layers] == [-1, -1, -1, -1, 3, 2]
    layers[5].kv_source_layer = 3  # a sliding layer's cache has another head dim than layer 5's
    spec.layers = layers
    register_tensors(spec, gguf)
    with pytest.raises(kcap.ModelError, match="different KV geometry"):
        kcap._core.explain_routes(spec, backend="cpu", kv_type="f32", n_ctx=0, excluded_kernels=[])


def test_yarn_shows_in_explain_and_matters():
    # The qwen3-yarn fixture's rope stage carries YaRN's factor (dims "yarn=4"); its manifest
    # records how far transformers' logits move without YaRN (the probe), so the conformance
    # above would fail a kcap that dropped it.
    routes = kcap.load(FIXTURES / "qwen3-yarn-f32.gguf").explain()
    rope = [r for r in routes if "rope" in r["stage"].split("+") or r["stage"].endswith("rope")]
    assert rope and all("yarn=4" in r["dims"].split() for r in rope)
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    assert manifest["qwen3-yarn"]["metadata"]["qwen3.rope.scaling.type"] == "yarn"
    assert manifest["qwen3-yarn"]["sensitivity"]["config"]["no YaRN"] > 100 * F32_TOLERANCE * golden("qwen3-yarn")["logits"].std()
