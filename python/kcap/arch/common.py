"""Helpers every architecture module uses to read hyperparameters and name tensors."""
from __future__ import annotations

import math

from kcap import _core
from kcap.errors import MissingMetadataError, ModelError
from kcap.gguf import GGUFFile

_REQUIRED = object()


# Keys (after '<arch>.') that the helpers below read; a module that calls a helper declares
# the helper's keys in its METADATA_KEYS.
SPEC_KEYS = ("block_count", "embedding_length", "context_length")
ATTENTION_KEYS = ("attention.head_count", "attention.head_count_kv", "attention.key_length",
                  "attention.value_length")
ROPE_KEYS = ("rope.dimension_count", "rope.freq_base", "rope.scaling.type", "rope.scaling.factor")
SLIDING_WINDOW_KEYS = ("attention.sliding_window", "attention.sliding_window_pattern")


class Hyperparameters:
    """Typed access to '<arch>.<key>' metadata, with errors that name the missing key.

    keys: the module's METADATA_KEYS. Reading any other key is a bug in the module (the
    metadata check of kcap.accounting trusts the declaration), so it raises AssertionError."""

    def __init__(self, gguf: GGUFFile, arch: str, keys):
        self.gguf = gguf
        self.arch = arch
        self.keys = frozenset(keys)

    def get(self, key: str, default=_REQUIRED):
        if key not in self.keys:
            raise AssertionError(f"kcap.arch.{self.arch} reads '{self.arch}.{key}' without declaring it "
                                 "in METADATA_KEYS")
        full = f"{self.arch}.{key}"
        if full in self.gguf.metadata:
            return self.gguf.metadata[full]
        if default is _REQUIRED:
            raise MissingMetadataError(f"{self.gguf.path}: missing metadata key '{full}'")
        return default

    def int(self, key: str, default=_REQUIRED) -> int:
        value = self.get(key, default)
        return int(value) if value is not None else None

    def float(self, key: str, default=_REQUIRED) -> float:
        value = self.get(key, default)
        return float(value) if value is not None else None


def block_tensor(gguf: GGUFFile, layer: int, name: str, required: bool = True) -> str:
    """The name 'blk.<layer>.<name>.weight' if the file has it; '' when optional and absent."""
    full = f"blk.{layer}.{name}"
    if full in gguf.tensors:
        return full
    if required:
        raise ModelError(f"{gguf.path}: missing tensor '{full}'")
    return ""


def optional_tensor(gguf: GGUFFile, name: str) -> str:
    return name if name in gguf.tensors else ""


def new_spec(gguf: GGUFFile, hp: Hyperparameters) -> _core.ModelSpec:
    """The fields every decoder family shares: embedding size, vocabulary, context, norm eps."""
    spec = _core.ModelSpec()
    spec.architecture = hp.arch
    spec.n_embd = hp.int("embedding_length")
    if "token_embd.weight" not in gguf.tensors:
        raise ModelError(f"{gguf.path}: missing tensor 'token_embd.weight'")
    spec.token_embd = "token_embd.weight"
    spec.n_vocab = int(gguf.tensors["token_embd.weight"].shape[1])
    spec.context_length = hp.int("context_length")
    spec.output_norm = optional_tensor(gguf, "output_norm.weight")
    if not spec.output_norm:
        raise ModelError(f"{gguf.path}: missing tensor 'output_norm.weight'")
    # Tied embeddings: without an output matrix the LM head is the embedding table.
    spec.output = optional_tensor(gguf, "output.weight") or spec.token_embd
    return spec


def default_head_dim(hp: Hyperparameters, n_embd: int, n_head: int) -> int:
    if n_embd % n_head:
        raise ModelError(f"embedding length {n_embd} is not a multiple of {n_head} heads")
    return n_embd // n_head


def inverse_sqrt(x: float) -> float:
    return 1.0 / math.sqrt(x)


def attention_geometry(hp: Hyperparameters, n_embd: int) -> tuple[int, int, int, int]:
    """(n_head, n_head_kv, head_dim, head_dim_v) from the standard GGUF keys."""
    n_head = hp.int("attention.head_count")
    n_head_kv = hp.int("attention.head_count_kv", n_head)
    head_dim = hp.int("attention.key_length", None)
    if head_dim is None:  # only then must the embedding split evenly into heads
        head_dim = default_head_dim(hp, n_embd, n_head)
    head_dim_v = hp.int("attention.value_length", head_dim)
    return n_head, n_head_kv, head_dim, head_dim_v


def sliding_windows(hp: Hyperparameters, n_layer: int, default_period: int | None = None) -> list[int]:
    """Each layer's sliding window (0: full attention), from attention.sliding_window (0 or
    absent: no window) and attention.sliding_window_pattern, as llama.cpp reads them: a bool
    per layer (true: the layer slides) or a period N (every N-th layer is full, the others
    slide; 0: every layer slides). Without a pattern key, default_period applies, or, without
    one, every layer slides."""
    window = hp.int("attention.sliding_window", 0) or 0
    pattern = hp.get("attention.sliding_window_pattern", default_period)
    if window < 0:
        raise ModelError(f"{hp.gguf.path}: {hp.arch}.attention.sliding_window = {window}")
    if window == 0:
        return [0] * n_layer
    if pattern is None:
        return [window] * n_layer
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise ModelError(f"{hp.gguf.path}: {hp.arch}.attention.sliding_window_pattern has {len(pattern)} "
                             f"entries for {n_layer} layers")
        return [window if sliding else 0 for sliding in pattern]
    period = int(pattern)
    if period < 0:
        raise ModelError(f"{hp.gguf.path}: {hp.arch}.attention.sliding_window_pattern = {period}")
    return [0 if period and (il + 1) % period == 0 else window for il in range(n_layer)]


def rope_scaling(hp: Hyperparameters, gguf: GGUFFile, allowed=("none", "linear")) -> float:
    """The linear rope frequency scale; refuses scaling kinds the family does not implement."""
    kind = hp.get("rope.scaling.type", "none")
    if kind not in allowed:
        raise ModelError(f"{gguf.path}: {hp.arch} rope scaling '{kind}' is not supported")
    factor = hp.float("rope.scaling.factor", 1.0) or 1.0
    return 1.0 / factor if kind == "linear" else 1.0


def standard_layer(gguf: GGUFFile, il: int, geometry, *, rope_style, rope_dim: int, rope_base: float,
                   activation, freq_scale: float = 1.0, gated_ffn: bool = True, biases: bool = False,
                   norm_biases: bool = False, qk_norm: bool = False, post_norms: bool = False,
                   rope_freqs: str = "", own_kv: bool = True) -> _core.LayerSpec:
    """A pre-norm decoder block named as llama.cpp's converter names it (attn_norm, attn_q/k/v,
    attn_output, ffn_norm, ffn_gate/up/down), with the optional parts a family declares:
    biases (read when present), norm biases, QK-norm, Gemma-style post-norms. A layer without
    own_kv (it reads another layer's KV cache) has no K/V projections or K norm."""
    layer = _core.LayerSpec()
    layer.n_head, layer.n_head_kv, layer.head_dim, layer.head_dim_v = geometry
    t = lambda name, required=True: block_tensor(gguf, il, name, required)  # noqa: E731
    layer.attn_norm = t("attn_norm.weight")
    layer.attn_norm_bias = t("attn_norm.bias", norm_biases)
    layer.wq, layer.wk, layer.wv = t("attn_q.weight"), t("attn_k.weight", own_kv), t("attn_v.weight", own_kv)
    layer.wo = t("attn_output.weight")
    layer.bq, layer.bk, layer.bv = t("attn_q.bias", False), t("attn_k.bias", False), t("attn_v.bias", False)
    layer.bo = t("attn_output.bias", False)
    if biases and not (layer.bq and layer.bk and layer.bv):
        raise ModelError(f"{gguf.path}: layer {il} lacks the Q/K/V biases its architecture requires")
    if qk_norm:
        layer.q_norm, layer.k_norm = t("attn_q_norm.weight"), t("attn_k_norm.weight", own_kv)
    if post_norms:
        layer.post_attn_norm = t("post_attention_norm.weight")
        layer.post_ffn_norm = t("post_ffw_norm.weight")
    layer.ffn_norm = t("ffn_norm.weight")
    layer.ffn_norm_bias = t("ffn_norm.bias", norm_biases)
    layer.ffn_gate = t("ffn_gate.weight") if gated_ffn else ""
    layer.ffn_up, layer.ffn_down = t("ffn_up.weight"), t("ffn_down.weight")
    layer.ffn_up_bias, layer.ffn_down_bias = t("ffn_up.bias", False), t("ffn_down.bias", False)
    layer.gated_ffn = gated_ffn
    layer.activation = activation
    layer.rope_style = rope_style
    layer.rope_dim = rope_dim
    layer.rope_base = rope_base
    layer.rope_freq_scale = freq_scale
    layer.rope_freqs = rope_freqs
    return layer


# What build_rms_decoder reads.
RMS_DECODER_KEYS = (*SPEC_KEYS, *ATTENTION_KEYS, *ROPE_KEYS, *SLIDING_WINDOW_KEYS, "attention.layer_norm_rms_epsilon")


def build_rms_decoder(gguf: GGUFFile, arch: str, rope_style, activation, **layer_features) -> _core.ModelSpec:
    """The common pre-norm RMSNorm decoder (Qwen 2/3 and kin): standard hyperparameters,
    sliding windows per layer (sliding_windows), standard_layer for every block, with the
    family's features (biases, qk_norm, ...)."""
    hp = Hyperparameters(gguf, arch, RMS_DECODER_KEYS)
    spec = new_spec(gguf, hp)
    spec.norm_kind = _core.NormKind.RMS
    spec.norm_eps = hp.float("attention.layer_norm_rms_epsilon")
    geometry = attention_geometry(hp, spec.n_embd)
    n_layer = hp.int("block_count")
    windows = sliding_windows(hp, n_layer)
    layers = []
    for il in range(n_layer):
        layer = standard_layer(gguf, il, geometry, rope_style=rope_style,
                               rope_dim=hp.int("rope.dimension_count", geometry[2]),
                               rope_base=hp.float("rope.freq_base", 10000.0), freq_scale=rope_scaling(hp, gguf),
                               activation=activation, **layer_features)
        layer.sliding_window = windows[il]
        layers.append(layer)
    spec.layers = layers
    return spec
