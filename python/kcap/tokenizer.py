"""Text <-> token ids for GGUF models, rebuilt from the file's tokenizer metadata.

A GGUF carries no tokenizer.json. It stores the vocabulary, merges, token types and special ids
under llama.cpp's `tokenizer.ggml.*` keys. We rebuild a Hugging Face `tokenizers` pipeline from
them exactly the way transformers does when it loads a GGUF
(transformers/integrations/gguf/gguf_tokenizer_mapping.py plus the GemmaTokenizer, LlamaTokenizer
and GPT2Tokenizer classes it hands the vocabulary to), so kcap produces the same ids as
`AutoTokenizer.from_pretrained(..., gguf_file=...)` except where that differs from the model's own
tokenizer and llama.cpp (below). tests/python/test_tokenizer.py holds kcap to goldens made by
transformers and llama.cpp (scripts/make_tokenizer_goldens.py) and to llama.cpp's vocabulary tests.

Deliberate differences from transformers:
  * a SentencePiece ("llama") vocabulary honours tokenizer.ggml.add_space_prefix = false, and its
    prefix space goes in front of every stretch of text as SentencePiece and llama.cpp put it
    (also before text that starts with a space, and after each special token);
  * "starcoder" and "smollm" byte-level vocabularies split each numeric character off first and
    Llama 3's ("llama-bpe", ...) take a word that is a token whole, as the models' own
    tokenizer.json files and llama.cpp do (transformers' GGUF loader splits no digits off);
  * eos_ids also holds the end-of-turn tokens llama.cpp stops on (see _END_OF_GENERATION_TOKENS).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers.models import BPE

from kcap.errors import InvalidArgumentError, KcapError

__all__ = [
    "StreamDecoder",
    "Tokenizer",
    "TokenizerMetadataError",
    "UnsupportedTokenizerError",
    "load_tokenizer",
]


class TokenizerMetadataError(KcapError, ValueError):
    """The GGUF's tokenizer metadata lacks a key kcap needs, or holds a value it cannot use (a
    KcapError like every kcap error; still a ValueError for callers that caught that)."""


class UnsupportedTokenizerError(TokenizerMetadataError):
    """The GGUF names a tokenizer model or pre-tokenizer that kcap does not implement."""


# llama.cpp's token types (tokenizer.ggml.token_type).
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4

_SPIECE_SPACE = "\u2581"  # SentencePiece's visible space, "▁"

# Architectures whose "llama" (SentencePiece) vocabulary transformers builds its own way.
_GEMMA_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3"})

# Splitting regexes transformers uses for byte-level vocabularies, keyed by tokenizer.ggml.pre.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# DeepSeek LLM (and DeepSeek-V2's files): a sequence of isolating splits, as its tokenizer.json and
# llama.cpp (LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM) define it: line breaks, runs of Latin/Greek/
# Cyrillic-like letters with an optional leading space, runs of ASCII and full-width punctuation,
# trailing whitespace, CJK / Hangul runs, digit runs.
_DEEPSEEK_LLM_SPLITS = (
    "[\r\n]",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    "\\p{N}+",
)
# DeepSeek V3 / R1 (llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM, as its tokenizer.json defines
# it): digit runs of up to three, CJK / kana runs, then one split of ASCII punctuation with the
# letters after it, letter runs with one leading non-letter, punctuation runs and whitespace.
_DEEPSEEK_V3_SPLITS = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)
# StarCoder, SmolLM and Refact (their tokenizer.json files: a Digits
# pre-tokenizer, then byte-level's GPT-2 regex; llama.cpp's LLAMA_VOCAB_PRE_TYPE_STARCODER and the
# types it shares that case with): each numeric character alone first, so " 42" is " ", "4", "2"
# and " ½" is " ", "½".
_DIGITS_THEN_GPT2_SPLITS = (
    r"\p{N}",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
)
# DeepSeek Coder (llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_CODER): line breaks, letter runs and
# punctuation runs with an optional leading space, CJK / Hangul runs, each digit alone.
_DEEPSEEK_CODER_SPLITS = (
    "[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    r"\p{N}",
)
# None means the GPT-2 regex built into the ByteLevel pre-tokenizer. transformers uses it for every
# `pre` it has no regex for; we list the ones we accept explicitly so an unknown `pre` fails loudly
# instead of quietly tokenizing with the wrong regex.
_BYTE_LEVEL_SPLITS: dict[str, str | tuple[str, ...] | None] = {
    "default": None,
    "gpt-2": None,
    "gpt2": None,
    "smollm": _DIGITS_THEN_GPT2_SPLITS,
    "starcoder": _DIGITS_THEN_GPT2_SPLITS,
    "refact": _DIGITS_THEN_GPT2_SPLITS,
    "deepseek-coder": _DEEPSEEK_CODER_SPLITS,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT,
    "falcon-h1": _LLAMA3_SPLIT,
    "pixtral": _LLAMA3_SPLIT,
    "midm-2.0": _LLAMA3_SPLIT,
    "lfm2": _LLAMA3_SPLIT,
    "jina-v5-nano": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "tekken": _TEKKEN_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "kormo": _QWEN2_SPLIT,
    "f2llmv2": _QWEN2_SPLIT,
    "megrez": _QWEN2_SPLIT,
    "qwen35": _QWEN35_SPLIT,
    "gpt-4o": _GPT4O_SPLIT,
    "llama4": _GPT4O_SPLIT,
    "kanana2": _GPT4O_SPLIT,
    "talkie": _GPT4O_SPLIT,
    "minimax-m2": _GPT4O_SPLIT,
    "deepseek-llm": _DEEPSEEK_LLM_SPLITS,
    "deepseek-v3": _DEEPSEEK_V3_SPLITS,
}

# Pre-tokenizers whose words are looked up whole before any merge (a word that is itself a token is
# that token, even where the merges would not build it), as their tokenizer.json says
# ("ignore_merges": true) and llama.cpp does (tokenizer_ignore_merges): Llama 3's " Việt" is one
# token, which merging splits into three.
_IGNORE_MERGES_PRES = frozenset(
    {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano", "tekken"}
)

# Token texts llama.cpp treats as end of generation wherever a vocabulary has them (llama-vocab.cpp).
# Few GGUFs name their end-of-turn token in metadata (Gemma 3's does not name <end_of_turn>), and a
# chat model that is not stopped there keeps writing the next turn itself.
_END_OF_GENERATION_TOKENS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",  # o200k_harmony (gpt-oss)
        "<|call|>",  # o200k_harmony
        "<|flush|>",  # solar-open
        "<|calls|>",  # solar-open
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",  # Kimi-K2
        "[EOS]",  # Kimi-K2
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",  # Gemma: a Gemma 3 instruct file names <end_of_turn> its EOS and may still emit <eos>
        "<turn|>",  # Gemma 4's end of turn
        "<|tool_response>",  # Gemma 4
        "<\uff5cend\u2581of\u2581sentence\uff5c>",  # DeepSeek
        "[e~[",  # MiniMax
    }
)
# Fill-in-the-middle tokens also end a generation in llama.cpp: the ids the metadata names, or else
# the first token spelled as one of these (llama-vocab.cpp's detection, in its order of keys).
_FIM_END_TOKENS = {
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}


def _end_of_generation_ids(metadata: dict, tokens: list[str], special_ids: dict) -> set[int]:
    """The ids that end a generation, as llama.cpp's vocabulary computes its EOG set."""
    ids = {index for index, token in enumerate(tokens) if token in _END_OF_GENERATION_TOKENS}
    for name, spellings in _FIM_END_TOKENS.items():
        named = _optional_token_id(metadata, f"tokenizer.ggml.{name}_token_id", len(tokens))
        if named is None:
            named = next((index for index, token in enumerate(tokens) if token in spellings), None)
        if named is not None:
            ids.add(named)
    ids.update(special_ids[name] for name in ("eos", "eot", "eom") if special_ids[name] is not None)
    spelled = {tokens[index]: index for index in ids}
    # Harmony (gpt-oss) and solar-open end a message with <|end|> and go on to the next one (the
    # final answer after the analysis): <|return|> or <|call|> ends the generation there.
    if "<|end|>" in spelled and (
        ("<|return|>" in spelled and "<|call|>" in spelled) or ("<|calls|>" in spelled and "<|flush|>" in spelled)
    ):
        ids.discard(spelled["<|end|>"])
    # Gemma 4 and PLaMo spell </s> as an ordinary token.
    if "</s>" in spelled and ("<|tool_response>" in spelled or "<|plamo:eos|>" in tokens):
        ids.discard(spelled["</s>"])
    return ids


@functools.cache
def _byte_of_unicode() -> dict[str, int]:
    return {c: b for b, c in _bytes_to_unicode().items()}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level vocabularies are spelled in."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    characters = printable[:]
    shift = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + shift)
            shift += 1
    return dict(zip(printable, map(chr, characters)))


def _require(metadata: dict, key: str) -> Any:
    if key not in metadata or metadata[key] is None:
        raise TokenizerMetadataError(f"GGUF tokenizer metadata is missing the required key {key!r}")
    return metadata[key]


def _require_list(metadata: dict, key: str, length: int | None = None) -> list:
    value = _require(metadata, key)
    if not isinstance(value, (list, tuple)):
        raise TokenizerMetadataError(f"GGUF metadata {key!r} should be a list, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise TokenizerMetadataError(
            f"GGUF metadata {key!r} has {len(value)} entries but tokenizer.ggml.tokens has {length}"
        )
    return list(value)


def _optional_token_id(metadata: dict, key: str, vocab_size: int) -> int | None:
    token_id = metadata.get(key)
    if token_id is None:
        return None
    if not isinstance(token_id, int) or not 0 <= token_id < vocab_size:
        raise TokenizerMetadataError(f"GGUF metadata {key!r} = {token_id!r} is not a token id below {vocab_size}")
    return token_id


def _merges_from_metadata(metadata: dict) -> list[tuple[str, str]] | None:
    merges = metadata.get("tokenizer.ggml.merges")
    if merges is None:
        return None
    pairs = []
    for merge in merges:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise TokenizerMetadataError(f"tokenizer.ggml.merges entry {merge!r} is not two tokens split by one space")
        pairs.append((parts[0], parts[1]))
    return pairs


def _merges_best_first(tokens_best_first, known: set[str]) -> list[tuple[str, str]]:
    """Each token's splits into two known tokens, longer left part first, token after token.

    For tokens ranked best-first without ties this is exactly the order transformers'
    `generate_merges` sorts merges into, without sorting half a million pairs.
    """
    return [
        (left, right)
        for token in tokens_best_first
        for cut in range(len(token) - 1, 0, -1)
        if (left := token[:cut]) in known and (right := token[cut:]) in known
    ]


def _merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """BPE merges for a vocabulary stored without any, as transformers' `generate_merges` rebuilds them.

    Every split of a token into two vocabulary tokens is a merge; merges rank by the token's score
    (best first), then by longer left part, ties keeping the vocabulary's order.
    """
    if len(set(scores.values())) == len(scores):
        return _merges_best_first(sorted(scores, key=scores.__getitem__, reverse=True), set(vocab))
    ranked = []
    for token, score in scores.items():
        splits = [
            (token[:cut], token[cut:]) for cut in range(1, len(token)) if token[:cut] in vocab and token[cut:] in vocab
        ]
        splits.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        ranked.extend((left, right, score) for left, right in splits)
    ranked.sort(key=lambda merge: (merge[2], len(merge[0]), len(merge[1])), reverse=True)
    return [(left, right) for left, right, _ in ranked]


class _Pipeline:
    """A built `tokenizers` backend plus what StreamDecoder needs to reproduce its decoder piecewise."""

    def __init__(self, backend: BackendTokenizer, vocab: dict[str, int], piece_decoder, leading_spaces_to_strip: int):
        self.backend = backend
        self.vocab = vocab  # the model's vocabulary as the backend spells it
        # The backend's decoder minus any final Strip: it is safe to apply to a stream in pieces.
        self.piece_decoder = piece_decoder
        self.leading_spaces_to_strip = leading_spaces_to_strip


def _spm_piece_decoder():
    return decoders.Sequence([decoders.Replace(_SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])


def _build_gemma(metadata: dict, tokens: list[str]) -> _Pipeline:
    # Gemma files store whitespace-only tokens ("  ") with real spaces while the normalizer turns
    # spaces into "▁", so they are respelled first (as transformers' gemma_tokenizer does).
    respelled = [_SPIECE_SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {token: index for index, token in enumerate(respelled)}
    merges = _merges_from_metadata(metadata)
    if merges is None:
        # Gemma's scores do not follow its merge order; the order tokens appear in the file does
        # (transformers ranks by position, a repeated token by its last one).
        best_first = respelled if len(vocab) == len(respelled) else sorted(vocab, key=vocab.__getitem__)
        merges = _merges_best_first(best_first, set(vocab))
    unknown_id = _optional_token_id(metadata, "tokenizer.ggml.unknown_token_id", len(tokens))
    unknown = respelled[unknown_id] if unknown_id is not None else ("<unk>" if "<unk>" in vocab else None)
    backend = BackendTokenizer(
        BPE(vocab=vocab, merges=merges, unk_token=unknown, fuse_unk=True, byte_fallback=True, dropout=None)
    )
    # Gemma's converter writes add_space_prefix = false (its SentencePiece model adds no prefix
    # space; transformers neither). A file that sets it true asks for one, which llama.cpp adds.
    prefix_space = metadata.get("tokenizer.ggml.add_space_prefix") is True
    steps = [normalizers.Replace(" ", _SPIECE_SPACE)]
    if prefix_space:
        steps.insert(0, normalizers.Prepend(_SPIECE_SPACE))
    backend.normalizer = normalizers.Sequence(steps) if prefix_space else steps[0]
    backend.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    decoder = _spm_piece_decoder()
    if prefix_space:
        decoder = decoders.Sequence([decoder, decoders.Strip(content=" ", left=1, right=0)])
    backend.decoder = decoder
    return _Pipeline(backend, vocab, _spm_piece_decoder(), leading_spaces_to_strip=1 if prefix_space else 0)


def _build_sentencepiece(metadata: dict, tokens: list[str]) -> _Pipeline:
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = _merges_from_metadata(metadata)
    if merges is None:
        scores = _require_list(metadata, "tokenizer.ggml.scores", len(tokens))
        merges = _merges_from_scores(vocab, dict(zip(tokens, scores)))
    add_prefix_space = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    backend = BackendTokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None))
    # SentencePiece's dummy prefix: every stretch of text gets one "▁" in front, also one that
    # already starts with a space (" Hello" -> "▁▁Hello") and one that follows a special token
    # ("<s>[INST]" -> "<s>", "▁[", ...): the tokenizers library normalizes each stretch between
    # added tokens on its own. That is SentencePiece's and llama.cpp's encoding (llama.cpp's
    # ggml-vocab-llama-spm test strings, whose ids come from the original Hugging Face tokenizer,
    # and its tokenizer on chat prompts); a Metaspace pre-tokenizer with prepend_scheme "first",
    # transformers' choice for GGUF files, drops both spaces.
    steps = [normalizers.Replace(" ", _SPIECE_SPACE)]
    if add_prefix_space:
        steps.insert(0, normalizers.Prepend(_SPIECE_SPACE))
    backend.normalizer = normalizers.Sequence(steps)
    backend.pre_tokenizer = None
    # The prefix space added while encoding is taken back off the front when decoding.
    leading_spaces_to_strip = 1 if add_prefix_space else 0
    steps = [decoders.Replace(_SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if leading_spaces_to_strip:
        steps.append(decoders.Strip(content=" ", left=leading_spaces_to_strip, right=0))
    backend.decoder = decoders.Sequence(steps)
    return _Pipeline(backend, vocab, _spm_piece_decoder(), leading_spaces_to_strip)


def _build_llama_family(metadata: dict, tokens: list[str]) -> _Pipeline:
    architecture = _require(metadata, "general.architecture")
    if architecture in _GEMMA_ARCHITECTURES:
        return _build_gemma(metadata, tokens)
    return _build_sentencepiece(metadata, tokens)


def _build_byte_level(metadata: dict, tokens: list[str]) -> _Pipeline:
    # A missing `pre` is what llama.cpp and transformers both read as "default".
    pre = metadata.get("tokenizer.ggml.pre") or "default"
    if not isinstance(pre, str):
        raise TokenizerMetadataError(f"GGUF metadata 'tokenizer.ggml.pre' should be a string, got {pre!r}")
    if pre not in _BYTE_LEVEL_SPLITS:
        raise UnsupportedTokenizerError(
            f"unsupported GGUF pre-tokenizer tokenizer.ggml.pre = {pre!r} for a 'gpt2' (byte-level BPE) vocabulary; "
            f"supported: {sorted(_BYTE_LEVEL_SPLITS)}"
        )
    merges = _merges_from_metadata(metadata)
    if merges is None:
        raise TokenizerMetadataError("GGUF tokenizer metadata is missing the required key 'tokenizer.ggml.merges'")
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    types = metadata.get("tokenizer.ggml.token_type") or []
    control = {index for index, token_type in enumerate(types) if token_type == _TOKEN_TYPE_CONTROL}
    # Some files store tokens as raw text; the model expects them spelled in the byte alphabet.
    # Control tokens are matched whole, by their raw text (DeepSeek's <｜begin▁of▁sentence｜>), as
    # the added tokens of a tokenizer.json are.
    vocab = {
        token if set(token) <= alphabet or index in control
        else "".join(spelling[byte] for byte in token.encode("utf-8")): index
        for index, token in enumerate(tokens)
    }
    backend = BackendTokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            ignore_merges=pre in _IGNORE_MERGES_PRES,
        )
    )
    split = _BYTE_LEVEL_SPLITS[pre]
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:  # one regex, or a sequence of them, each isolating its matches
        patterns = (split,) if isinstance(split, str) else split
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in patterns]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    backend.decoder = decoders.ByteLevel()
    return _Pipeline(backend, vocab, decoders.ByteLevel(), leading_spaces_to_strip=0)


_BUILDERS = {
    "llama": _build_llama_family,
    "gpt2": _build_byte_level,
    # Gemma 4: BPE merges over SentencePiece-style pieces ("▁" for spaces, byte fallback),
    # the Gemma pipeline with the merges the file stores.
    "gemma4": _build_gemma,
}


def _add_special_tokens(pipeline: _Pipeline, metadata: dict, tokens: list[str], named_ids: list[int]) -> None:
    """Make control and user-defined tokens match whole in text, as transformers does.

    Control tokens (<bos>, <|im_start|>, ...) become special tokens: skippable when decoding.
    User-defined ones (Gemma's "\\n\\n" runs, <think>, ...) are matched whole but are not special.
    Without this they would be cut into pieces like ordinary text.
    """
    token_types = metadata.get("tokenizer.ggml.token_type") or []
    control = [token for token, token_type in zip(tokens, token_types) if token_type == _TOKEN_TYPE_CONTROL]
    added = set(control)
    # The tokens the metadata names as bos/eos/unk/pad are special even when not typed control.
    control += [tokens[i] for i in named_ids if tokens[i] not in added and tokens[i] in pipeline.vocab]
    added.update(control)
    if control:
        pipeline.backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    user_defined = [
        token
        for token, token_type in zip(tokens, token_types)
        if token_type == _TOKEN_TYPE_USER_DEFINED and (token in pipeline.vocab or token in added)
    ]
    if user_defined:
        pipeline.backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user_defined])


def load_tokenizer(metadata: dict) -> Tokenizer:
    """Build the tokenizer a GGUF describes.

    `metadata` maps GGUF keys to plain values, as `gguf.GGUFReader(path).fields[key].contents()`
    returns them. Only the `tokenizer.*` keys and `general.architecture` are read.
    """
    model = _require(metadata, "tokenizer.ggml.model")
    if not isinstance(model, str) or model not in _BUILDERS:
        raise UnsupportedTokenizerError(
            f"unsupported GGUF tokenizer model tokenizer.ggml.model = {model!r}; supported: {sorted(_BUILDERS)}"
        )
    tokens = _require_list(metadata, "tokenizer.ggml.tokens")
    if not tokens:
        raise TokenizerMetadataError("GGUF metadata 'tokenizer.ggml.tokens' is empty")
    if "tokenizer.ggml.token_type" in metadata:
        _require_list(metadata, "tokenizer.ggml.token_type", len(tokens))

    special_ids = {
        name: _optional_token_id(metadata, f"tokenizer.ggml.{name}_token_id", len(tokens))
        for name in ("bos", "eos", "unknown", "padding", "eot", "eom")
    }
    named_ids = [special_ids[name] for name in ("bos", "eos", "unknown", "padding") if special_ids[name] is not None]
    try:
        pipeline = _BUILDERS[model](metadata, tokens)
        _add_special_tokens(pipeline, metadata, tokens, named_ids)
    except TokenizerMetadataError:
        raise
    except Exception as error:  # the tokenizers library's own (e.g. merges naming unknown tokens)
        raise TokenizerMetadataError(f"the GGUF's {model!r} tokenizer cannot be built from its metadata: "
                                     f"{type(error).__name__}: {error}") from error

    # transformers defaults add_bos_token to true for SentencePiece vocabularies (llama.cpp does too).
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", model == "llama"))
    if model == "gemma4":
        # As transformers: the flag is set, but Gemma 4's reference tokenizer adds no BOS (its chat
        # template writes `<bos>` itself); llama.cpp forces it on (ggml-org/llama.cpp#21500).
        add_bos = False
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))

    eos_ids = _end_of_generation_ids(metadata, tokens, special_ids)

    return Tokenizer(
        pipeline,
        tokens=tokens,
        bos_id=special_ids["bos"],
        eos_id=special_ids["eos"],
        eos_ids=eos_ids,
        unknown_id=special_ids["unknown"],
        padding_id=special_ids["padding"],
        add_bos=add_bos,
        add_eos=add_eos,
        chat_template=metadata.get("tokenizer.chat_template"),
    )


class Tokenizer:
    """Encodes text to token ids and back for one GGUF model. Build it with `load_tokenizer`."""

    def __init__(
        self,
        pipeline: _Pipeline,
        *,
        tokens: list[str],
        bos_id: int | None,
        eos_id: int | None,
        eos_ids: set[int],
        unknown_id: int | None,
        padding_id: int | None,
        add_bos: bool,
        add_eos: bool,
        chat_template: str | None,
    ):
        self._pipeline = pipeline
        self._backend = pipeline.backend
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eos_ids = frozenset(eos_ids)
        self.vocab_size = len(tokens)
        # transformers turns BOS/EOS adding off when the file names no such token.
        self.add_bos = add_bos and bos_id is not None
        self.add_eos = add_eos and eos_id is not None
        self.chat_template = chat_template
        self._special_ids = frozenset(
            token_id for token_id, token in self._backend.get_added_tokens_decoder().items() if token.special
        )
        # Chat templates see the special tokens by name, as in transformers.
        self._template_tokens = {
            f"{name}_token": tokens[token_id] if token_id is not None else None
            for name, token_id in (("bos", bos_id), ("eos", eos_id), ("unk", unknown_id), ("pad", padding_id))
        }
        self._compiled_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            if self.add_bos:
                ids.insert(0, self.bos_id)
            if self.add_eos:
                ids.append(self.eos_id)
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        # int(): ids often arrive as numpy integers, which the Rust side rejects.
        return self._backend.decode([int(token_id) for token_id in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(int(token_id))

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a byte-level token's raw bytes, which may be part of a
        UTF-8 character; a SentencePiece byte token <0xNN>'s byte; "▁" as a space); a special
        token's own text."""
        spelled = self._backend.id_to_token(int(token_id))
        if spelled is None:
            raise InvalidArgumentError(f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})")
        if token_id in self._special_ids:
            return spelled.encode("utf-8")
        if isinstance(self._pipeline.piece_decoder, decoders.ByteLevel):
            byte_of = _byte_of_unicode()
            if all(c in byte_of for c in spelled):
                return bytes(byte_of[c] for c in spelled)
            return spelled.encode("utf-8")
        if _may_continue_byte_sequence(spelled):
            try:
                return bytes([int(spelled[3:5], 16)])
            except ValueError:
                pass
        return spelled.replace(_SPIECE_SPACE, " ").encode("utf-8")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **variables) -> str:
        """Render `messages` with the GGUF's chat template (jinja2, sandboxed, as transformers renders it).

        Extra keyword arguments (tools=..., documents=...) are passed to the template as variables.
        """
        if self.chat_template is None:
            raise TokenizerMetadataError("this GGUF has no chat template (no 'tokenizer.chat_template' key)")
        if self._compiled_template is None:
            self._compiled_template = _compile_chat_template(self.chat_template)
        context = {**self._template_tokens, **variables}
        return self._compiled_template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **context
        )


class _GenerationTag(jinja2.ext.Extension):
    """Accepts transformers' assistant-mask marker `{% generation %}...{% endgeneration %}`; renders the body as is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def _raise_template_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson escapes HTML characters, which chat templates do not expect.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _compile_chat_template(source: str) -> jinja2.Template:
    # Chat templates come from model files, i.e. untrusted code: render them sandboxed, with the
    # same settings and helpers as transformers so they produce the same text.
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_template_exception
    environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return environment.from_string(source)


def _may_continue_byte_sequence(piece: str) -> bool:
    # ByteFallback reads a token spelled "<0xNN>" as a raw byte and decodes a whole run of them at
    # once: valid UTF-8 becomes text, otherwise every byte of the run becomes U+FFFD. So no text of
    # a run is final until a token of another kind ends it. The check is looser than ByteFallback's
    # (it accepts any "<0x??>"), which can only delay text, never emit it early.
    return len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")


class StreamDecoder:
    """Turns generated token ids into text one id at a time.

    `push` returns only text that later tokens cannot change: an incomplete UTF-8 character (byte
    fallback tokens like <0xE2>, or a byte-level token holding half a character) is held back until
    it completes. The concatenation of every `push` and the final `flush` equals
    `tokenizer.decode(all_ids, skip_special_tokens)`. `flush` also starts a new stream.

    continues_text: the ids continue a text already shown (a prompt being completed), so the
    space SentencePiece writes before a word stays, as in the decode of prompt + continuation
    (llama.cpp's detokenize with the prompt as previous tokens); otherwise the stream starts a
    text and, as `decode`, drops the prefix space the tokenizer adds when encoding.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False, continues_text: bool = False):
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._piece_decoder = tokenizer._pipeline.piece_decoder
        self._pending: list[str] = []
        self._spaces_at_start = 0 if continues_text else tokenizer._pipeline.leading_spaces_to_strip
        self._spaces_to_strip = self._spaces_at_start

    def push(self, token_id: int) -> str:
        if self._skip_special_tokens and self._tokenizer.is_special(token_id):
            return ""
        piece = self._tokenizer.id_to_token(token_id)
        if piece is None:  # decode() drops ids it has no token for, so do we
            return ""
        self._pending.append(piece)
        if _may_continue_byte_sequence(piece):
            return ""
        text = self._piece_decoder.decode(self._pending)
        # A trailing U+FFFD may be an incomplete character the next tokens finish (byte-level BPE
        # decodes all bytes together); keep the pieces until it is followed by settled text.
        if text.endswith("\ufffd"):
            return ""
        self._pending.clear()
        return self._strip_stream_start(text)

    def flush(self) -> str:
        text = self._piece_decoder.decode(self._pending) if self._pending else ""
        text = self._strip_stream_start(text)
        self._pending.clear()
        self._spaces_to_strip = self._spaces_at_start
        return text

    def _strip_stream_start(self, text: str) -> str:
        # decode() strips the prefix space SentencePiece added (a Strip decoder over the whole text);
        # in a stream that space is at the start of the first text we emit.
        while self._spaces_to_strip and text:
            if text[0] == " ":
                text = text[1:]
                self._spaces_to_strip -= 1
            else:
                self._spaces_to_strip = 0
        return text
