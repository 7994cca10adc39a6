#!/usr/bin/env python3
"""Regenerate the architecture-conformance fixtures and goldens.

For every family this script

1. builds a tiny random transformers model (fp32, seeded, every norm weight and bias
   perturbed away from its init so that a dropped norm or bias shows in the logits),
2. trains a tiny tokenizer offline (SentencePiece or byte-level BPE) just so that the
   converter has a vocabulary to write,
3. saves the HF model and runs llama.cpp's ``convert_hf_to_gguf.py`` (as a tool, in a
   subprocess) with ``--outtype f32`` and ``--outtype q8_0``, writing
   ``tests/fixtures/conformance/<name>-f32.gguf`` and ``<name>-q8_0.gguf``,
4. records the reference: the ORIGINAL transformers model in fp32, eager attention,
   logits at every position of a fixed 40-id prompt and a 16-token greedy continuation,
   in ``tests/goldens/conformance/<name>.npz``,
5. loads the GGUFs back with transformers (where it supports the architecture) and
   records how far those logits are from the reference, and
6. writes a manifest (``tests/fixtures/conformance/manifest.json``): per family the GGUF
   architecture, every scalar metadata key and value, and every tensor (type, shape).

The converter is NOT part of this repository. It comes from the llama-cpp-python source
distribution (which vendors llama.cpp); point the script at it with ``--llama-cpp DIR`` or
the ``KCAP_LLAMA_CPP`` environment variable, DIR being either the unpacked sdist root
(``llama_cpp_python-X.Y.Z``) or its ``vendor/llama.cpp`` folder::

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d ~/.cache/kcap-bench/sdist
    tar xzf ~/.cache/kcap-bench/sdist/llama_cpp_python-0.3.36.tar.gz -C ~/.cache/kcap-bench/
    KCAP_LLAMA_CPP=~/.cache/kcap-bench/llama_cpp_python-0.3.36 \\
        python scripts/make_conformance_fixtures.py [--family NAME ...]

Without either, the script looks for ``~/.cache/kcap-bench/**/vendor/llama.cpp``.
The converter runs with its own vendored ``gguf-py`` (it puts it first on sys.path itself).

One documented intervention in the converter's run: our tokenizers are trained here, so
the converter's BPE pre-tokenizer fingerprint (a hash of how a known string tokenizes)
matches no published model and it refuses with "BPE pre-tokenizer was not recognized".
For the byte-level BPE fixtures the subprocess wraps ``TextModel.get_vocab_base_pre`` so
that, ONLY when the original raises that error, it returns ``"gpt-2"`` (our BPE
tokenizers use exactly the GPT-2 byte-level pre-tokenizer). Nothing else is changed.

A second documented intervention, after the converter's run: for the families marked
``add_metadata`` (``qwen2-swa``, ``qwen3-swa``, ``starcoder2-swa``) the converter writes no
sliding-window key although transformers slides their attention, so the script adds
``<arch>.attention.sliding_window`` and, where the config has ``layer_types``,
``<arch>.attention.sliding_window_pattern`` (a bool per layer) to both files, in the form the
converter writes for the families that keep them; tensor bytes are untouched (this step needs
kcap installed, whose ``kcap.testing.synth`` rewrites the file). The manifest and ``meta``
record the added keys.

A third documented intervention, after the converter's run: ``deepseek2-kvb`` is the ``deepseek2``
model (``same_model_as``: same weights, prompt and reference) in the tensor layout that llama.cpp's
converter wrote before its MLA change, still the layout of many published DeepSeek-V2 GGUFs. The
current converter splits each ``kv_b_proj`` into ``attn_k_b`` / ``attn_v_b``; ``legacy_kv_b_gguf``
rewrites both converted files with one ``blk.N.attn_kv_b.weight`` per block instead (the HF
``kv_b_proj.weight`` unchanged, rebuilt exactly from the F32 file's ``attn_k_b`` / ``attn_v_b``;
in the q8_0 file quantized to Q8_0 as one matrix with ``gguf.quants.quantize``, as the converter
quantizes, after checking that the same function reproduces the converter's Q8_0 ``attn_k_b`` /
``attn_v_b`` bytes) and the metadata those files had: ``attention.head_count_kv`` = head_count,
``key_length`` = qk_nope + qk_rope, ``value_length`` = v_head_dim, no ``key_length_mla`` /
``value_length_mla``. Every other key and tensor is copied byte for byte with the ``gguf``
package's writer (which reproduces the converter's files exactly when nothing changes);
``meta.post_conversion`` and the manifest record the changes. Its ``logits_q8_0_weights`` come
from its own Q8_0 tensors.

Mixture-of-experts families (``mixtral``, ``qwen2moe``, ``qwen3moe``, ``gemma4-moe``, ``deepseek2``,
``deepseek3``): the converter merges the per-expert checkpoint tensors into one 3-D tensor per
matrix, and the fidelity check and the Q8_0-weights reference do the same and its inverse
(``merge_experts``; Gemma 4 saves its experts stacked already). Their routers get larger
weights (``ROUTER_SCALE``), and the weights seed is the first whose routers choose every token's
experts with a clear margin (``MIN_ROUTING_MARGIN``); ``meta.routing`` records the choices.
DeepSeek's routers choose groups of experts first, on scores (V2: softmax probabilities, a group
scored by its largest; V3: sigmoid scores plus ``e_score_correction_bias``, a group scored by its
two largest): their margin (``deepseek_choice_margins``) covers both choices. DeepSeek-V3's
``e_score_correction_bias``, zero at init, gets N(0, ``SCORE_BIAS_STD``^2) values.

``REFUSED`` models (features kcap does not implement; none at present) are converted to one F32
file each in ``tests/fixtures/conformance/refused/``, without goldens.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "conformance"
GOLDENS = REPO / "tests" / "goldens" / "conformance"
MANIFEST = FIXTURES / "manifest.json"
REFUSED_FIXTURES = FIXTURES / "refused"  # outside the *.gguf glob of the support matrix

PROMPT_LEN = 40
GREEDY_STEPS = 16
VOCAB = 384
OUTTYPES = ("f32", "q8_0")
MAX_FILE_BYTES = 2 * 1024 * 1024

# ----------------------------------------------------------------------------------------
# converter subprocess mode
# ----------------------------------------------------------------------------------------


def _converter_main(llama_dir: Path, pre_override: str | None, argv: list[str]) -> None:
    """Runs convert_hf_to_gguf.py in this (fresh) process, optionally with the one
    documented fallback for the BPE pre-tokenizer fingerprint."""
    import runpy

    sys.path.insert(0, str(llama_dir / "gguf-py"))
    sys.path.insert(0, str(llama_dir))
    if pre_override:
        from conversion import base  # the converter's own package

        original = base.TextModel.get_vocab_base_pre

        def get_vocab_base_pre(self, tokenizer):
            try:
                return original(self, tokenizer)
            except NotImplementedError:
                base.logger.warning(
                    "kcap conformance: tiny trained tokenizer has no known pre-tokenizer "
                    "fingerprint; writing tokenizer.ggml.pre=%r", pre_override)
                return pre_override

        base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    script = llama_dir / "convert_hf_to_gguf.py"
    sys.argv = [str(script), *argv]
    runpy.run_path(str(script), run_name="__main__")


def _tensor_map_main(llama_dir: Path, arch: str, n_blocks: int) -> None:
    """Maps HF tensor names (JSON list on stdin) to GGUF names with the converter's own
    gguf-py TensorNameMap; prints a JSON dict (None where the name does not map)."""
    sys.path.insert(0, str(llama_dir / "gguf-py"))
    import gguf

    arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    tmap = gguf.get_tensor_name_map(arch_enum, n_blocks)
    out = {}
    for name in json.load(sys.stdin):
        key = name
        if arch == "gemma4" and (key.endswith("layer_scalar") or key.endswith("per_dim_scale")):
            key += ".weight"  # as the converter's Gemma4Model.filter_tensors
        if arch == "gemma4" and ".experts." in key and not key.endswith(".weight"):
            key += ".weight"  # the stacked experts (experts.gate_up_proj), as filter_tensors
        if key.endswith("e_score_correction_bias"):  # as the converter's ModelBase.filter_tensors
            key = key[:-len("_bias")] + ".bias"
        out[name] = tmap.get_name(key, try_suffixes=(".weight", ".bias"))
        m = re.search(r"\.layers\.(\d+)\.router\.(scale|per_expert_scale)$", name)
        if arch == "gemma4" and m:  # renamed by the converter's Gemma4Model.modify_tensors
            stem = "ffn_gate_inp" if m.group(2) == "scale" else "ffn_down_exps"
            out[name] = f"blk.{m.group(1)}.{stem}.scale"
    json.dump(out, sys.stdout)


# ----------------------------------------------------------------------------------------
# locating the converter
# ----------------------------------------------------------------------------------------


def find_llama_cpp(arg: str | None) -> Path:
    candidates: list[Path] = []
    for value in (arg, os.environ.get("KCAP_LLAMA_CPP")):
        if value:
            p = Path(value).expanduser()
            candidates += [p, p / "vendor" / "llama.cpp"]
    if not candidates:
        root = Path("~/.cache/kcap-bench").expanduser()
        if root.is_dir():
            candidates += sorted(p.parent for p in root.glob("**/vendor/llama.cpp/convert_hf_to_gguf.py"))
    for c in candidates:
        if (c / "convert_hf_to_gguf.py").is_file() and (c / "gguf-py").is_dir():
            return c.resolve()
    sys.exit("convert_hf_to_gguf.py not found: pass --llama-cpp DIR or set KCAP_LLAMA_CPP to the "
             "unpacked llama-cpp-python sdist (or its vendor/llama.cpp folder); see the module docstring")


def llama_cpp_python_version(llama_dir: Path) -> str:
    init = llama_dir.parent.parent / "llama_cpp" / "__init__.py"
    if init.is_file():
        for line in init.read_text().splitlines():
            if line.startswith("__version__"):
                return line.split("=")[1].strip().strip("\"'")
    pkg = llama_dir.parent.parent / "PKG-INFO"
    if pkg.is_file():
        for line in pkg.read_text().splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return "unknown"


# ----------------------------------------------------------------------------------------
# tokenizers (trained offline on a seeded synthetic corpus)
# ----------------------------------------------------------------------------------------

_WORDS = (
    "the of and to in is was for on that with as by at from his her they this are which be or an "
    "had not but it one all were we when there can more has if will so no out up into do time only "
    "new some could these two may then first any like my now over such our man me even most made "
    "after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men "
    "work long get here between both life being under never day same another know while last "
    "might us great old year off come since against go came right used take three river stone "
    "light music garden window silver morning quiet number letter market bridge winter paper"
).split()


def corpus() -> list[str]:
    rng = random.Random(20240611)
    lines = []
    for _ in range(3000):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        s = " ".join(words)
        s = s[0].upper() + s[1:] + rng.choice([".", ",", "!", "?", ";", ":"])
        if rng.random() < 0.3:
            s += f" {rng.randint(0, 99999)}"
        lines.append(s)
    return lines


SPM_SPECIALS = {
    # style: (sentencepiece trainer ids, {role: piece})
    "llama": (dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1, unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>"),
              {"unk": "<unk>", "bos": "<s>", "eos": "</s>"}),
    "gemma": (dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>",
                   bos_piece="<bos>", unk_piece="<unk>"),
              {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"}),
}


def train_spm(style: str) -> bytes:
    import sentencepiece as spm

    ids, _ = SPM_SPECIALS[style]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=out, vocab_size=VOCAB, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=(style == "llama"), split_digits=True,
        num_threads=1, minloglevel=2, **ids)
    return out.getvalue()


def train_bpe(specials: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2 regex + byte map
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def write_tokenizer(hf_dir: Path, spec: dict) -> dict[str, int]:
    """Writes the tokenizer files the converter reads; returns {role: id}."""
    kind = spec["tokenizer"]
    if kind.startswith("spm-"):
        style = kind[4:]
        proto = train_spm(style)
        (hf_dir / "tokenizer.model").write_bytes(proto)
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_proto=proto)
        assert sp.vocab_size() == VOCAB
        pieces = [sp.id_to_piece(i) for i in range(VOCAB)]
        assert len(set(pieces)) == VOCAB, "duplicate pieces"
        roles = {role: sp.piece_to_id(p) for role, p in SPM_SPECIALS[style][1].items()}
        cfg = {f"{r}_token": SPM_SPECIALS[style][1][r] for r in roles}
        cfg.update(tokenizer_class="GemmaTokenizer" if style == "gemma" else "LlamaTokenizer",
                   add_bos_token=True, add_eos_token=False)
        (hf_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
        return roles
    if kind == "hf-gemma4":
        # Gemma 4's converter reads an HF fast tokenizer.json (BPE with byte fallback, as
        # the real one); derive it from a SentencePiece model through transformers.
        from transformers import AutoTokenizer

        proto = train_spm("gemma")
        with tempfile.TemporaryDirectory() as td:
            Path(td, "tokenizer.model").write_bytes(proto)
            Path(td, "tokenizer_config.json").write_text(json.dumps(
                {"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>",
                 "unk_token": "<unk>", "pad_token": "<pad>"}))
            tok = AutoTokenizer.from_pretrained(td)
            tok.save_pretrained(Path(td, "out"))
            tj = json.loads(Path(td, "out", "tokenizer.json").read_text())
        # GemmaTokenizer adds a <mask> token past the vocabulary; drop it so that the
        # tokenizer has exactly VOCAB entries.
        tj["added_tokens"] = [a for a in tj["added_tokens"] if a["id"] < VOCAB]
        assert len(tj["model"]["vocab"]) == VOCAB
        (hf_dir / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
        roles = {r: tj["model"]["vocab"][p] for r, p in SPM_SPECIALS["gemma"][1].items()}
        cfg = {f"{r}_token": p for r, p in SPM_SPECIALS["gemma"][1].items()}
        # PreTrainedTokenizerFast (not GemmaTokenizer): GemmaTokenizer would add <mask> again
        # when the converter loads it, giving 385 tokens for 384 embedding rows.
        cfg.update(tokenizer_class="PreTrainedTokenizerFast", add_bos_token=True, add_eos_token=False)
        (hf_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
        return roles
    if kind == "bpe":
        specials = spec["specials"]
        tok = train_bpe(specials)
        tok.save(str(hf_dir / "tokenizer.json"))
        vocab = tok.get_vocab()
        roles = {r: vocab[p] for r, p in spec["special_roles"].items()}
        cfg = {f"{r}_token": p for r, p in spec["special_roles"].items()}
        cfg.update(tokenizer_class="PreTrainedTokenizerFast", add_bos_token=False, add_eos_token=False)
        (hf_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
        return roles
    raise ValueError(kind)


# ----------------------------------------------------------------------------------------
# families
# ----------------------------------------------------------------------------------------

_GEMMA4_PROBES = {
    "no final softcap": {"final_logit_softcapping": None},
    "no sliding window": {"sliding_window": 4096},
    "full layers rotate all dims (partial_rotary_factor 1)": {"rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 1.0, "rope_theta": 1000000.0}}},
}


def _gemma4_config(**changes) -> dict:
    """The tiny Gemma 4 text model's configuration the gemma4 fixtures share, with `changes`."""
    shared = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                  sliding_window=8, hidden_size_per_layer_input=16, vocab_size_per_layer_input=VOCAB,
                  final_logit_softcapping=3.0, max_position_embeddings=256, rms_norm_eps=1e-6,
                  hidden_activation="gelu_pytorch_tanh", num_kv_shared_layers=0,
                  rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                   "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                      "rope_theta": 1000000.0}})
    return {**shared, **changes}


def _llama3_rope():
    return {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def _deepseek_yarn(mscale: float) -> dict:
    """DeepSeek's YaRN parameters at the fixtures' scale: factor 4 over 64 original positions,
    mscale = mscale_all_dim (transformers then leaves cos/sin unscaled and multiplies the softmax
    scale by (0.1 * mscale_all_dim * ln 4 + 1)^2)."""
    return {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
            "beta_fast": 32, "beta_slow": 1, "mscale": mscale, "mscale_all_dim": mscale}


FAMILIES: dict[str, dict] = {
    "llama3": dict(
        cls="LlamaForCausalLM", config_cls="LlamaConfig", tokenizer="bpe", pre="gpt-2",
        specials=["<|begin_of_text|>", "<|end_of_text|>"],
        special_roles={"bos": "<|begin_of_text|>", "eos": "<|end_of_text|>"},
        config=dict(hidden_size=96, intermediate_size=200, num_hidden_layers=3, num_attention_heads=6,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
                    tie_word_embeddings=False, rope_parameters=_llama3_rope()),
        probes={"rope_type default (ignore rope_freqs)":
                {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}},
        notes=["Llama-3 style: rope_type llama3 (factor 8, low/high_freq_factor 1/4, "
               "original_max_position_embeddings 64 so that the 16 rope frequencies fall in all three "
               "bands); the converter bakes the per-frequency divisors into rope_freqs.weight.",
               "Untied output (output.weight present). GQA 6 query heads / 2 KV heads."]),
    "llama-tied": dict(
        cls="LlamaForCausalLM", config_cls="LlamaConfig", tokenizer="spm-llama",
        config=dict(hidden_size=80, intermediate_size=176, num_hidden_layers=2, num_attention_heads=5,
                    num_key_value_heads=5, max_position_embeddings=256, rms_norm_eps=1e-6,
                    tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        notes=["Tied embeddings: the GGUF has no output.weight; the LM head is token_embd.weight.",
               "5 heads (MHA), head_dim 16, hidden 80 (not a multiple of 32: in the q8_0 file every "
               "matrix whose row length is 80 stays unquantized)."]),
    "mistral": dict(
        cls="MistralForCausalLM", config_cls="MistralConfig", tokenizer="spm-llama",
        config=dict(hidden_size=96, intermediate_size=224, num_hidden_layers=3, num_attention_heads=6,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
                    tie_word_embeddings=False, sliding_window=None,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        swa_probe=8,
        notes=["MistralForCausalLM converts to GGUF architecture 'llama' and the converter writes no "
               "sliding-window key, so the fixture uses sliding_window=None (full causal attention) to keep "
               "GGUF and reference consistent. meta.swa_probe records how much the logits would change "
               "with sliding_window=8."]),
    "qwen2": dict(
        cls="Qwen2ForCausalLM", config_cls="Qwen2Config", tokenizer="bpe", pre="gpt-2",
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        special_roles={"bos": "<|endoftext|>", "eos": "<|im_end|>"},
        config=dict(hidden_size=96, intermediate_size=200, num_hidden_layers=3, num_attention_heads=6,
                    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                    tie_word_embeddings=True, use_sliding_window=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        notes=["Q/K/V projections carry biases (perturbed); o_proj has none. Tied embeddings."]),
    "qwen3": dict(
        cls="Qwen3ForCausalLM", config_cls="Qwen3Config", tokenizer="bpe", pre="gpt-2",
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        special_roles={"bos": "<|endoftext|>", "eos": "<|im_end|>"},
        config=dict(hidden_size=64, intermediate_size=200, num_hidden_layers=3, num_attention_heads=6,
                    num_key_value_heads=2, head_dim=24, max_position_embeddings=256, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, attention_bias=False, use_sliding_window=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        notes=["QK-norm: per-head RMSNorm (weight [head_dim]) on q and k before RoPE.",
               "head_dim 24 != hidden/heads (64/6): q_proj is [144, 64]."]),
    "gemma2": dict(
        cls="Gemma2ForCausalLM", config_cls="Gemma2Config", tokenizer="spm-gemma",
        config=dict(hidden_size=96, intermediate_size=200, num_hidden_layers=4, num_attention_heads=6,
                    num_key_value_heads=2, head_dim=24, query_pre_attn_scalar=24, sliding_window=8,
                    attn_logit_softcapping=4.0, final_logit_softcapping=3.0, max_position_embeddings=256,
                    rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        probes={"no attn softcap": {"attn_logit_softcapping": None},
                "no final softcap": {"final_logit_softcapping": None},
                "query_pre_attn_scalar = hidden/heads (16)": {"query_pre_attn_scalar": 16},
                "no sliding window": {"sliding_window": 4096}},
        notes=["Layers alternate sliding (even: 0, 2) / global (odd: 1, 3), as transformers' Gemma2 "
               "layer_types; sliding_window 8 < prompt length.",
               "query_pre_attn_scalar = head_dim = 24 (the GGUF does not carry it), so scores scale by "
               "1/sqrt(head_dim).",
               "Softcaps chosen small (attn 4.0, final 3.0) so that a missing softcap is visible in a tiny "
               "random model; real Gemma 2 uses 50/30.",
               "Gemma RMSNorm computes x*(1+w); the converter stores 1+w, so GGUF norm weights are used "
               "as plain multipliers. Embeddings are scaled by sqrt(hidden) (not in the GGUF)."]),
    "gemma3": dict(
        cls="Gemma3ForCausalLM", config_cls="Gemma3TextConfig", tokenizer="spm-gemma",
        config=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=6, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=24, query_pre_attn_scalar=24, sliding_window=8,
                    max_position_embeddings=256, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
                    rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
        probes={"no sliding window": {"sliding_window": 4096},
                "query_pre_attn_scalar = hidden/heads (16)": {"query_pre_attn_scalar": 16},
                "sliding layers use the global rope theta": {"rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1000000.0}}}},
        notes=["6 layers with transformers' default pattern (sliding_window_pattern 6): layers 0-4 "
               "sliding (window 8), layer 5 global. The GGUF carries no pattern key for gemma3 "
               "(llama.cpp hard-codes 'every 6th layer is global', which matches).",
               "Sliding layers use rope_freq_base_swa (10000), global layers rope_freq_base (1e6).",
               "query_pre_attn_scalar = head_dim = 24 (not in the GGUF).",
               "QK-norm and the four norms per layer; Gemma norms x*(1+w) with 1+w stored in the GGUF."]),
    "gemma4": dict(
        cls="Gemma4ForCausalLM", config_cls="Gemma4TextConfig", tokenizer="hf-gemma4",
        config=_gemma4_config(intermediate_size=160, num_hidden_layers=5,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                           "sliding_attention", "full_attention"]),
        probes=_GEMMA4_PROBES,
        notes=["Gemma 4 dense text (Gemma4ForCausalLM): sliding layers head_dim 16, full layers "
               "global_head_dim 32; full layers use 'proportional' RoPE with partial_rotary_factor 0.25 "
               "(8 of 32 dims rotated, frequencies computed with the FULL head_dim in the exponent); "
               "v_norm (RMSNorm without weight) on values; q_norm/k_norm; attention scale 1.0; "
               "per-layer embeddings (hidden_size_per_layer_input 16) as in the E2B models; "
               "layer_scalar per layer (perturbed); final_logit_softcapping 3.0.",
               "No KV sharing here (num_kv_shared_layers 0); see gemma4-kvshare."]),
    "gemma4-kvshare": dict(
        cls="Gemma4ForCausalLM", config_cls="Gemma4TextConfig", tokenizer="hf-gemma4",
        config=_gemma4_config(intermediate_size=96, num_hidden_layers=6,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                           "sliding_attention", "sliding_attention", "full_attention"],
                              num_kv_shared_layers=2, use_double_wide_mlp=True),
        probes=_GEMMA4_PROBES,
        notes=["As gemma4, plus the E2B-style KV sharing: the last 2 layers (4: sliding, 5: full) have "
               "no k/v projections and reuse the K/V of the last earlier layer of the same type "
               "(3 and 2); use_double_wide_mlp doubles their FFN width (96 -> 192)."]),
    "gemma4-kev": dict(
        cls="Gemma4ForCausalLM", config_cls="Gemma4TextConfig", tokenizer="hf-gemma4",
        config=_gemma4_config(intermediate_size=96, num_hidden_layers=4,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                              attention_k_eq_v=True, num_global_key_value_heads=1),
        notes=["As gemma4 with attention_k_eq_v, as the larger Gemma 4 models: the full-attention "
               "layers (1, 3) have no v_proj (no attn_v in the GGUF) and take V from the K projection "
               "before its norm (then V's RMS norm without weight, no rope), with their own KV head "
               "count (num_global_key_value_heads 1; the sliding layers 2): the GGUF's "
               "attention.head_count_kv is a per-layer array."]),
    "gpt2": dict(
        cls="GPT2LMHeadModel", config_cls="GPT2Config", tokenizer="bpe", pre="gpt-2",
        specials=["<|endoftext|>"], special_roles={"bos": "<|endoftext|>", "eos": "<|endoftext|>"},
        config=dict(n_embd=96, n_layer=3, n_head=6, n_positions=128, n_ctx=128, n_inner=None,
                    activation_function="gelu_new", layer_norm_epsilon=1e-5),
        notes=["n_ctx = n_positions = 128 put in config.json (the converter reads n_ctx).",
               "n_inner None: the converter writes feed_forward_length = 4*n_embd unconditionally.",
               "Fused QKV (attn_qkv, [3*96] rows ordered q|k|v) with bias; learned positions "
               "(position_embd.weight); LayerNorm with bias; GELU (tanh approx.) non-gated FFN. Tied head."]),
    "starcoder2": dict(
        cls="Starcoder2ForCausalLM", config_cls="Starcoder2Config", tokenizer="bpe", pre="gpt-2",
        specials=["<|endoftext|>"], special_roles={"bos": "<|endoftext|>", "eos": "<|endoftext|>"},
        config=dict(hidden_size=96, intermediate_size=200, num_hidden_layers=3, num_attention_heads=6,
                    num_key_value_heads=2, max_position_embeddings=256, norm_epsilon=1e-5, use_bias=True,
                    hidden_act="gelu_pytorch_tanh", sliding_window=None, tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
        probes={"rope_theta 10000 instead of 100000":
                {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}},
        notes=["LayerNorm with bias, biases on q/k/v/o and on the two FFN matrices (c_fc/c_proj), "
               "non-gated GELU (tanh) FFN, GQA 6/2, NEOX rope. sliding_window None (the converter writes "
               "no sliding-window key for starcoder2)."]),
    "qwen2-swa": dict(
        cls="Qwen2ForCausalLM", config_cls="Qwen2Config", tokenizer="bpe", pre="gpt-2",
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        special_roles={"bos": "<|endoftext|>", "eos": "<|im_end|>"},
        config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                    tie_word_embeddings=True, use_sliding_window=True, sliding_window=8, max_window_layers=1,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        add_metadata="sliding_window",
        probes={"no sliding window": {"sliding_window": 4096}},
        notes=["use_sliding_window with sliding_window 8 and max_window_layers 1: transformers' Qwen2 "
               "slides the layers i >= max_window_layers (1 and 2), layer 0 is full.",
               "The converter writes no sliding-window key for qwen2; the script adds "
               "qwen2.attention.sliding_window and qwen2.attention.sliding_window_pattern (see "
               "'Second intervention' in README.md)."]),
    "qwen3-swa": dict(
        cls="Qwen3ForCausalLM", config_cls="Qwen3Config", tokenizer="bpe", pre="gpt-2",
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        special_roles={"bos": "<|endoftext|>", "eos": "<|im_end|>"},
        config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, attention_bias=False, use_sliding_window=True, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        add_metadata="sliding_window",
        probes={"no sliding window": {"sliding_window": 4096}},
        notes=["use_sliding_window with sliding_window 8 and explicit layer_types sliding/full/sliding "
               "(a pattern that max_window_layers cannot express; transformers' Qwen3 follows layer_types).",
               "The converter writes no sliding-window key for qwen3; the script adds "
               "qwen3.attention.sliding_window and qwen3.attention.sliding_window_pattern (see "
               "'Second intervention' in README.md)."]),
    "qwen3-yarn": dict(
        cls="Qwen3ForCausalLM", config_cls="Qwen3Config", tokenizer="bpe", pre="gpt-2",
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        special_roles={"bos": "<|endoftext|>", "eos": "<|im_end|>"},
        config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, max_position_embeddings=256, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, attention_bias=False, use_sliding_window=False,
                    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                     "original_max_position_embeddings": 64}),
        probes={"no YaRN": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}},
        notes=["YaRN rope scaling (factor 4 over an original context of 64, base 10000, head_dim 32): "
               "transformers keeps rotary pair 0's frequency, divides pairs 5.. by 4 and blends pairs 1..4 "
               "(correction dims 0 and 5), and multiplies cos and sin by 0.1 ln 4 + 1. The converter "
               "writes rope.scaling.type yarn, the factor and original_context_length."]),
    "starcoder2-swa": dict(
        cls="Starcoder2ForCausalLM", config_cls="Starcoder2Config", tokenizer="bpe", pre="gpt-2",
        specials=["<|endoftext|>"], special_roles={"bos": "<|endoftext|>", "eos": "<|endoftext|>"},
        config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256, norm_epsilon=1e-5, use_bias=True,
                    hidden_act="gelu_pytorch_tanh", sliding_window=8, tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
        add_metadata="sliding_window",
        probes={"no sliding window": {"sliding_window": None}},
        notes=["sliding_window 8: transformers' Starcoder2 slides every layer.",
               "The converter writes no sliding-window key for starcoder2; the script adds "
               "starcoder2.attention.sliding_window only (no pattern key: every layer slides; see "
               "'Second intervention' in README.md)."]),
    "granite": dict(
        cls="GraniteForCausalLM", config_cls="GraniteConfig", tokenizer="bpe", pre="gpt-2",
        specials=["<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>"],
        special_roles={"bos": "<|end_of_text|>", "eos": "<|end_of_text|>"},
        config=dict(hidden_size=96, intermediate_size=200, num_hidden_layers=3, num_attention_heads=6,
                    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                    tie_word_embeddings=True, embedding_multiplier=6.0, residual_multiplier=0.35,
                    attention_multiplier=0.09, logits_scaling=2.5,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        probes={"embedding_multiplier 1": {"embedding_multiplier": 1.0},
                "residual_multiplier 1": {"residual_multiplier": 1.0},
                "attention_multiplier 1/sqrt(head_dim)": {"attention_multiplier": 0.25},
                "logits_scaling 1": {"logits_scaling": 1.0}},
        notes=["embedding_multiplier 6.0 (granite.embedding_scale), residual_multiplier 0.35 "
               "(granite.residual_scale), attention_multiplier 0.09 replaces 1/sqrt(head_dim) "
               "(granite.attention.scale), logits divided by logits_scaling 2.5 (granite.logit_scale)."]),
    "mixtral": dict(
        cls="MixtralForCausalLM", config_cls="MixtralConfig", tokenizer="spm-llama",
        config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
                    tie_word_embeddings=False, sliding_window=None, num_local_experts=6, num_experts_per_tok=2,
                    router_jitter_noise=0.0, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        probes={"top-1 instead of top-2": {"num_experts_per_tok": 1}},
        notes=["Mixtral: GGUF architecture 'llama' with llama.expert_count 6 and llama.expert_used_count 2; "
               "every block's FFN is 6 SiLU-gated experts of width 96 (intermediate_size), softmax router, "
               "top-2, the two weights renormalized to sum 1. The converter merges the per-expert "
               "checkpoint tensors (block_sparse_moe.experts.E.w1/w2/w3) into blk.N.ffn_{gate,down,up}_exps.",
               "Router weights ~ N(0, (4/sqrt(hidden))^2) (ROUTER_SCALE) so that tokens choose different "
               "experts with clear margins; meta.routing records the choices."]),
    "qwen2moe": dict(
        cls="Qwen2MoeForCausalLM", config_cls="Qwen2MoeConfig", tokenizer="bpe", pre="gpt-2",
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        special_roles={"bos": "<|endoftext|>", "eos": "<|im_end|>"},
        config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                    tie_word_embeddings=True, use_sliding_window=False, num_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=32, shared_expert_intermediate_size=64, norm_topk_prob=False,
                    decoder_sparse_step=1, mlp_only_layers=[],
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        probes={"norm_topk_prob true (renormalized top-k weights)": {"norm_topk_prob": True},
                "top-1 instead of top-2": {"num_experts_per_tok": 1}},
        notes=["Qwen2-MoE: Qwen2 attention (Q/K/V biases) and in every block (decoder_sparse_step 1) 8 experts "
               "of width 32 (moe_intermediate_size), softmax router, top-2 weighted by their softmax "
               "probabilities without renormalization (norm_topk_prob false, as llama.cpp computes "
               "qwen2moe), plus a shared expert of width 64 scaled by sigmoid(shared_expert_gate . x). "
               "Tied embeddings.",
               "Router weights scaled as in mixtral (ROUTER_SCALE)."]),
    "qwen3moe": dict(
        cls="Qwen3MoeForCausalLM", config_cls="Qwen3MoeConfig", tokenizer="bpe", pre="gpt-2",
        specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        special_roles={"bos": "<|endoftext|>", "eos": "<|im_end|>"},
        config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, attention_bias=False, use_sliding_window=False, num_experts=6,
                    num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True, decoder_sparse_step=1,
                    mlp_only_layers=[], rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        probes={"norm_topk_prob false": {"norm_topk_prob": False},
                "top-1 instead of top-2": {"num_experts_per_tok": 1}},
        notes=["Qwen3-MoE: Qwen3 attention (QK-norm) and in every block 6 experts of width 64 "
               "(moe_intermediate_size), softmax router, top-2 renormalized. norm_topk_prob is set true on "
               "purpose: llama.cpp always renormalizes for qwen3moe (the GGUF carries no such flag), so "
               "with norm_topk_prob true transformers and llama.cpp compute the same model (the released "
               "Qwen3-MoE models set it true too).",
               "Router weights scaled as in mixtral (ROUTER_SCALE)."]),
    "gemma4-moe": dict(
        cls="Gemma4ForCausalLM", config_cls="Gemma4TextConfig", tokenizer="hf-gemma4",
        config=_gemma4_config(intermediate_size=64, num_hidden_layers=3,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                              enable_moe_block=True, num_experts=6, top_k_experts=2, moe_intermediate_size=32),
        notes=["Gemma 4 with its mixture-of-experts block (enable_moe_block) in every layer, as the "
               "26B-A4B model: the dense MLP (width 64) and 6 experts of width 32 (top 2) side by side. "
               "The router reads the attention residual: RMS norm without weight, times router.scale "
               "(ffn_gate_inp.scale) and hidden_size^-0.5, softmax over every expert, top 2 renormalized, "
               "times router.per_expert_scale (ffn_down_exps.scale). The experts' gate and up are one "
               "tensor (gate_up_proj -> ffn_gate_up_exps, gate rows first). Branch norms "
               "post_feedforward_layernorm_1/_2 and pre_feedforward_layernorm_2; PLE as gemma4.",
               "Router weights scaled as in mixtral (ROUTER_SCALE)."]),
    "gpt-oss": dict(
        cls="GptOssForCausalLM", config_cls="GptOssConfig", tokenizer="bpe", pre="gpt-2",
        specials=["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|start|>", "<|end|>", "<|message|>"],
        special_roles={"bos": "<|startoftext|>", "eos": "<|return|>"},
        config=dict(hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
                    tie_word_embeddings=False, attention_bias=True, sliding_window=8, num_local_experts=6,
                    num_experts_per_tok=2, swiglu_limit=7.0,
                    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                     "beta_fast": 32.0, "beta_slow": 1.0, "original_max_position_embeddings": 64,
                                     "truncate": False}),
        probes={"no sinks (a very negative sink logit)": "sinks",
                "truncated YaRN bounds": {"rope_parameters": {
                    "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                    "beta_slow": 1.0, "original_max_position_embeddings": 64, "truncate": True}},
                "no sliding window": {"sliding_window": 4096},
                "top-1 instead of top-2": {"num_experts_per_tok": 1}},
        notes=["gpt-oss: attention with Q/K/V/O biases and a learned sink logit per head (self_attn.sinks -> "
               "blk.N.attn_sinks.weight), sliding window 8 on layer 0 and full attention on layer 1 "
               "(transformers' default layer_types), YaRN (factor 32 over 64 positions, base 150000) with "
               "truncate false (fractional correction bounds); 6 experts of width 32, top 2: the router's "
               "logits plus its bias, softmax over the top 2; each expert's clamped SwiGLU (alpha 1.702, "
               "limit 7) with gate/up/down biases. The converter splits the interleaved gate_up_proj into "
               "ffn_gate_exps (even columns) and ffn_up_exps (odd), transposes the experts to GGUF rows, "
               "and appends '.weight' to the sinks.",
               "The tokenizer is the tiny GPT-2-style BPE of the other fixtures (pre gpt-2); real gpt-oss "
               "files use the o200k vocabulary with pre gpt-4o, which kcap's tokenizer implements.",
               "Router weights scaled as in mixtral (ROUTER_SCALE)."]),
    "deepseek2": dict(
        cls="DeepseekV2ForCausalLM", config_cls="DeepseekV2Config", tokenizer="bpe", pre="gpt-2",
        specials=["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
        special_roles={"bos": "<｜begin▁of▁sentence｜>", "eos": "<｜end▁of▁sentence｜>"},
        config=dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                    q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                    intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3,
                    n_shared_experts=2, first_k_dense_replace=1, topk_method="group_limited_greedy", n_group=4,
                    topk_group=2, norm_topk_prob=False, routed_scaling_factor=2.0, scoring_func="softmax",
                    max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_parameters=_deepseek_yarn(0.707)),
        probes={"no yarn mscale (mscale_all_dim 0)": {"rope_parameters": dict(_deepseek_yarn(0.707), mscale_all_dim=0)},
                "greedy instead of group_limited_greedy": {"topk_method": "greedy"},
                "routed_scaling_factor 1": {"routed_scaling_factor": 1.0},
                "groups scored by their two largest probabilities' sum (DeepSeek-V3's rule)": "v3_group_score"},
        notes=["DeepSeek-V2 (DeepseekV2ForCausalLM) shaped like DeepSeek-V2-Lite, with the group-limited routing of "
               "the large DeepSeek-V2. Multi-head latent attention without the query low-rank path (q_lora_rank "
               "None: one q_proj, 4 heads of 32 no-rope + 16 rope dims); kv_a_proj_with_mqa gives a 64-dim KV latent "
               "(RMS-normed by kv_a_layernorm) and one 16-dim rope key shared by the heads; kv_b_proj expands the "
               "latent per head into 32 key and 32 value dims. Rope on the 16 rope dims in interleaved pairs "
               "(GPT-J style), YaRN factor 4 over 64 original positions, mscale = mscale_all_dim = 0.707: "
               "transformers' cos/sin factor is 1 and the softmax scale is (0.1 * 0.707 * ln 4 + 1)^2 / sqrt(48).",
               "Block 0 is a dense SiLU MLP of width 96 (first_k_dense_replace 1); blocks 1 and 2 have 8 routed "
               "experts of width 32 plus the 2 shared experts as one SiLU MLP of width 64. Router: softmax over the "
               "8 logits; group_limited_greedy: the experts in 4 groups of 2, the 2 groups with the largest MAX "
               "probability kept, the top 3 experts of those 4; weights = their softmax probabilities (not "
               "renormalized, norm_topk_prob false) times routed_scaling_factor 2.0. 3 experts per token (not "
               "DeepSeek-V2-Lite's greedy top 6 of 64): with a group scored by its largest probability, the groups "
               "of the top k experts are always among the k best groups, so the group limit changes the choice "
               "only where topk_group (2) < k, as in DeepSeek-V2 (3 of 8 groups, top 6).",
               "The converter (DeepseekV2Model) writes GGUF architecture deepseek2 in its MLA layout: kv_b_proj "
               "split per head into attn_k_b (the key rows transposed, GGUF [32, 64, 4]) and attn_v_b (GGUF "
               "[64, 32, 4]); attention.head_count_kv 1, key_length 80 / value_length 64 (the latent's sizes) and "
               "key_length_mla 48 / value_length_mla 32 (per head); q_lora_rank absent; leading_dense_block_count 1, "
               "expert_shared_count 2, expert_weights_scale 2.0, no expert_weights_norm, expert_group_count 4, "
               "expert_group_used_count 2, expert_gating_func 1 (softmax, from scoring_func softmax as in "
               "DeepSeek-V2's config.json), rope.scaling.yarn_log_multiplier 0.0707 (0.1 * mscale_all_dim). The "
               "per-expert tensors are merged into ffn_{gate,up,down}_exps; the shared experts are ffn_*_shexp.",
               "The GGUF does not say how a group is scored: DeepSeek-V2's group_limited_greedy takes a group's "
               "largest probability, DeepSeek-V3's noaux_tc the sum of its two largest (biased) scores, and "
               "llama.cpp's build_moe_ffn uses the two-largest sum for every architecture. The probe "
               "'groups scored by their two largest probabilities' sum' shows how far that is from this model.",
               "Router weights scaled as in mixtral (ROUTER_SCALE). meta.routing records the choices with margins "
               "for both the group choice and the expert choice (deepseek_routing).",
               "The converter needs no intervention for DeepSeek. It logs 'Duplicated key name' for "
               "attention.key_length / value_length: its base class writes config.json's head_dim (transformers "
               "saves head_dim = qk_rope_head_dim, 16) and DeepseekV2Model then overwrites both with the MLA "
               "values, which are what the file holds."]),
    "deepseek3": dict(
        cls="DeepseekV3ForCausalLM", config_cls="DeepseekV3Config", tokenizer="bpe", pre="gpt-2",
        specials=["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
        special_roles={"bos": "<｜begin▁of▁sentence｜>", "eos": "<｜end▁of▁sentence｜>"},
        config=dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                    q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                    intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3,
                    n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2, norm_topk_prob=True,
                    routed_scaling_factor=2.5, scoring_func="sigmoid", topk_method="noaux_tc", rope_interleave=True,
                    max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                    rope_parameters=_deepseek_yarn(1.0)),
        probes={"no score correction bias (every e_score_correction_bias 0)": "no_score_bias",
                "softmax instead of sigmoid scores": "softmax_scores",
                "no groups (n_group 1, topk_group 1)": {"n_group": 1, "topk_group": 1},
                "norm_topk_prob false": {"norm_topk_prob": False},
                "rope_interleave false (NEOX halves)": {"rope_interleave": False}},
        notes=["DeepSeek-V3 (DeepseekV3ForCausalLM) at the sizes of deepseek2, with the query low-rank path: "
               "q_a_proj (64 -> q_lora_rank 64), q_a_layernorm (RMS), q_b_proj (64 -> 4 heads of 48). rope_interleave "
               "true: the rope dims rotate in interleaved pairs as DeepSeek's checkpoints store them. YaRN as "
               "deepseek2 with mscale = mscale_all_dim = 1.0 (softmax scale (0.1 ln 4 + 1)^2 / sqrt(48)).",
               "Block 0 dense (width 96); blocks 1 and 2: 8 routed experts of width 32 plus 1 shared expert (width "
               "32). Router (scoring_func sigmoid, topk_method noaux_tc as in DeepSeek-V3's config.json): scores = "
               "sigmoid(logits); the choice uses scores + e_score_correction_bias: 4 groups of 2, a group's score "
               "the sum of its two largest biased scores, the 2 best groups kept, the top 3 experts among their 4; "
               "the weights are the chosen experts' UNBIASED sigmoid scores, renormalized to sum 1 (norm_topk_prob), "
               "times routed_scaling_factor 2.5.",
               "e_score_correction_bias (a buffer that transformers initializes to 0) is set to N(0, 0.1^2) values "
               "(SCORE_BIAS_STD), large enough to change the choice at many tokens (meta.routing counts them), so "
               "that an engine that ignores it, or adds it to the weights, does not match.",
               "The converter writes deepseek2 as for deepseek2, plus attention.q_lora_rank 64 (attn_q_a, "
               "attn_q_a_norm, attn_q_b instead of attn_q), expert_gating_func 2 (sigmoid, from scoring_func), "
               "expert_weights_norm true, expert_weights_scale 2.5, rope.scaling.yarn_log_multiplier 0.1, and each "
               "router's e_score_correction_bias as blk.N.exp_probs_b.bias.",
               "Router weights scaled as in mixtral (ROUTER_SCALE)."]),
}

# gpt-oss with its experts in MXFP4, as OpenAI ships them: the gpt-oss model (its config,
# tokenizer and weights' seed rule), without its probes.
FAMILIES["gpt-oss-mxfp4"] = dict(
    {k: v for k, v in FAMILIES["gpt-oss"].items() if k not in ("probes", "notes")},
    mxfp4_experts=True,
    notes=["gpt-oss as the gpt-oss fixture, with the experts' weights in MXFP4 as OpenAI ships them: "
               "the script rounds each expert matrix to MXFP4 (32-value blocks, an E8M0 scale "
               "2^(floor(log2 amax) - 2), E2M1 codes rounded to nearest) in the model itself, so the "
               "transformers reference runs exactly those values, and writes the checkpoint's experts as "
               "*_blocks / *_scales (the low nibble holds the even element) with quantization_config "
               "{quant_method: mxfp4}; the converter repacks them into GGML MXFP4 tensors "
               "(GptOssModel.repack_mxfp4) and writes the other tensors in the outtype.",
               "Router weights scaled as in mixtral (ROUTER_SCALE)."])

# deepseek2 in the layout llama.cpp's converter wrote before its MLA change (still the layout of many
# published DeepSeek-V2 GGUFs): the deepseek2 model itself (same_model_as: its config, seeds, prompt and
# reference), converted as deepseek2 and then rewritten by legacy_kv_b_gguf (see the module docstring).
FAMILIES["deepseek2-kvb"] = dict(
    {k: v for k, v in FAMILIES["deepseek2"].items() if k not in ("probes", "notes")},
    same_model_as="deepseek2", kv_b="joined",
    notes=["The deepseek2 model (same weights, prompt and reference logits) in the tensor layout of GGUFs "
           "converted before llama.cpp's MLA change: one blk.N.attn_kv_b.weight per block, the HF kv_b_proj.weight "
           "unchanged (GGUF [64, 256]: per head 32 key rows then 32 value rows), instead of attn_k_b / attn_v_b; "
           "deepseek2.attention.head_count_kv 4 (= head_count), key_length 48 (qk_nope + qk_rope), value_length "
           "32 (v_head_dim), and no key_length_mla / value_length_mla. Made from the converter's deepseek2 files "
           "by legacy_kv_b_gguf (the third documented intervention); in the q8_0 file attn_kv_b is the F32 matrix "
           "quantized to Q8_0 as one tensor, as the converter quantizes, so logits_q8_0_weights (computed from "
           "this file's own tensors) differ from deepseek2's."])

# Mixture-of-experts routers: weights ~ N(0, (ROUTER_SCALE/sqrt(hidden))^2), larger than the other
# matrices' 1/sqrt(fan_in), so that the router's logits spread and different tokens choose
# different experts, with margins between the k-th and (k+1)-th expert well above rounding.
ROUTER_SCALE = 4.0
ROUTER_NAMES = (".mlp.gate.weight", ".block_sparse_moe.gate.weight", ".router.proj.weight", ".mlp.router.weight")
# DeepSeek-V3's e_score_correction_bias (added to the sigmoid scores for the choice only): transformers
# initializes it to 0; N(0, SCORE_BIAS_STD^2) values change the chosen experts at many tokens.
SCORE_BIAS_STD = 0.1
# Smallest gap between the k-th and (k+1)-th largest router logit a fixture may have at any token
# of the prompt and its greedy continuation (f32 rounding moves the logits by ~1e-5, Q8_0 weights
# elsewhere in the model by ~1e-2); weights seeds are tried ROUTING_SEED_STRIDE apart until one has it.
# DeepSeek's routers choose groups, then experts, on scores: their margin is the same quantity
# generalized, twice the smallest change of every router logit that can alter either choice
# (deepseek_choice_margins), which for a plain top-k router is exactly that gap.
MIN_ROUTING_MARGIN = 0.05
MAX_ROUTING_ATTEMPTS = 50
ROUTING_SEED_STRIDE = 7919


# Models that kcap must refuse (they need a feature it does not implement), made and converted
# the same way: one F32 file each in REFUSED_FIXTURES, no goldens (there are no kcap logits to
# compare); tests/python/test_accounting.py checks that loading one fails and says why.
REFUSED: dict[str, dict] = {}


# ----------------------------------------------------------------------------------------
# model building
# ----------------------------------------------------------------------------------------


def is_moe(spec: dict) -> bool:
    return "num_experts_per_tok" in spec["config"] or "top_k_experts" in spec["config"]


def family_seed(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def build_model(name: str, spec: dict, roles: dict[str, int], perturb: bool = True, perturb_seed: int | None = None):
    import torch
    import transformers

    cfg_cls = getattr(transformers, spec["config_cls"])
    kwargs = dict(spec["config"], vocab_size=VOCAB, attn_implementation="eager")
    if is_moe(spec):
        # the plain per-expert loop (transformers' default batches the experts with grouped_mm,
        # which has no float64 kernel for the precision floor below)
        kwargs["experts_implementation"] = "eager"
    if "bos" in roles:
        kwargs["bos_token_id"] = roles["bos"]
    if "eos" in roles:
        kwargs["eos_token_id"] = roles["eos"]
    kwargs["pad_token_id"] = roles.get("pad")
    config = cfg_cls(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(family_seed(name))
    model = getattr(transformers, spec["cls"])(config).eval()
    if perturb:
        reinit(model, family_seed(name) + 1 if perturb_seed is None else perturb_seed)
    if spec.get("mxfp4_experts"):
        mxfp4_round_experts(model)
    return model


def reinit(model, seed: int) -> None:
    """Weights N(0, 1/fan_in); embeddings and head N(0, (2.5/sqrt(d))^2) so logits have a
    spread of a few units; every 1-D weight (norms), bias and layer scalar gets noise."""
    import torch

    g = torch.Generator().manual_seed(seed)
    conv1d = tuple(m.weight for m in model.modules() if type(m).__name__ == "Conv1D")  # GPT-2 (in, out)
    conv1d_ids = {id(w) for w in conv1d}
    tied_ids = set()
    with torch.no_grad():
        for pname, p in model.named_parameters():  # tied parameters are listed once
            if id(p) in tied_ids:
                continue
            tied_ids.add(id(p))
            if p.ndim == 1:
                noise = torch.randn(p.shape, generator=g) * 0.3
                p.copy_(p + noise)  # norms around their init (1, or 0 for Gemma offsets), biases around 0
            elif p.ndim == 2:
                is_embedding = any(k in pname for k in ("embed", "wte", "wpe", "lm_head"))
                if is_embedding:
                    d = p.shape[1]
                    std = 2.5 / d ** 0.5
                    if "per_layer" in pname:  # Gemma 4 packed per-layer embeddings
                        std = 1.0
                else:
                    fan_in = p.shape[0] if id(p) in conv1d_ids else p.shape[1]
                    std = 1.0 / fan_in ** 0.5
                    if pname.endswith(ROUTER_NAMES):  # mixture-of-experts router [n_expert, hidden]
                        std *= ROUTER_SCALE
                        if pname.endswith(".router.proj.weight"):  # Gemma 4 scales its input by hidden^-0.5
                            std *= 3.0 * p.shape[1] ** 0.5
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif p.ndim == 3 and pname.endswith(("experts.gate_up_proj", "experts.down_proj")):
                # stacked experts: each expert's matrix ~ N(0, 1/in); [n_expert, out, in], or
                # [n_expert, in, out] for gpt-oss (GptOssExperts multiplies x @ W)
                fan_in = p.shape[1] if type(model).__name__.startswith("GptOss") else p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
            else:
                raise ValueError(f"unexpected parameter {pname} {tuple(p.shape)}")
        for bname, b in model.named_buffers():
            if bname.endswith("layer_scalar"):
                b.copy_(0.6 + 0.8 * torch.rand(b.shape, generator=g))
            elif bname.endswith("e_score_correction_bias"):  # DeepSeek-V3's router
                b.copy_(torch.randn(b.shape, generator=g) * SCORE_BIAS_STD)


def forward_logits(model, ids):
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].float().numpy()


def reference(model, prompt: list[int]) -> dict:
    import numpy as np

    logits = forward_logits(model, prompt)
    ids = list(prompt)
    greedy, margins, step_logits = [], [], []
    for _ in range(GREEDY_STEPS):
        last = forward_logits(model, ids)[-1]
        order = np.argsort(-last.astype(np.float64), kind="stable")
        greedy.append(int(order[0]))
        margins.append(float(last[order[0]] - last[order[1]]))
        step_logits.append(last)
        ids.append(int(order[0]))
    return dict(logits=logits.astype(np.float32), greedy_ids=np.array(greedy, dtype=np.int64),
                greedy_margins=np.array(margins, dtype=np.float32),
                greedy_logits=np.stack(step_logits).astype(np.float32))


def sensitivity_probes(name: str, spec: dict, model, prompt, ref_logits) -> dict:
    """How visible each feature is: max |delta logits| when one 1-D tensor (norm weight,
    bias, layer scalar) is reset to its init value, and for each config probe of the family."""
    import numpy as np
    import torch

    fresh = type(model)(model.config).eval()  # transformers' init values
    init = {k: v.clone() for k, v in fresh.state_dict().items()}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    resets = {}
    for key, value in state.items():
        if value.ndim != 1 or key.endswith(("inv_freq", "embed_scale")) or key not in init:
            continue
        if torch.equal(init[key], value):
            continue
        fresh.load_state_dict(state)
        with torch.no_grad():
            fresh.state_dict()[key].copy_(init[key])
        resets[key] = float(np.max(np.abs(forward_logits(fresh, prompt) - ref_logits)))
    weakest = min(resets, key=resets.get) if resets else None
    out = {"reset_1d_tensor_min_delta": resets[weakest] if weakest else None, "reset_1d_tensor_weakest": weakest,
           "reset_1d_tensor_count": len(resets), "reset_1d_tensor": dict(sorted(resets.items())), "config": {}}
    for desc, overrides in spec.get("probes", {}).items():
        if overrides == "sinks":  # gpt-oss: every sink logit at -1e4 (no sink)
            m = type(model)(model.config).eval()
            m.load_state_dict({k: (v.clone().fill_(-1e4) if k.endswith("self_attn.sinks") else v) for k, v in state.items()})
            out["config"][desc] = float(np.max(np.abs(forward_logits(m, prompt) - ref_logits)))
            continue
        if overrides == "no_score_bias":  # DeepSeek-V3: every e_score_correction_bias at 0
            m = type(model)(model.config).eval()
            m.load_state_dict({k: (v.clone().zero_() if k.endswith("e_score_correction_bias") else v)
                               for k, v in state.items()})
            out["config"][desc] = float(np.max(np.abs(forward_logits(m, prompt) - ref_logits)))
            continue
        if isinstance(overrides, str) and overrides in DEEPSEEK_ROUTER_VARIANTS:  # a rule the config cannot change
            m = type(model)(model.config).eval()
            m.load_state_dict(state)
            for r in m.modules():
                if type(r).__name__ in DEEPSEEK_ROUTERS:
                    r.forward = DEEPSEEK_ROUTER_VARIANTS[overrides].__get__(r)
            out["config"][desc] = float(np.max(np.abs(forward_logits(m, prompt) - ref_logits)))
            continue
        d = model.config.to_dict()
        d.update(overrides)
        cfg = type(model.config).from_dict(d)
        cfg._attn_implementation = "eager"
        if is_moe(spec):
            cfg._experts_implementation = "eager"
        m = type(model)(cfg).eval()
        m.load_state_dict(state)
        out["config"][desc] = float(np.max(np.abs(forward_logits(m, prompt) - ref_logits)))
    return out


DEEPSEEK_ROUTERS = ("DeepseekV2TopkRouter", "DeepseekV3TopkRouter")


def _group_limited_topk(choice, n_group: int, topk_group: int, k: int, group_rule: str):
    """The experts (indices [tokens, k]) that DeepSeek's group-limited selection chooses on the
    choice scores [tokens, n_expert]: the experts split into n_group consecutive groups, a group
    scored by its largest score ("max", DeepSeek-V2's group_limited_greedy) or by the sum of its
    two largest ("top2sum", DeepSeek-V3's noaux_tc), the topk_group best groups kept, then the k
    best experts of those groups."""
    import torch

    grouped = choice.view(choice.shape[0], n_group, -1)
    if group_rule == "max":
        group_scores = grouped.max(dim=-1).values
    else:
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    expert_mask = group_mask.unsqueeze(-1).expand_as(grouped).reshape(choice.shape).bool()
    return torch.topk(choice.masked_fill(~expert_mask, float("-inf")), k=k, dim=-1, sorted=False)[1]


def _v2_router_top2sum_groups(self, hidden_states):
    """DeepseekV2TopkRouter.forward with DeepSeek-V3's group score (sum of a group's two largest
    probabilities) instead of its largest: a sensitivity probe."""
    import torch.nn.functional as F

    router_logits = F.linear(hidden_states.view(-1, self.hidden_dim).float(), self.weight.float())
    scores = router_logits.softmax(dim=-1, dtype=router_logits.dtype)
    topk_indices = _group_limited_topk(scores, self.num_group, self.topk_group, self.top_k, "top2sum")
    return router_logits, scores.gather(1, topk_indices) * self.routed_scaling_factor, topk_indices


def _v3_router_softmax_scores(self, hidden_states):
    """DeepseekV3TopkRouter.forward with softmax scores instead of sigmoid (bias, groups and
    renormalization unchanged): a sensitivity probe."""
    import torch.nn.functional as F

    router_logits = F.linear(hidden_states.view(-1, self.hidden_dim).float(), self.weight.float())
    scores = router_logits.softmax(dim=-1)
    topk_indices = _group_limited_topk(scores + self.e_score_correction_bias, self.num_group, self.topk_group,
                                       self.top_k, "top2sum")
    topk_weights = scores.gather(1, topk_indices)
    if self.norm_topk_prob:
        topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + 1e-20)
    return router_logits, topk_weights * self.routed_scaling_factor, topk_indices


DEEPSEEK_ROUTER_VARIANTS = {"v3_group_score": _v2_router_top2sum_groups, "softmax_scores": _v3_router_softmax_scores}


def deepseek_router_rule(router) -> dict:
    """How a DeepSeek router chooses, as numpy functions of its logits: the choice scores (V2:
    the logits themselves, since softmax keeps their order within a token and a group's largest
    probability belongs to its largest logit; V3: sigmoid(logits) + e_score_correction_bias),
    the group rule and sizes. V2's "greedy" is one group."""
    import numpy as np

    v3 = type(router).__name__ == "DeepseekV3TopkRouter"
    grouped = v3 or router.topk_method == "group_limited_greedy"
    rule = {"n_group": router.num_group if grouped else 1, "topk_group": router.topk_group if grouped else 1,
            "k": router.top_k, "group_rule": "top2sum" if v3 else "max"}
    if v3:
        bias = router.e_score_correction_bias.detach().double().numpy()
        rule["score"] = lambda x: 1.0 / (1.0 + np.exp(-x))
        rule["bias"] = bias
    else:
        rule["score"] = lambda x: x
        rule["bias"] = 0.0
    return rule


def deepseek_choice_margins(logits, chosen, rule: dict) -> tuple:
    """Per token, twice the largest eps such that NO change of the router logits by at most eps
    each (|delta| <= eps) can alter (a) which groups are kept, (b) which experts are chosen among
    the kept groups' experts; for a plain top-k router this is the k-th minus (k+1)-th largest logit.
    The choice scores are monotone in each logit and the groups disjoint, so for a given eps the
    worst case is exact: the kept groups (chosen experts) scored at logits - eps, the others at
    logits + eps; eps is found by bisection. chosen: the experts the model chose [tokens, k] (a
    chosen expert outside the kept groups, or not the top k, counts as margin 0).
    Returns (group margins or None where every group is kept, expert margins), numpy [tokens]."""
    import numpy as np

    logits = np.asarray(logits, dtype=np.float64)
    n_tok, n_expert = logits.shape
    n_group, topk_group, per = rule["n_group"], rule["topk_group"], n_expert // rule["n_group"]

    def choice(x):
        return rule["score"](x) + rule["bias"]

    def group_scores(c):
        c = c.reshape(n_tok, n_group, per)
        return c.max(axis=-1) if rule["group_rule"] == "max" else np.sort(c, axis=-1)[..., -2:].sum(axis=-1)

    kept = np.zeros((n_tok, n_group), dtype=bool)
    best_groups = np.argsort(-group_scores(choice(logits)), axis=1, kind="stable")[:, :topk_group]
    kept[np.arange(n_tok)[:, None], best_groups] = True
    candidates = np.repeat(kept, per, axis=1)
    is_chosen = np.zeros((n_tok, n_expert), dtype=bool)
    is_chosen[np.arange(n_tok)[:, None], np.asarray(chosen)] = True
    all_chosen_kept = ~np.any(is_chosen & ~candidates, axis=1)

    def groups_hold(eps):
        lo, hi = group_scores(choice(logits - eps[:, None])), group_scores(choice(logits + eps[:, None]))
        return np.where(kept, lo, np.inf).min(axis=1) > np.where(kept, -np.inf, hi).max(axis=1)

    def experts_hold(eps):
        lo, hi = choice(logits - eps[:, None]), choice(logits + eps[:, None])
        others = candidates & ~is_chosen
        worst_chosen = np.where(is_chosen, lo, np.inf).min(axis=1)
        return all_chosen_kept & (worst_chosen > np.where(others, hi, -np.inf).max(axis=1))

    def largest_safe_eps(holds, eps_max=64.0):
        lo, hi = np.zeros(n_tok), np.full(n_tok, eps_max)
        safe_at_zero, safe_at_max = holds(lo), holds(hi)
        for _ in range(60):
            mid = (lo + hi) / 2
            ok = holds(mid)
            lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
        return np.where(safe_at_zero, np.where(safe_at_max, eps_max, lo), 0.0)

    group = None if topk_group >= n_group else 2 * largest_safe_eps(groups_hold)
    return group, 2 * largest_safe_eps(experts_hold)


def deepseek_routing(model, prompt) -> dict:
    """routing() for DeepSeek's routers (DeepseekV2TopkRouter / DeepseekV3TopkRouter), whose output
    (router_logits, topk_weights, topk_indices) is hooked: the chosen experts as the model really
    chose them, per MoE block (the leading dense blocks have no router). min_top_k_logit_margin is
    the smaller of the group-choice and expert-choice margins (deepseek_choice_margins); the counts
    say at how many tokens the groups (and, for V3, the score correction bias) change the choice
    against plain top-k on the same scores."""
    import numpy as np
    import torch

    blocks = {id(m): int(re.search(r"layers\.(\d+)\.", n).group(1))
              for n, m in model.named_modules() if type(m).__name__ in DEEPSEEK_ROUTERS}
    captured = []

    def capture(m, args, out):
        captured.append((m, out[0].detach(), out[2].detach()))

    hooks = [m.register_forward_hook(capture) for m in model.modules() if type(m).__name__ in DEEPSEEK_ROUTERS]
    try:
        forward_logits(model, prompt)
    finally:
        for h in hooks:
            h.remove()
    layers = []
    for router, logits, chosen in captured:  # in block order
        rule = deepseek_router_rule(router)
        group_margins, expert_margins = deepseek_choice_margins(logits.double().numpy(), chosen.numpy(), rule)
        margins = expert_margins if group_margins is None else np.minimum(group_margins, expert_margins)
        chosen_sets = [frozenset(row) for row in chosen.tolist()]
        choice = torch.from_numpy(rule["score"](logits.double().numpy()) + rule["bias"])
        plain = [frozenset(row) for row in torch.topk(choice, k=rule["k"], dim=-1)[1].tolist()]
        layer = {"block": blocks[id(router)],
                 "distinct_expert_sets": len(set(chosen_sets)),
                 "expert_use_counts": np.bincount(chosen.flatten().numpy(), minlength=router.num_experts).tolist(),
                 "min_top_k_logit_margin": float(margins.min()),
                 "min_group_choice_margin": None if group_margins is None else float(group_margins.min()),
                 "min_expert_choice_margin": float(expert_margins.min()),
                 "tokens_where_groups_change_the_choice": sum(a != b for a, b in zip(chosen_sets, plain))}
        if type(router).__name__ == "DeepseekV3TopkRouter":
            unbiased = torch.from_numpy(rule["score"](logits.double().numpy()))
            without_bias = _group_limited_topk(unbiased, rule["n_group"], rule["topk_group"], rule["k"], "top2sum")
            layer["tokens_where_score_bias_changes_the_choice"] = sum(
                a != frozenset(b) for a, b in zip(chosen_sets, without_bias.tolist()))
        layers.append(layer)
    return {"n_tokens": len(prompt), "layers": layers}


def routing(model, prompt) -> dict | None:
    """For a mixture-of-experts model, what its routers chose on the prompt, per layer: how many
    distinct expert sets the tokens chose, how often each expert was chosen, and the smallest
    margin between the k-th and (k+1)-th largest router logit over the tokens (the softmax keeps
    their order; a near-tie there would let rounding flip an expert choice). None for a dense model."""
    import numpy as np
    import torch

    if any(type(m).__name__ in DEEPSEEK_ROUTERS for m in model.modules()):
        return deepseek_routing(model, prompt)
    routers = [m for m in model.modules() if type(m).__name__.endswith(("TopKRouter", "Gemma4TextRouter"))]
    if not routers:
        return None
    captured = []

    def capture(m, args, out):
        if type(m).__name__ == "Gemma4TextRouter":  # returns the softmax probabilities: their logs
            # differ from the logits by one constant per token, so the margins are the logits'
            captured.append((m.config.top_k_experts, m.config.num_experts, out[0].double().log(), out[2]))
        else:
            captured.append((m.top_k, m.num_experts, out[0], out[2]))

    hooks = [r.register_forward_hook(capture) for r in routers]
    try:
        forward_logits(model, prompt)
    finally:
        for h in hooks:
            h.remove()
    layers = []
    for k, n_expert, logits, chosen in captured:  # in layer order
        ordered = logits.double().sort(dim=-1, descending=True).values
        sets = {tuple(sorted(row)) for row in chosen.tolist()}
        layers.append({"distinct_expert_sets": len(sets),
                       "expert_use_counts": np.bincount(chosen.flatten().numpy(), minlength=n_expert).tolist(),
                       "min_top_k_logit_margin": float((ordered[:, k - 1] - ordered[:, k]).min())})
    return {"n_tokens": len(prompt), "layers": layers}


def make_prompt(name: str) -> list[int]:
    import numpy as np

    rng = np.random.default_rng(family_seed(name) + 7)
    return [int(x) for x in rng.integers(4, VOCAB, size=PROMPT_LEN)]


# ----------------------------------------------------------------------------------------
# GGUF inspection and reload
# ----------------------------------------------------------------------------------------

_BIG_ARRAYS = {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
               "tokenizer.ggml.merges"}


def inspect_gguf(path: Path) -> dict:
    import numpy as np
    from gguf import GGUFReader, GGUFValueType

    r = GGUFReader(path)
    meta = {}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        vtype = f.types[0] if f.types else None
        if key in _BIG_ARRAYS:
            meta[key] = f"<array of {len(f.data)}>"
            continue
        if vtype == GGUFValueType.STRING:
            meta[key] = bytes(f.parts[f.data[0]]).decode("utf-8")
        elif vtype == GGUFValueType.ARRAY:
            sub = f.types[1] if len(f.types) > 1 else None
            if sub == GGUFValueType.STRING:
                meta[key] = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                meta[key] = [np.asarray(f.parts[i]).tolist()[0] for i in f.data]
        else:
            v = np.asarray(f.parts[f.data[0]]).tolist()[0]
            meta[key] = v
    tensors = {t.name: {"type": t.tensor_type.name, "shape": [int(x) for x in t.shape]} for t in r.tensors}
    return {"metadata": meta, "tensors": tensors}


def hf_to_gguf_names(llama_dir: Path, arch: str, n_blocks: int, names: list[str]) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_tensor-map", str(llama_dir), arch, str(n_blocks)]
    res = subprocess.run(cmd, input=json.dumps(names), capture_output=True, text=True, check=True)
    return json.loads(res.stdout)


def expected_gguf_tensor(arch: str, hf_name: str, t, config):
    """The converter's value transforms, applied to an HF tensor (numpy, HF layout). Transforms
    that make several GGUF tensors of one HF tensor are applied to the checkpoint's tensors before
    (gpt_oss_split, deepseek_split_kv_b, merge_experts)."""
    import numpy as np

    t = np.asarray(t, dtype=np.float32)
    if arch in ("llama", "granite"):  # LlamaModel.undo_permute: rope pairs made adjacent
        n_head = config.num_attention_heads
        n_kv = config.num_key_value_heads
        for suffix, heads in (("q_proj.weight", n_head), ("q_proj.bias", n_head),
                              ("k_proj.weight", n_kv), ("k_proj.bias", n_kv)):
            if hf_name.endswith(suffix):
                t = t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)
    if arch in ("gemma2", "gemma3") and hf_name.endswith("norm.weight"):
        t = t + 1.0  # Gemma RMSNorm x*(1+w): the GGUF stores 1+w
    if arch == "gpt2" and hf_name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
        t = t.T  # Conv1D (in, out) -> (out, in)
    return t


def hf_tensor_from_gguf(arch: str, hf_name: str, t, config):
    """Inverse of expected_gguf_tensor: a GGUF tensor (dequantized, GGUF row layout) back
    in the HF model's layout."""
    import numpy as np

    t = np.asarray(t, dtype=np.float32)
    if arch in ("llama", "granite"):
        n_head = config.num_attention_heads
        n_kv = config.num_key_value_heads
        for suffix, heads in (("q_proj.weight", n_head), ("q_proj.bias", n_head),
                              ("k_proj.weight", n_kv), ("k_proj.bias", n_kv)):
            if hf_name.endswith(suffix):
                t = t.reshape(heads, t.shape[0] // heads // 2, 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)
    if arch in ("gemma2", "gemma3") and hf_name.endswith("norm.weight"):
        t = t - 1.0
    if arch == "gpt2" and hf_name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):
        t = t.T
    return t


E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def mxfp4_encode(w):
    """MXFP4 of the rows of w [..., n] (n a multiple of 32): (codes [..., n / 32, 16] uint8, the
    low nibble the even element; scales [..., n / 32] uint8, E8M0 = exponent + 127), each 32-value
    block scaled by 2^(floor(log2 amax) - 2) and rounded to the nearest E2M1 value (ties to the
    lower code)."""
    import numpy as np

    w = np.asarray(w, dtype=np.float64)
    blocks = w.reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = np.abs(blocks).max(axis=-1)
    exponent = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2, 0).astype(np.int64)
    scaled = blocks / np.ldexp(1.0, exponent)[..., None]
    table = np.array(E2M1_VALUES)
    codes = np.abs(scaled[..., None] - table).argmin(axis=-1).astype(np.uint8)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return packed, (exponent + 127).astype(np.uint8)


def mxfp4_decode(packed, scales):
    import numpy as np

    table = np.array(E2M1_VALUES)
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], 32)
    values = table[codes] * np.ldexp(1.0, scales.astype(np.int64) - 127)[..., None]
    return values.reshape(*values.shape[:-2], -1).astype(np.float32)


def mxfp4_round_experts(model) -> None:
    """Rounds gpt-oss's expert matrices to their MXFP4 values in place (the rows that MXFP4 packs
    are the output features: gate_up_proj [E, in, 2 ff] packs along in per output column)."""
    import numpy as np
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
                rows = np.swapaxes(p.detach().numpy(), -1, -2)  # [E, out, in]
                values = mxfp4_decode(*mxfp4_encode(rows))
                p.copy_(torch.from_numpy(np.ascontiguousarray(np.swapaxes(values, -1, -2))))


def mxfp4_checkpoint(hf_dir: Path) -> None:
    """Rewrites a saved gpt-oss checkpoint's experts as MXFP4 blocks and scales, as OpenAI's."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    path = hf_dir / "model.safetensors"
    tensors = load_file(str(path))
    for name in [n for n in tensors if n.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))]:
        rows = np.swapaxes(tensors.pop(name), -1, -2)
        blocks, scales = mxfp4_encode(rows)
        assert np.array_equal(mxfp4_decode(blocks, scales), rows), f"{name} is not MXFP4-exact"
        # contiguous: safetensors writes an array's buffer as it lies in memory
        tensors[name + "_blocks"], tensors[name + "_scales"] = np.ascontiguousarray(blocks), np.ascontiguousarray(scales)
    save_file(tensors, str(path), metadata={"format": "pt"})
    config = json.loads((hf_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (hf_dir / "config.json").write_text(json.dumps(config, indent=2))


def mxfp4_dequantized(hf: dict) -> dict:
    """A checkpoint's *_blocks / *_scales experts as the float tensors transformers' model holds."""
    import numpy as np

    out = {}
    for name, t in hf.items():
        if name.endswith("_scales"):
            continue
        if name.endswith("_blocks"):
            stem = name[:-len("_blocks")]
            out[stem] = np.swapaxes(mxfp4_decode(t, hf[stem + "_scales"]), -1, -2)
        else:
            out[name] = t
    return out


def gpt_oss_split(hf: dict) -> dict:
    """gpt-oss checkpoint tensors as the converter writes them (GptOssModel.modify_tensors), under
    the names its TensorNameMap maps: gate_up_proj [E, in, 2 ff] (gate and up interleaved by
    column) -> experts.gate_proj.weight / experts.up_proj.weight [E, ff, in]; its bias [E, 2 ff]
    -> experts.gate_proj.bias / up_proj.bias [E, ff]; down_proj [E, ff, in] -> transposed
    down_proj.weight [E, hidden, ff]; down_proj_bias -> down_proj.bias; sinks -> sinks.weight."""
    import numpy as np

    out = {}
    for name, t in hf.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            w = np.swapaxes(t, -1, -2)
            stem = name[:-len("gate_up_proj")]
            out[stem + "gate_proj.weight"], out[stem + "up_proj.weight"] = w[:, ::2, :], w[:, 1::2, :]
        elif name.endswith("mlp.experts.gate_up_proj_bias"):
            stem = name[:-len("gate_up_proj_bias")]
            out[stem + "gate_proj.bias"], out[stem + "up_proj.bias"] = t[..., ::2], t[..., 1::2]
        elif name.endswith("mlp.experts.down_proj"):
            out[name + ".weight"] = np.swapaxes(t, -1, -2)
        elif name.endswith("mlp.experts.down_proj_bias"):
            out[name[:-len("_bias")] + ".bias"] = t
        elif name.endswith("self_attn.sinks"):
            out[name + ".weight"] = t
        else:
            out[name] = t
    return out


def gpt_oss_join(split: dict) -> dict:
    """The inverse of gpt_oss_split: GGUF-layout tensors back to the checkpoint's."""
    import numpy as np

    out = {}
    for name, t in split.items():
        if name.endswith("mlp.experts.gate_proj.weight"):
            stem = name[:-len("gate_proj.weight")]
            up = split[stem + "up_proj.weight"]
            w = np.empty((t.shape[0], 2 * t.shape[1], t.shape[2]), dtype=np.float32)
            w[:, ::2, :], w[:, 1::2, :] = t, up
            out[stem + "gate_up_proj"] = np.swapaxes(w, -1, -2)
        elif name.endswith("mlp.experts.gate_proj.bias"):
            stem = name[:-len("gate_proj.bias")]
            b = np.empty((t.shape[0], 2 * t.shape[1]), dtype=np.float32)
            b[:, ::2], b[:, 1::2] = t, split[stem + "up_proj.bias"]
            out[stem + "gate_up_proj_bias"] = b
        elif name.endswith(("mlp.experts.up_proj.weight", "mlp.experts.up_proj.bias")):
            continue
        elif name.endswith("mlp.experts.down_proj.weight"):
            out[name[:-len(".weight")]] = np.swapaxes(t, -1, -2)
        elif name.endswith("mlp.experts.down_proj.bias"):
            out[name[:-len(".bias")] + "_bias"] = t
        elif name.endswith("self_attn.sinks.weight"):
            out[name[:-len(".weight")]] = t
        else:
            out[name] = t
    return out


def deepseek_split_kv_b(hf: dict, n_head: int, nope: int, v: int) -> dict:
    """DeepSeek checkpoint tensors as the converter writes them for MLA (DeepseekV2Model.modify_tensors),
    under the names its TensorNameMap maps: each kv_b_proj.weight [n_head * (qk_nope + v), kv_lora_rank]
    viewed per head [n_head, qk_nope + v, kv_lora_rank] and split into k_b_proj.weight (the key rows,
    transposed: [n_head, kv_lora_rank, qk_nope]; GGUF attn_k_b) and v_b_proj.weight
    ([n_head, v, kv_lora_rank]; GGUF attn_v_b). n_head: the config's num_key_value_heads (which
    the converter reads), nope: qk_nope_head_dim, v: v_head_dim."""
    import numpy as np

    out = {}
    for name, t in hf.items():
        if name.endswith("self_attn.kv_b_proj.weight"):
            per_head = t.reshape(n_head, nope + v, t.shape[-1])
            stem = name[:-len("kv_b_proj.weight")]
            out[stem + "k_b_proj.weight"] = np.ascontiguousarray(np.swapaxes(per_head[:, :nope, :], 1, 2))
            out[stem + "v_b_proj.weight"] = np.ascontiguousarray(per_head[:, nope:, :])
        else:
            out[name] = t
    return out


def deepseek_join_kv_b(split: dict) -> dict:
    """The inverse of deepseek_split_kv_b: k_b_proj / v_b_proj back to the checkpoint's kv_b_proj."""
    import numpy as np

    out = {}
    for name, t in split.items():
        if name.endswith("self_attn.k_b_proj.weight"):
            stem = name[:-len("k_b_proj.weight")]
            per_head = np.concatenate([np.swapaxes(t, 1, 2), split[stem + "v_b_proj.weight"]], axis=1)
            out[stem + "kv_b_proj.weight"] = np.ascontiguousarray(per_head.reshape(-1, per_head.shape[-1]))
        elif not name.endswith("self_attn.v_b_proj.weight"):
            out[name] = t
    return out


_EXPERT_TENSOR = re.compile(r"^(.*\.experts)\.(\d+)\.(\w+)\.weight$")


def merge_experts(hf: dict) -> tuple[dict, dict]:
    """The converter's merge of per-expert checkpoint tensors ('<prefix>.experts.<E>.<w>.weight',
    as transformers saves Mixtral and Qwen-MoE models) into one [n_expert, rows, cols] tensor per
    matrix, named '<prefix>.experts.<w>.weight' as the converter's TensorNameMap knows it.
    Returns (tensors with the merged ones in place of the per-expert ones, merged name -> the
    per-expert names in expert order)."""
    import numpy as np

    groups: dict[str, list[tuple[int, str]]] = {}
    for name in hf:
        m = _EXPERT_TENSOR.match(name)
        if m:
            groups.setdefault(f"{m.group(1)}.{m.group(3)}.weight", []).append((int(m.group(2)), name))
    out = {k: v for k, v in hf.items() if not _EXPERT_TENSOR.match(k)}
    merged = {}
    for name, members in sorted(groups.items()):
        members.sort()
        if [i for i, _ in members] != list(range(len(members))):
            raise RuntimeError(f"experts of {name} are not numbered 0..{len(members) - 1}")
        merged[name] = [n for _, n in members]
        out[name] = np.stack([hf[n] for n in merged[name]])
    return out, merged


def logits_from_checkpoint(model, saved: dict, prompt) -> "np.ndarray":
    """The model's class loading checkpoint-format tensors (as save_pretrained writes them, e.g.
    per-expert matrices that transformers fuses on load) with the model's config."""
    import torch
    from safetensors.numpy import save_file

    with tempfile.TemporaryDirectory() as td:
        model.config.save_pretrained(td)
        save_file(saved, str(Path(td) / "model.safetensors"), metadata={"format": "pt"})
        m, info = type(model).from_pretrained(td, dtype=torch.float32, output_loading_info=True,
                                              experts_implementation="eager")
    if info["missing_keys"] or info["unexpected_keys"] or info.get("mismatched_keys"):
        raise RuntimeError(f"reloading the GGUF tensors as a checkpoint: {info}")
    m.eval()
    m.config._attn_implementation = "eager"
    return forward_logits(m, prompt), routing(m, prompt)


def logits_from_gguf_tensors(model, mapping: dict, gguf_path: Path, arch: str, prompt,
                             merged: dict | None = None, hf_shapes: dict | None = None, split_kv_b: bool = False):
    """The original transformers architecture (same config) running the GGUF's tensors,
    dequantized: for q8_0 this is the exact reference for an engine that dequantizes
    weights and computes in fp32. merged: merge_experts' names (the GGUF's merged expert
    tensors go back to the per-expert checkpoint tensors, loaded through from_pretrained).
    split_kv_b: the mapping names DeepSeek's k_b_proj / v_b_proj (deepseek_split_kv_b), joined
    back into kv_b_proj here.
    Returns (logits, routing on the prompt: None for a dense model)."""
    import numpy as np
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize

    gg = {t.name: t for t in GGUFReader(gguf_path).tensors}
    if arch == "gpt-oss":
        split = {}
        for hf_name, g_name in mapping.items():
            if g_name is not None:
                t = gg[g_name]
                split[hf_name] = dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)])
        joined = gpt_oss_join(split)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        for k, v in joined.items():
            state[k] = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)).reshape(state[k].shape)
        m = type(model)(model.config).eval()
        m.load_state_dict(state)
        return forward_logits(m, prompt), routing(m, prompt)
    if merged:
        saved = {}
        for hf_name, g_name in mapping.items():
            if g_name is None:
                continue
            t = gg[g_name]
            value = dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)])
            value = hf_tensor_from_gguf(arch, hf_name, value, model.config)
            if hf_name in merged:
                for i, name in enumerate(merged[hf_name]):
                    saved[name] = np.ascontiguousarray(value[i], dtype=np.float32).reshape(hf_shapes[name])
            else:
                saved[hf_name] = np.ascontiguousarray(value, dtype=np.float32).reshape(hf_shapes[hf_name])
        if split_kv_b:
            saved = deepseek_join_kv_b(saved)
        return logits_from_checkpoint(model, saved, prompt)
    original = model.state_dict()
    aliases: dict[int, list[str]] = {}  # tied parameters appear under several keys
    for k, v in original.items():
        aliases.setdefault(v.data_ptr(), []).append(k)
    state = {k: v.clone() for k, v in original.items()}
    for hf_name, g_name in mapping.items():
        if g_name is None:
            continue
        t = gg[g_name]
        value = dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)])
        value = hf_tensor_from_gguf(arch, hf_name, value, model.config)
        value = torch.from_numpy(np.ascontiguousarray(value)).reshape(state[hf_name].shape)
        for k in aliases[original[hf_name].data_ptr()]:
            state[k] = value
    m = type(model)(model.config).eval()
    m.load_state_dict(state)
    return forward_logits(m, prompt), routing(m, prompt)


def tensor_fidelity(llama_dir: Path, hf_dir: Path, gguf_paths: dict[str, Path], arch: str, config,
                    split_kv_b: bool = False) -> dict:
    """Compares every GGUF tensor with the HF tensor it came from (after the converter's
    documented transforms). f32 must be exact; q8_0 shows the quantization error.
    split_kv_b: the GGUFs hold DeepSeek's kv_b_proj split for MLA (deepseek_split_kv_b)."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.numpy import load_file

    hf = load_file(str(hf_dir / "model.safetensors"))
    if arch == "gpt-oss":
        hf = gpt_oss_split(mxfp4_dequantized(hf))
    if split_kv_b:
        hf = deepseek_split_kv_b(hf, config.num_key_value_heads, config.qk_nope_head_dim, config.v_head_dim)
    hf_shapes = {k: list(v.shape) for k, v in hf.items()}
    hf, merged = merge_experts(hf)
    mapping = hf_to_gguf_names(llama_dir, arch, config.num_hidden_layers, sorted(hf))
    unmapped = sorted(k for k, v in mapping.items() if v is None)
    result = {"hf_to_gguf": mapping, "hf_tensors_not_in_gguf": unmapped, "merged_experts": merged,
              "hf_shapes": hf_shapes}
    for outtype, path in gguf_paths.items():
        r = GGUFReader(path)
        gg = {t.name: t for t in r.tensors}
        worst, worst_name, missing = 0.0, None, []
        for hf_name, g_name in mapping.items():
            if g_name is None:
                continue
            if g_name not in gg:
                missing.append(f"{hf_name} -> {g_name}")
                continue
            t = gg[g_name]
            got = dequantize(t.data, t.tensor_type).reshape([int(x) for x in reversed(t.shape)])
            want = expected_gguf_tensor(arch, hf_name, hf[hf_name], config).reshape(got.shape)
            d = float(np.max(np.abs(got.astype(np.float64) - want)))
            if d >= worst:
                worst, worst_name = d, g_name
        produced = set(v for v in mapping.values() if v)
        result[outtype] = {"max_abs_delta": worst, "worst_tensor": worst_name,
                           "mapped_but_missing_in_gguf": missing,
                           "gguf_tensors_not_from_hf": sorted(set(gg) - produced)}
    return result


def gguf_reload_delta(gguf_path: Path, ref_logits, prompt, config=None) -> tuple[float | None, str]:
    """Loads a GGUF with transformers (optionally forcing the original config so that
    only the tensors come from the GGUF) and returns max |logits - reference|."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    try:
        kw = dict(gguf_file=gguf_path.name, dtype=torch.float32)
        detail = ""
        if config is not None:
            import copy

            config = copy.deepcopy(config)  # from_pretrained may modify the object it is given
            if config.model_type == "mistral":
                # the GGUF says 'llama' and transformers' GGUF loader keys its tensor
                # handling on the config's model_type; sliding_window is None, so a
                # LlamaConfig with the same values is the same model
                from transformers import LlamaConfig

                d = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "sliding_window")}
                config = LlamaConfig.from_dict(d)
                config.architectures = ["LlamaForCausalLM"]
                detail = " (as LlamaConfig)"
            kw["config"] = config
        else:
            kw["attn_implementation"] = "eager"
        m = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), **kw).eval()
        m.config._attn_implementation = "eager"
        if config is not None and config.model_type == "gemma4_text":
            # transformers' GGUF loader does not map blk.N.layer_output_scale back to
            # layer_scalar; copy it so that only the tensors' values are compared
            from gguf import GGUFReader
            from gguf.quants import dequantize

            scales = {t.name: dequantize(t.data, t.tensor_type) for t in GGUFReader(gguf_path).tensors
                      if t.name.endswith("layer_output_scale.weight")}
            with torch.no_grad():
                for i, layer in enumerate(m.model.layers):
                    layer.layer_scalar.copy_(torch.tensor(scales[f"blk.{i}.layer_output_scale.weight"]).reshape(-1))
            detail = " (layer_scalar copied from blk.N.layer_output_scale)"
        got = forward_logits(m, prompt)
        if got.shape != ref_logits.shape:
            return None, f"shape {got.shape} != {ref_logits.shape}"
        return float(np.max(np.abs(got - ref_logits))), type(m).__name__ + detail
    except Exception as e:  # report, do not fail
        msg = f"{type(e).__name__}: {e}".replace("\n", " ")
        return None, msg[:400]


_IGNORED_CONFIG_KEYS = {"_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype",
                        "attn_implementation", "_attn_implementation", "use_cache", "output_attentions",
                        "output_hidden_states", "return_dict", "model_type", "bos_token_id", "eos_token_id",
                        "pad_token_id", "initializer_range", "chunk_size_feed_forward", "problem_type",
                        "id2label", "label2id", "tokenizer_class", "is_encoder_decoder"}


def gguf_config_diff(gguf_path: Path, config) -> dict | str:
    """What transformers' own GGUF loader reconstructs differently from the original
    config (explains a non-zero 'gguf_config' reload delta)."""
    from transformers import AutoConfig

    try:
        got = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name).to_dict()
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:300]
    want = config.to_dict()
    diff = {}
    for k in sorted(set(want) | set(got)):
        if k in _IGNORED_CONFIG_KEYS or k.startswith("_"):
            continue
        if want.get(k) != got.get(k):
            diff[k] = {"original": want.get(k), "from_gguf": got.get(k)}
    return diff


# ----------------------------------------------------------------------------------------
# metadata the converter omits (the second intervention)
# ----------------------------------------------------------------------------------------


def sliding_window_metadata(arch: str, config) -> dict:
    """The sliding-window keys of a config whose converter class writes none, in the form the
    converter writes for the families that keep them (its Cohere2, EXAONE 4 and Gemma 4 classes):
    the window, and where the config has layer_types a bool per layer (true: the layer slides)."""
    keys = {f"{arch}.attention.sliding_window": int(config.sliding_window)}
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        keys[f"{arch}.attention.sliding_window_pattern"] = [t == "sliding_attention" for t in layer_types]
    return keys


ADDED_METADATA = {"sliding_window": sliding_window_metadata}


def add_metadata(path: Path, keys: dict) -> None:
    """Rewrites a GGUF with extra metadata keys, every tensor's bytes unchanged (needs kcap
    installed: kcap.testing.synth writes the copy)."""
    from kcap.testing.synth import copy_with_changes

    tmp = path.with_name(path.name + ".tmp")
    copy_with_changes(str(path), str(tmp), metadata_overrides=keys)
    tmp.replace(path)


# ----------------------------------------------------------------------------------------
# deepseek2 in the layout before llama.cpp's MLA change (the third intervention)
# ----------------------------------------------------------------------------------------


def deepseek_kv_b_from_gguf(path: Path) -> dict:
    """{block: kv_b_proj.weight} (F32, [n_head * (qk_nope + v), kv_lora_rank]) joined back from an
    F32 deepseek2 file's attn_k_b / attn_v_b (deepseek_join_kv_b)."""
    import numpy as np
    from gguf import GGUFReader

    split = {}
    for t in GGUFReader(path).tensors:
        m = re.match(r"blk\.(\d+)\.attn_(k|v)_b\.weight$", t.name)
        if m:
            if t.tensor_type.name != "F32":
                raise RuntimeError(f"{path.name}: {t.name} is {t.tensor_type.name}, want F32")
            split[f"{m.group(1)}.self_attn.{m.group(2)}_b_proj.weight"] = np.asarray(t.data, dtype=np.float32)
    return {int(k.split(".")[0]): v for k, v in deepseek_join_kv_b(split).items()}


def legacy_kv_b_gguf(path: Path, kv_b: dict) -> dict:
    """Rewrites a converted deepseek2 GGUF in the layout llama.cpp's converter wrote before its MLA
    change: in each block, attn_k_b and attn_v_b are replaced (at attn_k_b's place) by one
    blk.N.attn_kv_b.weight = kv_b[N], the HF kv_b_proj.weight unchanged (GGUF shape
    [kv_lora_rank, n_head * (qk_nope + v)]), in F32 in an F32 file, and in a Q8_0 file quantized as
    the converter quantizes a 2-D weight (gguf.quants.quantize to Q8_0, F16 if its rows do not fit
    Q8_0 blocks); attention.head_count_kv = head_count, key_length = key_length_mla (qk_nope +
    qk_rope), value_length = value_length_mla (v), and the two _mla keys removed. Every other key
    and tensor is copied byte for byte (the gguf package's writer reproduces the converter's file
    exactly when nothing changes). Returns what changed, for the manifest."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, QuantError
    from gguf.quants import quantize

    reader = GGUFReader(path)
    fields = reader.fields
    arch = fields["general.architecture"].contents()
    if arch != "deepseek2":
        raise RuntimeError(f"{path.name}: architecture {arch!r}, want deepseek2")
    p = f"{arch}.attention."
    changed = {p + "head_count_kv": int(fields[f"{arch}.attention.head_count"].contents()),
               p + "key_length": int(fields[p + "key_length_mla"].contents()),
               p + "value_length": int(fields[p + "value_length_mla"].contents())}
    removed = [p + "key_length_mla", p + "value_length_mla"]
    quantized = fields["general.file_type"].contents() != 0  # 0: ALL_F32; else the q8_0 outtype
    kv_b_type = GGMLQuantizationType.Q8_0 if quantized else GGMLQuantizationType.F32
    tensors = {t.name: t for t in reader.tensors}

    tmp = path.with_name(path.name + ".tmp")
    writer = GGUFWriter(tmp, arch)  # writes general.architecture first, as the converter
    for key, f in fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in removed:
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == GGUFValueType.ARRAY and len(f.types) > 1 else None
        writer.add_key_value(key, changed.get(key, f.contents()), vtype, sub)
    replaced = {}
    for t in reader.tensors:
        m = re.match(r"blk\.(\d+)\.attn_(k|v)_b\.weight$", t.name)
        if m and m.group(2) == "v":
            continue
        if m:
            block = int(m.group(1))
            value = np.ascontiguousarray(kv_b[block], dtype=np.float32)
            name, qtype = f"blk.{block}.attn_kv_b.weight", kv_b_type
            if quantized:
                # the converter quantized attn_k_b / attn_v_b from these same F32 values: this gguf
                # package must reproduce its bytes for attn_kv_b's quantization to be the converter's
                k_b, v_b = tensors[f"blk.{block}.attn_k_b.weight"], tensors[f"blk.{block}.attn_v_b.weight"]
                # GGUF shapes [qk_nope, kv_lora_rank, n_head] and [kv_lora_rank, v, n_head]
                k_b_v_b = deepseek_split_kv_b({"self_attn.kv_b_proj.weight": value}, int(k_b.shape[2]),
                                              int(k_b.shape[0]), int(v_b.shape[1]))
                for which in ("k", "v"):
                    ref = tensors[f"blk.{block}.attn_{which}_b.weight"]
                    mine = quantize(k_b_v_b[f"self_attn.{which}_b_proj.weight"], ref.tensor_type)
                    if not np.array_equal(mine.reshape(-1), np.asarray(ref.data).reshape(-1)):
                        raise RuntimeError(f"gguf.quants.quantize does not reproduce the converter's {ref.name}")
                try:
                    data = quantize(value, qtype)
                except QuantError:
                    qtype = GGMLQuantizationType.F16
                    data = quantize(value, qtype)
                writer.add_tensor(name, data, raw_dtype=qtype)
            else:
                writer.add_tensor(name, value)
            replaced[name] = {"type": qtype.name, "shape": [int(value.shape[1]), int(value.shape[0])],
                              "replaces": [t.name, f"blk.{block}.attn_v_b.weight"]}
        elif t.tensor_type == GGMLQuantizationType.F32:
            writer.add_tensor(t.name, np.asarray(t.data))
        else:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(path)
    return {"layout": "kv_b (before llama.cpp's MLA change)", "metadata_changed": changed,
            "metadata_removed": removed, "tensors_replaced": replaced}


# ----------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------


def convert(llama_dir: Path, hf_dir: Path, out: Path, outtype: str, name: str, pre: str | None,
            log: Path) -> None:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_convert", str(llama_dir), pre or "", "--",
           str(hf_dir), "--outtype", outtype, "--outfile", str(out), "--model-name", f"kcap-conformance-{name}"]
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    with open(log, "w") as fh:
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(hf_dir.parent)).returncode
    if rc != 0 or not out.is_file():
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-25:])
        raise RuntimeError(f"convert_hf_to_gguf.py failed for {name} ({outtype}), rc={rc}; log {log}:\n{tail}")


def run_family(name: str, llama_dir: Path, work: Path, args) -> dict:
    import numpy as np
    import torch
    import transformers

    spec = FAMILIES[name]
    hf_dir = work / name
    if hf_dir.exists():
        shutil.rmtree(hf_dir)
    hf_dir.mkdir(parents=True)
    roles = write_tokenizer(hf_dir, spec)
    # a family may be another family's model in another file layout (deepseek2-kvb): then the
    # weights, prompt and reference are that family's
    model_name = spec.get("same_model_as", name)
    prompt = make_prompt(model_name)
    perturb_seed = family_seed(model_name) + 1
    model = build_model(model_name, spec, roles, perturb_seed=perturb_seed)
    ref = reference(model, prompt)
    routes = routing(model, prompt + ref["greedy_ids"].tolist())
    # A mixture of experts: the first weights whose routers choose every token's experts with a
    # clear margin (MIN_ROUTING_MARGIN) over the prompt and its greedy continuation, so that an
    # engine's rounding cannot flip a choice that the reference makes.
    for attempt in range(1, MAX_ROUTING_ATTEMPTS):
        if routes is None or min(layer["min_top_k_logit_margin"] for layer in routes["layers"]) >= MIN_ROUTING_MARGIN:
            break
        perturb_seed = family_seed(model_name) + 1 + ROUTING_SEED_STRIDE * attempt
        model = build_model(model_name, spec, roles, perturb_seed=perturb_seed)
        ref = reference(model, prompt)
        routes = routing(model, prompt + ref["greedy_ids"].tolist())
    else:
        raise RuntimeError(f"no weights with routing margins >= {MIN_ROUTING_MARGIN} in {MAX_ROUTING_ATTEMPTS} seeds")
    model.save_pretrained(hf_dir)
    if spec.get("mxfp4_experts"):
        mxfp4_checkpoint(hf_dir)
    if name == "gpt2":  # keep n_ctx in config.json whatever transformers does with it
        cj = json.loads((hf_dir / "config.json").read_text())
        cj["n_ctx"] = spec["config"]["n_ctx"]
        (hf_dir / "config.json").write_text(json.dumps(cj, indent=2))

    notes = list(spec.get("notes", []))

    # numerical floor: the same model in float64
    m64 = type(model)(model.config).eval()
    m64.load_state_dict(model.state_dict())
    m64 = m64.double()
    with torch.no_grad():
        l64 = m64(input_ids=torch.tensor([prompt]), use_cache=False).logits[0].numpy()
    fp64_delta = float(np.max(np.abs(l64 - ref["logits"].astype(np.float64))))
    del m64

    swa_probe = None
    if spec.get("swa_probe"):
        cfg2 = type(model.config).from_dict(model.config.to_dict())
        cfg2.sliding_window = spec["swa_probe"]
        cfg2._attn_implementation = "eager"
        m2 = type(model)(cfg2).eval()
        m2.load_state_dict(model.state_dict())
        swa_probe = {"sliding_window": spec["swa_probe"],
                     "max_abs_logit_change": float(np.max(np.abs(forward_logits(m2, prompt) - ref["logits"])))}
        del m2

    probes = sensitivity_probes(name, spec, model, prompt, ref["logits"])

    FIXTURES.mkdir(parents=True, exist_ok=True)
    GOLDENS.mkdir(parents=True, exist_ok=True)
    files, inspected, reload = {}, {}, {}
    added = {}
    post_conversion, kv_b = {}, None
    for outtype in OUTTYPES:  # f32 first: the kv_b layout's q8_0 file quantizes the f32 file's values
        out = FIXTURES / f"{name}-{outtype}.gguf"
        if out.exists():
            out.unlink()
        convert(llama_dir, hf_dir, out, outtype, name, spec.get("pre"), work / f"{name}-{outtype}.log")
        if spec.get("add_metadata"):
            from gguf import GGUFReader

            arch = bytes(GGUFReader(out).fields["general.architecture"].parts[-1]).decode()
            added = ADDED_METADATA[spec["add_metadata"]](arch, model.config)
            add_metadata(out, added)
        if spec.get("kv_b") == "joined":
            if kv_b is None:
                kv_b = deepseek_kv_b_from_gguf(out)
            post_conversion[outtype] = legacy_kv_b_gguf(out, kv_b)
        size = out.stat().st_size
        if size >= MAX_FILE_BYTES:
            raise RuntimeError(f"{out.name} is {size} bytes (limit {MAX_FILE_BYTES})")
        files[outtype] = {"file": out.name, "bytes": size}
        inspected[outtype] = inspect_gguf(out)
        if not args.skip_reload:
            d_own, how_own = gguf_reload_delta(out, ref["logits"], prompt)
            d_cfg, how_cfg = gguf_reload_delta(out, ref["logits"], prompt, config=model.config)
            reload[outtype] = {
                "gguf_config": {"max_abs_delta": d_own, "detail": how_own},
                "original_config": {"max_abs_delta": d_cfg, "detail": how_cfg},
            }
            if outtype == "f32":
                reload["config_diff"] = gguf_config_diff(out, model.config)

    md = inspected["f32"]["metadata"]
    arch = md["general.architecture"]
    # the converter splits DeepSeek's kv_b_proj for MLA; the kv_b layout keeps it whole
    split_kv_b = arch == "deepseek2" and spec.get("kv_b") != "joined"
    fidelity = tensor_fidelity(llama_dir, hf_dir, {t: FIXTURES / files[t]["file"] for t in OUTTYPES},
                               arch, model.config, split_kv_b=split_kv_b)
    n_tok = int(md["tokenizer.ggml.tokens"].split()[-1].rstrip(">"))
    emb_rows = inspected["f32"]["tensors"]["token_embd.weight"]["shape"][1]
    if n_tok != VOCAB or emb_rows != VOCAB:
        raise RuntimeError(f"vocabulary mismatch: {n_tok} tokens, token_embd has {emb_rows} rows, want {VOCAB}")
    if fidelity["f32"]["max_abs_delta"] != 0.0 or fidelity["f32"]["mapped_but_missing_in_gguf"]:
        raise RuntimeError(f"f32 GGUF tensors differ from the HF model: {fidelity['f32']}")
    gguf_logits, routing_of_gguf_weights = {}, {}
    for t in OUTTYPES:
        gguf_logits[t], routing_of_gguf_weights[t] = logits_from_gguf_tensors(
            model, fidelity["hf_to_gguf"], FIXTURES / files[t]["file"], arch, prompt, fidelity["merged_experts"],
            fidelity["hf_shapes"], split_kv_b=split_kv_b)
    for t in OUTTYPES:
        fidelity[t]["logits_max_abs_delta"] = float(np.max(np.abs(gguf_logits[t] - ref["logits"])))

    meta = {
        "name": name,
        "hf_class": spec["cls"],
        "hf_config": model.config.to_dict(),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "llama_cpp_python_version": llama_cpp_python_version(llama_dir),
        "converter": "vendor/llama.cpp/convert_hf_to_gguf.py of the llama-cpp-python sdist",
        "gguf_files": files,
        "gguf_architecture": inspected["f32"]["metadata"].get("general.architecture"),
        "tokenizer": spec["tokenizer"] + (f" (tokenizer.ggml.pre forced to {spec['pre']!r})" if spec.get("pre") else ""),
        "special_token_ids": roles,
        "prompt_seed": family_seed(model_name) + 7,
        "weights_seed": family_seed(model_name),
        "perturb_seed": perturb_seed,
        "attention": "eager",
        "dtype": "float32",
        "fp64_max_abs_delta": fp64_delta,
        "swa_probe": swa_probe,
        "sensitivity": probes,
        "gguf_reload": reload,
        "tensor_fidelity": {t: fidelity[t] for t in OUTTYPES},
        "hf_tensors_not_in_gguf": fidelity["hf_tensors_not_in_gguf"],
        "metadata_added_after_conversion": added,
        "routing": routes and dict(routes, q8_0_weights=routing_of_gguf_weights["q8_0"]),
        "notes": notes,
    }
    if model_name != name:
        meta["same_model_as"] = model_name
    if post_conversion:
        meta["post_conversion"] = post_conversion
    if spec["cls"].startswith("Deepseek"):
        # MLA's softmax scale: 1/sqrt(qk_nope + qk_rope) times YaRN's mscale(mscale_all_dim)^2
        meta["attention_softmax_scale"] = float(model.model.layers[0].self_attn.scaling)
    # Scaled rope (YaRN): transformers' own frequencies and cos/sin factor, which tests compare
    # with kcap's rope table directly.
    rope_reference = {}
    if spec["config"].get("rope_parameters", {}).get("rope_type") == "yarn":
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](model.config, "cpu")
        rope_reference = dict(rope_inv_freq=inv_freq.numpy().astype(np.float32),
                              rope_attention_factor=np.float64(attention_factor))
    np.savez_compressed(
        GOLDENS / f"{name}.npz",
        **rope_reference,
        prompt_ids=np.array(prompt, dtype=np.int64),
        logits=ref["logits"],
        greedy_ids=ref["greedy_ids"],
        greedy_margins=ref["greedy_margins"],
        greedy_logits=ref["greedy_logits"],
        logits_q8_0_weights=gguf_logits["q8_0"].astype(np.float32),
        meta=np.array(json.dumps(meta, sort_keys=True, default=str)),
    )
    entry = {
        "hf_class": spec["cls"],
        "gguf_architecture": meta["gguf_architecture"],
        "files": files,
        "metadata": inspected["f32"]["metadata"],
        "tensors": {t: {"f32": inspected["f32"]["tensors"][t],
                        "q8_0_type": inspected["q8_0"]["tensors"].get(t, {}).get("type")}
                    for t in inspected["f32"]["tensors"]},
        "q8_0_only_tensors": sorted(set(inspected["q8_0"]["tensors"]) - set(inspected["f32"]["tensors"])),
        "hf_to_gguf": fidelity["hf_to_gguf"],
        "hf_tensors_not_in_gguf": fidelity["hf_tensors_not_in_gguf"],
        "tensor_fidelity": {t: fidelity[t] for t in OUTTYPES},
        "fp64_max_abs_delta": fp64_delta,
        "swa_probe": swa_probe,
        "sensitivity": probes,
        "gguf_reload": reload,
        "metadata_added_after_conversion": added,
        "merged_experts": fidelity["merged_experts"],
        "routing": meta["routing"],
        "greedy_min_margin": float(ref["greedy_margins"].min()),
        "logit_std": float(ref["logits"].std()),
    }
    for key in ("same_model_as", "post_conversion", "attention_softmax_scale"):
        if key in meta:
            entry[key] = meta[key]
    return entry


def run_refused(name: str, llama_dir: Path, work: Path) -> dict:
    """Converts a REFUSED model to one F32 file; returns its manifest entry."""
    spec = REFUSED[name]
    hf_dir = work / name
    if hf_dir.exists():
        shutil.rmtree(hf_dir)
    hf_dir.mkdir(parents=True)
    roles = write_tokenizer(hf_dir, spec)
    model = build_model(name, spec, roles, perturb=False)
    model.save_pretrained(hf_dir)
    REFUSED_FIXTURES.mkdir(parents=True, exist_ok=True)
    out = REFUSED_FIXTURES / f"{name}-f32.gguf"
    if out.exists():
        out.unlink()
    convert(llama_dir, hf_dir, out, "f32", name, spec.get("pre"), work / f"{name}-f32.log")
    size = out.stat().st_size
    if size >= MAX_FILE_BYTES:
        raise RuntimeError(f"{out.name} is {size} bytes (limit {MAX_FILE_BYTES})")
    inspected = inspect_gguf(out)
    return {"refused": True, "hf_class": spec["cls"], "hf_config": model.config.to_dict(),
            "gguf_architecture": inspected["metadata"].get("general.architecture"),
            "files": {"f32": {"file": f"refused/{out.name}", "bytes": size}},
            "metadata": inspected["metadata"], "tensors": inspected["tensors"], "notes": spec["notes"]}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--_tensor-map":
        _tensor_map_main(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--_convert":
        llama_dir, pre = Path(sys.argv[2]), sys.argv[3] or None
        assert sys.argv[4] == "--"
        _converter_main(llama_dir, pre, sys.argv[5:])
        return

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES) + sorted(REFUSED),
                    help="family to (re)generate; repeatable; default all")
    ap.add_argument("--llama-cpp", help="unpacked llama-cpp-python sdist or its vendor/llama.cpp "
                                        "(default: $KCAP_LLAMA_CPP, then ~/.cache/kcap-bench/**)")
    ap.add_argument("--work-dir", help="keep the HF model folders and converter logs here")
    ap.add_argument("--skip-reload", action="store_true", help="skip the transformers GGUF reload check")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    llama_dir = find_llama_cpp(args.llama_cpp)
    print(f"converter: {llama_dir / 'convert_hf_to_gguf.py'} (llama-cpp-python "
          f"{llama_cpp_python_version(llama_dir)})", flush=True)
    names = args.family or list(FAMILIES) + list(REFUSED)
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {}
    failures = {}
    tmp = None
    if args.work_dir:
        work = Path(args.work_dir)
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="kcap-conformance-")
        work = Path(tmp.name)
    try:
        for name in names:
            print(f"== {name}", flush=True)
            try:
                if name in REFUSED:
                    manifest[name] = run_refused(name, llama_dir, work)
                else:
                    manifest[name] = run_family(name, llama_dir, work, args)
                e = manifest[name]
                print(f"   {e['gguf_architecture']}: "
                      + ", ".join(f"{f['file']} {f['bytes']} B" for f in e["files"].values()), flush=True)
            except Exception as exc:  # one family failing must not hide the others
                failures[name] = f"{type(exc).__name__}: {exc}"
                manifest[name] = {"produced": False, "error": failures[name]}
                print(f"   FAILED: {failures[name]}", flush=True)
    finally:
        FIXTURES.mkdir(parents=True, exist_ok=True)
        MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        if tmp is not None:
            tmp.cleanup()
    total = sum(p.stat().st_size for d in (FIXTURES, GOLDENS, REFUSED_FIXTURES) if d.is_dir()
                for p in d.iterdir() if p.is_file())
    print(f"total size of fixtures + goldens: {total} bytes", flush=True)
    if failures:
        sys.exit("failed: " + ", ".join(failures))


if __name__ == "__main__":
    main()
