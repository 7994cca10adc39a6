"""Nothing in a model file is silently ignored: every load (kcap.load, kcap explain) checks

* metadata: a key of the architecture's namespace that changes the computation (MATH_KEYS,
  the one list of them) must be one the architecture module implements (its METADATA_KEYS),
  or hold the value that leaves the computation unchanged (e.g. a sliding window of 0);
  otherwise the load fails with the key, its value and what it would change;
* tensors: every tensor of the file is used by the plan (the tensors the ModelSpec references,
  plus those an architecture module folded into the spec's numbers), or is on the module's
  KNOWN_UNUSED_TENSORS list, each with its reason; otherwise the load fails listing the unused
  tensors, grouped by what they look like (e.g. mixture-of-experts tensors).

llama.cpp refuses a file whose tensor count differs from what its loader used ("wrong number of
tensors"); these checks are at least as strict and say what they found.
"""
from __future__ import annotations

import fnmatch
import re

from kcap.errors import UnimplementedMetadataError, UnusedTensorError
from kcap.gguf import GGUFFile

# Metadata keys (after '<arch>.') known to change the computation: pattern -> (what the key
# changes, values that leave the computation as if the key were absent). A key matching one
# of these that the architecture module does not implement refuses the load.
MATH_KEYS: dict[str, tuple[str, tuple]] = {
    "attention.head_count": ("the number of query heads", ()),
    "attention.head_count_kv": ("the number of KV heads", ()),
    "attention.key_length": ("the head size", ()),
    "attention.value_length": ("the value head size", ()),
    "attention.key_length_swa": ("the sliding layers' head size", ()),
    "attention.value_length_swa": ("the sliding layers' value head size", ()),
    "attention.key_length_mla": ("multi-head latent attention", ()),
    "attention.value_length_mla": ("multi-head latent attention", ()),
    "attention.q_lora_rank": ("low-rank query projections (multi-head latent attention)", (0,)),
    "attention.kv_lora_rank": ("low-rank KV projections (multi-head latent attention)", (0,)),
    "attention.sliding_window": ("sliding-window attention", (0,)),
    "attention.sliding_window_pattern": ("which layers use the sliding window", ()),
    "attention.scale": ("the attention score scale", ()),
    "attention.output_scale": ("the attention output scale", (1.0,)),
    "attention.temperature_scale": ("attention temperature tuning", (0.0,)),
    "attention.temperature_length": ("attention temperature tuning", (0,)),
    "attention.clamp_kqv": ("clamping of Q, K and V", (0.0,)),
    "attention.max_alibi_bias": ("ALiBi position biases", (0.0,)),
    "attention.causal": ("non-causal attention", (True,)),
    "attention.shared_kv_layers": ("layers that reuse another layer's KV cache", (0,)),
    "attn_logit_softcapping": ("attention-logit softcapping", (0.0,)),
    "final_logit_softcapping": ("final-logit softcapping", (0.0,)),
    "router_logit_softcapping": ("router-logit softcapping (mixture of experts)", (0.0,)),
    "logit_scale": ("a scale of the logits", (1.0,)),
    "embedding_scale": ("a scale of the embeddings", (1.0,)),
    "residual_scale": ("a scale of each block's output", (1.0,)),
    "use_parallel_residual": ("attention and FFN in parallel", (False,)),
    "swin_norm": ("Swin-style norms", (False,)),
    "embedding_length_per_layer_input": ("per-layer input embeddings", (0,)),
    "altup.*": ("AltUp (alternating updates)", ()),
    "activation_sparsity_scale": ("activation sparsity", ()),
    "swiglu_clamp_*": ("clamped SwiGLU", (0.0,)),
    "rope.dimension_count": ("the number of rotated dimensions", ()),
    "rope.dimension_count_swa": ("the sliding layers' rotated dimensions", ()),
    "rope.dimension_sections": ("multimodal rope sections", ()),
    "rope.freq_base": ("the rope base", ()),
    "rope.freq_base_swa": ("the sliding layers' rope base", ()),
    "rope.scaling.type": ("rope scaling", ("none",)),
    "rope.scale_linear": ("linear rope scaling (an older converter's key for its factor)", (0.0, 1.0)),
    "rope.scaling.factor": ("rope scaling", (0.0, 1.0)),
    # YaRN variants of llama.cpp's that transformers' YaRN does not have (first match wins).
    "rope.scaling.yarn_ext_factor": ("YaRN's extrapolation mix (llama.cpp's ext_factor)", (1.0,)),
    "rope.scaling.yarn_log_multiplier": ("YaRN's attention-factor multiplier (DeepSeek's mscale_all_dim)", (0.0,)),
    "rope.scaling.attn_factor": ("a scale of the rope's cos and sin", (1.0,)),
    "rope.scaling.*": ("rope scaling", ()),
    # Mixture of experts: implemented by the modules that declare these keys (a softmax router
    # over experts merged into 3-D tensors, optionally a sigmoid-gated shared expert).
    "expert_count": ("mixture of experts: the number of experts", (0,)),
    "expert_used_count": ("mixture of experts: the experts chosen per token", (0,)),
    "expert_feed_forward_length": ("mixture of experts: the experts' FFN width", (0,)),
    "expert_shared_feed_forward_length": ("mixture of experts: the shared expert's FFN width", (0,)),
    "expert_gating_func": ("mixture of experts: the router's gating function", ()),
    "expert_weights_norm": ("mixture of experts: renormalizing the chosen experts' weights", ()),
    "expert_weights_scale": ("mixture of experts: a scale of the chosen experts' weights", (1.0,)),
    # Mixture-of-experts variants no module implements.
    "expert_*": ("a mixture-of-experts variant kcap does not implement", (0,)),
    "experts_per_group": ("a mixture-of-experts variant kcap does not implement", (0,)),
    "moe_*": ("a mixture-of-experts variant kcap does not implement", (0,)),
    "interleave_moe_layer_step": ("mixture-of-experts layers interleaved with dense ones", (0,)),
    "leading_dense_block_count": ("dense layers before the mixture-of-experts ones", (0,)),
    "full_attention_interval": ("a hybrid of attention and recurrent layers", ()),
    "ssm.*": ("state-space (Mamba) layers", ()),
}

# One tensor per expert and matrix (blk.N.ffn_gate.E.weight), as converters before mid-2024
# wrote Mixtral; the arch modules read the experts merged into one 3-D tensor per matrix.
SPLIT_EXPERTS = ("per-expert split tensors, an older converter's mixture-of-experts layout: kcap reads "
                 "the experts merged into one 3-D tensor per matrix (blk.N.ffn_gate_exps.weight), as "
                 "llama.cpp's convert_hf_to_gguf.py writes them today; reconvert the model")

# What unused tensors look like, first match wins: (name patterns, description).
TENSOR_KINDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("blk.*.ffn_gate.[0-9]*.weight", "blk.*.ffn_up.[0-9]*.weight", "blk.*.ffn_down.[0-9]*.weight"),
     SPLIT_EXPERTS),
    (("*_exps.*", "*_shexp.*", "*_chexps.*", "*.ffn_gate_inp.*", "*.ffn_gate_inp_shexp.*", "*.exp_probs_b*"),
     "expert tensors: mixture-of-experts parts that this architecture module does not implement"),
    (("v.*", "mm.*", "a.*"), "vision or audio tower tensors: kcap runs the text model only"),
    (("*.ssm_*",), "state-space (Mamba) tensors"),
    (("*nextn*",), "multi-token-prediction tensors"),
)


def math_key_meaning(key: str) -> tuple[str, tuple] | None:
    """(what the key changes, neutral values) for a key after '<arch>.', or None."""
    for pattern, meaning in MATH_KEYS.items():
        if fnmatch.fnmatchcase(key, pattern):
            return meaning
    return None


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def unimplemented_metadata(gguf: GGUFFile, arch: str, implemented) -> list[str]:
    """'key = value (what it changes)' for each math-changing key of the file's '<arch>.'
    namespace that the module does not implement and whose value is not neutral."""
    prefix = f"{arch}."
    found = []
    for full, value in gguf.metadata.items():
        if not full.startswith(prefix):
            continue
        key = full[len(prefix):]
        meaning = math_key_meaning(key)
        if meaning is None or key in implemented:
            continue
        what, neutral = meaning
        if not isinstance(value, list) and value in neutral:
            continue
        found.append(f"{full} = {_show(value)} ({what})")
    return found


def check_metadata(gguf: GGUFFile, arch: str, implemented) -> None:
    found = unimplemented_metadata(gguf, arch, implemented)
    if found:
        raise UnimplementedMetadataError(
            f"{gguf.path}: the {arch} architecture does not implement metadata that changes the computation: "
            + "; ".join(found))


def _compact(names: list[str]) -> list[str]:
    """'blk.0.x', 'blk.1.x', 'blk.3.x' -> 'blk.[0-1,3].x': one entry per tensor kind."""
    layers: dict[str, list[int]] = {}
    others = []
    for name in names:
        m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
        if m:
            layers.setdefault(m.group(2), []).append(int(m.group(1)))
        else:
            others.append(name)
    out = sorted(others)
    for rest, ids in sorted(layers.items()):
        ids.sort()
        runs, start = [], ids[0]
        for prev, cur in zip(ids, ids[1:] + [None]):
            if cur != prev + 1:
                runs.append(f"{start}" if start == prev else f"{start}-{prev}")
                start = cur
        out.append(f"blk.{runs[0]}.{rest}" if len(ids) == 1 else f"blk.[{','.join(runs)}].{rest}")
    return out


def describe_unused(names) -> list[str]:
    """The unused tensors grouped by what they look like, one line per group."""
    groups: dict[str, list[str]] = {}
    for name in names:
        kind = next((what for patterns, what in TENSOR_KINDS
                     if any(fnmatch.fnmatchcase(name, p) for p in patterns)),
                    "tensors the architecture module does not know")
        groups.setdefault(kind, []).append(name)
    return [f"{kind}: {', '.join(_compact(found))}" for kind, found in groups.items()]


def unused_tensors(gguf: GGUFFile, used, known_unused: dict[str, str]) -> list[str]:
    """Tensors of the file neither used nor matching a known-unused pattern, in file order."""
    used = set(used)
    return [name for name in gguf.tensors
            if name not in used and not any(fnmatch.fnmatchcase(name, p) for p in known_unused)]


def check_tensors(gguf: GGUFFile, arch: str, used, known_unused: dict[str, str]) -> None:
    unused = unused_tensors(gguf, used, known_unused)
    if unused:
        raise UnusedTensorError(
            f"{gguf.path}: {len(unused)} of the file's {len(gguf.tensors)} tensors are not used by the "
            f"{arch} plan, and kcap refuses to ignore them: " + "; ".join(describe_unused(unused)))
