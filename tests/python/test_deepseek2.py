"""DeepSeek V2/V3 (kcap.arch.deepseek2) beyond the conformance goldens: the compressed KV cache
of multi-head latent attention as `kcap explain` states it, the older converter's tensor layout
computing the same model, the fixtures' routing really exercising groups and the choice bias,
and the files the module refuses, each with a message that names the key or tensor."""
import json
import re

import numpy as np
import pytest

import kcap
from kcap.explain import explain_file, format_table
from kcap.gguf import GGUFFile
from kcap.testing.synth import copy_with_changes

from test_conformance import FIXTURES, golden, relative_error

DEEPSEEK = ("deepseek2", "deepseek3", "deepseek2-kvb")
ELEMENT_BYTES = {"f32": 4, "f16": 2}


def metadata(fixture: str) -> dict:
    return GGUFFile(FIXTURES / f"{fixture}-f32.gguf").metadata


def changed(fixture: str, tmp_path, **changes) -> str:
    return copy_with_changes(str(FIXTURES / f"{fixture}-f32.gguf"), str(tmp_path / f"{fixture}-changed.gguf"),
                             **changes)


@pytest.mark.parametrize("fixture", DEEPSEEK)
@pytest.mark.parametrize("kv_type", sorted(ELEMENT_BYTES))
@pytest.mark.parametrize("backend", ["cpu", "cuda", "metal"])
def test_cache_holds_the_latent_and_the_rope_key_only(fixture, kv_type, backend):
    # Per token and layer: kv_lora_rank + rope dims values, against the n_head * (qk + v) values
    # that keys and values expanded from the latent would take.
    md = metadata(fixture)
    lora, rope = md["deepseek2.attention.kv_lora_rank"], md["deepseek2.rope.dimension_count"]
    n_head = md["deepseek2.attention.head_count"]
    qk = md.get("deepseek2.attention.key_length_mla", md["deepseek2.attention.key_length"])
    v = md.get("deepseek2.attention.value_length_mla", md["deepseek2.attention.value_length"])
    routes = explain_file(str(FIXTURES / f"{fixture}-f32.gguf"), backend=backend, kv_type=kv_type)
    attention = [r for r in routes if r["op"] == "attention_mla"]
    assert len({r["layer"] for r in attention}) == md["deepseek2.block_count"]
    want = (lora + rope) * ELEMENT_BYTES[kv_type]
    assert {r["kv_bytes_per_token"] for r in attention} == {want}
    assert 2 * want < n_head * (qk + v) * ELEMENT_BYTES[kv_type]
    assert all(r["kv_bytes_per_token"] == 0 for r in routes if r["op"] != "attention_mla")
    assert f"cache={want}B/token" in format_table(routes)


def test_dense_attention_states_its_cache_too():
    md = GGUFFile(FIXTURES / "qwen3-f32.gguf").metadata
    head_dim = md["qwen3.attention.key_length"]
    routes = explain_file(str(FIXTURES / "qwen3-f32.gguf"), kv_type="f16")
    want = md["qwen3.attention.head_count_kv"] * 2 * head_dim * 2
    assert {r["kv_bytes_per_token"] for r in routes if r["op"] == "attention"} == {want}


def test_older_kv_b_layout_computes_the_same_model():
    # deepseek2-kvb holds deepseek2's weights with both up-projections in one attn_kv_b (the K part
    # untransposed); only the order of the absorbed query's sums differs. The order of f32 sums
    # alone moves this model's logits by up to 1.03e-5 x std (the same file run with the AVX-512,
    # AVX2 and portable dot kernels: 0.76e-5 to 1.03e-5), so the layouts are held to three times that.
    ids = golden("deepseek2")["prompt_ids"].tolist()
    split = kcap.load(FIXTURES / "deepseek2-f32.gguf").eval(ids, all_logits=True)
    combined = kcap.load(FIXTURES / "deepseek2-kvb-f32.gguf").eval(ids, all_logits=True)
    assert relative_error(combined, split) <= 3e-5
    kinds = {r["stage"]: r["features"] for r in kcap.load(FIXTURES / "deepseek2-kvb-f32.gguf").explain()}
    assert "mla_kv_b_combined" in kinds["attention_mla"].split(",")


@pytest.mark.parametrize("fixture,bias", [("deepseek2", False), ("deepseek3", True)])
def test_fixture_routing_uses_groups_and_the_choice_bias(fixture, bias):
    # make_conformance_fixtures.py records, per MoE block, how many tokens' choices the group limit
    # (and V3's score correction bias) changed in the reference model, and the choice margins.
    routing = json.loads(str(golden(fixture)["meta"]))["routing"]
    for layer in routing["layers"]:
        assert layer["distinct_expert_sets"] > 1
        assert layer["tokens_where_groups_change_the_choice"] > 0
        assert layer["min_top_k_logit_margin"] >= 0.05
        if bias:
            assert layer["tokens_where_score_bias_changes_the_choice"] > 0


def test_yarn_scales_the_scores_by_mscale_squared():
    # deepseek2's YaRN factor 4 and mscale_all_dim 0.707 (yarn_log_multiplier 0.0707): the scores
    # are scaled by (1 + 0.0707 ln 4)^2 / sqrt(qk head dim), as transformers' DeepseekV2Attention.
    meta = json.loads(str(golden("deepseek2")["meta"]))
    md = metadata("deepseek2")
    spec_scale = kcap.load(FIXTURES / "deepseek2-f32.gguf").spec.layers[0].attn_scale
    mscale = 1 + md["deepseek2.rope.scaling.yarn_log_multiplier"] * np.log(md["deepseek2.rope.scaling.factor"])
    assert spec_scale == pytest.approx(mscale**2 / np.sqrt(md["deepseek2.attention.key_length_mla"]), rel=1e-6)
    assert spec_scale == pytest.approx(meta["attention_softmax_scale"], rel=1e-6)


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("fixture,changes,error,message", [
    ("deepseek2-kvb", {"metadata_overrides": {"deepseek2.attention.kv_lora_rank": 32}}, kcap.ModelError,
     "tensor 'blk.0.attn_kv_a_mqa.weight' has shape [64, 80], expected [64, 48]"),
    ("deepseek2", {"metadata_overrides": {"deepseek2.attention.kv_lora_rank": 32}}, kcap.ModelError,
     "deepseek2.attention.key_length = 80, expected kv_lora_rank + rope dims = 48 beside key_length_mla"),
    ("deepseek2", {"metadata_overrides": {"deepseek2.expert_group_count": 3}}, kcap.ModelError,
     "deepseek2.expert_group_count = 3 must divide expert_count = 8"),
    ("deepseek2", {"metadata_overrides": {"deepseek2.expert_group_used_count": 5}}, kcap.ModelError,
     "expert_group_used_count = 5 be 1 .. 4"),
    ("deepseek3", {"metadata_overrides": {"deepseek2.expert_gating_func": 1}}, kcap.ModelError,
     "tensor 'blk.1.exp_probs_b.bias' (a score correction bias) needs sigmoid gating"),
    ("deepseek3", {"metadata_overrides": {"deepseek2.expert_gating_func": 3}}, kcap.UnimplementedMetadataError,
     "deepseek2.expert_gating_func = 3"),
    ("deepseek2", {"drop_tensors": {"blk.2.attn_k_b.weight"}}, kcap.ModelError,
     "missing tensor 'blk.2.attn_k_b.weight'"),
    ("deepseek2", {"drop_metadata": {"deepseek2.attention.value_length_mla"}}, kcap.MissingMetadataError,
     "key_length_mla and value_length_mla come together"),
    ("deepseek2", {"metadata_overrides": {"deepseek2.rope.scaling.yarn_attn_factor": 1.2}},
     kcap.UnimplementedMetadataError, "deepseek2.rope.scaling.yarn_attn_factor"),
    ("deepseek2", {"metadata_overrides": {"deepseek2.leading_dense_block_count": 5}}, kcap.ModelError,
     "deepseek2.leading_dense_block_count = 5: must be 0 .. block_count (3)"),
    ("deepseek2", {"metadata_overrides": {"deepseek2.attention.q_lora_rank": 64}}, kcap.ModelError,
     "missing tensor 'blk.0.attn_q_a.weight'"),
    ("deepseek2", {"metadata_overrides": {"deepseek2.expert_used_count": 9}}, kcap.ModelError,
     "deepseek2.expert_used_count = 9 must be between 1 and deepseek2.expert_count = 8"),
    ("deepseek3", {"metadata_overrides": {"deepseek2.expert_shared_count": 2}}, kcap.ModelError,
     "tensor 'blk.1.ffn_up_shexp.weight' has width 32, expected deepseek2.expert_shared_count 2 x the experts' width 32"),
    ("deepseek2-kvb", {"metadata_overrides": {"deepseek2.rope.dimension_count": 48}}, kcap.ModelError,
     "deepseek2.rope.dimension_count = 48: must be even and smaller than the query head (48)"),
])
def test_inconsistent_file_is_refused(fixture, changes, error, message, tmp_path):
    with pytest.raises(error, match=re.escape(message)):
        kcap.load(changed(fixture, tmp_path, **changes))


def test_both_kv_b_layouts_in_one_block_are_refused(tmp_path):
    import gguf

    kvb = next(t for t in gguf.GGUFReader(FIXTURES / "deepseek2-kvb-f32.gguf").tensors
               if t.name == "blk.0.attn_kv_b.weight")
    path = changed("deepseek2", tmp_path, add_tensors=[(kvb.name, "F32", tuple(int(d) for d in kvb.shape),
                                                        np.asarray(kvb.data))])
    with pytest.raises(kcap.ModelError, match=re.escape("block 0 has both attn_kv_b and attn_k_b/attn_v_b")):
        kcap.load(path)


@pytest.mark.parametrize("fixture", DEEPSEEK)
@pytest.mark.parametrize("kv_type", sorted(ELEMENT_BYTES))
def test_metal_plan_keeps_latent_attention_and_routing(fixture, kv_type):
    # The Metal rows run CUDA's bodies (kernels/attention_mla.h, kernels/moe.h; compile-checked
    # only: no Apple GPU here): the latent attention (one token in key splits, a prefill chunk in
    # one), V2's group-limited softmax router, V3's sigmoid router with its choice bias, the
    # experts' sum with the shared expert's output. A row that lacked one of the stage's features
    # would leave it without a route, and the plan would be refused.
    routes = explain_file(str(FIXTURES / f"{fixture}-f32.gguf"), backend="metal", kv_type=kv_type)
    assert {r["backend"] for r in routes} == {"metal"}
    assert all(r["kernel"].startswith("metal.") for r in routes)
    md = metadata(fixture)
    attention = [r for r in routes if r["op"] == "attention_mla"]
    assert len({r["layer"] for r in attention}) == md["deepseek2.block_count"]
    assert sorted({(r["kernel"], r["tokens_min"], r["tokens_max"]) for r in attention}) == [
        ("metal.attention_mla", 2, None), ("metal.attention_mla_decode", 1, 1)]
    want = {"rms_norm", "rope_normal"} | ({"mla_kv_b_combined"} if fixture == "deepseek2-kvb" else set())
    assert all(set(r["features"].split(",")) == want for r in attention), attention[0]["features"]
    assert all(("W_kv_b=F32" if fixture == "deepseek2-kvb" else "W_k_b=F32 W_v_b=F32") in r["formats"]
               for r in attention)
    router = [r for r in routes if r["stage"] == "ffn_router"]
    assert router and all(r["kernel"] == "metal.moe_route" and "expert_groups" in r["features"].split(",")
                          for r in router)
    if fixture == "deepseek3":
        assert all({"expert_sigmoid", "expert_choice_bias", "expert_weights_norm"} <= set(r["features"].split(",")) and
                   "choice_bias=F32" in r["formats"] for r in router)
    else:
        assert all("expert_softmax" in r["features"].split(",") for r in router)
    experts = [r for r in routes if r["stage"] == "ffn_moe"]
    assert experts and all(r["kernel"] == "metal.moe_experts.f32" and r["tokens_min"] == 1 and r["tokens_max"] is None
                           and {"silu", "gated", "shared_expert_sum"} <= set(r["features"].split(",")) for r in experts)
    assert {r["layer"] for r in experts} == {r["layer"] for r in router}


def test_metal_takes_deepseek_latent_dims(tmp_path):
    # DeepSeek V2/V3's own latent attention (kv_lora_rank 512, heads of 128 + 64 rotated, values of
    # 128: a cache row of 576, at the bodies' limits) plans on Metal as on CUDA, with the
    # V2-Lite Q4_K_M mix's Q5_0 attn_k_b.
    from kcap.testing import synth

    path = synth.deepseek2_q4_k_m(str(tmp_path / "v2-latent.gguf"), n_layer=2, n_embd=256, n_head=16,
                                  kv_lora_rank=512, qk_nope=128, qk_rope=64, v_head_dim=128, n_ff=512, n_expert=4,
                                  n_expert_used=2, n_shared=1, n_vocab=256, context_length=4096)
    # CUDA's prefill chunks take the tiled form (its threadgroup memory is the CUDA device's to give;
    # without the row, the per-slot form); Metal's the per-slot one.
    cuda_tiled = explain_file(path, backend="cuda")
    cuda_slots = explain_file(path, backend="cuda", excluded_kernels=["cuda.attention_mla_tiled"])
    for backend, routes, prefill in (("cuda", cuda_tiled, "cuda.attention_mla_tiled"),
                                     ("cuda", cuda_slots, "cuda.attention_mla"),
                                     ("metal", explain_file(path, backend="metal"), "metal.attention_mla")):
        attention = [r for r in routes if r["op"] == "attention_mla"]
        assert {(r["kernel"], r["tokens_min"], r["tokens_max"]) for r in attention} == {
            (prefill, 2, None), (f"{backend}.attention_mla_decode", 1, 1)}
        assert all("kv_lora=512" in r["dims"] and "rope_dim=64" in r["dims"] for r in attention), attention[0]["dims"]


@pytest.mark.parametrize("fixture,query", [("deepseek2", "attn_q"), ("deepseek3", "attn_q_a")])
def test_cuda_q8_plan_fuses_query_and_compressed_kv_matmuls(fixture, query):
    # The query's (first) matmul and the compressed KV row's both read the normed row: a q8_1 plan
    # on CUDA makes them one qkv stage of two matrices (x rounded once for both; one launch for a
    # token), at every token count; excluding the qkv rows gives the two matmuls back. Exact
    # plans, and the CPU and Metal ones (no qkv rows), keep them apart.
    path = str(FIXTURES / f"{fixture}-q8_0.gguf")
    md = metadata(fixture)
    fused_name = f"{query}+attn_kv_a_mqa"
    routes = explain_file(path, backend="cuda", activations="q8_1")
    pairs = [r for r in routes if r["stage"] == fused_name]
    assert {r["layer"] for r in pairs} == set(range(md["deepseek2.block_count"]))
    assert all(r["op"] == "qkv" and r["formats"] == "W_q=Q8_0 W_kv_a=Q8_0" for r in pairs)
    kv_width = md["deepseek2.attention.kv_lora_rank"] + md["deepseek2.rope.dimension_count"]
    assert all(r["dims"].endswith(f"/{kv_width}") for r in pairs), pairs[0]["dims"]
    assert {r["kernel"] for r in pairs if r["tokens_min"] == 1} <= {"cuda.qkv_q8", "cuda.qkv_q8_quant",
                                                                     "cuda.qkv_q8_in"}
    assert max(r["tokens_max"] or 1 << 30 for r in pairs) == 1 << 30  # a route for every token count
    qkv_rows = sorted({r["kernel"] for r in routes if r["op"] == "qkv"})
    apart = explain_file(path, backend="cuda", activations="q8_1", excluded_kernels=qkv_rows)
    assert not [r for r in apart if r["op"] == "qkv"]
    assert {r["stage"] for r in apart if r["layer"] == 0} >= {query, "attn_kv_a_mqa"}
    for backend, activations in (("cuda", "f32"), ("cuda", "bf16"), ("cpu", "q8_1"), ("metal", "f32")):
        kept = explain_file(path, backend=backend, activations=activations)
        assert not [r for r in kept if r["op"] == "qkv"], (backend, activations)
        assert {r["stage"] for r in kept if r["layer"] == 0} >= {query, "attn_kv_a_mqa"}, (backend, activations)


def test_v2_lite_q4_k_m_mix_routes_on_every_backend(tmp_path):
    # DeepSeek-V2-Lite's Q4_K_M types (synth.deepseek2_q4_k_m, narrowed): Q4_K gate and up with
    # 1408-value expert rows, whose down takes llama-quant.cpp's Q8_0 / Q5_0 fallback, and a Q5_0
    # attn_k_b of 32-value rows. Each weight's blocks are checked along its own inner dimension.
    from kcap.testing import synth

    path = synth.deepseek2_q4_k_m(str(tmp_path / "v2-lite-mix.gguf"), n_layer=3, n_embd=256, n_head=4,
                                  kv_lora_rank=64, qk_nope=32, qk_rope=16, v_head_dim=32, n_ff=512, n_expert=4,
                                  n_expert_used=2, n_shared=1, n_vocab=256, context_length=512)
    for backend in ("cpu", "cuda", "metal"):
        routes = explain_file(path, backend=backend)
        experts = [r for r in routes if r["stage"] == "ffn_moe"]
        assert experts and all("W_gate_exps=Q4_K" in r["formats"] for r in experts), backend
        assert {r["formats"].split("W_down_exps=")[1] for r in experts} == {"Q8_0", "Q5_0"}, backend
        assert all("W_k_b=Q5_0" in r["formats"] for r in routes if r["stage"] == "attention_mla"), backend
    model = kcap.load(path)
    logits = model.eval(list(range(1, 9)), all_logits=True)
    assert logits.shape == (8, 256) and np.isfinite(logits).all()
