"""Token sampling from a logits vector: logit bias, repetition, frequency and presence
penalties, greedy, temperature, top-k, top-p (nucleus) and min-p, in pure numpy.

The semantics and the stage order are llama.cpp's default sampler chain (also
llama-cpp-python's and mlx-lm's), so that the same settings keep the same tokens:

    logit bias -> penalties (repetition, frequency, presence) -> (greedy if temperature == 0)
    -> top-k -> softmax -> top-p -> min-p -> temperature -> renormalize -> draw

top-p and min-p cut on the probabilities at temperature 1; the temperature then
shapes only the draw among the tokens they kept. (HF transformers applies the
temperature first, so its top-p / min-p sets differ from these when T != 1.)

Everything is vectorized because a vocabulary can have 262144 entries and this
runs once per generated token: top-k uses a partition rather than a sort, top-p
sorts the values (not indices) of only a growing prefix of the most likely
tokens, and the draw inverts a two-level (blocked) CDF instead of a full
cumulative sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from types import MappingProxyType
from typing import Mapping, Optional, Sequence, Tuple

import numpy as np

from kcap.errors import InvalidArgumentError, NumericalError

__all__ = ["SamplerConfig", "Sampler"]


_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class SamplerConfig:
    """Sampling parameters; each default turns its stage off.

    temperature        0.0 means greedy (argmax); > 0 divides the logits.
    top_k              keep the k most likely tokens; 0 disables.
    top_p              keep the smallest set with cumulative probability >= top_p; 1.0 disables.
    min_p              drop tokens with p < min_p * p_max; 0.0 disables.
    repetition_penalty CTRL-style penalty on recently seen tokens; 1.0 disables.
    frequency_penalty  subtracted from a token's logit once per time it occurs in the window; 0 disables.
    presence_penalty   subtracted from the logit of every token that occurs in the window; 0 disables.
    repetition_window  how many of the most recent history tokens the three penalties count; 0 disables.
    logit_bias         {token id: value added to its logit} before everything else; empty disables.
    seed               seed of the PCG64 generator; None draws fresh OS entropy.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_window: int = 64
    logit_bias: Optional[Mapping[int, float]] = None
    seed: Optional[int] = None

    def __post_init__(self) -> None:
        # Frozen, so validating once here means a Sampler never sees a bad config.
        _require_real("temperature", self.temperature)
        if not self.temperature >= 0.0:
            raise InvalidArgumentError(f"temperature must be >= 0 (0 means greedy), got {self.temperature!r}")

        _require_int("top_k", self.top_k)
        if self.top_k < 0:
            raise InvalidArgumentError(f"top_k must be >= 0 (0 disables it), got {self.top_k!r}")

        _require_real("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidArgumentError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p!r}")

        _require_real("min_p", self.min_p)
        if not 0.0 <= self.min_p < 1.0:
            raise InvalidArgumentError(f"min_p must be in [0, 1) (0 disables it), got {self.min_p!r}")

        _require_real("repetition_penalty", self.repetition_penalty)
        if not self.repetition_penalty > 0.0:
            raise InvalidArgumentError(
                f"repetition_penalty must be > 0 (1 disables it), got {self.repetition_penalty!r}"
            )

        for field in ("frequency_penalty", "presence_penalty"):
            _require_real(field, getattr(self, field))

        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, Mapping):
                raise InvalidArgumentError(f"logit_bias must map token ids to numbers, got {self.logit_bias!r}")
            for token_id, bias in self.logit_bias.items():
                _require_int("a logit_bias token id", token_id)
                if token_id < 0:
                    raise InvalidArgumentError(f"logit_bias token ids must be >= 0, got {token_id!r}")
                _require_real(f"logit_bias[{token_id}]", bias)
            # Frozen: an immutable copy the caller cannot change under a running generation.
            object.__setattr__(self, "logit_bias", MappingProxyType({int(t): float(b) for t, b in self.logit_bias.items()}))

        _require_int("repetition_window", self.repetition_window)
        if self.repetition_window < 0:
            raise InvalidArgumentError(
                f"repetition_window must be >= 0 (0 disables it), got {self.repetition_window!r}"
            )

        if self.seed is not None:
            _require_int("seed", self.seed)
            if self.seed < 0:
                # PCG64 itself rejects negative seeds; say which field is at fault.
                raise InvalidArgumentError(f"seed must be a non-negative integer or None, got {self.seed!r}")


def _require_real(field: str, value: object) -> None:
    # bool is a Real in Python; accepting True as a temperature would hide a bug.
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise InvalidArgumentError(f"{field} must be a finite real number, got {value!r}")


def _require_int(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidArgumentError(f"{field} must be an integer, got {value!r}")


# Tokens per block of the two-level cumulative sums (draw, top-p cut);
# ~sqrt(262144) keeps both levels small.
_DRAW_BLOCK = 512
# Top-k on a large vocabulary first narrows the search with a cut-off
# estimated from every STRIDE-th score (see _top_k_ids).
_TOP_K_PREFILTER_MIN_VOCAB = 32768
_TOP_K_PREFILTER_STRIDE = 64
# First prefix size tried by the full-vocabulary top-p, and its growth factor.
_TOP_P_FIRST_PREFIX = 256
_TOP_P_PREFIX_GROWTH = 8


class Sampler:
    """Picks the next token from logits; holds the random generator state.

    One Sampler per generation stream: with a fixed seed, the same sequence of
    (logits, history) calls yields the same tokens on every run.
    """

    def __init__(self, config: Optional[SamplerConfig] = None) -> None:
        self.config = config if config is not None else SamplerConfig()
        self._rng = np.random.Generator(np.random.PCG64(self.config.seed))

    def reset(self, seed: Optional[int] = None) -> None:
        """Restart the random stream, from `seed` if given, else from the config seed."""
        if seed is None:
            seed = self.config.seed
        elif isinstance(seed, bool) or not isinstance(seed, Integral) or seed < 0:
            raise InvalidArgumentError(f"seed must be a non-negative integer or None, got {seed!r}")
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """Return the next token id. `logits` is not modified."""
        token_ids, weights = self._candidates(logits, history)
        if token_ids.size == 1:
            # Greedy, top_k=1 or a collapsed filter: nothing to draw, and not
            # consuming a random number keeps greedy runs independent of the seed.
            return int(token_ids[0])
        return int(token_ids[_draw_index(weights, self._rng.random())])

    def distribution(
        self, logits: np.ndarray, history: Sequence[int] = ()
    ) -> Tuple[np.ndarray, np.ndarray]:
        """The distribution `sample` draws from: (token ids ascending, probabilities summing to 1).

        Tokens outside the returned ids have probability 0. Meant for tests
        and inspection; `sample` avoids normalizing and sorting when it can.
        """
        token_ids, weights = self._candidates(logits, history)
        weights = np.asarray(weights, dtype=np.float64)
        keep = weights > 0.0
        token_ids, weights = token_ids[keep], weights[keep]
        order = np.argsort(token_ids, kind="stable")
        return token_ids[order], weights[order] / weights.sum()

    # -- pipeline -----------------------------------------------------------

    def _candidates(
        self, logits: np.ndarray, history: Sequence[int]
    ) -> Tuple[np.ndarray, np.ndarray]:
        """Run every filter; return (token ids, unnormalized non-negative weights)."""
        cfg = self.config
        scores = _validated_logits(logits)
        vocab_size = scores.shape[0]

        if cfg.logit_bias:
            scores = _apply_logit_bias(scores, cfg.logit_bias)
        if cfg.repetition_window > 0 and (
            cfg.repetition_penalty != 1.0 or cfg.frequency_penalty != 0.0 or cfg.presence_penalty != 0.0
        ):
            scores = _apply_penalties(scores, history, cfg)

        # One O(V) pass that also catches NaN (max propagates it) and +inf
        # (softmax would turn it into NaN).
        max_score = float(scores.max())
        if math.isnan(max_score):
            raise NumericalError("logits contain NaN; refusing to sample from them")
        if max_score == math.inf:
            raise NumericalError("logits contain +inf; refusing to sample from them")
        if max_score == -math.inf:
            raise NumericalError("all logits are -inf; no token can be sampled")

        if cfg.temperature == 0.0 or cfg.top_k == 1 or 1.0 / cfg.temperature > _FLOAT32_MAX:
            # argmax returns the first maximum: ties go to the lowest index.
            # top_k=1 leaves a single token whatever the temperature; so does a temperature so
            # small that 1 / T overflows float32 (below about 3e-39): the limit of T -> 0.
            return np.array([int(np.argmax(scores))], dtype=np.int64), np.ones(1)

        if 0 < cfg.top_k < vocab_size:
            token_ids = _top_k_ids(scores, cfg.top_k)
            candidate_scores = scores[token_ids]
        else:
            token_ids = None  # the whole vocabulary; avoids an arange + gather
            candidate_scores = scores

        # Softmax numerators at temperature 1 relative to the best token: the best one
        # has weight exactly 1, so min-p compares against 1 without normalizing.
        offsets = np.subtract(candidate_scores, np.float32(max_score), dtype=np.float32)
        weights = np.exp(offsets)

        if cfg.top_p < 1.0:
            kept = _top_p_positions(weights, cfg.top_p)
            token_ids = kept if token_ids is None else token_ids[kept]
            weights, offsets = weights[kept], offsets[kept]

        if cfg.min_p > 0.0:
            # p_i < min_p * p_max  <=>  weight_i < min_p, since p_max has weight 1
            # and normalization cancels; top-p never drops the best token.
            kept = np.flatnonzero(weights >= cfg.min_p)
            token_ids = kept if token_ids is None else token_ids[kept]
            weights, offsets = weights[kept], offsets[kept]

        if cfg.temperature != 1.0:
            # The temperature shapes the draw among the kept tokens only.
            offsets *= np.float32(1.0 / cfg.temperature)
            weights = np.exp(offsets, out=offsets)

        if token_ids is None:
            token_ids = np.arange(vocab_size, dtype=np.int64)
        return token_ids, weights


def _validated_logits(logits: np.ndarray) -> np.ndarray:
    scores = np.asarray(logits)
    if scores.ndim != 1 or scores.shape[0] == 0:
        raise InvalidArgumentError(f"logits must be a non-empty 1-D array, got shape {scores.shape}")
    if not np.issubdtype(scores.dtype, np.floating):
        raise InvalidArgumentError(f"logits must be a floating-point array, got dtype {scores.dtype}")
    return scores


def _apply_logit_bias(scores: np.ndarray, logit_bias: Mapping[int, float]) -> np.ndarray:
    """scores with each biased token's value added (llama.cpp's logit_bias sampler); a copy."""
    ids = np.fromiter(logit_bias.keys(), dtype=np.int64, count=len(logit_bias))
    if ids.max() >= scores.shape[0]:
        raise InvalidArgumentError(f"logit_bias names token id {int(ids.max())}, outside the vocabulary "
                                   f"[0, {scores.shape[0]})")
    biased = scores.astype(np.float32, copy=True)
    biased[ids] += np.fromiter(logit_bias.values(), dtype=np.float32, count=len(logit_bias))
    return biased


def _apply_penalties(scores: np.ndarray, history: Sequence[int], cfg: SamplerConfig) -> np.ndarray:
    """llama.cpp's penalties on the tokens of the last `repetition_window` history entries: each
    distinct token's logit divided by the repetition penalty (multiplied where it is negative, so
    that it falls), then lowered by frequency_penalty times its count and by presence_penalty; a
    copy."""
    if not isinstance(history, (list, tuple, np.ndarray, range)):
        history = list(history)  # e.g. a deque, which cannot be sliced
    recent = np.asarray(history[-cfg.repetition_window:], dtype=np.int64).reshape(-1)
    if recent.size == 0:
        return scores
    vocab_size = scores.shape[0]
    if recent.min() < 0 or recent.max() >= vocab_size:
        # A negative id would silently index from the end of the vocabulary.
        raise InvalidArgumentError(f"history contains token ids outside [0, {vocab_size})")
    seen, counts = np.unique(recent, return_counts=True)
    penalized = scores.copy()  # never write into the caller's array
    values = penalized[seen]
    if cfg.repetition_penalty != 1.0:
        # Dividing a negative logit would raise it; multiplying lowers it instead.
        values = np.where(values > 0, values / cfg.repetition_penalty, values * cfg.repetition_penalty)
    penalized[seen] = values - (counts * cfg.frequency_penalty + cfg.presence_penalty).astype(values.dtype)
    return penalized


def _top_k_ids(scores: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k highest scores, ascending; ties at the cut keep the lowest ids.

    Deterministic tie-breaking makes top_k=1 agree with greedy, and a given
    input always yields the same set.
    """
    vocab_size = scores.shape[0]
    if vocab_size >= _TOP_K_PREFILTER_MIN_VOCAB and k * _TOP_K_PREFILTER_STRIDE <= vocab_size // 16:
        # Guess a cut-off from a strided subsample, chosen so that ~4k tokens
        # of the full vocabulary are expected above it; one cheap comparison
        # then leaves a small pool. If the pool holds >= k tokens it holds the
        # exact answer (every token >= the true k-th value is in it), so only
        # the speed, never the result, depends on the guess.
        subsample = scores[::_TOP_K_PREFILTER_STRIDE]  # a view, no copy
        rank = max(2, -(-4 * k // _TOP_K_PREFILTER_STRIDE))
        guess = np.partition(subsample, subsample.size - rank)[subsample.size - rank]
        pool = np.flatnonzero(scores >= guess)  # ascending
        if pool.size >= k:
            return pool[_exact_top_k_positions(scores[pool], k)]
    return _exact_top_k_positions(scores, k)


def _exact_top_k_positions(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k highest scores, ascending, lowest positions winning ties."""
    count = scores.shape[0]
    # The k-th largest value, in O(n) with no sort.
    threshold = np.partition(scores, count - k)[count - k]
    positions = np.flatnonzero(scores >= threshold)  # ascending
    if positions.size > k:
        above = positions[scores[positions] > threshold]
        tied = positions[scores[positions] == threshold][: k - above.size]
        positions = np.sort(np.concatenate([above, tied]))
    return positions


def _top_p_positions(weights: np.ndarray, top_p: float) -> np.ndarray:
    """Positions (ascending) of the smallest most-likely set whose mass reaches
    top_p of the total; at equal weights the lower position goes first.

    Only values are sorted, never indices: numpy's vectorized value sort is
    several times faster than argsort. The cut is then found by weight, and
    the positions recovered with one comparison. For peaked LLM
    distributions the first, small prefix of the largest weights already
    holds enough mass; broad ones grow the prefix geometrically.
    """
    count = weights.shape[0]
    target = top_p * float(weights.sum(dtype=np.float64))
    prefix = _TOP_P_FIRST_PREFIX
    while True:
        if prefix >= count:
            largest = np.sort(weights)[::-1]
        else:
            # The `prefix` largest weights, in O(n), then sorted descending.
            largest = np.sort(np.partition(weights, count - prefix)[count - prefix :])[::-1]
        if prefix >= count or float(largest.sum(dtype=np.float64)) >= target:
            break
        prefix *= _TOP_P_PREFIX_GROWTH

    # Keep tokens up to and including the one whose cumulative mass reaches
    # the target (llama.cpp and HF keep the crossing token); never fewer than 1.
    keep_count = _first_reaching(largest, target) + 1
    cutoff = largest[keep_count - 1]
    positions = np.flatnonzero(weights >= cutoff)  # ascending
    if positions.size > keep_count:
        # Weights tied with the cutoff straddle the cut: keep the lowest positions.
        above = positions[weights[positions] > cutoff]
        tied = positions[weights[positions] == cutoff][: keep_count - above.size]
        positions = np.sort(np.concatenate([above, tied]))
    return positions


def _first_reaching(descending: np.ndarray, target: float) -> int:
    """First index whose float64 cumulative sum reaches `target`, clamped to the
    last index (rounding can leave a target of ~the total just out of reach).

    Blocked like _draw_index: a float64 cumsum over 262144 values is the
    slowest step otherwise.
    """
    count = descending.shape[0]
    block_count = count // _DRAW_BLOCK
    if block_count < 2:
        cumulative = np.cumsum(descending, dtype=np.float64)
        return min(int(np.searchsorted(cumulative, target, side="left")), count - 1)
    body = block_count * _DRAW_BLOCK
    block_sums = np.empty(block_count + 1, dtype=np.float64)
    block_sums[:block_count] = (
        descending[:body].reshape(block_count, _DRAW_BLOCK).sum(axis=1, dtype=np.float64)
    )
    block_sums[block_count] = descending[body:].sum(dtype=np.float64)
    block_cumulative = np.cumsum(block_sums)
    block = min(int(np.searchsorted(block_cumulative, target, side="left")), block_count)
    before = block_cumulative[block - 1] if block > 0 else 0.0
    start = block * _DRAW_BLOCK
    in_block = np.cumsum(descending[start : start + _DRAW_BLOCK], dtype=np.float64)
    offset = min(int(np.searchsorted(in_block, target - before, side="left")), in_block.size - 1)
    return min(start + offset, count - 1)


def _draw_index(weights: np.ndarray, uniform: float) -> int:
    """Index i with probability weights[i] / sum(weights), from one uniform in [0, 1).

    Inverts a two-level CDF (per-block sums, then one block's cumulative sum):
    a full float64 cumsum over 262144 entries costs several times more than this.
    Zero-weight entries are never returned.
    """
    count = weights.shape[0]
    block_count = count // _DRAW_BLOCK
    if block_count < 2:
        cumulative = np.cumsum(weights, dtype=np.float64)
        return _search_nonzero(weights, cumulative, uniform * cumulative[-1])

    body = block_count * _DRAW_BLOCK
    block_sums = np.empty(block_count + 1, dtype=np.float64)
    # float32 pairwise sums within a block are accurate to ~1e-6 relative.
    block_sums[:block_count] = weights[:body].reshape(block_count, _DRAW_BLOCK).sum(axis=1)
    block_sums[block_count] = weights[body:].sum(dtype=np.float64)  # ragged tail (may be empty)
    block_cumulative = np.cumsum(block_sums)
    target = uniform * block_cumulative[-1]
    block = _search_nonzero(block_sums, block_cumulative, target)

    start = block * _DRAW_BLOCK
    in_block = weights[start : start + _DRAW_BLOCK]
    before = block_cumulative[block - 1] if block > 0 else 0.0
    cumulative = np.cumsum(in_block, dtype=np.float64)
    # Position of the target inside the block as a fraction of the block's
    # mass, rescaled to this cumsum: the float32 block sum and the float64
    # cumsum differ in the last bits, and rescaling keeps the in-block draw
    # exactly proportional to the weights.
    fraction = (target - before) / block_sums[block]
    return start + _search_nonzero(in_block, cumulative, fraction * cumulative[-1])


def _search_nonzero(weights: np.ndarray, cumulative: np.ndarray, target: float) -> int:
    """First i with cumulative[i] > target, moved back onto a non-zero weight if
    rounding pushed the target past the end."""
    # side="right" skips entries whose weight is 0 (their cumulative equals the previous one).
    index = int(np.searchsorted(cumulative, target, side="right"))
    if index >= weights.shape[0] or weights[index] <= 0:
        nonzero = np.flatnonzero(weights[: min(index + 1, weights.shape[0])] > 0)
        index = int(nonzero[-1]) if nonzero.size else int(np.flatnonzero(weights > 0)[0])
    return index
