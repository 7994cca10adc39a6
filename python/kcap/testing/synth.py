"""Synthetic GGUF files: the exact layout of a real file, or of a named shape, filled with
random weights whose block scales are sane (activations stay O(1) through the layers).

Used where real weights cannot travel (the device machine takes 64 MiB) and for tests
that need a particular format, shape or defect. Formats gguf-py can quantize are made by
quantizing Gaussian weights; the k-quants (which gguf-py only dequantizes) get random
quant bytes with their f16 super-block scales overwritten by small values (and, for those with
a minimum per sub-block, sub-scales and mins that center the weights on 0).

    python -m kcap.testing.synth clone SRC.gguf DST.gguf
    python -m kcap.testing.synth llama DST.gguf --layers 2 --embd 64 --type Q8_0
    python -m kcap.testing.synth llama3-8b DST.gguf            # Llama-3-8B shape, Q4_K_M mix
    python -m kcap.testing.synth layout SRC.gguf LAYOUT.json   # a file's layout, no weights
    python -m kcap.testing.synth from-layout LAYOUT.json DST.gguf
"""
from __future__ import annotations

import argparse
import math
import os

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

# Byte offsets of the f16 scale fields in each quantized block (ggml-common.h layouts).
F16_SCALE_OFFSETS = {
    "Q2_K": (80, 82),     # scales[16] qs[64] d dmin
    "Q3_K": (108,),       # hmask[32] qs[64] scales[12] d
    "Q4_K": (0, 2),       # d dmin scales[12] qs[128]
    "Q5_K": (0, 2),       # d dmin scales[12] qh[32] qs[128]
    "Q6_K": (208,),       # ql[128] qh[64] scales[16] d
}
QUANTIZABLE = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "F16", "BF16"}
# Formats whose quants are symmetric about 0 with one f16 scale first in each block, and the
# standard deviation of their quant values when the bytes are uniformly random: raw random
# blocks of these scaled to a Gaussian's std (random_tensor's raw; gguf-py's quantize takes
# minutes for the billions of weights of a mixture of experts' stacks).
RAW_QUANT_STD = {"Q4_0": 4.61, "Q5_0": 9.23, "Q8_0": 73.9}
# MXFP4 (one E8M0 exponent byte, then 32 E2M1 nibbles): the std of an E2M1 value when the
# nibbles are uniformly random, sqrt(mean of 0, .25, 1, 2.25, 4, 9, 16, 36).
MXFP4_RAW_STD = 2.926


def random_tensor(type_name: str, shape: tuple[int, ...], rng: np.random.Generator, raw: bool = False) -> np.ndarray:
    """Random weights for a tensor of GGUF-order shape, as the array GGUFWriter takes:
    float32 for F32, else uint8 rows of raw blocks; raw: Q4_0/Q5_0/Q8_0 as random quant bytes
    under a scale that gives them a Gaussian's std, not quantized Gaussian weights."""
    row_length = shape[0]
    n_rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    std = 1.0 / math.sqrt(row_length)
    if type_name == "F32":
        return (rng.standard_normal((n_rows, row_length)) * std).astype(np.float32).reshape(tuple(reversed(shape)))
    qtype = QT[type_name]
    if raw and type_name in RAW_QUANT_STD:
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        data = np.frombuffer(rng.bytes(n_rows * (row_length // block_elems) * block_bytes), dtype=np.uint8)
        blocks = data.reshape(n_rows, row_length // block_elems, block_bytes).copy()
        blocks[:, :, 0:2] = np.frombuffer(np.float16(std / RAW_QUANT_STD[type_name]).tobytes(), dtype=np.uint8)
        return blocks.reshape(n_rows, -1)
    if raw and type_name == "MXFP4":
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        data = np.frombuffer(rng.bytes(n_rows * (row_length // block_elems) * block_bytes), dtype=np.uint8)
        blocks = data.reshape(n_rows, row_length // block_elems, block_bytes).copy()
        blocks[:, :, 0] = 127 + round(math.log2(std / MXFP4_RAW_STD))  # the power of two nearest std
        return blocks.reshape(n_rows, -1)
    if type_name in QUANTIZABLE:
        values = (rng.standard_normal((n_rows, row_length)) * std).astype(np.float32)
        return gguf.quants.quantize(values, qtype)
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = row_length // block_elems
    raw = rng.integers(0, 256, size=(n_rows, n_blocks, block_bytes), dtype=np.uint8)
    if type_name in CENTERED_MINS:
        return centered_k_quant(type_name, raw, std, rng).reshape(n_rows, n_blocks * block_bytes)
    # The symmetric K-quants (signed sub-scales): d such that the weights' std is about std.
    scale = np.float16(std / RAW_K_QUANT_STD[type_name])
    for offset in F16_SCALE_OFFSETS[type_name]:
        raw[:, :, offset:offset + 2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
    return raw.reshape(n_rows, n_blocks * block_bytes)


# The std of d = 1 weights of the K-quants without mins when their bytes are uniformly random:
# Q6_K codes q - 32 (std 18.5) times int8 sub-scales (rms 73.9), Q3_K codes q - 4 (rms 2.35)
# times 6-bit signed sub-scales (rms 18.5).
RAW_K_QUANT_STD = {"Q6_K": 18.47 * 73.9, "Q3_K": 2.35 * 18.5}

# The K-quants with a minimum per sub-block (w = d * scale * q - dmin * min, q >= 0): the mean of
# their uniformly random codes, and the sub-scales random_tensor draws for them, each with the
# min that cancels that mean (min = mean * scale, an integer), so that the weights are centered
# on 0. Random mins instead gave every matrix a large common offset, every token's hidden state
# the same direction, and a mixture of experts' router the same experts for every token.
CENTERED_MINS = {"Q2_K": (1.5, (2, 4, 6, 8, 10)), "Q4_K": (7.5, (2, 4, 6, 8)), "Q5_K": (15.5, (2, 4))}


def centered_k_quant(type_name: str, raw: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    """raw ([rows, blocks, bytes] random Q2_K/Q4_K/Q5_K blocks) with sub-scales from
    CENTERED_MINS[type_name], each min cancelling the codes' mean, and d = dmin chosen so that the
    weights' standard deviation is about std."""
    mean, choices = CENTERED_MINS[type_name]
    levels = 2 * mean + 1  # codes 0 .. levels - 1
    sub_blocks = 16 if type_name == "Q2_K" else 8
    scale = rng.choice(np.array(choices, dtype=np.int64), size=raw.shape[:2] + (sub_blocks,))
    minimum = (scale * mean).astype(np.int64)
    code_std = math.sqrt((levels * levels - 1) / 12.0)  # uniform codes
    d = np.float16(std / (code_std * math.sqrt(np.mean(np.square(np.array(choices, dtype=np.float64))))))
    if type_name == "Q2_K":  # scales[16] (scale | min << 4), qs[64], d, dmin
        raw[:, :, 0:16] = (scale | (minimum << 4)).astype(np.uint8)
    else:  # d, dmin, scales[12] packed as ggml's get_scale_min_k4 reads them
        packed = np.empty(raw.shape[:2] + (12,), dtype=np.int64)
        packed[..., 0:4] = (scale[..., :4] & 63) | ((scale[..., 4:] >> 4) << 6)
        packed[..., 4:8] = (minimum[..., :4] & 63) | ((minimum[..., 4:] >> 4) << 6)
        packed[..., 8:12] = (scale[..., 4:] & 15) | ((minimum[..., 4:] & 15) << 4)
        raw[:, :, 4:16] = packed.astype(np.uint8)
    for offset in F16_SCALE_OFFSETS[type_name]:  # d and dmin alike
        raw[:, :, offset:offset + 2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    return raw


def plausible_weights(type_name: str, shape: tuple[int, ...], rng: np.random.Generator,
                      raw: bool = False) -> np.ndarray:
    """Norm weights (1-D F32) near 1 so the model behaves like a trained one; random_tensor else."""
    if type_name == "F32" and len(shape) == 1:
        return (1.0 + 0.1 * rng.standard_normal(shape[0])).astype(np.float32)
    return random_tensor(type_name, shape, rng, raw=raw)


def _value_type(value) -> VT:
    if isinstance(value, bool):
        return VT.BOOL
    if isinstance(value, int):
        return VT.UINT32 if 0 <= value < 2**32 else VT.INT64
    if isinstance(value, float):
        return VT.FLOAT32
    if isinstance(value, str):
        return VT.STRING
    raise TypeError(f"no GGUF value type for {value!r}")


def write_gguf(path: str, arch: str, metadata: dict, tensors: list[tuple[str, str, tuple[int, ...], np.ndarray]],
               typed_metadata: dict | None = None) -> str:
    """Writes a GGUF file. metadata: key -> plain value (types inferred; lists of one type);
    typed_metadata: key -> (value, vtype, subtype) kept exactly; tensors: (name, type, shape, data)."""
    writer = gguf.GGUFWriter(path, arch)
    for key, (value, vtype, subtype) in (typed_metadata or {}).items():
        if key == "general.architecture" or key.startswith("GGUF."):
            continue
        writer.add_key_value(key, value, vtype, subtype)
    for key, value in metadata.items():
        if key == "general.architecture":
            continue
        if isinstance(value, list):
            writer.add_key_value(key, value, VT.ARRAY, _value_type(value[0]) if value else VT.INT32)
        else:
            writer.add_key_value(key, value, _value_type(value))
    for name, type_name, shape, data in tensors:
        if type_name == "F32":
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=QT[type_name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def clone_layout(src: str, dst: str, seed: int = 0, metadata_overrides: dict | None = None,
                 drop_tensors=(), type_overrides: dict | None = None) -> str:
    """Same metadata, tensor names, shapes and types as src, with random weights.
    Norm weights (1-D F32) are set near 1 so the model behaves like a trained one."""
    reader = gguf.GGUFReader(src)
    rng = np.random.default_rng(seed)
    typed = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        vtype = field.types[0]
        subtype = field.types[1] if vtype == VT.ARRAY and len(field.types) > 1 else None
        typed[key] = (field.contents(), vtype, subtype)
    arch = typed.get("general.architecture", ("llama",))[0]
    overrides = dict(metadata_overrides or {})
    if "general.architecture" in overrides:
        arch = overrides.pop("general.architecture")
    for key in overrides:
        typed.pop(key, None)  # an override replaces the original value and its type
    tensors = []
    for t in reader.tensors:
        if t.name in drop_tensors:
            continue
        type_name = (type_overrides or {}).get(t.name, t.tensor_type.name)
        shape = tuple(int(d) for d in t.shape)
        tensors.append((t.name, type_name, shape, plausible_weights(type_name, shape, rng)))
    return write_gguf(dst, arch, overrides, tensors, typed_metadata=typed)


def copy_with_changes(src: str, dst: str, metadata_overrides: dict | None = None, drop_metadata=(),
                      drop_tensors=(), add_tensors=()) -> str:
    """Copies a GGUF file's metadata and tensor bytes with edits, to make defective files:
    add_tensors holds (name, type, GGUF-order shape, data) as write_gguf takes them."""
    reader = gguf.GGUFReader(src)
    typed = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in drop_metadata:
            continue
        vtype = field.types[0]
        subtype = field.types[1] if vtype == VT.ARRAY and len(field.types) > 1 else None
        typed[key] = (field.contents(), vtype, subtype)
    overrides = dict(metadata_overrides or {})
    arch = overrides.pop("general.architecture", typed.get("general.architecture", ("llama",))[0])
    for key in overrides:
        typed.pop(key, None)
    tensors = []
    for t in reader.tensors:
        if t.name in drop_tensors:
            continue
        shape = tuple(int(d) for d in t.shape)
        data = np.asarray(t.data)
        if t.tensor_type.name != "F32":
            # raw block bytes [.., rows, row bytes]: the writer reads the dims from the array, so a
            # 3-D tensor (stacked experts) keeps its outer dims
            data = data.view(np.uint8).reshape(*(reversed(shape[1:]) if len(shape) > 1 else (1,)), -1)
        tensors.append((t.name, t.tensor_type.name, shape, data))
    tensors.extend(add_tensors)
    return write_gguf(dst, arch, overrides, tensors, typed_metadata=typed)


def llama_tensor_shapes(n_layer: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, n_ff: int,
                        n_vocab: int, tied: bool) -> list[tuple[str, tuple[int, ...]]]:
    """(name, GGUF-order shape) of every tensor of a Llama-layout file, as llama.cpp names them."""
    shapes = [("token_embd.weight", (n_embd, n_vocab)), ("output_norm.weight", (n_embd,))]
    if not tied:
        shapes.append(("output.weight", (n_embd, n_vocab)))
    for il in range(n_layer):
        shapes += [
            (f"blk.{il}.attn_norm.weight", (n_embd,)),
            (f"blk.{il}.attn_q.weight", (n_embd, n_head * head_dim)),
            (f"blk.{il}.attn_k.weight", (n_embd, n_head_kv * head_dim)),
            (f"blk.{il}.attn_v.weight", (n_embd, n_head_kv * head_dim)),
            (f"blk.{il}.attn_output.weight", (n_head * head_dim, n_embd)),
            (f"blk.{il}.ffn_norm.weight", (n_embd,)),
            (f"blk.{il}.ffn_gate.weight", (n_embd, n_ff)),
            (f"blk.{il}.ffn_up.weight", (n_embd, n_ff)),
            (f"blk.{il}.ffn_down.weight", (n_ff, n_embd)),
        ]
    return shapes


def tiny_llama(path: str, n_layer: int = 2, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2, n_ff: int = 96,
               n_vocab: int = 256, weight_type: str = "Q8_0", context_length: int = 256, tied: bool = True,
               seed: int = 0, extra_metadata: dict | None = None, tensor_types: dict | None = None) -> str:
    """A small random Llama-layout model with no tokenizer ("no_vocab"): drive it by ids.
    tensor_types: a type for some tensors by name (e.g. {"blk.0.attn_v.weight": "F16"})."""
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    meta = {
        "llama.block_count": n_layer,
        "llama.embedding_length": n_embd,
        "llama.feed_forward_length": n_ff,
        "llama.attention.head_count": n_head,
        "llama.attention.head_count_kv": n_head_kv,
        "llama.context_length": context_length,
        "llama.rope.freq_base": 10000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.vocab_size": n_vocab,
        "llama.rope.dimension_count": head_dim,
        "tokenizer.ggml.model": "no_vocab",
    }
    meta.update(extra_metadata or {})
    tensors = []
    for name, shape in llama_tensor_shapes(n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, tied):
        type_name = (tensor_types or {}).get(name, "F32" if len(shape) == 1 else weight_type)
        tensors.append((name, type_name, shape, plausible_weights(type_name, shape, rng)))
    return write_gguf(path, "llama", meta, tensors)


def tiny_gemma3(path: str, n_layer: int = 3, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                head_dim: int = 32, n_ff: int = 96, n_vocab: int = 256, weight_type: str = "Q8_0",
                sliding_window: int = 4, pattern: int = 2, attn_softcap: float = 0.0, final_softcap: float = 0.0,
                context_length: int = 256, seed: int = 0) -> str:
    """A small random Gemma-3-layout model (QK-norm, post-norms, sliding-window layers
    every `pattern`-th layer global, optional softcaps), with no tokenizer."""
    rng = np.random.default_rng(seed)
    meta = {
        "gemma3.block_count": n_layer,
        "gemma3.embedding_length": n_embd,
        "gemma3.feed_forward_length": n_ff,
        "gemma3.attention.head_count": n_head,
        "gemma3.attention.head_count_kv": n_head_kv,
        "gemma3.attention.key_length": head_dim,
        "gemma3.attention.value_length": head_dim,
        "gemma3.context_length": context_length,
        "gemma3.rope.freq_base": 1000000.0,
        "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
        "gemma3.attention.sliding_window": sliding_window,
        "gemma3.attention.sliding_window_pattern": pattern,
        "tokenizer.ggml.model": "no_vocab",
    }
    if attn_softcap:
        meta["gemma3.attn_logit_softcapping"] = attn_softcap
    if final_softcap:
        meta["gemma3.final_logit_softcapping"] = final_softcap
    tensors = []

    def add(name, shape, type_name):
        tensors.append((name, type_name, shape, plausible_weights(type_name, shape, rng)))

    add("token_embd.weight", (n_embd, n_vocab), weight_type)
    add("output_norm.weight", (n_embd,), "F32")
    for il in range(n_layer):
        add(f"blk.{il}.attn_norm.weight", (n_embd,), "F32")
        add(f"blk.{il}.attn_q.weight", (n_embd, n_head * head_dim), weight_type)
        add(f"blk.{il}.attn_k.weight", (n_embd, n_head_kv * head_dim), weight_type)
        add(f"blk.{il}.attn_v.weight", (n_embd, n_head_kv * head_dim), weight_type)
        add(f"blk.{il}.attn_q_norm.weight", (head_dim,), "F32")
        add(f"blk.{il}.attn_k_norm.weight", (head_dim,), "F32")
        add(f"blk.{il}.attn_output.weight", (n_head * head_dim, n_embd), weight_type)
        add(f"blk.{il}.post_attention_norm.weight", (n_embd,), "F32")
        add(f"blk.{il}.ffn_norm.weight", (n_embd,), "F32")
        add(f"blk.{il}.ffn_gate.weight", (n_embd, n_ff), weight_type)
        add(f"blk.{il}.ffn_up.weight", (n_embd, n_ff), weight_type)
        add(f"blk.{il}.ffn_down.weight", (n_ff, n_embd), weight_type)
        add(f"blk.{il}.post_ffw_norm.weight", (n_embd,), "F32")
    return write_gguf(path, "gemma3", meta, tensors)


# --- Big layouts for the CUDA benchmarks, made where they run ---------------------------

def q4_k_m_type(name: str, n_layer: int) -> str:
    """The type llama.cpp's Q4_K_M mix gives a Llama tensor (llama-quant.cpp): Q6_K for the
    output and for attn_v / ffn_down of the layers use_more_bits picks, Q4_K for the other
    matrices, F32 for norms."""
    def use_more_bits(i: int, n: int) -> bool:
        return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

    if name == "output.weight":
        return "Q6_K"
    if name.endswith("_norm.weight"):
        return "F32"
    if name.startswith("blk.") and (".attn_v." in name or ".ffn_down." in name):
        layer = int(name.split(".")[1])
        return "Q6_K" if use_more_bits(layer, n_layer) else "Q4_K"
    return "Q4_K"


def llama3_8b_q4_k_m(path: str, n_layer: int = 32, n_embd: int = 4096, n_ff: int = 14336, n_head: int = 32,
                     n_head_kv: int = 8, n_vocab: int = 128256, context_length: int = 8192, seed: int = 0) -> str:
    """Random weights in the shape of Llama-3-8B quantized with llama.cpp's Q4_K_M mix
    (about 4.9 GB at full size): 32 layers, n_embd 4096, n_ff 14336, 32 heads, 8 KV heads,
    vocabulary 128256 (no tokenizer: "no_vocab" plus llama.vocab_size), rope base 500000.
    Smaller n_layer / n_vocab give the same per-layer shapes for quick routing checks."""
    rng = np.random.default_rng(seed)
    head_dim = n_embd // n_head
    meta = {
        "llama.block_count": n_layer,
        "llama.embedding_length": n_embd,
        "llama.feed_forward_length": n_ff,
        "llama.attention.head_count": n_head,
        "llama.attention.head_count_kv": n_head_kv,
        "llama.context_length": context_length,
        "llama.rope.freq_base": 500000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.vocab_size": n_vocab,
        "llama.rope.dimension_count": head_dim,
        "general.file_type": 15,  # LLAMA_FTYPE_MOSTLY_Q4_K_M
        "tokenizer.ggml.model": "no_vocab",
    }
    tensors = []
    for name, shape in llama_tensor_shapes(n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, tied=False):
        type_name = q4_k_m_type(name, n_layer)
        tensors.append((name, type_name, shape, plausible_weights(type_name, shape, rng)))
    return write_gguf(path, "llama", meta, tensors)


# llama-quant.cpp's fallback for a tensor whose rows are not whole 256-value super-blocks.
K_QUANT_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def _stacked_adder(tensors: list, rng: np.random.Generator, fallback: bool = False, raw: bool = False):
    """add(name, GGUF-order shape, type): appends plausible weights to tensors, a 3-D stack of
    quantized matrices as one block row per matrix row with the stack outermost (the converter's
    stacked experts); with fallback, a K-quant whose rows are not whole super-blocks takes
    llama-quant.cpp's fallback type (K_QUANT_FALLBACK); with fallback or raw, Q4_0/Q5_0/Q8_0 and
    MXFP4 are filled with raw random blocks (random_tensor's raw)."""
    def add(name, shape, type_name):
        if fallback and type_name in K_QUANT_FALLBACK and shape[0] % 256:
            type_name = K_QUANT_FALLBACK[type_name]
        data = plausible_weights(type_name, shape, rng, raw=fallback or raw)
        if len(shape) == 3 and type_name != "F32":
            data = data.reshape(shape[2], shape[1], -1)
        tensors.append((name, type_name, shape, data))
    return add


# The synthetic Qwen3-MoE layout's QK-norm weights (about 3 instead of 1): its attention logits
# are q.k / sqrt(128) of RMS-normalized q and k, which with norm weights near 1 have a standard
# deviation near 1, so over hundreds of positions each head averages, every token's state
# converges layer by layer and the router picks the same few experts for every token (a 12-layer
# file: 36 of 128 experts in layer 11, one of them with 486 of 512 tokens). With weights near 3
# the heads attend sharply, as a trained model's do, and every layer's router reaches all 128
# experts with at most 50-113 tokens each, as a trained router with its load-balancing loss does.
QK_NORM_SCALE = 3.0


def qwen3moe_q4_k_m(path: str, n_layer: int = 48, n_embd: int = 2048, n_head: int = 32, n_head_kv: int = 4,
                    head_dim: int = 128, n_expert: int = 128, n_expert_used: int = 8, n_ff_exp: int = 768,
                    n_vocab: int = 151936, context_length: int = 40960, seed: int = 0) -> str:
    """Random weights in the shape of Qwen3-30B-A3B quantized with llama.cpp's Q4_K_M mix
    (about 17.3 GiB at full size): 48 layers, n_embd 2048, 32 heads and 4 KV heads of 128, QK-norm,
    128 experts of width 768 with 8 used per token (weights renormalized), no shared expert,
    vocabulary 151936 (no tokenizer). The experts are stacked 3-D tensors as the converter writes
    them; the router stays F32 (llama-quant.cpp never quantizes ffn_gate_inp) and ffn_down_exps
    follows ffn_down's Q6_K/Q4_K rule. Fewer layers keep every per-layer shape."""
    rng = np.random.default_rng(seed)
    meta = {
        "qwen3moe.block_count": n_layer,
        "qwen3moe.embedding_length": n_embd,
        "qwen3moe.feed_forward_length": 6144,
        "qwen3moe.expert_feed_forward_length": n_ff_exp,
        "qwen3moe.expert_count": n_expert,
        "qwen3moe.expert_used_count": n_expert_used,
        "qwen3moe.attention.head_count": n_head,
        "qwen3moe.attention.head_count_kv": n_head_kv,
        "qwen3moe.attention.key_length": head_dim,
        "qwen3moe.attention.value_length": head_dim,
        "qwen3moe.context_length": context_length,
        "qwen3moe.rope.freq_base": 1000000.0,
        "qwen3moe.attention.layer_norm_rms_epsilon": 1e-6,
        "qwen3moe.vocab_size": n_vocab,
        "general.file_type": 15,  # LLAMA_FTYPE_MOSTLY_Q4_K_M
        "tokenizer.ggml.model": "no_vocab",
    }
    tensors = []
    add = _stacked_adder(tensors, rng)

    add("token_embd.weight", (n_embd, n_vocab), "Q4_K")
    add("output_norm.weight", (n_embd,), "F32")
    add("output.weight", (n_embd, n_vocab), "Q6_K")
    for il in range(n_layer):
        down = q4_k_m_type(f"blk.{il}.ffn_down.weight", n_layer)
        add(f"blk.{il}.attn_norm.weight", (n_embd,), "F32")
        add(f"blk.{il}.attn_q.weight", (n_embd, n_head * head_dim), "Q4_K")
        add(f"blk.{il}.attn_k.weight", (n_embd, n_head_kv * head_dim), "Q4_K")
        add(f"blk.{il}.attn_v.weight", (n_embd, n_head_kv * head_dim), q4_k_m_type(f"blk.{il}.attn_v.weight", n_layer))
        for norm in ("attn_q_norm", "attn_k_norm"):
            add(f"blk.{il}.{norm}.weight", (head_dim,), "F32")
            name, type_name, shape, data = tensors[-1]
            tensors[-1] = (name, type_name, shape, (data * QK_NORM_SCALE).astype(np.float32))
        add(f"blk.{il}.attn_output.weight", (n_head * head_dim, n_embd), "Q4_K")
        add(f"blk.{il}.ffn_norm.weight", (n_embd,), "F32")
        add(f"blk.{il}.ffn_gate_inp.weight", (n_embd, n_expert), "F32")
        add(f"blk.{il}.ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), "Q4_K")
        add(f"blk.{il}.ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), "Q4_K")
        add(f"blk.{il}.ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), down)
    return write_gguf(path, "qwen3moe", meta, tensors)


def gpt_oss_20b_mxfp4(path: str, n_layer: int = 24, n_embd: int = 2880, n_head: int = 64, n_head_kv: int = 8,
                      head_dim: int = 64, n_expert: int = 32, n_expert_used: int = 4, n_ff_exp: int = 2880,
                      n_vocab: int = 201088, context_length: int = 131072, seed: int = 0) -> str:
    """Random weights in the shape of gpt-oss-20b as ggml-org ships it (gpt-oss-20b-mxfp4.gguf,
    about 11.3 GiB at full size): 24 layers, n_embd 2880, 64 heads and 8 KV heads of 64 with
    attention sinks, a 128-token sliding window on every other layer, YaRN factor 32 over 4096
    positions, 32 experts of 2880 with 4 used per token, the experts MXFP4 with F32 biases, the
    router F32 with its bias, attention and embeddings Q8_0, biases and norms F32, vocabulary
    201088 (no tokenizer). Fewer layers keep every per-layer shape."""
    rng = np.random.default_rng(seed)
    a = "gpt-oss"
    meta = {
        f"{a}.block_count": n_layer,
        f"{a}.context_length": context_length,
        f"{a}.embedding_length": n_embd,
        f"{a}.feed_forward_length": n_ff_exp,
        f"{a}.attention.head_count": n_head,
        f"{a}.attention.head_count_kv": n_head_kv,
        f"{a}.attention.key_length": head_dim,
        f"{a}.attention.value_length": head_dim,
        f"{a}.attention.sliding_window": 128,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{a}.rope.freq_base": 150000.0,
        f"{a}.rope.scaling.type": "yarn",
        f"{a}.rope.scaling.factor": 32.0,
        f"{a}.rope.scaling.original_context_length": 4096,
        f"{a}.rope.scaling.yarn_beta_fast": 32.0,
        f"{a}.rope.scaling.yarn_beta_slow": 1.0,
        f"{a}.expert_count": n_expert,
        f"{a}.expert_used_count": n_expert_used,
        f"{a}.expert_feed_forward_length": n_ff_exp,
        f"{a}.vocab_size": n_vocab,
        "general.file_type": 38,  # LLAMA_FTYPE_MOSTLY_MXFP4_MOE
        "tokenizer.ggml.model": "no_vocab",
    }
    tensors = []
    add = _stacked_adder(tensors, rng, raw=True)

    def bias(name, shape):  # small, as trained biases are
        tensors.append((name, "F32", shape, (0.02 * rng.standard_normal(tuple(reversed(shape)))).astype(np.float32)))

    add("token_embd.weight", (n_embd, n_vocab), "Q8_0")
    add("output_norm.weight", (n_embd,), "F32")
    add("output.weight", (n_embd, n_vocab), "Q8_0")
    for il in range(n_layer):
        b = f"blk.{il}."
        add(b + "attn_norm.weight", (n_embd,), "F32")
        for name, rows in (("attn_q", n_head * head_dim), ("attn_k", n_head_kv * head_dim), ("attn_v", n_head_kv * head_dim)):
            add(b + name + ".weight", (n_embd, rows), "Q8_0")
            bias(b + name + ".bias", (rows,))
        add(b + "attn_output.weight", (n_head * head_dim, n_embd), "Q8_0")
        bias(b + "attn_output.bias", (n_embd,))
        bias(b + "attn_sinks.weight", (n_head,))
        add(b + "post_attention_norm.weight", (n_embd,), "F32")
        add(b + "ffn_gate_inp.weight", (n_embd, n_expert), "F32")
        bias(b + "ffn_gate_inp.bias", (n_expert,))
        add(b + "ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), "MXFP4")
        add(b + "ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), "MXFP4")
        add(b + "ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), "MXFP4")
        bias(b + "ffn_gate_exps.bias", (n_ff_exp, n_expert))
        bias(b + "ffn_up_exps.bias", (n_ff_exp, n_expert))
        bias(b + "ffn_down_exps.bias", (n_embd, n_expert))
    return write_gguf(path, a, meta, tensors)


def deepseek2_q4_k_m(path: str, n_layer: int = 27, n_embd: int = 2048, n_head: int = 16, kv_lora_rank: int = 512,
                     qk_nope: int = 128, qk_rope: int = 64, v_head_dim: int = 128, n_ff: int = 10944,
                     n_expert: int = 64, n_expert_used: int = 6, n_ff_exp: int = 1408, n_shared: int = 2,
                     n_vocab: int = 102400, context_length: int = 163840, seed: int = 0) -> str:
    """Random weights in the shape of DeepSeek-V2-Lite quantized with llama.cpp's Q4_K_M mix
    (about 9 GiB at full size): 27 layers, n_embd 2048, 16 heads, multi-head latent attention
    (no query low rank, kv_lora_rank 512, rope 64, nope 128, v 128: attn_k_b / attn_v_b as the
    converter writes them), a dense first block (FFN 10944), then 64 experts of 1408 with 6 used
    and 2 shared experts, YaRN factor 40 over 4096 positions with mscale_all_dim 0.707,
    vocabulary 102400 (no tokenizer). Rows that are not whole super-blocks take llama-quant.cpp's
    fallback type (K_QUANT_FALLBACK): attn_k_b's 128-value rows and ffn_down(_exps)' 10944 and
    1408. Fewer layers keep every per-layer shape."""
    rng = np.random.default_rng(seed)
    a = "deepseek2"
    meta = {
        f"{a}.block_count": n_layer,
        f"{a}.context_length": context_length,
        f"{a}.embedding_length": n_embd,
        f"{a}.feed_forward_length": n_ff,
        f"{a}.attention.head_count": n_head,
        f"{a}.attention.head_count_kv": 1,
        f"{a}.attention.key_length": kv_lora_rank + qk_rope,
        f"{a}.attention.value_length": kv_lora_rank,
        f"{a}.attention.key_length_mla": qk_nope + qk_rope,
        f"{a}.attention.value_length_mla": v_head_dim,
        f"{a}.attention.kv_lora_rank": kv_lora_rank,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{a}.rope.dimension_count": qk_rope,
        f"{a}.rope.freq_base": 10000.0,
        f"{a}.rope.scaling.type": "yarn",
        f"{a}.rope.scaling.factor": 40.0,
        f"{a}.rope.scaling.original_context_length": 4096,
        f"{a}.rope.scaling.yarn_log_multiplier": 0.0707,
        f"{a}.leading_dense_block_count": 1,
        f"{a}.expert_count": n_expert,
        f"{a}.expert_used_count": n_expert_used,
        f"{a}.expert_shared_count": n_shared,
        f"{a}.expert_feed_forward_length": n_ff_exp,
        f"{a}.expert_weights_scale": 1.0,
        f"{a}.expert_gating_func": 1,
        f"{a}.vocab_size": n_vocab,
        "general.file_type": 15,  # LLAMA_FTYPE_MOSTLY_Q4_K_M
        "tokenizer.ggml.model": "no_vocab",
    }
    tensors = []
    add = _stacked_adder(tensors, rng, fallback=True)

    add("token_embd.weight", (n_embd, n_vocab), "Q4_K")
    add("output_norm.weight", (n_embd,), "F32")
    add("output.weight", (n_embd, n_vocab), "Q6_K")
    for il in range(n_layer):
        down = q4_k_m_type(f"blk.{il}.ffn_down.weight", n_layer)
        add(f"blk.{il}.attn_norm.weight", (n_embd,), "F32")
        add(f"blk.{il}.attn_q.weight", (n_embd, n_head * (qk_nope + qk_rope)), "Q4_K")
        add(f"blk.{il}.attn_kv_a_mqa.weight", (n_embd, kv_lora_rank + qk_rope), "Q4_K")
        add(f"blk.{il}.attn_kv_a_norm.weight", (kv_lora_rank,), "F32")
        add(f"blk.{il}.attn_k_b.weight", (qk_nope, kv_lora_rank, n_head), "Q4_K")
        add(f"blk.{il}.attn_v_b.weight", (kv_lora_rank, v_head_dim, n_head), "Q4_K")
        add(f"blk.{il}.attn_output.weight", (n_head * v_head_dim, n_embd), "Q4_K")
        add(f"blk.{il}.ffn_norm.weight", (n_embd,), "F32")
        if il == 0:
            add(f"blk.{il}.ffn_gate.weight", (n_embd, n_ff), "Q4_K")
            add(f"blk.{il}.ffn_up.weight", (n_embd, n_ff), "Q4_K")
            add(f"blk.{il}.ffn_down.weight", (n_ff, n_embd), down)
            continue
        add(f"blk.{il}.ffn_gate_inp.weight", (n_embd, n_expert), "F32")
        add(f"blk.{il}.ffn_gate_exps.weight", (n_embd, n_ff_exp, n_expert), "Q4_K")
        add(f"blk.{il}.ffn_up_exps.weight", (n_embd, n_ff_exp, n_expert), "Q4_K")
        add(f"blk.{il}.ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), down)
        add(f"blk.{il}.ffn_gate_shexp.weight", (n_embd, n_shared * n_ff_exp), "Q4_K")
        add(f"blk.{il}.ffn_up_shexp.weight", (n_embd, n_shared * n_ff_exp), "Q4_K")
        add(f"blk.{il}.ffn_down_shexp.weight", (n_shared * n_ff_exp, n_embd), "Q4_K")
    return write_gguf(path, "deepseek2", meta, tensors)


def extract_layout(src: str) -> dict:
    """A GGUF file's layout without its weights or vocabulary: architecture metadata (plain
    values) and the tensor table, small enough to travel where the file cannot. The
    tokenizer is dropped ("no_vocab" plus <arch>.vocab_size), so clones are driven by ids."""
    reader = gguf.GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key.startswith("tokenizer.") or key == "general.architecture":
            continue
        value = field.contents()
        if isinstance(value, (bool, int, float, str)) or (isinstance(value, list) and value and
                                                          isinstance(value[0], (int, float, str))):
            metadata[key] = value
    tensors = [(t.name, t.tensor_type.name, [int(d) for d in t.shape]) for t in reader.tensors]
    n_vocab = next(shape[1] for name, _, shape in tensors if name == "token_embd.weight")
    metadata[f"{arch}.vocab_size"] = int(n_vocab)
    metadata["tokenizer.ggml.model"] = "no_vocab"
    return {"architecture": arch, "metadata": metadata, "tensors": tensors}


def from_layout(layout: dict, dst: str, seed: int = 0) -> str:
    """Random weights in a layout made by extract_layout (norm weights near 1)."""
    rng = np.random.default_rng(seed)
    tensors = []
    for name, type_name, shape in layout["tensors"]:
        shape = tuple(shape)
        if type_name == "F32" and len(shape) == 1:
            data = (1.0 + 0.1 * rng.standard_normal(shape[0])).astype(np.float32)
        else:
            data = random_tensor(type_name, shape, rng)
        tensors.append((name, type_name, shape, data))
    return write_gguf(dst, layout["architecture"], layout["metadata"], tensors)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kcap.testing.synth")
    sub = parser.add_subparsers(dest="command", required=True)
    clone = sub.add_parser("clone", help="random weights in the exact layout of a real GGUF")
    clone.add_argument("src")
    clone.add_argument("dst")
    clone.add_argument("--seed", type=int, default=0)
    llama = sub.add_parser("llama", help="a small random Llama-layout file")
    llama.add_argument("dst")
    llama.add_argument("--layers", type=int, default=2)
    llama.add_argument("--embd", type=int, default=64)
    llama.add_argument("--type", default="Q8_0")
    big = sub.add_parser("llama3-8b", help="Llama-3-8B shape in llama.cpp's Q4_K_M mix, random weights")
    big.add_argument("dst")
    big.add_argument("--layers", type=int, default=32)
    big.add_argument("--vocab", type=int, default=128256)
    layout = sub.add_parser("layout", help="write a GGUF file's layout (no weights, no vocabulary) as JSON")
    layout.add_argument("src")
    layout.add_argument("dst")
    made = sub.add_parser("from-layout", help="random weights in a layout written by 'layout'")
    made.add_argument("src")
    made.add_argument("dst")
    made.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "clone":
        clone_layout(args.src, args.dst, seed=args.seed)
    elif args.command == "llama3-8b":
        llama3_8b_q4_k_m(args.dst, n_layer=args.layers, n_vocab=args.vocab)
    elif args.command == "layout":
        import json

        with open(args.dst, "w") as f:
            json.dump(extract_layout(args.src), f)
    elif args.command == "from-layout":
        import json

        with open(args.src) as f:
            from_layout(json.load(f), args.dst, seed=args.seed)
    else:
        tiny_llama(args.dst, n_layer=args.layers, n_embd=args.embd, weight_type=args.type)
    print(os.path.abspath(args.dst))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
