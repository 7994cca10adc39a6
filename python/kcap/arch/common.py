"""Helpers every architecture module uses to read hyperparameters and name tensors."""
from __future__ import annotations

import math
from dataclasses import dataclass

from kcap import _core
from kcap.accounting import SPLIT_EXPERTS
from kcap.errors import MissingMetadataError, ModelError, UnimplementedMetadataError
from kcap.gguf import GGUFFile

_REQUIRED = object()


# Keys (after '<arch>.') that the helpers below read; a module that calls a helper declares
# the helper's keys in its METADATA_KEYS.
SPEC_KEYS = ("block_count", "embedding_length", "context_length")
ATTENTION_KEYS = ("attention.head_count", "attention.head_count_kv", "attention.key_length",
                  "attention.value_length")
ROPE_KEYS = ("rope.dimension_count", "rope.freq_base", "rope.scaling.type", "rope.scaling.factor", "rope.scale_linear")
# What rope_yarn reads: a module that lets rope_scaling take "yarn" declares these too.
YARN_KEYS = ("rope.scaling.original_context_length", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
             "rope.scaling.yarn_attn_factor")
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
        """An integer key, checked before anything is sized by it: an integer (not a float or a
        bool) within 32 bits; head counts, sizes and block_count at least 1; block_count at least 1 and at most the
        blocks the file has tensors for (a file claiming 2^26 blocks fails here, not after
        building 2^26 layers)."""
        value = self.get(key, default)
        if value is None:
            return None
        full = f"{self.gguf.path}: {self.arch}.{key} = {value!r}"
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelError(f"{full}: expected an integer, found {type(value).__name__}")
        if not -_MAX_COUNT <= value <= _MAX_COUNT:  # the sign is the caller's to check (with its meaning)
            raise ModelError(f"{full}: out of range (|value| <= {_MAX_COUNT})")
        if key in _AT_LEAST_ONE and value < 1:
            raise ModelError(f"{full}: must be at least 1")
        if key == "block_count" and value > blocks_in_file(self.gguf):
            raise ModelError(f"{full}: the file has tensors for {blocks_in_file(self.gguf)} blocks (blk.0 .. "
                             f"blk.{blocks_in_file(self.gguf) - 1})")
        return value

    def float(self, key: str, default=_REQUIRED) -> float:
        """A real-valued key: a number (an integer is taken as its value), finite."""
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ModelError(f"{self.gguf.path}: {self.arch}.{key} = {value!r}: expected a finite number")
        return float(value)


_MAX_COUNT = 2**31 - 1  # the core's counts are 32-bit
_AT_LEAST_ONE = frozenset({"block_count", "embedding_length", "context_length", "attention.head_count",
                           "attention.head_count_kv", "attention.key_length", "attention.value_length",
                           "attention.key_length_swa", "attention.value_length_swa"})


def blocks_in_file(gguf: GGUFFile) -> int:
    """1 + the highest N of the file's blk.N.* tensors (0 without any)."""
    highest = -1
    for name in gguf.tensors:
        if name.startswith("blk."):
            index = name.split(".", 2)[1]
            if index.isdigit():
                highest = max(highest, int(index))
    return highest + 1


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
    shape = gguf.tensors["token_embd.weight"].shape
    if len(shape) != 2:
        raise ModelError(f"{gguf.path}: tensor 'token_embd.weight' has shape {list(shape)}; expected [n_embd, n_vocab]")
    spec.n_vocab = int(shape[1])
    tokens = gguf.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and tokens and len(tokens) != spec.n_vocab:
        # llama.cpp refuses the file too (the embedding's shape is [n_embd, the token count]): ids
        # past the shorter of the two would be tokens without rows, or rows no text can stand for.
        raise ModelError(f"{gguf.path}: tokenizer.ggml.tokens has {len(tokens)} tokens but token_embd.weight has "
                         f"{spec.n_vocab} rows")
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


def sliding_windows(hp: Hyperparameters, n_layer: int, default_period: int | None = None,
                    required: bool = False) -> list[int]:
    """Each layer's sliding window (0: full attention), from attention.sliding_window (0 or
    absent: no window) and attention.sliding_window_pattern, as llama.cpp reads them: a bool
    per layer (true: the layer slides) or a period N (every N-th layer is full, the others
    slide; 0: every layer slides). Without a pattern key, default_period applies, or, without
    one, every layer slides. required: the family always slides (llama.cpp refuses a file
    without the window), so a missing or zero window is refused rather than read as none."""
    window = hp.int("attention.sliding_window", _REQUIRED if required else 0) or 0
    if required and window <= 0:
        raise ModelError(f"{hp.gguf.path}: {hp.arch}.attention.sliding_window = {window}: this architecture's "
                         "sliding layers need a positive window")
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
    """The linear rope frequency scale; refuses scaling kinds the family does not implement
    (a family that allows "yarn" also reads rope_yarn). As llama.cpp reads the keys: a factor
    without rope.scaling.type is linear scaling, and rope.scale_linear (older converters) is the
    factor where rope.scaling.factor is absent."""
    factor = hp.float("rope.scaling.factor", None)
    if factor is None:
        factor = hp.float("rope.scale_linear", None)
    kind = hp.get("rope.scaling.type", None)
    if kind is None:
        kind = "none" if factor in (None, 0.0, 1.0) else "linear"
    if kind not in allowed:
        raise ModelError(f"{gguf.path}: {hp.arch} rope scaling '{kind}' is not supported"
                         + ("" if hp.get("rope.scaling.type", None) is not None else
                            f" (a factor of {factor} without {hp.arch}.rope.scaling.type, which llama.cpp reads as "
                            "linear scaling)"))
    if kind != "linear" or not factor:  # llama.cpp: no factor (or 0) scales by 1
        return 1.0
    if factor < 0:
        raise ModelError(f"{gguf.path}: {hp.arch} linear rope scaling needs a positive factor, got {factor!r}")
    return 1.0 / factor


def rope_yarn(hp: Hyperparameters, gguf: GGUFFile) -> _core.RopeYarn:
    """YaRN rope scaling as transformers computes it (_compute_yarn_parameters), from the keys
    llama.cpp's converter writes for rope_scaling {"rope_type": "yarn", ...}: the factor, the
    original context, beta_fast / beta_slow (32 / 1 when absent) and the attention factor
    (transformers' 0.1 ln(factor) + 1 unless the file gives one). None (factor 0) unless
    rope.scaling.type is "yarn"."""
    yarn = _core.RopeYarn()
    if hp.get("rope.scaling.type", "none") != "yarn":
        return yarn
    prefix = f"{gguf.path}: {hp.arch}.rope.scaling"
    factor = hp.float("rope.scaling.factor", None)
    if factor is None or not math.isfinite(factor) or factor <= 0:
        raise ModelError(f"{prefix}.factor = {factor!r}: YaRN needs a positive factor")
    original = hp.int("rope.scaling.original_context_length")
    if original <= 0:
        raise ModelError(f"{prefix}.original_context_length = {original}: must be positive")
    beta_fast = hp.float("rope.scaling.yarn_beta_fast", 32.0)
    beta_slow = hp.float("rope.scaling.yarn_beta_slow", 1.0)
    for name, value in (("yarn_beta_fast", beta_fast), ("yarn_beta_slow", beta_slow)):
        if not math.isfinite(value) or value <= 0:
            raise ModelError(f"{prefix}.{name} = {value!r}: must be positive")
    attn = hp.float("rope.scaling.yarn_attn_factor", None)
    if attn is None:
        attn = 0.1 * math.log(factor) + 1.0 if factor > 1.0 else 1.0
    elif not math.isfinite(attn) or attn <= 0:
        raise ModelError(f"{prefix}.yarn_attn_factor = {attn!r}: must be positive")
    yarn.factor, yarn.original_context = factor, original
    yarn.beta_fast, yarn.beta_slow, yarn.attn_factor = beta_fast, beta_slow, attn
    return yarn


def standard_layer(gguf: GGUFFile, il: int, geometry, *, rope_style, rope_dim: int, rope_base: float,
                   activation, freq_scale: float = 1.0, yarn: _core.RopeYarn | None = None,
                   gated_ffn: bool = True, biases: bool = False,
                   norm_biases: bool = False, qk_norm: bool = False, post_norms: bool = False,
                   rope_freqs: str = "", own_kv: bool = True, dense_ffn: bool = True,
                   ffn_norm: str = "ffn_norm", v_from_k: bool = False) -> _core.LayerSpec:
    """A pre-norm decoder block named as llama.cpp's converter names it (attn_norm, attn_q/k/v,
    attn_output, ffn_norm, ffn_gate/up/down), with the optional parts a family declares:
    biases (read when present), norm biases, QK-norm, Gemma-style post-norms. A layer without
    own_kv (it reads another layer's KV cache) has no K/V projections or K norm. Without
    dense_ffn the block has no dense FFN matrices (moe_ffn fills its experts instead). ffn_norm:
    the FFN's input norm's name (gpt-oss: post_attention_norm). v_from_k: a layer without
    attn_v takes its values from the K projection (weights and bias) instead of failing."""
    layer = _core.LayerSpec()
    layer.n_head, layer.n_head_kv, layer.head_dim, layer.head_dim_v = geometry
    t = lambda name, required=True: block_tensor(gguf, il, name, required)  # noqa: E731
    layer.attn_norm = t("attn_norm.weight")
    layer.attn_norm_bias = t("attn_norm.bias", norm_biases)
    layer.wq, layer.wk = t("attn_q.weight"), t("attn_k.weight", own_kv)
    layer.wv = t("attn_v.weight", own_kv and not v_from_k)
    layer.wo = t("attn_output.weight")
    layer.bq, layer.bk, layer.bv = t("attn_q.bias", False), t("attn_k.bias", False), t("attn_v.bias", False)
    if own_kv and v_from_k and not layer.wv:
        layer.wv, layer.bv = layer.wk, layer.bk
    layer.bo = t("attn_output.bias", False)
    if biases and not (layer.bq and layer.bk and layer.bv):
        raise ModelError(f"{gguf.path}: layer {il} lacks the Q/K/V biases its architecture requires")
    if qk_norm:
        layer.q_norm, layer.k_norm = t("attn_q_norm.weight"), t("attn_k_norm.weight", own_kv)
    if post_norms:
        layer.post_attn_norm = t("post_attention_norm.weight")
        layer.post_ffn_norm = t("post_ffw_norm.weight")
    layer.ffn_norm = t(f"{ffn_norm}.weight")
    layer.ffn_norm_bias = t(f"{ffn_norm}.bias", norm_biases)
    if dense_ffn:
        layer.ffn_gate = t("ffn_gate.weight") if gated_ffn else ""
        layer.ffn_up, layer.ffn_down = t("ffn_up.weight"), t("ffn_down.weight")
        layer.ffn_up_bias, layer.ffn_down_bias = t("ffn_up.bias", False), t("ffn_down.bias", False)
    layer.gated_ffn = gated_ffn
    layer.activation = activation
    layer.rope_style = rope_style
    layer.rope_dim = rope_dim
    layer.rope_base = rope_base
    layer.rope_freq_scale = freq_scale
    if yarn is not None:
        layer.rope_yarn = yarn
    layer.rope_freqs = rope_freqs
    return layer


# --- mixture of experts ------------------------------------------------------------------

# What mixture_of_experts reads; SHARED_EXPERT_KEYS as well for a family with a shared expert.
MOE_KEYS = ("expert_count", "expert_used_count", "expert_gating_func", "expert_feed_forward_length")
SHARED_EXPERT_KEYS = ("expert_shared_feed_forward_length",)
# <arch>.expert_gating_func as gguf-py writes it (ExpertGatingFuncType); kcap implements softmax.
GATING_SOFTMAX = 1


@dataclass(frozen=True)
class Experts:
    """A family's mixture-of-experts hyperparameters, read and checked once per file."""
    n_expert: int
    n_expert_used: int
    weights_norm: bool  # the chosen experts' weights renormalized to sum 1
    n_ff: int | None  # <arch>.expert_feed_forward_length when the file has it (else the tensors' width)
    shared: bool  # a shared expert with a sigmoid gate beside the routed ones
    n_ff_shared: int | None  # <arch>.expert_shared_feed_forward_length when the file has it


def mixture_of_experts(hp: Hyperparameters, *, weights_norm: bool, shared: bool = False,
                       required: bool = False) -> Experts | None:
    """The file's expert counts; None for a dense model (expert_count absent or 0), which a
    family whose every block is a mixture of experts (required) refuses. The router is a
    softmax over every expert's logit, then the top expert_used_count (weights_norm: their
    weights renormalized, as the family's transformers model and llama.cpp compute it)."""
    path, arch = hp.gguf.path, hp.arch
    n_expert = hp.int("expert_count", 0) or 0
    if n_expert < 0:
        raise ModelError(f"{path}: {arch}.expert_count = {n_expert} is negative")
    if n_expert == 0 and required:
        raise MissingMetadataError(f"{path}: missing metadata key '{arch}.expert_count' (or it is 0): every "
                                   f"{arch} block is a mixture of experts")
    if n_expert == 0 and "blk.0.ffn_gate_inp.weight" in hp.gguf.tensors:
        raise MissingMetadataError(f"{path}: missing metadata key '{arch}.expert_count' (or it is 0) in a file "
                                   "with a mixture-of-experts router (blk.0.ffn_gate_inp.weight)")
    if n_expert == 0:
        used = hp.int("expert_used_count", 0) or 0
        if used:
            raise ModelError(f"{path}: {arch}.expert_used_count = {used} without {arch}.expert_count")
        return None
    used = hp.int("expert_used_count", None)
    if used is None:
        raise MissingMetadataError(f"{path}: missing metadata key '{arch}.expert_used_count' "
                                   f"({arch}.expert_count = {n_expert})")
    if not 0 < used <= n_expert:
        raise ModelError(f"{path}: {arch}.expert_used_count = {used} must be between 1 and "
                         f"{arch}.expert_count = {n_expert}")
    gating = hp.int("expert_gating_func", GATING_SOFTMAX)
    if gating != GATING_SOFTMAX:
        raise UnimplementedMetadataError(
            f"{path}: {arch}.expert_gating_func = {gating} (kcap implements the softmax router, "
            f"{GATING_SOFTMAX}, only)")
    n_ff_shared = hp.int("expert_shared_feed_forward_length", None) if shared else None
    return Experts(n_expert, used, weights_norm, hp.int("expert_feed_forward_length", None), shared, n_ff_shared)


def expert_tensor(gguf: GGUFFile, il: int, name: str, want: tuple, meaning: str) -> str:
    """'blk.<il>.<name>' after checking its GGUF-order shape against want (None: any size;
    trailing dims of 1 in the file are ignored, as ggml ignores them)."""
    full = f"blk.{il}.{name}"
    if full not in gguf.tensors:
        stem = name.split("_exps")[0]
        if any(t.startswith(f"blk.{il}.{stem}.") and t.split(".")[3].isdigit() for t in gguf.tensors):
            raise ModelError(f"{gguf.path}: missing tensor '{full}'; the file has {SPLIT_EXPERTS} "
                             f"(e.g. 'blk.{il}.{stem}.0.weight')")
        if name in ("ffn_gate_exps.weight", "ffn_up_exps.weight") and f"blk.{il}.ffn_gate_up_exps.weight" in gguf.tensors:
            raise ModelError(f"{gguf.path}: missing tensor '{full}'; the file fuses the experts' gate and up "
                             f"matrices into 'blk.{il}.ffn_gate_up_exps.weight', which kcap does not read")
        raise ModelError(f"{gguf.path}: missing tensor '{full}'")
    stored = shape = gguf.tensors[full].shape
    while len(shape) > len(want) and shape[-1] == 1:  # e.g. the shared expert's gate [n_embd, 1]
        shape = shape[:-1]
    if len(shape) != len(want) or any(w is not None and s != w for s, w in zip(shape, want)):
        shown = "[" + ", ".join("*" if w is None else str(w) for w in want) + "]"
        raise ModelError(f"{gguf.path}: tensor '{full}' has shape {list(stored)}, expected {shown} ({meaning})")
    return full


def moe_ffn(gguf: GGUFFile, layer: _core.LayerSpec, il: int, n_embd: int, experts: Experts, arch: str,
            shared_gate: bool = True) -> None:
    """Fills a block's mixture-of-experts fields and tensors, named as llama.cpp's converter
    writes them (experts merged into one 3-D tensor per matrix), each tensor's shape checked
    against the embedding size and the metadata's expert counts before the spec reaches the core.
    A shared expert has a sigmoid gate (ffn_gate_inp_shexp) unless shared_gate is false."""
    n_expert = experts.n_expert
    count = f"{arch}.expert_count = {n_expert}"
    layer.ffn_gate_inp = expert_tensor(gguf, il, "ffn_gate_inp.weight", (n_embd, n_expert),
                                        f"the router: [n_embd {n_embd}, {count}]")
    # The experts' width is the metadata's where it has one, else ffn_gate_exps' (the others agree).
    width = f"{arch}.expert_feed_forward_length = {experts.n_ff}" if experts.n_ff else "expert width"
    gate = expert_tensor(gguf, il, "ffn_gate_exps.weight", (n_embd, experts.n_ff, n_expert),
                          f"[n_embd {n_embd}, {width}, {count}]")
    n_ff = gguf.tensors[gate].shape[1]
    if not experts.n_ff:
        width = f"expert width {n_ff} (of blk.{il}.ffn_gate_exps.weight)"
    layer.ffn_gate_exps = gate
    layer.ffn_up_exps = expert_tensor(gguf, il, "ffn_up_exps.weight", (n_embd, n_ff, n_expert),
                                       f"[n_embd {n_embd}, {width}, {count}]")
    layer.ffn_down_exps = expert_tensor(gguf, il, "ffn_down_exps.weight", (n_ff, n_embd, n_expert),
                                         f"[{width}, n_embd {n_embd}, {count}]")
    layer.n_expert = n_expert
    layer.n_expert_used = experts.n_expert_used
    layer.expert_gating = _core.ExpertGating.Softmax
    layer.expert_weights_norm = experts.weights_norm
    layer.expert_weights_scale = 1.0
    if experts.shared:
        n_ff_shared = experts.n_ff_shared
        width = (f"{arch}.expert_shared_feed_forward_length = {n_ff_shared}" if n_ff_shared
                 else "shared expert width")
        shexp = expert_tensor(gguf, il, "ffn_gate_shexp.weight", (n_embd, n_ff_shared),
                               f"the shared expert: [n_embd {n_embd}, {width}]")
        if not n_ff_shared:
            n_ff_shared = gguf.tensors[shexp].shape[1]
            width = f"shared expert width {n_ff_shared} (of blk.{il}.ffn_gate_shexp.weight)"
        layer.ffn_gate_shexp = shexp
        layer.ffn_up_shexp = expert_tensor(gguf, il, "ffn_up_shexp.weight", (n_embd, n_ff_shared),
                                            f"the shared expert: [n_embd {n_embd}, {width}]")
        layer.ffn_down_shexp = expert_tensor(gguf, il, "ffn_down_shexp.weight", (n_ff_shared, n_embd),
                                              f"the shared expert: [{width}, n_embd {n_embd}]")
        if shared_gate:
            layer.ffn_gate_inp_shexp = expert_tensor(gguf, il, "ffn_gate_inp_shexp.weight", (n_embd,),
                                                      f"the shared expert's gate: [n_embd {n_embd}]")


# What build_rms_decoder reads.
RMS_DECODER_KEYS = (*SPEC_KEYS, *ATTENTION_KEYS, *ROPE_KEYS, *YARN_KEYS, *SLIDING_WINDOW_KEYS,
                    "attention.layer_norm_rms_epsilon")


def build_rms_decoder(gguf: GGUFFile, arch: str, rope_style, activation, keys=RMS_DECODER_KEYS,
                      experts: dict | None = None, **layer_features) -> _core.ModelSpec:
    """The common pre-norm RMSNorm decoder (Qwen 2/3 and kin): standard hyperparameters,
    sliding windows per layer (sliding_windows), standard_layer for every block, with the
    family's features (biases, qk_norm, ...). keys: the module's METADATA_KEYS. experts: the
    family's mixture_of_experts arguments; a file with expert_count > 0 then has expert FFNs
    (moe_ffn) in every block."""
    hp = Hyperparameters(gguf, arch, keys)
    spec = new_spec(gguf, hp)
    spec.norm_kind = _core.NormKind.RMS
    spec.norm_eps = hp.float("attention.layer_norm_rms_epsilon")
    geometry = attention_geometry(hp, spec.n_embd)
    n_layer = hp.int("block_count")
    windows = sliding_windows(hp, n_layer)
    moe = mixture_of_experts(hp, **experts) if experts is not None else None
    freq_scale = rope_scaling(hp, gguf, allowed=("none", "linear", "yarn"))
    yarn = rope_yarn(hp, gguf)
    layers = []
    for il in range(n_layer):
        layer = standard_layer(gguf, il, geometry, rope_style=rope_style,
                               rope_dim=hp.int("rope.dimension_count", geometry[2]),
                               rope_base=hp.float("rope.freq_base", 10000.0), freq_scale=freq_scale, yarn=yarn,
                               activation=activation, dense_ffn=moe is None, **layer_features)
        if moe is not None:
            moe_ffn(gguf, layer, il, spec.n_embd, moe, arch)
        layer.sliding_window = windows[il]
        layers.append(layer)
    spec.layers = layers
    return spec
