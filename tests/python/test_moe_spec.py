"""Mixture-of-experts specs (Mixtral through kcap.arch.llama, kcap.arch.qwen2moe, kcap.arch.qwen3moe,
Gemma 4's expert block through kcap.arch.gemma4):
the expert fields each module fills from the conformance fixtures, and the files it refuses before
the spec reaches the core: expert counts that disagree with the expert tensors' shapes, a missing
expert tensor, a used count outside 1..count, a router kcap does not implement, and the per-expert
split layout of older converters."""
import json
import re

import numpy as np
import pytest

import kcap
from kcap.accounting import SPLIT_EXPERTS
from kcap.arch import build_spec
from kcap.gguf import GGUFFile
from kcap.model import register_tensors
from kcap.testing.synth import copy_with_changes

from test_conformance import FIXTURES, golden

# Fixture -> (GGUF architecture, chosen experts' weights renormalized, shared expert), as the
# fixture's transformers model computes it (make_conformance_fixtures.py).
MOE_FIXTURES = {
    "mixtral": ("llama", True, False),
    "qwen2moe": ("qwen2moe", False, True),
    "qwen3moe": ("qwen3moe", True, False),
}
# Every fixture with experts, Gemma 4's (dense FFN and experts side by side) included.
ALL_MOE_FIXTURES = sorted(MOE_FIXTURES) + ["gemma4-moe"]
DENSE_FFN = ("ffn_gate", "ffn_up", "ffn_down", "ffn_up_bias", "ffn_down_bias")
SHARED_EXPERT = ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp", "ffn_gate_inp_shexp")
# The smallest gap between the k-th and (k+1)-th router logit make_conformance_fixtures.py lets a
# fixture have (MIN_ROUTING_MARGIN there), so that rounding cannot flip an expert choice.
MIN_ROUTING_MARGIN = 0.05


def hf_config(fixture: str) -> dict:
    return json.loads(str(golden(fixture)["meta"]))["hf_config"]


def hf_expert_counts(config: dict) -> tuple[int, int]:
    return (config.get("num_local_experts") or config["num_experts"],
            config.get("num_experts_per_tok") or config["top_k_experts"])


def changed(fixture: str, tmp_path, **changes) -> str:
    return copy_with_changes(str(FIXTURES / f"{fixture}-f32.gguf"), str(tmp_path / f"{fixture}-changed.gguf"),
                             **changes)


def tensor(path, name: str):
    """(name, type, GGUF-order shape, data) of a tensor of an F32 fixture, as copy_with_changes takes it."""
    import gguf

    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
    return t.name, "F32", tuple(int(d) for d in t.shape), np.asarray(t.data)


@pytest.mark.parametrize("fixture", sorted(MOE_FIXTURES))
@pytest.mark.parametrize("quant", ["f32", "q8_0"])
def test_spec_has_the_transformers_models_experts(fixture, quant):
    arch, weights_norm, shared = MOE_FIXTURES[fixture]
    config = hf_config(fixture)
    n_expert, n_used = hf_expert_counts(config)
    gguf = GGUFFile(FIXTURES / f"{fixture}-{quant}.gguf")
    spec = build_spec(gguf)
    assert spec.architecture == arch
    assert len(spec.layers) == config["num_hidden_layers"]
    for il, layer in enumerate(spec.layers):
        assert (layer.n_expert, layer.n_expert_used) == (n_expert, n_used)
        assert n_used < n_expert  # the router really chooses
        assert layer.expert_gating == kcap._core.ExpertGating.Softmax
        assert layer.expert_weights_norm is weights_norm
        assert layer.expert_weights_scale == 1.0
        assert layer.ffn_gate_inp == f"blk.{il}.ffn_gate_inp.weight"
        for name in ("gate", "up", "down"):
            assert getattr(layer, f"ffn_{name}_exps") == f"blk.{il}.ffn_{name}_exps.weight"
        assert all(getattr(layer, f) == "" for f in DENSE_FFN)
        assert all(bool(getattr(layer, f)) is shared for f in SHARED_EXPERT)
        assert layer.activation == kcap._core.Activation.SiLU
    width = config.get("moe_intermediate_size") or config["intermediate_size"]
    assert gguf.tensors["blk.0.ffn_down_exps.weight"].shape == (width, spec.n_embd, n_expert)
    register_tensors(spec, gguf)  # every tensor of the file is used


@pytest.mark.parametrize("quant", ["f32", "q8_0"])
def test_gemma4_spec_has_the_transformers_models_expert_block(quant):
    config = hf_config("gemma4-moe")
    assert config["enable_moe_block"]
    gguf = GGUFFile(FIXTURES / f"gemma4-moe-{quant}.gguf")
    spec = build_spec(gguf)
    assert spec.architecture == "gemma4"
    assert len(spec.layers) == config["num_hidden_layers"]
    for il, layer in enumerate(spec.layers):
        assert (layer.n_expert, layer.n_expert_used) == (config["num_experts"], config["top_k_experts"])
        assert layer.expert_weights_norm is True  # Gemma4TextRouter renormalizes the top k
        assert layer.expert_dense_branch is True
        assert layer.expert_logit_scale == pytest.approx(config["hidden_size"] ** -0.5)
        assert layer.ffn_gate_inp == f"blk.{il}.ffn_gate_inp.weight"
        assert layer.ffn_gate_inp_scale == f"blk.{il}.ffn_gate_inp.scale"
        assert layer.ffn_gate_up_exps == f"blk.{il}.ffn_gate_up_exps.weight"
        assert (layer.ffn_gate_exps, layer.ffn_up_exps) == ("", "")
        assert layer.ffn_down_exps == f"blk.{il}.ffn_down_exps.weight"
        assert layer.ffn_down_exps_scale == f"blk.{il}.ffn_down_exps.scale"
        assert layer.ffn_post_norm_1 == f"blk.{il}.post_ffw_norm_1.weight"
        assert layer.ffn_pre_norm_2 == f"blk.{il}.pre_ffw_norm_2.weight"
        assert layer.ffn_post_norm_2 == f"blk.{il}.post_ffw_norm_2.weight"
        assert all(getattr(layer, f) for f in ("ffn_gate", "ffn_up", "ffn_down"))  # the dense branch
        assert all(getattr(layer, f) == "" for f in SHARED_EXPERT)
        assert layer.activation == kcap._core.Activation.GeluTanh
    width = config["moe_intermediate_size"]
    assert gguf.tensors["blk.0.ffn_gate_up_exps.weight"].shape == (spec.n_embd, 2 * width, config["num_experts"])
    register_tensors(spec, gguf)  # every tensor of the file is used


@pytest.mark.parametrize("fixture", ALL_MOE_FIXTURES)
def test_fixture_routing_varies_across_tokens(fixture):
    # The reference model's layer-0 router chose more than one set of experts over the prompt, and
    # no token's k-th and (k+1)-th experts were near a tie (make_conformance_fixtures.py).
    routing = json.loads(str(golden(fixture)["meta"]))["routing"]
    assert routing["n_tokens"] == len(golden(fixture)["prompt_ids"]) + len(golden(fixture)["greedy_ids"])
    layers = routing["layers"]
    assert layers[0]["distinct_expert_sets"] > 1
    n_expert, n_used = hf_expert_counts(hf_config(fixture))
    for layer in layers:
        assert sum(layer["expert_use_counts"]) == routing["n_tokens"] * n_used
        assert layer["min_top_k_logit_margin"] >= MIN_ROUTING_MARGIN
    assert routing["q8_0_weights"]["layers"][0]["distinct_expert_sets"] > 1


@pytest.mark.parametrize("fixture", ALL_MOE_FIXTURES)
def test_spec_computes_the_goldens(fixture):
    # The spec's mixture-of-experts semantics (LayerSpec), run by the float64 NumPy reference on the
    # GGUF's weights, give the transformers goldens: F32 file vs the original model, Q8_0 file vs
    # the model on its dequantized weights, at test_conformance's bounds.
    from reference_forward import reference_logits

    from test_conformance import F32_TOLERANCE, Q8_SAME_WEIGHTS_TOLERANCE, relative_error

    g = golden(fixture)
    ids = g["prompt_ids"].tolist()
    for quant, want, bound in (("f32", g["logits"], F32_TOLERANCE),
                               ("q8_0", g["logits_q8_0_weights"], Q8_SAME_WEIGHTS_TOLERANCE)):
        gguf = GGUFFile(FIXTURES / f"{fixture}-{quant}.gguf")
        assert relative_error(reference_logits(gguf, build_spec(gguf), ids), want) <= bound, quant


def router_choices(model, ids, stepped: bool) -> dict:
    """Each router's choice over ids from an empty cache (engine.trace with routing): layer ->
    (experts [T, n_used], weights [T, n_used]); in one call, or one token per call (the decode
    rows) when stepped."""
    calls = [ids] if not stepped else [[t] for t in ids]
    got = {}
    for i, call in enumerate(calls):
        ran, _ = model.engine.trace(np.asarray(call, np.int32), keep_cache=i > 0, routing=True)
        for e in ran:
            if e["stage"].split("+")[-1] == "ffn_router":  # or the add_norm before it fused in
                experts, weights = got.setdefault(e["layer"], ([], []))
                experts.append(e["experts"])
                weights.append(e["weights"])
    return {layer: (np.concatenate(x), np.concatenate(w)) for layer, (x, w) in got.items()}


def check_same_choices(got: dict, want: dict, what: str, weight_tolerance: float) -> None:
    """Every layer's router chose the same experts in the same order on every token, with weights
    within weight_tolerance times the token's largest weight (a routed scaling factor, DeepSeek's
    2 or 2.5, scales the weights and their rounding alike)."""
    assert sorted(got) == sorted(want), what
    for layer in want:
        (x, w), (rx, rw) = got[layer], want[layer]
        assert x.shape == rx.shape, (what, layer)
        differ = np.nonzero((x != rx).any(axis=1))[0]
        assert differ.size == 0, (f"{what}: layer {layer} chose other experts at tokens {differ.tolist()[:8]}: "
                                  f"{x[differ[0]].tolist()} vs {rx[differ[0]].tolist()}")
        scale = np.abs(rw).max(axis=1, keepdims=True)
        worst = float((np.abs(w - rw) / scale).max())
        print(f"routing weights {what} layer {layer}: {worst:.3g} of the largest")  # shown with pytest -s
        assert worst <= weight_tolerance, (what, layer, worst)


@pytest.mark.parametrize("fixture", ALL_MOE_FIXTURES)
@pytest.mark.parametrize("quant", ["f32", "q8_0"])
def test_cpu_router_chooses_the_reference_experts(fixture, quant):
    # The CPU router (the reference the GPU routers are held to) chooses, on every token of the
    # fixture's prompt and greedy continuation, the experts the float64 NumPy reference chooses
    # from the same weights, in one call and one token per call; the weights agree to f32 rounding.
    from reference_forward import reference_logits

    g = golden(fixture)
    ids = g["prompt_ids"].tolist() + g["greedy_ids"].tolist()
    path = FIXTURES / f"{fixture}-{quant}.gguf"
    gguf = GGUFFile(path)
    reference = {}
    reference_logits(gguf, build_spec(gguf), ids, reference)
    want = {layer: (np.array([c for c, _ in rows]), np.array([w for _, w in rows])) for layer, rows in reference.items()}
    assert want and all(len(x) == len(ids) for x, _ in want.values())
    model = kcap.load(path, backend="cpu")
    for stepped in (False, True):
        check_same_choices(router_choices(model, ids, stepped), want, f"{fixture}-{quant} stepped={stepped}", 1e-5)


# Every fixture with experts, DeepSeek's and gpt-oss's (MXFP4 experts) too.
Q8_EXPERT_FIXTURES = ALL_MOE_FIXTURES + ["deepseek2", "deepseek3", "gpt-oss", "gpt-oss-mxfp4"]


@pytest.mark.parametrize("fixture", Q8_EXPERT_FIXTURES)
def test_q8_1_plans_round_the_experts_inputs_where_every_expert_matrix_has_integer_products(fixture):
    # activations="q8_1": the experts take cpu.moe_experts_q8 for one token and
    # cpu.moe_experts_q8_tiles for more (x and each slot's activations rounded to q8_1, as the
    # dense matmuls' inputs) where gate, up and down are quantized, the exact rows where they are
    # F32; the exact plan never rounds them (cpu.moe_experts for one token, cpu.moe_experts_tiles
    # for more).
    def experts(quant, **options):
        routes = kcap.load(FIXTURES / f"{fixture}-{quant}.gguf", backend="cpu", **options).explain()
        return {(r["kernel"], r["tokens_min"], r["tokens_max"]) for r in routes if r["op"] == "moe_experts"}

    def integer_products(quant):  # gate, up and down all quantized (gpt-oss-mxfp4: MXFP4 in both files)
        routes = kcap.load(FIXTURES / f"{fixture}-{quant}.gguf", backend="cpu").explain()
        formats = {f.split("=")[1] for r in routes if r["op"] == "moe_experts" for f in r["formats"].split()[:3]}
        return not formats & {"F32", "F16", "BF16"}

    q8_rows = {("cpu.moe_experts_q8", 1, 1), ("cpu.moe_experts_q8_tiles", 2, None)}
    exact = {("cpu.moe_experts", 1, 1), ("cpu.moe_experts_tiles", 2, None)}
    assert integer_products("q8_0")
    assert experts("q8_0", activations="q8_1") == q8_rows
    assert experts("f32", activations="q8_1") == (q8_rows if integer_products("f32") else exact)
    assert experts("q8_0") == exact
    assert experts("q8_0", activations="q8_1", excluded_kernels=["cpu.moe_experts_q8_tiles"]) == {
        ("cpu.moe_experts_q8", 1, 1), ("cpu.moe_experts_tiles", 2, None)}
    assert experts("q8_0", activations="q8_1",
                   excluded_kernels=["cpu.moe_experts_q8", "cpu.moe_experts_q8_tiles"]) == exact


@pytest.mark.parametrize("fixture", ["qwen3moe", "gpt-oss-mxfp4", "deepseek2"])
def test_q8_1_experts_prefill_and_token_by_token_agree(fixture):
    # The q8_1 experts round each token's x and each slot's activations on their own, so a prompt
    # evaluated at once and token by token rounds the same values: the logits agree to the f32
    # roundings of the sums (measured 1.0-1.6e-6 x std on these fixtures' first 16 tokens), far
    # inside what the rounding itself moves them (max 0.1-0.5 x std). The dense q8_1 matmuls of
    # a prompt and of one token sum in different orders, so a value that lies on a rounding
    # boundary can round to the next code in one of the two and move everything after it (not
    # these fixtures; Gemma 4's MoE fixture moves 0.046 x std from its 12th token on with the
    # q8_1 experts, 1.2e-6 with the exact ones).
    ids = golden(fixture)["prompt_ids"].tolist()[:16]
    model = kcap.load(FIXTURES / f"{fixture}-q8_0.gguf", backend="cpu", activations="q8_1")
    prefill = model.eval(ids, all_logits=True)
    model.reset()
    stepped = np.stack([model.eval([t]) for t in ids])
    assert np.abs(stepped - prefill).max() / prefill.std() <= 1e-4


def test_routing_trace_is_refused_where_not_implemented():
    # A backend without it says so instead of returning a trace without choices; without a
    # router stage a routing trace is just the trace.
    model = kcap.load(FIXTURES / "llama3-f32.gguf", backend="cpu")
    ran, _ = model.engine.trace(np.asarray([1, 2, 3], np.int32), routing=True)
    assert ran and not any("experts" in e for e in ran)


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("fixture,key,value,message", [
    ("mixtral", "llama.expert_count", 5,
     "tensor 'blk.0.ffn_gate_inp.weight' has shape [64, 6], expected [64, 5] (the router: [n_embd 64, "
     "llama.expert_count = 5])"),
    ("qwen3moe", "qwen3moe.expert_count", 8,
     "tensor 'blk.0.ffn_gate_inp.weight' has shape [64, 6], expected [64, 8] (the router: [n_embd 64, "
     "qwen3moe.expert_count = 8])"),
    ("mixtral", "llama.expert_used_count", 7, "llama.expert_used_count = 7 must be between 1 and llama.expert_count = 6"),
    ("qwen2moe", "qwen2moe.expert_used_count", 9,
     "qwen2moe.expert_used_count = 9 must be between 1 and qwen2moe.expert_count = 8"),
    ("mixtral", "llama.expert_used_count", 0, "llama.expert_used_count = 0 must be between 1 and llama.expert_count = 6"),
    ("qwen3moe", "qwen3moe.expert_used_count", -1,
     "qwen3moe.expert_used_count = -1 must be between 1 and qwen3moe.expert_count = 6"),
    ("mixtral", "llama.expert_count", -2, "llama.expert_count = -2 is negative"),
    ("qwen2moe", "qwen2moe.expert_feed_forward_length", 48,
     "tensor 'blk.0.ffn_gate_exps.weight' has shape [64, 32, 8], expected [64, 48, 8] ([n_embd 64, "
     "qwen2moe.expert_feed_forward_length = 48, qwen2moe.expert_count = 8])"),
    ("qwen2moe", "qwen2moe.expert_shared_feed_forward_length", 96,
     "tensor 'blk.0.ffn_gate_shexp.weight' has shape [64, 64], expected [64, 96] (the shared expert: [n_embd 64, "
     "qwen2moe.expert_shared_feed_forward_length = 96])"),
])
def test_expert_metadata_that_disagrees_is_refused(fixture, key, value, message, tmp_path):
    path = changed(fixture, tmp_path, metadata_overrides={key: value})
    with pytest.raises(kcap.ModelError, match=re.escape(message)):
        kcap.load(path)


@pytest.mark.parametrize("fixture,key", [("mixtral", "llama.expert_used_count"),
                                         ("qwen2moe", "qwen2moe.expert_used_count"),
                                         ("qwen3moe", "qwen3moe.expert_count")])
def test_missing_expert_key_is_refused(fixture, key, tmp_path):
    path = changed(fixture, tmp_path, drop_metadata={key})
    with pytest.raises(kcap.MissingMetadataError, match=re.escape(f"missing metadata key '{key}'")):
        kcap.load(path)


def test_mixtral_without_expert_count_is_refused(tmp_path):
    path = changed("mixtral", tmp_path, drop_metadata={"llama.expert_count", "llama.expert_used_count"})
    with pytest.raises(kcap.MissingMetadataError, match=re.escape(
            "missing metadata key 'llama.expert_count' (or it is 0) in a file with a mixture-of-experts router "
            "(blk.0.ffn_gate_inp.weight)")):
        kcap.load(path)


@pytest.mark.parametrize("fixture,name", [("mixtral", "blk.1.ffn_up_exps.weight"),
                                          ("qwen2moe", "blk.0.ffn_down_exps.weight"),
                                          ("qwen2moe", "blk.1.ffn_gate_inp_shexp.weight"),
                                          ("qwen3moe", "blk.1.ffn_gate_inp.weight")])
def test_missing_expert_tensor_is_refused(fixture, name, tmp_path):
    path = changed(fixture, tmp_path, drop_tensors={name})
    with pytest.raises(kcap.ModelError, match=re.escape(f"missing tensor '{name}'")):
        kcap.load(path)


@pytest.mark.parametrize("name", ["blk.0.ffn_gate_inp.scale", "blk.1.ffn_down_exps.scale",
                                  "blk.2.ffn_gate_up_exps.weight", "blk.1.pre_ffw_norm_2.weight",
                                  "blk.0.post_ffw_norm_1.weight", "blk.2.post_ffw_norm_2.weight"])
def test_gemma4_missing_expert_tensor_is_refused(name, tmp_path):
    path = changed("gemma4-moe", tmp_path, drop_tensors={name})
    with pytest.raises(kcap.ModelError, match=re.escape(f"missing tensor '{name}'")):
        kcap.load(path)


@pytest.mark.parametrize("key", ["gemma4.expert_used_count"])
def test_gemma4_missing_expert_key_is_refused(key, tmp_path):
    path = changed("gemma4-moe", tmp_path, drop_metadata={key})
    with pytest.raises(kcap.MissingMetadataError, match=re.escape(f"missing metadata key '{key}'")):
        kcap.load(path)


def test_gemma4_without_expert_count_is_refused(tmp_path):
    # The expert tensors are there but the metadata says nothing of them: never a dense-only run.
    path = changed("gemma4-moe", tmp_path, drop_metadata={"gemma4.expert_count", "gemma4.expert_used_count"})
    with pytest.raises(kcap.MissingMetadataError, match=re.escape(
            "missing metadata key 'gemma4.expert_count' (or it is 0) in a file with a mixture-of-experts router "
            "(blk.0.ffn_gate_inp.weight)")):
        kcap.load(path)


def test_gemma4_expert_scale_with_another_expert_count_is_refused(tmp_path):
    src = FIXTURES / "gemma4-moe-f32.gguf"
    name, kind, shape, data = tensor(src, "blk.1.ffn_down_exps.scale")
    assert shape == (6,)
    fewer = (name, kind, (5,), np.ascontiguousarray(data[:5]))
    path = changed("gemma4-moe", tmp_path, drop_tensors={name}, add_tensors=[fewer])
    with pytest.raises(kcap.ModelError, match=re.escape(
            "tensor 'blk.1.ffn_down_exps.scale' has shape [5], expected [6] (the experts' output scales: "
            "[gemma4.expert_count = 6])")):
        kcap.load(path)


def test_expert_tensor_with_another_expert_count_is_refused(tmp_path):
    src = FIXTURES / "qwen3moe-f32.gguf"
    name, kind, shape, data = tensor(src, "blk.1.ffn_down_exps.weight")
    assert shape == (64, 64, 6)
    fewer = (name, kind, (64, 64, 5), np.ascontiguousarray(data[:5]))
    path = changed("qwen3moe", tmp_path, drop_tensors={name}, add_tensors=[fewer])
    with pytest.raises(kcap.ModelError, match=re.escape(
            "tensor 'blk.1.ffn_down_exps.weight' has shape [64, 64, 5], expected [64, 64, 6] "
            "([qwen3moe.expert_feed_forward_length = 64, n_embd 64, qwen3moe.expert_count = 6])")):
        kcap.load(path)


def test_router_other_than_softmax_is_refused(tmp_path):
    path = changed("qwen3moe", tmp_path, metadata_overrides={"qwen3moe.expert_gating_func": 2})  # sigmoid
    with pytest.raises(kcap.UnimplementedMetadataError, match=re.escape("qwen3moe.expert_gating_func = 2")):
        kcap.load(path)


def split_experts(path, n_layer: int, n_expert: int) -> tuple[set, list]:
    """An older converter's Mixtral layout: blk.N.ffn_{gate,up,down}.E.weight for the merged tensors."""
    drop, add = set(), []
    for il in range(n_layer):
        for matrix in ("gate", "up", "down"):
            name, kind, shape, data = tensor(path, f"blk.{il}.ffn_{matrix}_exps.weight")
            drop.add(name)
            add += [(f"blk.{il}.ffn_{matrix}.{e}.weight", kind, shape[:2], np.ascontiguousarray(data[e]))
                    for e in range(n_expert)]
    return drop, add


def test_mixtral_with_per_expert_split_tensors_is_refused(tmp_path):
    drop, add = split_experts(FIXTURES / "mixtral-f32.gguf", 2, 6)
    path = changed("mixtral", tmp_path, drop_tensors=drop, add_tensors=add)
    with pytest.raises(kcap.ModelError, match=re.escape(
            f"missing tensor 'blk.0.ffn_gate_exps.weight'; the file has {SPLIT_EXPERTS} (e.g. 'blk.0.ffn_gate.0.weight')")):
        kcap.load(path)


def test_unreferenced_per_expert_split_tensors_are_refused_by_accounting(tmp_path):
    # The merged tensors are there too, so the spec builds; accounting names the split ones.
    _, add = split_experts(FIXTURES / "mixtral-f32.gguf", 1, 2)
    path = changed("mixtral", tmp_path, add_tensors=add[:1])
    with pytest.raises(kcap.UnusedTensorError,
                       match=re.escape(f"{SPLIT_EXPERTS}: blk.0.ffn_gate.0.weight")):
        kcap.load(path)


@pytest.mark.parametrize("fixture,arch", [("qwen2", "qwen2"), ("qwen3", "qwen3"), ("gemma3", "gemma3")])
def test_expert_keys_of_a_dense_module_are_refused(fixture, arch, tmp_path):
    # Only the mixture-of-experts modules implement the expert keys.
    path = changed(fixture, tmp_path, metadata_overrides={f"{arch}.expert_count": 4, f"{arch}.expert_used_count": 2})
    with pytest.raises(kcap.UnimplementedMetadataError, match=re.escape(
            f"{arch}.expert_count = 4 (mixture of experts: the number of experts); "
            f"{arch}.expert_used_count = 2 (mixture of experts: the experts chosen per token)")):
        kcap.load(path)
