"""kcap serve: the OpenAI HTTP API over one Model, on FastAPI and uvicorn (kcap[server]).

    GET  /health                 {"status": "ok", "model": ..., "active_generations": n}
    GET  /v1/models              the one model served (GET /v1/models/{id}: that model)
    POST /v1/completions         prompt -> text
    POST /v1/chat/completions    messages -> the assistant's answer, through the GGUF's chat template

Both POST routes take max_tokens, temperature, top_p, seed, stop, frequency_penalty,
presence_penalty, logit_bias, logprobs (chat: with top_logprobs), echo (completions) and stream (server-sent events, ending with "data: [DONE]";
stream_options.include_usage adds a usage chunk), plus top_k, min_p, repetition_penalty (or
repeat_penalty) and ignore_eos as llama.cpp's and vLLM's servers do; a field sent as null takes
its default; chat_template_kwargs and reasoning_effort are variables of the chat template. A
request for what kcap does not implement (tools, response_format, n > 1, echo with stream, ...) is refused
with 400 naming the field, never answered as if it had not asked. Answers carry usage counts
and finish_reason "stop" (end of turn / end of text or a stop string) or "length"
(max_tokens or the end of the context). Errors have OpenAI's shape,
{"error": {"message", "type", "param", "code"}}, with 400 for a bad request, 404 for an
unknown model or route, 500 for a failure of the server.

Each request generates on a thread of its own; the Model's lock makes concurrent requests take
turns, each with its own KV cache contents. A client that disconnects cancels its generation
between prefill chunks or tokens. A model that reasons before it answers (gpt-oss's harmony
channels, <think> blocks) answers a chat with its final text and returns its reasoning as
reasoning_content, as llama.cpp's server does.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import uuid
from typing import Any, Literal, Optional, Sequence, Union

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as exc:  # pragma: no cover - depends on the installation
    from kcap.errors import KcapError

    raise KcapError(f"kcap serve needs FastAPI and uvicorn: pip install 'kcap[server]' ({exc})") from None

from kcap.errors import ContextOverflowError, KcapError, ModelError
from kcap.generate import GenerationStats, chat_prompt_ids, ids_text_stream, prompt_logprobs
from kcap.sampling import SamplerConfig

# How often a non-streaming request checks whether its client is still connected.
DISCONNECT_POLL_SECONDS = 0.25


# --- requests ------------------------------------------------------------------------------
# Fields of OpenAI's (and llama.cpp's server's) requests that would change the answer and that kcap
# does not implement: a request that sets one to anything but its neutral value is refused (400,
# naming it) rather than answered as if it had not asked. field -> (neutral values, what it asks for).
_UNSUPPORTED = {
    "tools": ((None, []), "tool calling"),
    "tool_choice": ((None, "none"), "tool calling"),
    "functions": ((None, []), "function calling"),
    "function_call": ((None, "none"), "function calling"),
    "response_format": ((None, {"type": "text"}), "structured output (JSON mode or a JSON schema)"),
    "json_schema": ((None, {}), "structured output (a JSON schema)"),
    "grammar": ((None, ""), "grammar-constrained output"),
    "suffix": ((None, ""), "fill-in-the-middle with a suffix"),
    "best_of": ((None, 1), "best-of-n sampling"),
    "modalities": ((None, ["text"]), "output modalities other than text"),
    "audio": ((None,), "audio output"),
}


MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    ignore_eos: bool = False
    seed: Optional[int] = Field(None, ge=-1, description="-1 or none: a random seed (llama.cpp's server's -1)")
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    stream_options: Optional[dict] = None
    n: int = Field(1, ge=1, le=1, description="one choice per request")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    # OpenAI's: token ids (as JSON object keys, strings) to a value in [-100, 100] added to the logit.
    logit_bias: Optional[dict[str, float]] = None

    @model_validator(mode="before")
    @classmethod
    def _defaults_for_null(cls, data):
        """OpenAI's schema lets a client send null for an option it leaves at its default; llama.cpp's
        server's repeat_penalty is repetition_penalty; a field of _UNSUPPORTED is refused unless
        neutral (not declared: read here, before extra="ignore" would drop it)."""
        if not isinstance(data, dict):
            return data
        for field, (neutral, what) in _UNSUPPORTED.items():
            if data.get(field) not in neutral:
                raise APIError(400, f"{field}: kcap serve does not implement {what}; an answer would ignore it",
                               param=field, code="unsupported_parameter")
        data = {key: value for key, value in data.items()
                if not (value is None and key in cls.model_fields and cls.model_fields[key].default is not None)}
        if "repeat_penalty" in data:
            alias = data.pop("repeat_penalty")
            if alias is not None:
                if data.get("repetition_penalty", alias) != alias:
                    raise ValueError("repeat_penalty and repetition_penalty differ; give one of them")
                data["repetition_penalty"] = alias
        return data

    @model_validator(mode="after")
    def _stream_options_with_stream(self):
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options: only allowed when stream is true", param="stream_options")
        return self

    @model_validator(mode="after")
    def _logit_bias_ids(self):
        for key, value in (self.logit_bias or {}).items():
            if not key.isdigit():
                raise APIError(400, f"logit_bias: {key!r} is not a token id", param="logit_bias")
            if not -100.0 <= value <= 100.0:
                raise APIError(400, f"logit_bias[{key}] = {value}: must be in [-100, 100]", param="logit_bias")
        return self

    def sampling(self) -> dict:
        """The generation's sampling options: top_p 0 keeps only the most likely token (greedy), as
        OpenAI's range allows; seed -1 draws a random seed."""
        top_k, top_p = (1, 1.0) if self.top_p == 0.0 else (self.top_k, self.top_p)
        return dict(temperature=self.temperature, top_k=top_k, top_p=top_p, min_p=self.min_p,
                    repetition_penalty=self.repetition_penalty, frequency_penalty=self.frequency_penalty,
                    presence_penalty=self.presence_penalty,
                    logit_bias={int(key): value for key, value in self.logit_bias.items()} if self.logit_bias else None,
                    seed=None if self.seed == -1 else self.seed)


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[StrictInt]]
    max_tokens: Optional[int] = Field(16, ge=0, description="0: none (with echo: the prompt's log probabilities)")
    # The prompt's text ahead of the answer's (with logprobs: the prompt tokens' too, the first null).
    echo: bool = False
    # The log probability of each generated token and of this many most likely ones.
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    def top_logprobs_asked(self) -> int | None:
        return self.logprobs

    @model_validator(mode="after")
    def _echo_without_stream(self):
        if self.echo and self.stream:
            raise APIError(400, "echo: not implemented together with stream", param="echo",
                           code="unsupported_parameter")
        if self.max_tokens == 0 and not self.echo:
            raise APIError(400, "max_tokens: 0 generates nothing; it is meant with echo", param="max_tokens")
        return self


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[dict[str, Any]], None] = None
    tool_calls: Optional[Any] = None

    @model_validator(mode="after")
    def _refuse_tool_calls(self):
        if self.tool_calls:
            raise APIError(400, "messages: an assistant message's tool_calls are not supported by kcap serve "
                                "(tool calling is not implemented)", param="messages", code="unsupported_parameter")
        return self


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    # Variables for the chat template, as llama.cpp's server takes them (enable_thinking...);
    # reasoning_effort (OpenAI's, gpt-oss's template reads it) is one of them.
    chat_template_kwargs: Optional[dict[str, Any]] = None
    reasoning_effort: Optional[str] = None

    @model_validator(mode="after")
    def _top_logprobs_with_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs: only allowed when logprobs is true", param="top_logprobs")
        return self

    def top_logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def template_variables(self) -> dict:
        variables = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort is not None:
            variables.setdefault("reasoning_effort", self.reasoning_effort)
        return variables


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


def _error_response(status: int, message: str, type_: str = "invalid_request_error", param=None, code=None):
    return JSONResponse(status_code=status,
                        content={"error": {"message": message, "type": type_, "param": param, "code": code}})


def _message_text(message: ChatMessage, index: int) -> str:
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    texts = []
    for part in message.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise APIError(400, f"messages[{index}]: only text content parts are supported, got type "
                                f"{part.get('type')!r}", param=f"messages[{index}].content")
        texts.append(part["text"])
    return "".join(texts)


# --- generation on a worker thread -------------------------------------------------------------
class _Generation:
    """One request's generation: a thread runs it under the Model's lock and hands text pieces
    to the event loop through a queue; cancel() stops it at the next token, or within the prompt at
    the next chunk (on the CPU the next stage)."""

    def __init__(self, server: "_Server", prompt_ids: list[int], options: dict, skip_special_tokens: bool,
                 continues_text: bool, top_logprobs: int | None = None, echo_logprobs: bool = False):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancel_event = threading.Event()
        self.stats = GenerationStats()
        self.prompt_tokens = len(prompt_ids)
        self._server = server
        if top_logprobs is not None:  # each answer token's TokenLogprob goes ahead of its text
            options = dict(options, on_logprob=lambda entry: self._put(("logprob", entry)), top_logprobs=top_logprobs)
        self.prompt_logprobs = None  # echo_logprobs: the prompt tokens' TokenLogprobs, set before any text
        self._echo_logprobs = echo_logprobs and top_logprobs is not None
        self._top = top_logprobs
        self._thread = threading.Thread(target=self._work, args=(prompt_ids, options, skip_special_tokens, continues_text),
                                        name="kcap-generation", daemon=True)
        self._thread.start()

    def _put(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop has closed (server shutdown): nobody is listening
            self.cancel_event.set()

    def _work(self, prompt_ids, options, skip_special_tokens, continues_text) -> None:
        with self._server.count_lock:
            self._server.active += 1
        try:
            if self._echo_logprobs:
                self.prompt_logprobs = prompt_logprobs(self._server.model, prompt_ids, self._top, self.cancel_event)
            for piece in ids_text_stream(self._server.model, prompt_ids, skip_special_tokens=skip_special_tokens,
                                         continues_text=continues_text, chat=not continues_text,
                                         on_reasoning=lambda text: self._put(("reasoning", text)), stats=self.stats, cancel=self.cancel_event, **options):
                self._put(("text", piece))
                if self.cancel_event.is_set():
                    break
            self._put(("done", None))
        except BaseException as exc:  # reported to the client; the server keeps running
            self._put(("error", exc))
        finally:
            with self._server.count_lock:
                self._server.active -= 1

    def cancel(self) -> None:
        self.cancel_event.set()

    @property
    def finish_reason(self) -> str:
        return "stop" if self.stats.finish_reason == "stop" else "length"

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.stats.generated_tokens,
                "total_tokens": self.prompt_tokens + self.stats.generated_tokens}


def _token_text(tokenizer, token: int) -> str:
    return tokenizer.token_bytes(token).decode("utf-8", errors="replace")


def _token_logprob_item(tokenizer, token: int, logprob: float) -> dict:
    return {"token": _token_text(tokenizer, token), "logprob": logprob, "bytes": list(tokenizer.token_bytes(token))}


def _chat_logprobs(tokenizer, entries) -> dict:
    """OpenAI's chat choice logprobs: each token with its log probability, bytes and top tokens."""
    return {"content": [dict(_token_logprob_item(tokenizer, e.token, e.logprob),
                             top_logprobs=[_token_logprob_item(tokenizer, t, lp) for t, lp in e.top])
                        for e in entries],
            "refusal": None}


def _completion_logprobs(tokenizer, entries, offset: int = 0, first_token: int | None = None) -> dict:
    """OpenAI's completion choice logprobs: tokens, their log probabilities, the top tokens' by
    text, and where each token starts in the choice's text (from `offset`). An echoed prompt's
    first token (first_token; its entry None: nothing predicts it) has null ones."""
    tokens, offsets, logprobs, tops = [], [], [], []
    for e in entries:
        tokens.append(_token_text(tokenizer, first_token if e is None else e.token))
        offsets.append(offset)
        offset += len(tokens[-1])
        logprobs.append(None if e is None else e.logprob)
        tops.append(None if e is None else {_token_text(tokenizer, t): lp for t, lp in e.top})
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}


def _failure(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextOverflowError):
        return APIError(400, str(exc), code="context_length_exceeded")
    if isinstance(exc, (ValueError, ModelError)):
        return APIError(400, str(exc))
    return APIError(500, f"generation failed: {type(exc).__name__}: {exc}", type_="server_error")


class _Server:
    def __init__(self, model, model_name: str):
        self.model = model
        self.model_name = model_name
        self.created = int(time.time())
        self.active = 0
        self.count_lock = threading.Lock()

    # request -> (prompt ids, generation options), every check made before a response starts
    def prepare(self, body: _Sampling, prompt_ids: list[int], max_tokens: int | None) -> dict:
        if body.model is not None and body.model != self.model_name:
            raise APIError(404, f"The model '{body.model}' does not exist; this server serves '{self.model_name}'",
                           param="model", code="model_not_found")
        if len(prompt_ids) >= self.model.n_ctx:
            raise APIError(400, f"the prompt has {len(prompt_ids)} tokens; this model's context holds "
                                f"{self.model.n_ctx}, one of which must remain for the answer",
                           param="messages" if isinstance(body, ChatRequest) else "prompt",
                           code="context_length_exceeded")
        sampling = body.sampling()
        try:
            SamplerConfig(**sampling)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        vocab = self.model.tokenizer.vocab_size if self.model.tokenizer is not None else None
        outside = [token for token in sampling["logit_bias"] or () if vocab is not None and token >= vocab]
        if outside:
            raise APIError(400, f"logit_bias: token id {outside[0]} is outside the vocabulary [0, {vocab})",
                           param="logit_bias")
        return dict(sampling, max_tokens=max_tokens, stop=body.stop, ignore_eos=body.ignore_eos)

    async def collect(self, request: Request, generation: _Generation) -> tuple[str, str, list]:
        """The whole text of a generation, of its reasoning (a harmony model's analysis channel;
        empty for others) and the TokenLogprob of each token whose text is in it (where asked);
        cancels the generation if the client goes away meanwhile."""
        pieces, thoughts, logprobs = [], [], []
        next_check = time.monotonic() + DISCONNECT_POLL_SECONDS
        try:
            while True:
                # Every DISCONNECT_POLL_SECONDS, whether or not tokens keep coming.
                if time.monotonic() >= next_check:
                    if await request.is_disconnected():
                        generation.cancel()
                        raise APIError(499, "the client closed the connection")
                    next_check = time.monotonic() + DISCONNECT_POLL_SECONDS
                try:
                    kind, value = await asyncio.wait_for(generation.queue.get(),
                                                         max(next_check - time.monotonic(), 0.001))
                except asyncio.TimeoutError:
                    continue
                if kind == "text":
                    pieces.append(value)
                elif kind == "logprob":
                    logprobs.append(value)
                elif kind == "reasoning":
                    thoughts.append(value)
                elif kind == "done":
                    text = "".join(pieces)
                    return text, "".join(thoughts), self.within(logprobs, text)
                else:
                    raise _failure(value)
        finally:
            generation.cancel()  # a no-op once it has finished

    def within(self, logprobs: list, text: str) -> list:
        """The TokenLogprobs of the tokens whose text starts within `text` (a stop string cuts the
        tokens after it off the answer, and their log probabilities with them)."""
        kept, offset, length = [], 0, len(text.encode("utf-8"))
        for entry in logprobs:
            if offset >= length:
                break
            kept.append(entry)
            offset += len(self.model.tokenizer.token_bytes(entry.token))
        return kept

    async def events(self, generation: _Generation, chunk, include_usage: bool, usage_chunk):
        """Server-sent events of a generation: chunk(text, finish_reason, logprobs=[TokenLogprob of
        the tokens whose text it carries]) for each piece and the end, chunk(text, None,
        reasoning=True) for each piece of a harmony model's reasoning."""
        pending = []
        try:
            first = chunk(None, None)
            if first is not None:
                yield _sse(first)
            while True:
                kind, value = await generation.queue.get()
                if kind == "logprob":
                    pending.append(value)
                elif kind == "text":
                    yield _sse(chunk(value, None, logprobs=pending))
                    pending = []
                elif kind == "reasoning":
                    yield _sse(chunk(value, None, reasoning=True))
                elif kind == "done":
                    yield _sse(chunk("", generation.finish_reason))
                    if include_usage:
                        yield _sse(usage_chunk(generation.usage()))
                    break
                else:
                    error = _failure(value)
                    yield _sse({"error": {"message": error.message, "type": error.type, "param": error.param,
                                          "code": error.code}})
                    break
            yield "data: [DONE]\n\n"
        finally:
            generation.cancel()  # the client went away, or the stream ended: stop generating


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


# Browser pages served from this machine may call the API (CORS), as ollama allows by default;
# others only where kcap serve --cors-origin names them ('*': any page, as llama.cpp's server).
LOCAL_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:[0-9]+)?"


def create_app(model, model_name: str | None = None, cors_origins: Sequence[str] = ()) -> FastAPI:
    """The FastAPI application serving model under model_name (default: its file name without .gguf);
    browser pages of this machine and of cors_origins may call it."""
    from fastapi.middleware.cors import CORSMiddleware

    name = model_name or os.path.splitext(os.path.basename(model.path))[0]
    server = _Server(model, name)
    app = FastAPI(title="kcap", description="OpenAI-compatible API over a kcap model")
    app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_origin_regex=LOCAL_ORIGINS,
                       allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"])
    app.state.kcap = server

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return _error_response(exc.status, exc.message, exc.type, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        location = [str(part) for part in first.get("loc", ()) if part != "body"]
        param = ".".join(location) or None
        message = first.get("msg", "invalid request")
        return _error_response(400, f"{param}: {message}" if param else message, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = "not_found" if exc.status_code == 404 else None
        return _error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", type_, code=code)

    @app.exception_handler(Exception)
    async def _server_error(request, exc: Exception):
        error = _failure(exc)
        return _error_response(error.status, error.message, error.type, error.param, error.code)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": server.model_name, "active_generations": server.active}

    @app.get("/v1/models/{model_id:path}")
    async def model_info(model_id: str):
        if model_id != server.model_name:
            raise APIError(404, f"The model '{model_id}' does not exist; this server serves '{server.model_name}'",
                           param="model", code="model_not_found")
        return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "kcap"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": server.model_name, "object": "model", "created": server.created,
                                            "owned_by": "kcap"}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "one prompt per request", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt:
                raise APIError(400, "the prompt is empty", param="prompt")
            prompt_ids = model.tokenize(prompt, add_special_tokens=True)
        else:
            prompt_ids = [int(i) for i in prompt]
            if not prompt_ids or not all(0 <= i < model.n_vocab for i in prompt_ids):
                raise APIError(400, f"token ids must be a non-empty list of ids below {model.n_vocab}",
                               param="prompt")
        options = server.prepare(body, prompt_ids, body.max_tokens)
        top = body.top_logprobs_asked()
        generation = _Generation(server, prompt_ids, options, skip_special_tokens=False, continues_text=True,
                                 top_logprobs=top, echo_logprobs=body.echo)
        request_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        def envelope(choices, **extra):
            return {"id": request_id, "object": "text_completion", "created": created, "model": server.model_name,
                    "choices": choices, **extra}

        if body.stream:
            offset = 0

            def chunk(text, finish_reason, logprobs=()):
                nonlocal offset
                if text is None:
                    return None
                entries = _completion_logprobs(model.tokenizer, logprobs, offset) if top is not None else None
                offset += len(text)
                return envelope([{"index": 0, "text": text, "logprobs": entries, "finish_reason": finish_reason}])

            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(server.events(generation, chunk, include_usage,
                                                   lambda usage: envelope([], usage=usage)),
                                     media_type="text/event-stream")
        text, _, logprobs = await server.collect(request, generation)
        entries = None
        if top is not None:
            entries = _completion_logprobs(model.tokenizer, logprobs)
        if body.echo:
            echoed = prompt if isinstance(prompt, str) else model.detokenize(prompt_ids)
            if top is not None:
                # The prompt's tokens as its text has them: a BOS the tokenizer added is not in it.
                first = 1 if isinstance(prompt, str) and model.tokenizer.add_bos else 0
                head = _completion_logprobs(model.tokenizer, generation.prompt_logprobs[first:], 0,
                                            first_token=prompt_ids[first])
                tail = _completion_logprobs(model.tokenizer, logprobs, len(echoed))
                entries = {key: head[key] + tail[key] for key in head}
            text = echoed + text
        return envelope([{"index": 0, "text": text, "logprobs": entries, "finish_reason": generation.finish_reason}],
                        usage=generation.usage())

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": _message_text(m, i)}
                    for i, m in enumerate(body.messages)]
        try:
            prompt_ids = chat_prompt_ids(model, messages, **body.template_variables())
        except (ValueError, ModelError) as exc:
            raise APIError(400, str(exc), param="messages") from None
        max_tokens = body.max_completion_tokens or body.max_tokens
        options = server.prepare(body, prompt_ids, max_tokens)
        top = body.top_logprobs_asked()
        generation = _Generation(server, prompt_ids, options, skip_special_tokens=True, continues_text=False,
                                 top_logprobs=top)
        request_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def envelope(object_, choices, **extra):
            return {"id": request_id, "object": object_, "created": created, "model": server.model_name,
                    "choices": choices, **extra}

        if body.stream:
            def chunk(text, finish_reason, reasoning=False, logprobs=()):
                if text is None:  # the first chunk opens the assistant's message
                    delta = {"role": "assistant", "content": ""}
                elif finish_reason is not None:
                    delta = {}
                else:
                    delta = {"reasoning_content" if reasoning else "content": text}
                entries = _chat_logprobs(model.tokenizer, logprobs) if top is not None and logprobs else None
                return envelope("chat.completion.chunk",
                                [{"index": 0, "delta": delta, "logprobs": entries, "finish_reason": finish_reason}])

            include_usage = bool((body.stream_options or {}).get("include_usage"))
            return StreamingResponse(server.events(generation, chunk, include_usage,
                                                   lambda usage: envelope("chat.completion.chunk", [], usage=usage)),
                                     media_type="text/event-stream")
        text, reasoning, logprobs = await server.collect(request, generation)
        message = {"role": "assistant", "content": text}
        if reasoning:  # llama.cpp's server's field for a reasoning model's thinking
            message["reasoning_content"] = reasoning
        return envelope("chat.completion",
                        [{"index": 0, "message": message,
                          "logprobs": _chat_logprobs(model.tokenizer, logprobs) if top is not None else None,
                          "finish_reason": generation.finish_reason}],
                        usage=generation.usage())

    return app


def serve(model, host: str = "127.0.0.1", port: int = 8000, model_name: str | None = None,
          log_level: str = "info", quiet: bool = False, cors_origins: Sequence[str] = ()) -> None:
    """Runs the server until Ctrl-C (or SIGTERM)."""
    try:
        import uvicorn
    except ImportError:
        raise KcapError("kcap serve needs uvicorn: pip install 'kcap[server]'") from None
    app = create_app(model, model_name, cors_origins)
    if not quiet:
        print(f"kcap: serving '{app.state.kcap.model_name}' at http://{host}:{port}/v1", file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning" if quiet else log_level)
