"""The engine on small synthetic models against an independent float64 NumPy forward pass
(tests/python/reference_forward.py): every weight format, prefill vs token-by-token vs
chunked prefill, KV cache types, sliding window and softcaps, Gemma 4's per-layer embeddings,
layer output scale and KV sharing, context limits.

Tolerance: kcap keeps activations in f32 against exactly dequantized weights, the reference
runs in f64 on the same weights, so logits agree to f32 rounding: max |Δ| ≤ 1e-4 × std."""
import numpy as np
import pytest

import kcap
from kcap.gguf import GGUFFile
from pathlib import Path

from kcap.testing.synth import clone_layout, tiny_gemma3, tiny_llama
from reference_forward import reference_logits

F32_TOLERANCE = 1e-4
BLOCK32_FORMATS = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"]
KQUANT_FORMATS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
PROMPT = [5, 17, 200, 3, 99, 42, 7, 128, 255, 0, 61]
CONFORMANCE = Path(__file__).resolve().parent.parent / "fixtures" / "conformance"


def assert_close(got, ref, tol, what):
    err = float(np.abs(got - ref).max())
    bound = tol * float(ref.std())
    assert err <= bound, f"{what}: max |Δ| {err:.3g} > {bound:.3g}"


def check_against_reference(path, **load_options):
    model = kcap.load(path, **load_options)
    ref = reference_logits(GGUFFile(path), model.spec, PROMPT)
    model.reset()
    got = model.eval(PROMPT, all_logits=True)
    assert_close(got, ref, F32_TOLERANCE, f"{path} prefill")
    # The usual path computes the LM head on the last position only.
    assert_close(model.logits(PROMPT), ref[-1], F32_TOLERANCE, f"{path} last-position logits")
    return model, ref


@pytest.mark.parametrize("weight_type", BLOCK32_FORMATS + KQUANT_FORMATS)
def test_every_weight_format_matches_reference(tmp_path, weight_type):
    kquant = weight_type in KQUANT_FORMATS
    path = tiny_llama(str(tmp_path / f"{weight_type}.gguf"), n_embd=256 if kquant else 64,
                      n_ff=512 if kquant else 96, weight_type=weight_type, seed=3)
    check_against_reference(path)


def test_prefill_decode_and_chunks_agree(tmp_path):
    path = tiny_llama(str(tmp_path / "m.gguf"), tied=False)
    model, ref = check_against_reference(path, max_batch=4)  # prefill in chunks of 4
    model.reset()
    stepped = np.stack([model.eval([t]) for t in PROMPT])
    assert_close(stepped, ref, F32_TOLERANCE, "token by token")


@pytest.mark.parametrize("softcaps", [(0.0, 0.0), (5.0, 3.0)])
def test_gemma_features_sliding_window_qk_norm_softcap(tmp_path, softcaps):
    attn_cap, final_cap = softcaps
    path = tiny_gemma3(str(tmp_path / "g.gguf"), sliding_window=4, pattern=2, attn_softcap=attn_cap,
                       final_softcap=final_cap)
    model, ref = check_against_reference(path)
    routes = model.explain()
    windows = [r for r in routes if r["stage"] == "attention" and "sliding_window" in r["features"]]
    assert len(windows) == 2  # layers 0 and 2 slide; layer 1 is global (pattern 2)
    if attn_cap:
        assert all("softcap" in r["features"] for r in routes if r["stage"] == "attention")
        assert any(r["stage"] == "final_softcap" for r in routes)
    model.reset()
    stepped = np.stack([model.eval([t]) for t in PROMPT])
    assert_close(stepped, ref, F32_TOLERANCE, "token by token")


# 53 tokens: causal spans of up to four of the CPU cache's 16-position key blocks.
LONG_PROMPT = [int(v) for v in np.random.default_rng(7).integers(0, 256, 53)]


@pytest.mark.parametrize("kv_type", ["f32", "f16"])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_attention_across_key_blocks(tmp_path, family, kv_type):
    # The CPU attention reads keys in blocks of 16 positions (cpu/attention.cpp): spans over
    # several blocks, chunks of 7 tokens (chunk starts inside a block), 3 query heads per KV head
    # (a pair of heads, then one) and 40-dim heads (two 16-dim value chunks and 8 dims past
    # them); Gemma 3's sliding window of 20 (window starts inside a block) and softcap. All
    # positions against the reference, prefill in chunks and token by token. f16 keys and values
    # carry ~5e-4 relative rounding into attention: 1e-2 x std bounds it, as above.
    if family == "llama":
        path = tiny_llama(str(tmp_path / "m.gguf"), n_embd=240, n_head=6, n_head_kv=2, weight_type="F32", seed=5)
    else:
        path = tiny_gemma3(str(tmp_path / "m.gguf"), n_embd=96, n_head=6, n_head_kv=2, head_dim=40, sliding_window=20,
                           pattern=2, attn_softcap=20.0, weight_type="F32")
    tol = F32_TOLERANCE if kv_type == "f32" else 1e-2
    model = kcap.load(path, backend="cpu", kv_type=kv_type, max_batch=7)
    ref = reference_logits(GGUFFile(path), model.spec, LONG_PROMPT)
    assert_close(model.eval(LONG_PROMPT, all_logits=True), ref, tol, f"{family} {kv_type} chunks of 7")
    model.reset()
    stepped = np.stack([model.eval([t]) for t in LONG_PROMPT])
    assert_close(stepped, ref, tol, f"{family} {kv_type} token by token")


def test_f16_kv_cache_is_close(tmp_path):
    path = tiny_gemma3(str(tmp_path / "g.gguf"))
    model = kcap.load(path, kv_type="f16")
    ref = reference_logits(GGUFFile(path), model.spec, PROMPT)
    got = model.eval(PROMPT, all_logits=True)
    # f16 keys/values carry ~5e-4 relative rounding into attention: 1e-2 × std bounds it.
    assert_close(got, ref, 1e-2, "f16 KV")
    with pytest.raises(kcap.FormatError, match="q4_0"):
        kcap.load(path, kv_type="q4_0")


def test_context_limit_is_enforced(tmp_path):
    path = tiny_llama(str(tmp_path / "m.gguf"), context_length=64)
    model = kcap.load(path, n_ctx=8)
    assert model.n_ctx == 8
    with pytest.raises(kcap.ContextOverflowError, match="context length 8"):
        model.eval(list(range(9)))
    model.reset()
    model.eval(list(range(8)))
    with pytest.raises(kcap.ContextOverflowError):
        model.eval([1])
    with pytest.raises(kcap.ContextOverflowError, match="exceeds the model's context length 64"):
        kcap.load(path, n_ctx=65)
    with pytest.raises(kcap.ContextOverflowError, match="does not fit the context"):
        list(model.generate_ids(list(range(8)), max_tokens=2))


def test_generation_stops_at_context_end(tmp_path):
    path = tiny_llama(str(tmp_path / "m.gguf"), context_length=64)
    model = kcap.load(path, n_ctx=12)
    out = list(model.generate_ids([1, 2, 3, 4], max_tokens=100, ignore_eos=True))
    assert len(out) == 8  # 4 prompt + 8 generated fill the 12 positions


def test_prefix_reuse_matches_fresh_evaluation(tmp_path):
    path = tiny_llama(str(tmp_path / "m.gguf"))
    model = kcap.load(path)
    a = model.prefill(PROMPT[:6] + [9, 9])
    b = model.prefill(PROMPT)  # shares 6 tokens with the cached sequence
    fresh = model.logits(PROMPT)
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(b, fresh)


def test_token_outside_vocabulary_is_refused(tmp_path):
    path = tiny_llama(str(tmp_path / "m.gguf"), n_vocab=256)
    model = kcap.load(path)
    with pytest.raises(kcap.InvalidArgumentError, match=r"id \[1\] = 256 is outside the vocabulary \(0 .. 255\)"):
        model.eval([1, 256])
    with pytest.raises(kcap.ModelError, match="token id 256 .* is outside the vocabulary"):
        model.engine.eval(np.array([1, 256], dtype=np.int32), False)
    with pytest.raises(kcap.ModelError, match="no tokenizer"):
        model.tokenize("hello")


@pytest.mark.parametrize("layout", ["gemma4", "gemma4-kvshare"])
def test_gemma4_per_layer_embeddings_and_kv_sharing(tmp_path, layout):
    # The Gemma 4 fixture layouts (Q8_0/F16 tensors) with fresh random weights: PLE, per-layer
    # head dims, V-norm, layer output scale and (kvshare) shared-KV layers vs the reference.
    path = clone_layout(str(CONFORMANCE / f"{layout}-q8_0.gguf"), str(tmp_path / "g4.gguf"), seed=11)
    model, ref = check_against_reference(path, max_batch=4)
    model.reset()
    stepped = np.stack([model.eval([t]) for t in PROMPT])
    assert_close(stepped, ref, F32_TOLERANCE, "token by token")
    features = {f for r in model.explain() for f in r["features"].split(",") if f}
    assert {"per_layer_embedding", "layer_output_scale", "parameter_free_norm"} <= features
    assert ("kv_shared" in features) == (layout == "gemma4-kvshare")


def test_reference_forward_matches_transformers_on_gemma4_kvshare():
    # The reference itself against the HF golden, so the engine tests above check real semantics.
    g = np.load(CONFORMANCE.parent.parent / "goldens" / "conformance" / "gemma4-kvshare.npz")
    path = CONFORMANCE / "gemma4-kvshare-f32.gguf"
    spec = kcap.load(path).spec
    ref = reference_logits(GGUFFile(str(path)), spec, g["prompt_ids"].tolist())
    assert_close(ref, g["logits"], 1e-4, "reference vs transformers")
