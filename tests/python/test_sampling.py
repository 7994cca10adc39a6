# Tests for kcap.sampling: exact checks on constructed logits, statistical
# checks (binomial 5-sigma bounds) on the draws, and a cross-check of every
# filter against a slow full-sort reference, including a 262144-token vocabulary.

import math

import numpy as np
import pytest

from kcap.sampling import Sampler, SamplerConfig


def softmax(logits, temperature=1.0):
    scaled = np.asarray(logits, dtype=np.float64) / temperature
    weights = np.exp(scaled - scaled.max())
    return weights / weights.sum()


def draw_counts(sampler, logits, draws, history=()):
    counts = np.zeros(len(logits), dtype=np.int64)
    for _ in range(draws):
        counts[sampler.sample(logits, history)] += 1
    return counts


def assert_frequencies_match(counts, probabilities):
    """Every count within 5 binomial sigmas of draws * p (and p == 0 never drawn)."""
    draws = counts.sum()
    probabilities = np.asarray(probabilities, dtype=np.float64)
    expected = draws * probabilities
    sigma = np.sqrt(draws * probabilities * (1.0 - probabilities))
    # +1 so a p of almost 0 or 1 is not held to a zero-width bound.
    bound = 5.0 * sigma + 1.0
    bad = np.abs(counts - expected) > bound
    assert not bad.any(), f"counts {counts[bad]} vs expected {expected[bad]} (bound {bound[bad]})"
    assert counts[probabilities == 0].sum() == 0


# -- greedy ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_greedy_equals_argmax(dtype):
    rng = np.random.default_rng(1)
    sampler = Sampler(SamplerConfig())
    for _ in range(50):
        logits = (rng.standard_normal(1000) * 4).astype(dtype)
        assert sampler.sample(logits, []) == int(np.argmax(logits))


def test_greedy_ties_pick_lowest_index():
    logits = np.array([0.0, 3.0, 1.0, 3.0, 3.0], dtype=np.float32)
    assert Sampler(SamplerConfig(temperature=0.0)).sample(logits, []) == 1


def test_greedy_ignores_seed():
    logits = np.random.default_rng(2).standard_normal(500).astype(np.float32)
    picks = {Sampler(SamplerConfig(seed=seed)).sample(logits, []) for seed in range(10)}
    assert picks == {int(np.argmax(logits))}


# -- repetition penalty --------------------------------------------------------


def test_repetition_penalty_divides_positive_logit():
    # 2.0 / 2 = 1.0 drops below token 1's 1.5.
    logits = np.array([2.0, 1.5, 0.0], dtype=np.float32)
    assert Sampler(SamplerConfig()).sample(logits, [0]) == 0
    assert Sampler(SamplerConfig(repetition_penalty=2.0)).sample(logits, [0]) == 1


def test_repetition_penalty_multiplies_negative_logit():
    # CTRL rule: -1.0 * 2 = -2.0 falls below -1.5. Dividing (-0.5) would wrongly
    # raise it and keep token 0 on top.
    logits = np.array([-1.0, -1.5, -3.0], dtype=np.float32)
    assert Sampler(SamplerConfig()).sample(logits, [0]) == 0
    assert Sampler(SamplerConfig(repetition_penalty=2.0)).sample(logits, [0]) == 1


def llama_cpp_penalties(logits, history, repeat, freq, present, window=64, bias=None):
    """llama.cpp's logit_bias then penalties samplers (llama-sampler.cpp), written out per token."""
    out = np.asarray(logits, dtype=np.float64).copy()
    for token, value in (bias or {}).items():
        out[token] += value
    counts = {}
    for token in list(history)[-window:]:
        counts[token] = counts.get(token, 0) + 1
    for token, count in counts.items():
        out[token] = out[token] * repeat if out[token] <= 0 else out[token] / repeat
        out[token] -= count * freq + present
    return out


@pytest.mark.parametrize("repeat, freq, present", [(1.0, 0.7, 0.0), (1.0, 0.0, 1.3), (1.2, 0.4, -0.5),
                                                   (1.0, -0.3, 0.2)])
def test_frequency_and_presence_penalties_follow_llama_cpp(repeat, freq, present):
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 2, 50).astype(np.float32)
    history = list(rng.integers(0, 50, 80)) + [3, 3, 3, 9]
    bias = {3: 2.5, 11: -4.0, 49: 0.25}
    sampler = Sampler(SamplerConfig(temperature=1.0, repetition_penalty=repeat, frequency_penalty=freq,
                                    presence_penalty=present, logit_bias=bias))
    ids, probs = sampler.distribution(logits, history)
    np.testing.assert_array_equal(ids, np.arange(50))
    np.testing.assert_allclose(probs, softmax(llama_cpp_penalties(logits, history, repeat, freq, present, bias=bias)),
                               rtol=1e-5)
    # Greedy takes the argmax of the same scores.
    greedy = Sampler(SamplerConfig(repetition_penalty=repeat, frequency_penalty=freq, presence_penalty=present,
                                   logit_bias=bias))
    assert greedy.sample(logits, history) == int(np.argmax(llama_cpp_penalties(logits, history, repeat, freq,
                                                                                present, bias=bias)))


def test_frequency_penalty_counts_repeats_and_presence_does_not():
    logits = np.array([3.0, 2.0], dtype=np.float32)
    # Token 0 seen three times: 3 - 3 * 0.4 = 1.8 < 2.0; presence 0.4 alone leaves 2.6.
    assert Sampler(SamplerConfig(frequency_penalty=0.4)).sample(logits, [0, 0, 0]) == 1
    assert Sampler(SamplerConfig(presence_penalty=0.4)).sample(logits, [0, 0, 0]) == 0
    assert Sampler(SamplerConfig(frequency_penalty=0.4, repetition_window=1)).sample(logits, [0, 0, 0]) == 0


def test_logit_bias_bans_and_forces_tokens():
    logits = np.array([5.0, 1.0, 0.0, -1.0], dtype=np.float32)
    assert Sampler(SamplerConfig(logit_bias={0: -100})).sample(logits) == 1
    assert Sampler(SamplerConfig(logit_bias={3: 100})).sample(logits) == 3
    forced = Sampler(SamplerConfig(temperature=1.0, logit_bias={2: 100}, seed=1))
    assert {forced.sample(logits) for _ in range(50)} == {2}
    np.testing.assert_array_equal(logits, [5.0, 1.0, 0.0, -1.0])  # not modified
    with pytest.raises(ValueError, match="outside the vocabulary"):
        Sampler(SamplerConfig(logit_bias={4: 1.0})).sample(logits)
    for bad in ({-1: 1.0}, {1: float("nan")}, {"1": 1.0}, [1, 2]):
        with pytest.raises(ValueError, match="logit_bias"):
            SamplerConfig(logit_bias=bad)


def test_repetition_penalty_below_one_favors_repeats():
    logits = np.array([1.0, 1.5, -2.0, -1.8], dtype=np.float32)
    sampler = Sampler(SamplerConfig(repetition_penalty=0.5))
    assert sampler.sample(logits, [0]) == 0  # 1.0 / 0.5 = 2.0 > 1.5
    assert sampler.sample(logits[2:], [0]) == 0  # -2.0 * 0.5 = -1.0 > -1.8


def test_repetition_penalty_counts_each_distinct_token_once():
    logits = np.array([4.0, 0.0], dtype=np.float32)
    sampler = Sampler(SamplerConfig(temperature=1.0, repetition_penalty=2.0))
    ids, probs = sampler.distribution(logits, [0, 0, 0, 0])
    # Penalized once: logit 2.0, not 4.0 / 2**4.
    np.testing.assert_allclose(probs, softmax([2.0, 0.0]), rtol=1e-6)


def test_repetition_penalty_only_within_window():
    logits = np.array([2.0, 1.5, 0.0], dtype=np.float32)
    sampler = Sampler(SamplerConfig(repetition_penalty=2.0, repetition_window=3))
    assert sampler.sample(logits, [0, 2, 2, 2]) == 0  # token 0 is 4 back: outside
    assert sampler.sample(logits, [2, 0, 2, 2]) == 1  # 3 back: inside
    assert Sampler(SamplerConfig(repetition_penalty=2.0, repetition_window=0)).sample(
        logits, [0]
    ) == 0


def test_repetition_penalty_accepts_numpy_and_deque_history():
    from collections import deque

    logits = np.array([2.0, 1.5, 0.0], dtype=np.float32)
    sampler = Sampler(SamplerConfig(repetition_penalty=2.0))
    assert sampler.sample(logits, np.array([0], dtype=np.int32)) == 1
    assert sampler.sample(logits, deque([2, 0])) == 1


@pytest.mark.parametrize("bad_token", [-1, 3, 10**9])
def test_history_token_out_of_range_raises(bad_token):
    sampler = Sampler(SamplerConfig(repetition_penalty=1.3))
    with pytest.raises(ValueError, match="history"):
        sampler.sample(np.zeros(3, dtype=np.float32), [0, bad_token])


# -- top-k / top-p / min-p -----------------------------------------------------


@pytest.mark.parametrize("temperature", [0.01, 0.7, 1.0, 5.0, 1000.0])
def test_top_k_one_equals_greedy(temperature):
    rng = np.random.default_rng(3)
    sampler = Sampler(SamplerConfig(temperature=temperature, top_k=1, seed=0))
    for _ in range(30):
        logits = rng.standard_normal(2000).astype(np.float32)
        assert sampler.sample(logits, []) == int(np.argmax(logits))
    tied = np.array([0.0, 2.0, 2.0, 1.0], dtype=np.float32)
    assert sampler.sample(tied, []) == 1


def test_top_k_keeps_exactly_the_k_best():
    rng = np.random.default_rng(4)
    logits = rng.standard_normal(5000).astype(np.float32)
    ids, probs = Sampler(SamplerConfig(temperature=1.0, top_k=40)).distribution(logits, [])
    np.testing.assert_array_equal(ids, np.sort(np.argsort(-logits)[:40]))
    np.testing.assert_allclose(probs, softmax(logits[ids]), rtol=1e-5)


def test_top_k_ties_at_cut_keep_lowest_ids():
    logits = np.array([5.0, 1.0, 1.0, 1.0, 0.0, 1.0], dtype=np.float32)
    ids, _ = Sampler(SamplerConfig(temperature=1.0, top_k=3)).distribution(logits, [])
    np.testing.assert_array_equal(ids, [0, 1, 2])


def test_top_k_larger_than_vocab_keeps_all():
    logits = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    ids, probs = Sampler(SamplerConfig(temperature=1.0, top_k=100)).distribution(logits, [])
    np.testing.assert_array_equal(ids, [0, 1, 2])
    np.testing.assert_allclose(probs, softmax(logits), rtol=1e-6)


def test_top_p_tiny_keeps_only_top_token():
    rng = np.random.default_rng(5)
    logits = rng.standard_normal(3000).astype(np.float32)
    sampler = Sampler(SamplerConfig(temperature=1.5, top_p=1e-6, seed=0))
    ids, probs = sampler.distribution(logits, [])
    np.testing.assert_array_equal(ids, [int(np.argmax(logits))])
    assert {sampler.sample(logits, []) for _ in range(200)} == {int(np.argmax(logits))}


@pytest.mark.parametrize(
    "top_p, expected_ids",
    [(0.45, [0]), (0.75, [0, 1]), (0.85, [0, 1, 2]), (0.99, [0, 1, 2, 3])],
)
def test_top_p_smallest_set_reaching_mass(top_p, expected_ids):
    probabilities = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probabilities).astype(np.float32)
    ids, probs = Sampler(SamplerConfig(temperature=1.0, top_p=top_p)).distribution(logits, [])
    np.testing.assert_array_equal(ids, expected_ids)
    kept = probabilities[expected_ids]
    np.testing.assert_allclose(probs, kept / kept.sum(), rtol=1e-5)


def test_top_p_ties_at_cut_keep_lowest_ids():
    # Four equal tokens, top_p 0.5: two are needed, and the lowest ids win
    # (the same rule as a stable sort by probability).
    logits = np.array([0.0, -5.0, 0.0, 0.0, 0.0], dtype=np.float32)
    ids, _ = Sampler(SamplerConfig(temperature=1.0, top_p=0.49)).distribution(logits, [])
    np.testing.assert_array_equal(ids, [0, 2])


@pytest.mark.parametrize("top_k", [1, 5, 40])
def test_large_vocab_top_k_ties_keep_lowest_ids(top_k):
    # All tied: any prefilter pool is the whole vocabulary.
    logits = np.zeros(262144, dtype=np.float32)
    ids, _ = Sampler(SamplerConfig(temperature=1.0, top_k=top_k)).distribution(logits, [])
    np.testing.assert_array_equal(ids, np.arange(top_k))
    logits[[70000, 262143]] = 1.0
    ids, _ = Sampler(SamplerConfig(temperature=1.0, top_k=top_k)).distribution(logits, [])
    expected = [70000] if top_k == 1 else sorted([70000, 262143] + list(range(top_k - 2)))
    np.testing.assert_array_equal(ids, expected)


def test_large_vocab_top_k_when_subsample_misleads():
    # The top-k prefilter guesses a cut-off from every 64th score. Put the only
    # high scores on those positions so the guess is far too high (3 tokens
    # pass, fewer than k): the result must still be the exact top-k.
    rng = np.random.default_rng(10)
    logits = rng.standard_normal(262144).astype(np.float32)
    logits[[0, 64, 128]] = [10.0, 9.0, 8.0]
    ids, _ = Sampler(SamplerConfig(temperature=1.0, top_k=40)).distribution(logits, [])
    np.testing.assert_array_equal(ids, np.sort(np.argsort(-logits, kind="stable")[:40]))


def test_min_p_filters_relative_to_best():
    # min_p 0.2 -> threshold 0.2 * 0.5 = 0.1: token 3 (0.05) goes, token 2 (0.15) stays.
    probabilities = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probabilities).astype(np.float32)
    ids, probs = Sampler(SamplerConfig(temperature=1.0, min_p=0.2)).distribution(logits, [])
    np.testing.assert_array_equal(ids, [0, 1, 2])
    np.testing.assert_allclose(probs, probabilities[:3] / 0.95, rtol=1e-5)
    # 0.7 -> threshold 0.35: only tokens 0 remains.
    ids, _ = Sampler(SamplerConfig(temperature=1.0, min_p=0.7)).distribution(logits, [])
    np.testing.assert_array_equal(ids, [0])


def test_min_p_cuts_at_temperature_one():
    # llama.cpp's chain: min-p compares probabilities at T=1 (p1/p0 = 0.6 < 0.7), whatever the
    # temperature; at T=2 the ratio would be sqrt(0.6) ~ 0.77 and keep token 1.
    logits = np.log(np.array([0.5, 0.3])).astype(np.float32)
    for temperature in (0.5, 1.0, 2.0):
        ids, _ = Sampler(SamplerConfig(temperature=temperature, min_p=0.7)).distribution(logits, [])
        np.testing.assert_array_equal(ids, [0])
    ids, _ = Sampler(SamplerConfig(temperature=2.0, min_p=0.55)).distribution(logits, [])
    np.testing.assert_array_equal(ids, [0, 1])


def _llama_cpp_chain(logits, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """llama.cpp's default sampler chain written out in float64 with a full sort:
    top-k -> softmax -> top-p -> min-p -> temperature -> softmax (src/llama-sampling.cpp)."""
    order = np.argsort(-logits.astype(np.float64), kind="stable")
    if top_k > 0:
        order = order[:top_k]
    values = logits[order].astype(np.float64)
    probs = np.exp(values - values[0])
    probs /= probs.sum()
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), top_p, side="left")) + 1
        order, values, probs = order[:keep], values[:keep], probs[:keep]
    if min_p > 0.0:
        keep = probs >= min_p * probs[0]
        order, values = order[keep], values[keep]
    final = np.exp((values - values[0]) / temperature)
    final /= final.sum()
    by_id = np.argsort(order)
    return order[by_id], final[by_id]


@pytest.mark.parametrize("temperature", [0.5, 2.0])
@pytest.mark.parametrize("top_k, top_p, min_p", [(0, 0.8, 0.0), (0, 1.0, 0.2), (5, 0.9, 0.05), (0, 0.95, 0.1)])
def test_temperature_shapes_the_draw_after_the_cuts(temperature, top_k, top_p, min_p):
    # Evenly spaced logits: the kept sets at T=0.5 and T=2 differ from a temperature-first
    # order (which keeps 2 and 6 tokens for top_p 0.8 here, against 4 at T=1).
    logits = np.linspace(3.0, -1.5, 10).astype(np.float32)
    ids, probs = Sampler(
        SamplerConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    ).distribution(logits, [])
    want_ids, want_probs = _llama_cpp_chain(logits, temperature, top_k, top_p, min_p)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(probs, want_probs, rtol=1e-5)
    if (top_k, top_p, min_p) == (0, 0.8, 0.0):
        assert ids.tolist() == [0, 1, 2, 3]


def test_masked_tokens_are_never_sampled():
    logits = np.full(10, -np.inf, dtype=np.float32)
    logits[[2, 7]] = [0.0, 0.5]
    sampler = Sampler(SamplerConfig(temperature=1.0, seed=0))
    assert set(draw_counts(sampler, logits, 2000).nonzero()[0]) == {2, 7}


# -- draws: statistics ---------------------------------------------------------


def test_empirical_frequencies_match_softmax():
    logits = np.array([1.0, 0.5, 0.0, -0.5, -1.0, 2.0, -3.0, 0.2], dtype=np.float32)
    sampler = Sampler(SamplerConfig(temperature=1.0, seed=1234))
    assert_frequencies_match(draw_counts(sampler, logits, 20000), softmax(logits))


def test_empirical_frequencies_with_top_k_and_top_p():
    logits = np.log(np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])).astype(np.float32)
    # top_k 4 -> {0..3} renormalized by 0.9; top_p 0.8 -> cumulative 0.444, 0.722,
    # 0.889: keeps {0, 1, 2}.
    sampler = Sampler(SamplerConfig(temperature=1.0, top_k=4, top_p=0.8, seed=7))
    expected = np.array([0.4, 0.25, 0.15, 0.0, 0.0, 0.0])
    assert_frequencies_match(draw_counts(sampler, logits, 20000), expected / expected.sum())


def test_temperature_half_sharpens():
    logits = np.array([1.0, 0.5, 0.0, -0.5], dtype=np.float32)
    draws = 20000
    warm = draw_counts(Sampler(SamplerConfig(temperature=1.0, seed=11)), logits, draws)
    cold = draw_counts(Sampler(SamplerConfig(temperature=0.5, seed=12)), logits, draws)
    assert_frequencies_match(cold, softmax(logits, 0.5))
    # p_top goes from 0.41 to 0.60: far beyond the ~0.02 sampling noise.
    assert cold[0] / draws > warm[0] / draws + 0.1
    assert cold[3] < warm[3]


def test_large_vocab_draw_reaches_every_block():
    # 262147 = 512 * 512 + 3: tokens in the first block, a middle block and the
    # ragged tail of the two-level CDF, with everything else masked.
    vocab = 262147
    logits = np.full(vocab, -np.inf, dtype=np.float32)
    chosen = np.array([3, 131000, 200001, vocab - 1])
    logits[chosen] = [0.0, 1.0, -0.5, 0.7]
    sampler = Sampler(SamplerConfig(temperature=1.0, seed=5))
    counts = np.zeros(len(chosen), dtype=np.int64)
    index_of = {int(token): i for i, token in enumerate(chosen)}
    for _ in range(3000):
        counts[index_of[sampler.sample(logits, [])]] += 1  # KeyError if a masked token
    assert_frequencies_match(counts, softmax(logits[chosen]))


def test_large_vocab_uniform_draw_is_unbiased_across_blocks():
    vocab = 262144
    sampler = Sampler(SamplerConfig(temperature=1.0, seed=9))
    logits = np.zeros(vocab, dtype=np.float32)
    tokens = np.array([sampler.sample(logits, []) for _ in range(3000)])
    # 8 equal bands of the vocabulary, 375 expected draws each: the block choice.
    bands = np.bincount(tokens * 8 // vocab, minlength=8)
    assert_frequencies_match(bands, np.full(8, 1 / 8))
    # 8 bands of the position modulo 512 (the CDF block size): the choice within a block.
    offsets = np.bincount((tokens % 512) * 8 // 512, minlength=8)
    assert_frequencies_match(offsets, np.full(8, 1 / 8))


# -- seeding -------------------------------------------------------------------


def test_same_seed_same_sequence_different_seed_differs():
    rng = np.random.default_rng(6)
    steps = [rng.standard_normal(1000).astype(np.float32) for _ in range(64)]
    config = dict(temperature=1.0, top_k=50, top_p=0.95, repetition_penalty=1.1)

    def run(seed):
        sampler = Sampler(SamplerConfig(seed=seed, **config))
        history = []
        for logits in steps:
            history.append(sampler.sample(logits, history))
        return history

    assert run(42) == run(42)
    assert run(42) != run(43)


def test_reset_restarts_the_stream():
    logits = np.zeros(1000, dtype=np.float32)
    sampler = Sampler(SamplerConfig(temperature=1.0, seed=3))
    first = [sampler.sample(logits, []) for _ in range(20)]
    sampler.reset()
    assert [sampler.sample(logits, []) for _ in range(20)] == first
    sampler.reset(4)
    assert [sampler.sample(logits, []) for _ in range(20)] != first


# -- validation ----------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("top_k", -1),
        ("top_k", 2.5),
        ("top_p", 0.0),
        ("top_p", -0.5),
        ("top_p", 1.01),
        ("min_p", -0.01),
        ("min_p", 1.0),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("repetition_window", -1),
        ("seed", -5),
        ("seed", 1.5),
    ],
)
def test_config_rejects_bad_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplerConfig(**{field: value})


def test_config_accepts_boundaries():
    SamplerConfig(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1e-3)
    SamplerConfig(top_p=1e-9, min_p=0.999, repetition_window=0, seed=0)


@pytest.mark.parametrize(
    "config",
    [SamplerConfig(), SamplerConfig(temperature=0.8, top_k=5), SamplerConfig(temperature=1.0)],
)
def test_nan_in_logits_raises(config):
    logits = np.zeros(100, dtype=np.float32)
    logits[37] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        Sampler(config).sample(logits, [])
    # Also when the NaN sits on a penalized token.
    penalized = Sampler(
        SamplerConfig(temperature=config.temperature, repetition_penalty=1.5)
    )
    with pytest.raises(ValueError, match="NaN"):
        penalized.sample(logits, [37])


def test_positive_inf_and_all_masked_raise():
    sampler = Sampler(SamplerConfig(temperature=1.0))
    with pytest.raises(ValueError, match=r"\+inf"):
        sampler.sample(np.array([0.0, np.inf], dtype=np.float32), [])
    with pytest.raises(ValueError, match="-inf"):
        sampler.sample(np.full(4, -np.inf, dtype=np.float32), [])


@pytest.mark.parametrize(
    "bad", [np.zeros((2, 3), np.float32), np.zeros(0, np.float32), np.arange(4)]
)
def test_bad_logits_shape_or_dtype_raises(bad):
    with pytest.raises(ValueError, match="logits"):
        Sampler(SamplerConfig()).sample(bad, [])


def test_input_logits_not_mutated():
    rng = np.random.default_rng(8)
    logits = rng.standard_normal(4096).astype(np.float32)
    logits[:3] = [3.0, -2.0, 0.0]
    original = logits.copy()
    logits.flags.writeable = False  # any in-place write raises instead of passing silently
    for config in [
        SamplerConfig(repetition_penalty=1.7),
        SamplerConfig(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.7),
        SamplerConfig(temperature=2.0, top_p=0.5, repetition_penalty=0.6),
    ]:
        sampler = Sampler(config)
        sampler.sample(logits, [0, 1, 2, 0])
        sampler.distribution(logits, [0, 1, 2])
    np.testing.assert_array_equal(logits, original)


# -- cross-check against a full-sort reference ---------------------------------


def reference_distribution(logits, history, config):
    """The whole pipeline written plainly: loops over history, full stable sorts.

    Weights use the same float32 exp as the sampler, so top-p cuts compare
    bit-identical cumulative sums and the check can demand equal sets.
    """
    scores = np.array(logits, dtype=np.float32)
    if config.repetition_window > 0:
        for token in set(history[-config.repetition_window :]):
            if scores[token] > 0:
                scores[token] /= config.repetition_penalty
            else:
                scores[token] *= config.repetition_penalty
    order = np.argsort(-scores, kind="stable")  # descending, ties by ascending id
    if config.top_k > 0:
        order = order[: config.top_k]
    ids = np.sort(order)
    offsets = np.subtract(scores[ids], np.float32(scores.max()), dtype=np.float32)
    weights = np.exp(offsets)  # the cuts see temperature 1 (llama.cpp's chain)
    keep = np.ones(ids.size, dtype=bool)
    if config.top_p < 1.0:
        by_weight = np.argsort(-weights, kind="stable")
        cumulative = np.cumsum(weights[by_weight], dtype=np.float64)
        target = config.top_p * float(weights.sum(dtype=np.float64))
        reached = np.flatnonzero(cumulative >= target)
        count = reached[0] + 1 if reached.size else ids.size  # include the crossing token
        keep[:] = False
        keep[by_weight[:count]] = True
    if config.min_p > 0.0:
        keep &= weights >= config.min_p * weights[keep].max()
    ids = ids[keep]
    weights = np.exp(offsets[keep] * np.float32(1.0 / config.temperature)).astype(np.float64)
    return ids, weights / weights.sum()


@pytest.mark.parametrize(
    "vocab, config",
    [
        (1000, SamplerConfig(temperature=0.8, top_k=40, top_p=0.95)),
        (1000, SamplerConfig(temperature=1.3, top_p=0.5, min_p=0.05)),
        (1000, SamplerConfig(temperature=0.6, top_k=100, min_p=0.1, repetition_penalty=1.3)),
        (50000, SamplerConfig(temperature=1.0, top_p=0.9, repetition_penalty=1.2)),
        # Nucleus of tens of thousands of tokens: forces the prefix to grow past
        # its first sizes (256, 2048, 16384) before the cut is found.
        (262144, SamplerConfig(temperature=1.0, top_p=0.95)),
        (262144, SamplerConfig(temperature=0.7, top_p=0.3, min_p=0.001)),
        (262144, SamplerConfig(temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.1)),
    ],
)
def test_matches_full_sort_reference(vocab, config):
    rng = np.random.default_rng(vocab)
    for _ in range(3):
        logits = (rng.standard_normal(vocab) * 2.0).astype(np.float32)
        history = rng.integers(0, vocab, size=100).tolist() + [int(np.argmax(logits))]
        ids, probs = Sampler(config).distribution(logits, history)
        expected_ids, expected_probs = reference_distribution(logits, history, config)
        np.testing.assert_array_equal(ids, expected_ids)
        np.testing.assert_allclose(probs, expected_probs, rtol=1e-9, atol=0)
        assert math.isclose(probs.sum(), 1.0, rel_tol=1e-12)
