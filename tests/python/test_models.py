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
