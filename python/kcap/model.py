"""kcap.load(path) -> Model: the Python API over one planned engine.

Loading reads the GGUF (memory-mapped), builds the architecture's ModelSpec, registers
exactly the tensors the spec names (raw blocks, no copies; a file with tensors the plan does
not use is refused, kcap.accounting), builds the tokenizer from the metadata, and plans every
stage on the backend (kcap.RoutingError if a stage has no row).
"""
from __future__ import annotations

import numbers
import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np

from kcap import _core
from kcap.accounting import check_tensors
from kcap.arch import build_spec, known_unused_tensors
from kcap.errors import BackendUnavailableError, ContextOverflowError, FormatError, InvalidArgumentError, \
    InvalidArgumentTypeError, ModelError
from kcap.gguf import GGUFFile

# LayerSpec / ModelSpec fields that hold tensor names (the rest are numbers and enums): one list,
# in the core (KCAP_LAYER_TENSOR_FIELDS / KCAP_MODEL_TENSOR_FIELDS of model_spec.h).
LAYER_TENSOR_FIELDS = _core.LAYER_TENSOR_FIELDS
MODEL_TENSOR_FIELDS = _core.MODEL_TENSOR_FIELDS


def tensor_views(spec) -> dict:
    """Views an arch module declared: name -> (base tensor, offset, count) (e.g. fused QKV)."""
    return getattr(spec, "views", {})


def referenced_tensors(spec) -> list[str]:
    """File tensors the spec uses, in order; a view contributes its base tensor."""
    views = tensor_views(spec)
    names = [getattr(spec, f) for f in MODEL_TENSOR_FIELDS]
    for layer in spec.layers:
        names.extend(getattr(layer, f) for f in LAYER_TENSOR_FIELDS)
    seen, ordered = set(), []
    for name in names:
        name = views[name][0] if name in views else name
        if name and name not in seen:
            seen.add(name)
            ordered.append(name)
    return ordered


def folded_tensors(spec) -> list[str]:
    """File tensors an arch module read into the spec's numbers (e.g. a scalar layer scale):
    used, but not registered with the core."""
    return list(getattr(spec, "folded_tensors", []))


def register_tensors(spec, gguf: GGUFFile, progress=None) -> None:
    """Registers the tensors the spec references, after refusing a file that holds tensors the
    plan does not use (kcap.accounting.check_tensors)."""
    check_tensors(gguf, spec.architecture, referenced_tensors(spec) + folded_tensors(spec),
                  known_unused_tensors(spec.architecture))
    supported = set(_core.supported_formats())
    for name in referenced_tensors(spec):
        info = gguf.tensors.get(name)
        if info is None:
            raise ModelError(f"{gguf.path}: missing tensor '{name}'")
        if info.type_name not in supported:
            raise FormatError(
                f"{gguf.path}: tensor '{name}' has type {info.type_name} (GGML type {info.ggml_type}), "
                f"which kcap does not decode (supported: {', '.join(sorted(supported))})"
            )
        spec.add_tensor(name, info.ggml_type, list(info.shape), info.data)
        if progress is not None:
            progress.update(1)
    for name, (base, offset, count) in tensor_views(spec).items():
        spec.add_tensor_view(name, base, offset, count)


MAX_THREADS = 1024  # the most CPU threads a model takes (n_threads)


def _check_count(name: str, value, minimum: int, maximum: int | None, allowed: str) -> None:
    """A count argument: None (its default) or an integer in [minimum, maximum]; never coerced."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgumentTypeError(f"{name} = {value!r}: expected {allowed}")
    if value < minimum or (maximum is not None and value > maximum):
        raise InvalidArgumentError(f"{name} = {value}: expected {allowed}")


class Model:
    """A GGUF model planned on one backend, with its tokenizer and KV cache.

    A Model may be shared by threads: one lock serializes every engine call, and a generation
    holds it from its prefill to its last token, so concurrent generations run one after the
    other and each sees only its own tokens in the KV cache. A generator from stream() or
    chat_stream() holds the lock until it is exhausted or closed."""

    def __init__(
        self,
        path: str | os.PathLike,
        backend: str | None = None,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        kv_type: str = "f32",
        activations: str = "f32",
        max_batch: int = 512,
        excluded_kernels: Sequence[str] = (),
        progress: bool = False,
        profile: bool = False,
        check_finite: bool = False,
    ):
        from kcap.tokenizer import load_tokenizer

        from kcap.hub import resolve_model_path

        _check_count("n_ctx", n_ctx, 1, None, "a positive number of tokens, or None for the model's own context")
        _check_count("n_threads", n_threads, 1, MAX_THREADS, f"1 .. {MAX_THREADS}, or None for one per core")
        _check_count("max_batch", max_batch, 1, None, "a positive number of tokens")
        bar = _progress_bar(progress)
        self.path = resolve_model_path(path)
        self.gguf = GGUFFile(self.path)
        _step(bar, "architecture")
        self.spec = build_spec(self.gguf)
        _step(bar, "tokenizer")
        # A file without a vocabulary ("no_vocab", e.g. a synthetic layout) is driven by ids.
        has_vocab = self.gguf.metadata.get("tokenizer.ggml.model", "no_vocab") != "no_vocab"
        self.tokenizer = load_tokenizer(self.gguf.metadata) if has_vocab else None
        names = referenced_tensors(self.spec)
        if bar is not None:
            bar.total = len(names) + 3
            bar.set_description("tensors")
        register_tensors(self.spec, self.gguf, bar)
        _step(bar, "planning")
        backend = backend or default_backend()
        check_backend(backend)
        self.backend = backend
        # Tokens per engine.eval call of a prompt: max_batch on every backend, the batch each
        # matmul takes. On the CPU each call decodes every weight row once for all its tokens, and
        # a mixture of experts gives each expert its share of them, so shorter chunks cost a large
        # part of a prefill (docs/benchmarks.md). Neither a stop nor a cancellation waits for a
        # chunk's end: the CPU engine checks between stages (every 10 ms at most) for Ctrl-C on
        # the main thread and for the cancel event on any thread, and stops with the cache at the
        # last whole chunk; a GPU's chunk takes tens of milliseconds. Fixed per load, so a
        # prompt's chunks (and so its numbers) never depend on timing.
        self.prefill_chunk = max_batch
        cublas = locate_cublas() if backend == "cuda" and activations == "bf16" else None
        self.engine = _core.Engine(
            self.spec,
            backend=backend,
            kv_type=kv_type,
            activations=activations,
            n_ctx=int(n_ctx or 0),
            n_threads=int(n_threads or 0),
            max_batch=max_batch,
            excluded_kernels=list(excluded_kernels),
            profile=profile,
            cublas_library=cublas or "",
            check_finite=check_finite,
        )
        if bar is not None:
            bar.update(1)
            bar.close()
        self._cached: list[int] = []  # token ids whose K/V the engine holds, in order
        self._lock = threading.Lock()
        self._generating_thread: int | None = None  # the thread whose generation holds the lock
        self.last_stats = None  # kcap.generate.GenerationStats of the latest generation
        self.last_prefill_reused = 0  # prompt tokens the latest prefill found in the cache

    # --- the lock -------------------------------------------------------------------
    @contextmanager
    def locked(self):
        """Holds the Model's lock (the engine and its KV cache) for a block of calls. Calls made
        inside must be the unlocked ones (_eval, _prefill, ...), as a generation's are."""
        if self._generating_thread == threading.get_ident():
            raise ModelError(
                "this thread has a generation open on this Model (a stream() or chat_stream() not yet "
                "exhausted or closed); finish it or call its close() before using the Model again"
            )
        with self._lock:
            self._generating_thread = threading.get_ident()
            try:
                self._sync()
                yield
            finally:
                self._generating_thread = None

    def _sync(self) -> None:
        """Makes the record of cached tokens agree with the engine's n_past: an interrupt that
        arrives just after an engine call returns can leave the record one call behind."""
        n_past = int(self.engine.n_past)
        if n_past != len(self._cached):
            keep = min(n_past, len(self._cached))
            self.engine.truncate(keep)
            self._cached = self._cached[:keep]

    # --- properties -----------------------------------------------------------------
    @property
    def architecture(self) -> str:
        return self.spec.architecture

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    @property
    def n_vocab(self) -> int:
        return self.engine.n_vocab

    # --- tokens ---------------------------------------------------------------------
    def _require_tokenizer(self):
        if self.tokenizer is None:
            raise ModelError(f"{self.path} has no tokenizer (tokenizer.ggml.model is 'no_vocab'); pass token ids")
        return self.tokenizer

    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._require_tokenizer().encode(text, add_special_tokens=add_special_tokens)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._require_tokenizer().decode(self.token_ids(ids, "detokenize"))

    def token_ids(self, ids: Sequence[int], what: str = "token ids") -> list[int]:
        """ids as a list of Python ints, checked, never coerced: each an integer (a float or a
        bool is refused, so 5.7 never runs as 5) within the vocabulary (an int64 id of 2^32 + 2
        never wraps to 2)."""
        out = []
        n_vocab = self.n_vocab
        for index, value in enumerate(ids):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise InvalidArgumentTypeError(f"{what}: id [{index}] = {value!r} is not an integer")
            value = int(value)
            if not 0 <= value < n_vocab:
                raise InvalidArgumentError(f"{what}: id [{index}] = {value} is outside the vocabulary "
                                           f"(0 .. {n_vocab - 1})")
            out.append(value)
        return out

    # --- evaluation -----------------------------------------------------------------
    def reset(self) -> None:
        """Empties the KV cache."""
        with self.locked():
            self._reset()

    def _reset(self) -> None:
        self.engine.reset()
        self._cached = []

    def eval(self, ids: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Appends ids after what the cache holds; returns the last position's logits
        (float32 [vocab]) or every new position's ([len(ids), vocab]) when all_logits."""
        with self.locked():
            return self._eval(ids, all_logits)

    def _eval(self, ids: Sequence[int], all_logits: bool = False, cancel=None) -> np.ndarray | None:
        ids = self.token_ids(ids, "eval")
        if not ids:
            raise InvalidArgumentError("eval needs at least one token id")
        parts = []
        step = self.prefill_chunk
        for start in range(0, len(ids), step):
            if cancel is not None and cancel.is_set():
                return None
            chunk = ids[start:start + step]
            try:
                logits = self.engine.eval(np.asarray(chunk, dtype=np.int32), all_logits, cancel=cancel)
                if logits is None:  # cancelled while it ran: the engine's cache is where it was
                    return None
                self._cached.extend(chunk)
            except BaseException:
                # A KeyboardInterrupt lands when the engine call returns, before the chunk is
                # recorded: the cache is cut back to what _cached says it holds.
                self.engine.truncate(len(self._cached))
                raise
            parts.append(logits)
        return np.concatenate(parts) if all_logits else parts[-1]

    def decode_next(self, token: int, step) -> int:
        """Appends token through step(engine) (engine.decode_greedy / decode_sample with n=1:
        the engine evaluates token and chooses the next one on the device); returns the choice."""
        with self.locked():
            return self._decode_next(token, step)

    def _decode_next(self, token: int, step) -> int:
        choice = int(step(self.engine)[0])
        self._cached.append(int(token))
        return choice

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Logits of the last position after running token_ids from an empty cache: [vocab]."""
        with self.locked():
            ids = self.token_ids(token_ids, "logits")  # checked before the cache is emptied
            if not ids:
                raise InvalidArgumentError("logits needs at least one token id")
            self._reset()
            return self._eval(ids)

    def explain(self) -> list[dict]:
        """The engine's plan, one dict per route of each stage: layer, stage, op, formats, dims,
        features, kernel, backend, and the tokens per call it takes (tokens_min .. tokens_max,
        None for no bound). A stage's routes cover 1 .. max_batch exactly once."""
        with self.locked():
            return self.engine.routes()

    def trace(self, token_ids: Sequence[int]) -> list[dict]:
        """Evaluates token_ids from an empty cache in one call, as eval does, and returns what
        ran: one dict per stage call (layer, stage, kernel, n_tokens), in order. Each kernel is
        the route explain() lists for that stage and n_tokens. The cache then holds token_ids."""
        ids = self.token_ids(token_ids, "trace")
        if not ids:
            raise InvalidArgumentError("trace needs at least one token id")
        self._cached = []
        ran, _ = self.engine.trace(np.asarray(ids, dtype=np.int32))
        self._cached = ids
        return ran

    # --- generation -----------------------------------------------------------------
    def prefill(self, prompt_ids: Sequence[int]) -> np.ndarray:
        """Runs the prompt, reusing the longest cached prefix; returns the last logits."""
        with self.locked():
            return self._prefill(prompt_ids)

    def _prefill(self, prompt_ids: Sequence[int], cancel=None) -> np.ndarray | None:
        """prefill under the lock; returns None if cancel (a threading.Event) is set: checked between
        chunks and, on the CPU, between the stages of a chunk."""
        prompt_ids = self.token_ids(prompt_ids, "prompt")
        if not prompt_ids:
            raise InvalidArgumentError("the prompt is empty")
        if len(prompt_ids) >= self.n_ctx:
            raise ContextOverflowError(
                f"prompt of {len(prompt_ids)} tokens does not fit the context of {self.n_ctx} tokens "
                "(one position must remain for the first generated token)"
            )
        common = 0
        for a, b in zip(self._cached, prompt_ids):
            if a != b:
                break
            common += 1
        common = min(common, len(prompt_ids) - 1)  # always evaluate ≥ 1 token to get logits
        self.engine.truncate(common)
        self._cached = self._cached[:common]
        self.last_prefill_reused = common
        return self._eval(prompt_ids[common:], cancel=cancel)

    def generate_ids(self, prompt_ids: Sequence[int], max_tokens: int | None = 256, ignore_eos: bool = False,
                     **sampling) -> Iterator[int]:
        """Yields generated token ids: stops at EOS (unless ignore_eos), max_tokens (None: no
        limit), or the context end. Options: the sampling ones, stats (a GenerationStats to
        fill in), cancel (a threading.Event that stops the generation between tokens, and in a prompt
        between chunks or, on the CPU, between stages)."""
        from kcap.generate import token_stream

        yield from token_stream(self, prompt_ids, max_tokens=max_tokens, ignore_eos=ignore_eos, **sampling)

    def stream(self, prompt: str, max_tokens: int | None = 256, stop: Sequence[str] | str | None = None,
               add_special_tokens: bool = True, **sampling) -> Iterator[str]:
        """Yields pieces of generated text as they complete; see generate for the options."""
        from kcap.generate import text_stream

        yield from text_stream(self, prompt, max_tokens=max_tokens, stop=stop,
                               add_special_tokens=add_special_tokens, **sampling)

    def generate(self, prompt: str, max_tokens: int | None = 256, temperature: float = 0.0, top_k: int = 0,
                 top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0, seed: int | None = None,
                 stop: Sequence[str] | str | None = None, ignore_eos: bool = False,
                 add_special_tokens: bool = True, frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 logit_bias: dict | None = None) -> str:
        """Generates text after prompt. temperature 0 is greedy. Stops at EOS, a stop string
        (not included in the result), max_tokens, or the end of the context. The penalties count
        the last 64 tokens (prompt included), as llama.cpp's; logit_bias: {token id: value added to
        its logit}."""
        return "".join(self.stream(prompt, max_tokens=max_tokens, stop=stop, temperature=temperature, top_k=top_k,
                                   top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty, seed=seed,
                                   ignore_eos=ignore_eos, add_special_tokens=add_special_tokens,
                                   frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                                   logit_bias=logit_bias))

    # --- chat -----------------------------------------------------------------------
    def chat_stream(self, messages: Sequence[dict], max_tokens: int | None = None,
                    stop: Sequence[str] | str | None = None, on_reasoning=None,
                    chat_template_kwargs: dict | None = None, **sampling) -> Iterator[str]:
        """Yields the assistant's answer to messages ([{"role": "system"|"user"|"assistant",
        "content": str}, ...]) as pieces of text. The messages go through the GGUF's chat
        template; the answer ends at the template's end-of-turn token (not shown), a stop
        string, max_tokens (None: no limit) or the end of the context. Successive turns of
        one conversation reuse the cached K/V of the turns before. A model that reasons before it
        answers (gpt-oss's harmony channels, <think> blocks) answers with its final text; the text
        of its reasoning goes to on_reasoning(text) where given. chat_template_kwargs: variables for
        the template, as transformers' apply_chat_template and llama.cpp's server take them (e.g.
        {"enable_thinking": False} for Qwen3, {"reasoning_effort": "high"} for gpt-oss). Sampling
        options as generate."""
        from kcap.generate import chat_prompt_ids, ids_text_stream

        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
            raise InvalidArgumentError(f"chat_template_kwargs must be a dict, got {chat_template_kwargs!r}")
        prompt_ids = chat_prompt_ids(self, messages, **(chat_template_kwargs or {}))
        yield from ids_text_stream(self, prompt_ids, max_tokens=max_tokens, stop=stop, skip_special_tokens=True,
                                   chat=True, on_reasoning=on_reasoning, **sampling)

    def chat(self, messages: Sequence[dict], max_tokens: int | None = None,
             stop: Sequence[str] | str | None = None, on_reasoning=None,
             chat_template_kwargs: dict | None = None, **sampling) -> str:
        """The assistant's answer to messages, as one string; see chat_stream."""
        return "".join(self.chat_stream(messages, max_tokens=max_tokens, stop=stop, on_reasoning=on_reasoning,
                                        chat_template_kwargs=chat_template_kwargs, **sampling))


def _progress_bar(enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=4, desc="loading", unit="step", file=sys.stderr, leave=False)


def _step(bar, name: str) -> None:
    if bar is not None:
        bar.set_description(name)
        bar.update(1)


def default_backend() -> str:
    """The backend load() uses when none is named: "cuda" where the build has the CUDA backend
    and a CUDA device is visible, else "metal" on a Mac whose build has Metal and a Metal
    device, else "cpu"."""
    if _core.cuda_device_available():
        return "cuda"
    if sys.platform == "darwin" and _core.metal_device_available():
        return "metal"
    return "cpu"


def check_backend(backend: str) -> None:
    """Refuses, with kcap.BackendUnavailableError, a named backend this build or machine cannot run
    (planning refuses backends the build lacks too; this also covers a build without a device)."""
    if backend == "cuda" and not _core.cuda_device_available():
        where = ("no CUDA device is visible (check the driver and CUDA_VISIBLE_DEVICES)" if _core.cuda_built
                 else "the CUDA backend is not compiled into this build (it was built without nvcc)")
        raise BackendUnavailableError(f"backend 'cuda' is unavailable: {where}; "
                                      f"use backend='cpu', or leave it out to pick {default_backend()!r}")
    if backend == "metal" and not _core.metal_device_available():
        raise BackendUnavailableError(
            "backend 'metal' is unavailable: " + ("no Metal device is visible; " if sys.platform == "darwin" else
            "the Metal backend is not compiled into this build (it needs a Mac); ") +
            f"use backend='cpu', or leave it out to pick {default_backend()!r}")


def locate_cublas() -> str | None:
    """The libcublas for the CUDA bf16 rows (cuda/matmul_gemm.cu loads it at run time): None where
    KCAP_CUBLAS_LIBRARY names one or the loader finds it by its soname or in the CUDA toolkit
    (the engine then loads that), else the newest copy in pip's NVIDIA package (nvidia-cublas,
    which PyTorch installs: nvidia/cu13/lib or nvidia/cublas/lib), which kcap.load hands to the
    engine. The process environment is left as it is."""
    import ctypes
    import glob
    import importlib.util

    if os.environ.get("KCAP_CUBLAS_LIBRARY"):
        return None
    for name in ("libcublas.so.13", "libcublas.so.12", "/usr/local/cuda/lib64/libcublas.so"):
        try:
            ctypes.CDLL(name)
            return None
        except OSError:
            pass

    def major(path: str) -> int:  # libcublas.so.13 -> 13
        version = path.rsplit(".so.", 1)[-1].split(".")[0]
        return int(version) if version.isdigit() else 0

    spec = importlib.util.find_spec("nvidia")
    found = [path for base in ((spec.submodule_search_locations or []) if spec else [])
             for path in glob.glob(os.path.join(base, "*", "lib", "libcublas.so.*"))]
    return max(found, key=major) if found else None  # the newest cuBLAS


def load(path: str | os.PathLike, backend: str | None = None, **options) -> Model:
    """Loads a GGUF model and plans it on a backend ("cpu"; "cuda" and "metal" where built;
    default: default_backend(): CUDA where built and a device exists, else Metal on a Mac with
    a Metal device, else the CPU; model.backend says which).

    path: a GGUF file, or a Hugging Face Hub file "hf://ORG/REPO/FILE.gguf" (or
    "hf://ORG/REPO@REVISION/FILE.gguf"), downloaded once into the Hub cache (needs kcap[hub]).

    Options: n_ctx (default: the model's context length), n_threads, kv_type ("f32"/"f16"),
    activations ("f32", exact, the default; "q8_1": matmuls may round their input to int8 per
    32 values as llama.cpp does, where the backend has such rows: CUDA; "bf16": a prefill batch's
    matmuls round their weights and input to bf16 and run on cuBLAS, as a bf16 model in PyTorch
    computes; decode stays exact; CUDA, needs libcublas), max_batch (the most tokens per call;
    kcap explain shows the plan's routes per range of tokens per call), excluded_kernels,
    progress (show a loading bar), check_finite (CPU: raise NumericalError naming the first stage
    that writes NaN or infinity; tests turn it on), profile (CUDA: per-stage times on stderr when the model is
    freed)."""
    return Model(path, backend=backend, **options)
