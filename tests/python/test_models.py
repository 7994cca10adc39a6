"""Whole-model correctness against Hugging Face transformers (goldens made by
scripts/make_logit_goldens.py, which loads the same GGUF files with transformers in fp32).

Tolerance: kcap's CPU rows dequantize weights exactly and keep activations in f32, like the
reference, so the only differences are summation order and libm: max |Δlogit| over the
vocabulary must stay within 1e-2 × std of the reference logits (the issue's bound)."""
from pathlib import Path

import numpy as np
import pytest

from conftest import MODEL_PATHS, load_model

GOLDENS = Path(__file__).resolve().parent.parent / "goldens"
LOGIT_TOLERANCE = 1e-2  # × std of the reference logits
GREEDY_TOKENS = 32


def goldens(name):
    return np.load(GOLDENS / f"logits_{name}.npz")


def n_prompts(g):
    return len(g["prompts"])


def assert_close(got, ref, what):
    err = float(np.abs(got.astype(np.float64) - ref).max())
    bound = LOGIT_TOLERANCE * float(ref.std())
    assert err <= bound, f"{what}: max |Δ| = {err:.4g} > {bound:.4g} (= {LOGIT_TOLERANCE} × std {ref.std():.4g})"


@pytest.mark.parametrize("name", sorted(MODEL_PATHS))
def test_last_position_logits_match_transformers(name):
    model = load_model(name)
    g = goldens(name)
    assert n_prompts(g) >= 5
    for i in range(n_prompts(g)):
        ids = g[f"prompt_ids_{i}"].tolist()
        got = model.logits(ids)
        assert got.shape == (model.n_vocab,)
        assert_close(got, g[f"last_logits_{i}"], f"{name} prompt {i}")


@pytest.mark.parametrize("name", sorted(MODEL_PATHS))
def test_every_position_prefill_and_token_by_token(name):
    model = load_model(name)
    g = goldens(name)
    for i in (0, 1):
        ids = g[f"prompt_ids_{i}"].tolist()
        ref = g[f"all_logits_{i}"]
        model.reset()
        prefill = model.eval(ids, all_logits=True)
        assert prefill.shape == (len(ids), model.n_vocab)
        model.reset()
        stepped = np.stack([model.eval([t]) for t in ids])
        for pos in range(len(ids)):
            assert_close(prefill[pos], ref[pos], f"{name} prompt {i} prefill position {pos}")
            assert_close(stepped[pos], ref[pos], f"{name} prompt {i} decode position {pos}")


@pytest.mark.parametrize("name", sorted(MODEL_PATHS))
def test_greedy_continuation_matches_transformers(name):
    model = load_model(name)
    g = goldens(name)
    for i in range(n_prompts(g)):
        ids = g[f"prompt_ids_{i}"].tolist()
        model.reset()
        got = list(model.generate_ids(ids, max_tokens=GREEDY_TOKENS, ignore_eos=True))
        assert got == g[f"greedy_ids_{i}"].tolist(), f"{name} prompt {i}"


# activations="q8_1" (each matmul's input rounded to int8 per 32 values, llama.cpp's numerics)
# is not exact by design; what it costs on the real models, against the transformers goldens
# (max |Δlogit| at each golden prompt's last position, over the 7 prompts): Gemma 3 270M 0.163 x
# std (build for this CPU, -march=native) and 0.147 (portable build), SmolLM2-135M 0.281 and
# 0.371; the argmax kept on 7/7 prompts each. llama.cpp's CPU backend (8-bit activations too;
# llama-cpp-python 0.3.36) measured the same way: 0.25 and 0.281 x std, 7/7 each. The max is a
# noisy statistic: a value of the 8-bit rounding that sits on a step boundary flips with the last
# bit of its f32 input, and SmolLM2's outlier features amplify a flip, so two evaluation orders of
# the same q8_1 model that agree to 8e-6 x std in f32 (prefill against token by token) differ by
# 0.17 x std in q8_1. Bound: llama.cpp's 0.281 plus that spread, 0.45 x std; and the mean over the
# prompts of the RMS error, a steadier measure of the cost (measured 0.030 / 0.030 on Gemma and
# 0.060 / 0.082 on SmolLM2 in the two builds), at most 0.12 x std; the goldens' argmax kept on at
# least 4 of every 5 prompts.
Q8_1_COST_TOLERANCE = 0.45
Q8_1_MEAN_RMS_TOLERANCE = 0.12


@pytest.mark.parametrize("name", sorted(MODEL_PATHS))
def test_q8_1_activations_stay_near_the_reference(name):
    model = load_model(name, activations="q8_1")
    quantized = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "mxfp4")
    assert {r["kernel"] for r in model.engine.routes() if r["op"] == "matmul"} <= {
        f"cpu.{row}_q8.{f}" for row in ("matmul", "matvec") for f in quantized} | {
        "cpu.matmul.f32", "cpu.matmul.f16", "cpu.matmul.bf16"}
    g = goldens(name)
    worst, same, rms = 0.0, 0, []
    for i in range(n_prompts(g)):
        ids = g[f"prompt_ids_{i}"].tolist()
        got, ref = model.logits(ids), g[f"last_logits_{i}"]
        error = got.astype(np.float64) - ref
        worst = max(worst, float(np.abs(error).max() / ref.std()))
        rms.append(float(np.sqrt(np.mean(error ** 2)) / ref.std()))
        same += int(np.argmax(got) == np.argmax(ref))
    print(f"{name} q8_1: max |Δ| {worst:.3g} × std, mean RMS {np.mean(rms):.3g} × std, "
          f"argmax kept on {same}/{n_prompts(g)} prompts")
    assert worst <= Q8_1_COST_TOLERANCE
    assert np.mean(rms) <= Q8_1_MEAN_RMS_TOLERANCE
    assert same >= 0.8 * n_prompts(g)
