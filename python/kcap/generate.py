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
    sampler = Sampler(SamplerConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                    repetition_penalty=repetition_penalty, seed=seed))
    history = [int(i) for i in prompt_ids]
    logits = model.prefill(history)
    eos_ids = model.tokenizer.eos_ids if model.tokenizer is not None else set()
    for _ in range(max_tokens):
        token = sampler.sample(logits, history)
        if token in eos_ids and not ignore_eos:
            return
        history.append(token)
        yield token
        if len(history) >= model.n_ctx:
            return  # the context is full: stop like llama.cpp does at n_ctx, without error
        logits = model.eval([token])


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
