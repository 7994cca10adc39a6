"""The generation loop: prefill, sample, decode one token per core call, stop rules, and
streaming text with stop strings held back until they can no longer match."""
from __future__ import annotations

from typing import Iterator, Sequence

from kcap.sampling import Sampler, SamplerConfig


def token_stream(model, prompt_ids: Sequence[int], max_tokens: int = 256, ignore_eos: bool = False,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                 repetition_penalty: float = 1.0, seed: int | None = None) -> Iterator[int]:
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be ≥ 0, got {max_tokens}")
    config = SamplerConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                           repetition_penalty=repetition_penalty, seed=seed)
    sampler = Sampler(config)
    history = [int(i) for i in prompt_ids]
    logits = model.prefill(history)
    eos_ids = model.tokenizer.eos_ids if model.tokenizer is not None else set()
    on_device = device_choice(model, config)
    token = sampler.sample(logits, history)
    for _ in range(max_tokens):
        if token in eos_ids and not ignore_eos:
            return
        history.append(token)
        yield token
        if len(history) >= model.n_ctx:
            return  # the context is full: stop like llama.cpp does at n_ctx, without error
        if on_device is not None:
            token = on_device(token)
        else:
            token = sampler.sample(model.eval([token]), history)


def device_choice(model, config: SamplerConfig):
    """Where the engine picks the next token on the device (CUDA: greedy, or top-k sampling
    with k <= MAX_DEVICE_TOP_K and no repetition penalty), a function token -> next token
    that appends `token` and returns the device's choice, with no logits copied to the host;
    else None (the host sampler runs on eval's logits). The device draw is a hash of the seed
    and the position, so a seeded run repeats, but its numbers differ from the host sampler's
    generator: same distribution, not the same tokens."""
    from kcap import _core

    engine = getattr(model, "engine", None)
    if engine is None or not getattr(engine, "samples_on_device", False) or config.repetition_penalty != 1.0:
        return None
    if config.temperature == 0.0 or config.top_k == 1:
        return lambda token: model.decode_next(token, lambda e: e.decode_greedy(token, 1))
    if not 1 <= config.top_k <= _core.MAX_DEVICE_TOP_K:
        return None
    import secrets

    seed = (config.seed if config.seed is not None else secrets.randbits(32)) & 0xFFFFFFFF
    return lambda token: model.decode_next(
        token, lambda e: e.decode_sample(token, 1, config.temperature, config.top_k, config.top_p, config.min_p, seed))


class StopMatcher:
    """Finds the earliest stop string in streamed text and holds back any tail that could
    still be the start of one, so a stop string never leaks into the output."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, stopped)."""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out = self.pending[: min(hits)]
            self.pending = ""
            return out, True
        hold = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(stop[:k]):
                    hold = max(hold, k)
                    break
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out):]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def text_stream(model, prompt: str, max_tokens: int = 256, stop: Sequence[str] | str | None = None,
                add_special_tokens: bool = True, **options) -> Iterator[str]:
    from kcap.tokenizer import StreamDecoder

    stops = [stop] if isinstance(stop, str) else list(stop or [])
    matcher = StopMatcher(stops)
    decoder = StreamDecoder(model.tokenizer)
    prompt_ids = model.tokenize(prompt, add_special_tokens=add_special_tokens)
    for token in token_stream(model, prompt_ids, max_tokens=max_tokens, **options):
        text, stopped = matcher.push(decoder.push(token))
        if text:
            yield text
        if stopped:
            return
    text, stopped = matcher.push(decoder.flush())
    if text:
        yield text
    if not stopped:
        rest = matcher.flush()
        if rest:
            yield rest
