"""An independent float64 NumPy forward pass over a ModelSpec, for tests.

Weights come from gguf-py's dequantize (the format oracle), the math is written from the
architecture definitions, not from kcap's kernels. It is slow and only meant for the small
synthetic models; the real models are checked against transformers instead."""
from __future__ import annotations

import numpy as np

import gguf
from kcap import _core


def dequantized(gg, name: str) -> np.ndarray:
    info = gg.tensors[name]
    values = gguf.quants.dequantize(info.data, gguf.GGMLQuantizationType(info.ggml_type))
    return np.asarray(values, dtype=np.float64).reshape(tuple(reversed(info.shape)))


def norm(x, weight, bias, eps, kind):
    if kind == _core.NormKind.Layer:
        x = x - x.mean(-1, keepdims=True)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def rope(x, positions, rope_dim, base, freq_scale, factors, neox):
    # x: [T, heads, head_dim]
    half = rope_dim // 2
    inv_freq = base ** (-2.0 * np.arange(half) / rope_dim)
    if factors is not None:
        inv_freq = inv_freq / factors
    angles = (positions[:, None] * freq_scale) * inv_freq[None, :]  # [T, half]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    out = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:rope_dim]
        out[..., :half] = a * cos - b * sin
        out[..., half:rope_dim] = a * sin + b * cos
    else:
        a, b = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
        out[..., 0:rope_dim:2] = a * cos - b * sin
        out[..., 1:rope_dim:2] = a * sin + b * cos
    return out


def activation(x, kind):
    if kind == _core.Activation.SiLU:
        return x / (1 + np.exp(-x))
    if kind == _core.Activation.GeluTanh:
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    if kind == _core.Activation.GeluErf:
        from math import erf

        return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))
    return np.maximum(x, 0)


def mixture_of_experts(layer, w, h, router_in=None, choices=None) -> np.ndarray:
    """A mixture-of-experts FFN as LayerSpec defines it, h [T, n_embd] -> [T, n_embd]: per token a
    softmax over the router's logits (of router_in where given, else h; times expert_logit_scale),
    the n_expert_used largest (renormalized to sum 1 when expert_weights_norm, times
    expert_weights_scale and the expert's ffn_down_exps_scale entry) weighing the chosen experts'
    gated FFNs (gate and up from ffn_gate_up_exps' halves where it is set), plus the shared expert
    times sigmoid(ffn_gate_inp_shexp . h) where it exists. choices (a list) gets each token's
    chosen experts, in the router's order, and their final weights."""
    assert layer.expert_gating == _core.ExpertGating.Softmax
    logits = (h if router_in is None else router_in) @ w(layer.ffn_gate_inp).T * layer.expert_logit_scale
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    if layer.ffn_gate_up_exps:  # [n_expert, 2 ff, in]: each expert's gate rows, then its up rows
        gate_up = w(layer.ffn_gate_up_exps)
        ff = gate_up.shape[1] // 2
        gate, up = gate_up[:, :ff], gate_up[:, ff:]
    else:
        gate, up = w(layer.ffn_gate_exps), w(layer.ffn_up_exps)  # [n_expert, out, in]
    down = w(layer.ffn_down_exps)
    expert_scale = w(layer.ffn_down_exps_scale) if layer.ffn_down_exps_scale else np.ones(layer.n_expert)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        chosen = np.argsort(-probs[t], kind="stable")[:layer.n_expert_used]
        weights = probs[t, chosen]
        if layer.expert_weights_norm:
            weights = weights / weights.sum()
        weights = weights * layer.expert_weights_scale * expert_scale[chosen]
        if choices is not None:
            choices.append((chosen, weights))
        for e, weight in zip(chosen, weights):
            a = activation(gate[e] @ h[t], layer.activation) * (up[e] @ h[t])
            out[t] += weight * (down[e] @ a)
    if layer.ffn_up_shexp:
        a = activation(h @ w(layer.ffn_gate_shexp).T, layer.activation) * (h @ w(layer.ffn_up_shexp).T)
        shared = a @ w(layer.ffn_down_shexp).T
        if layer.ffn_gate_inp_shexp:
            shared = shared / (1.0 + np.exp(-(h @ w(layer.ffn_gate_inp_shexp).reshape(-1))))[:, None]
        out = out + shared
    return out


def reference_logits(gg, spec, ids, choices=None) -> np.ndarray:
    """Logits [len(ids), vocab] for token ids at positions 0..len(ids)-1. choices (a dict) gets,
    for each layer with experts, the list of (chosen experts, weights) of every token."""
    views = getattr(spec, "views", {})

    def w(name):
        if not name:
            return None
        if name in views:  # rows (2-D) or elements (1-D) of a fused tensor
            base, offset, count = views[name]
            return dequantized(gg, base)[offset:offset + count]
        return dequantized(gg, name)

    ids = np.asarray(ids)
    T = len(ids)
    positions = np.arange(T, dtype=np.float64)
    x = w(spec.token_embd)[ids] * spec.embed_scale
    if spec.position_embd:
        x = x + w(spec.position_embd)[:T]
    ple = None
    if spec.ple_token_embd:  # per-layer embeddings [T, n_layer, P]
        L, P = len(spec.layers), spec.n_embd_per_layer
        ctx = ((x @ w(spec.ple_model_proj).T) * spec.ple_model_proj_scale).reshape(T, L, P)
        ctx = norm(ctx, w(spec.ple_proj_norm), None, spec.norm_eps, _core.NormKind.RMS)
        tok = w(spec.ple_token_embd)[ids].reshape(T, L, P) * spec.ple_token_scale
        ple = (ctx + tok) * spec.ple_combine_scale
    caches = {}  # layer -> (k, v) after norms and RoPE, for layers that share them

    def layer_choices(il):
        return None if choices is None else choices.setdefault(il, [])

    for il, layer in enumerate(spec.layers):
        H, Hkv, D, Dv = layer.n_head, layer.n_head_kv, layer.head_dim, layer.head_dim_v
        h = norm(x, w(layer.attn_norm), w(layer.attn_norm_bias), spec.norm_eps, spec.norm_kind)

        def proj(weight, bias):
            y = h @ w(weight).T
            return y + w(bias) if bias else y

        shared = layer.kv_source_layer >= 0
        q = proj(layer.wq, layer.bq).reshape(T, H, D)
        if not shared:
            k = proj(layer.wk, layer.bk).reshape(T, Hkv, D)
            v = proj(layer.wv, layer.bv).reshape(T, Hkv, Dv)
        if layer.q_norm:
            q = norm(q, w(layer.q_norm), None, spec.norm_eps, _core.NormKind.RMS)
        if layer.k_norm and not shared:
            k = norm(k, w(layer.k_norm), None, spec.norm_eps, _core.NormKind.RMS)
        if layer.v_norm and not shared:
            v = norm(v, None, None, spec.norm_eps, _core.NormKind.RMS)
        if layer.rope_style != _core.RopeStyle.None_:
            neox = layer.rope_style == _core.RopeStyle.NeoX
            factors = w(layer.rope_freqs)
            q = rope(q, positions, layer.rope_dim, layer.rope_base, layer.rope_freq_scale, factors, neox)
            if not shared:
                k = rope(k, positions, layer.rope_dim, layer.rope_base, layer.rope_freq_scale, factors, neox)
        if shared:  # another layer's keys and values, as that layer cached them
            k, v = caches[layer.kv_source_layer]
        else:
            caches[il] = (k, v)
        scale = layer.attn_scale if layer.attn_scale > 0 else 1 / np.sqrt(D)
        group = H // Hkv
        out = np.zeros((T, H, Dv))
        for t in range(T):
            first = max(0, t - layer.sliding_window + 1) if layer.sliding_window > 0 else 0
            for hh in range(H):
                kv = hh // group
                s = (k[first:t + 1, kv] @ q[t, hh]) * scale
                if layer.attn_softcap > 0:
                    s = layer.attn_softcap * np.tanh(s / layer.attn_softcap)
                p = np.exp(s - s.max())
                p /= p.sum()
                out[t, hh] = p @ v[first:t + 1, kv]
        o = out.reshape(T, H * Dv) @ w(layer.wo).T
        if layer.bo:
            o = o + w(layer.bo)
        if layer.post_attn_norm:
            o = norm(o, w(layer.post_attn_norm), None, spec.norm_eps, spec.norm_kind)
        x = x + layer.residual_scale * o
        h = norm(x, w(layer.ffn_norm), w(layer.ffn_norm_bias), spec.norm_eps, spec.norm_kind)
        router_in = None
        if layer.ffn_gate_inp_scale:  # the router's own norm of the residual
            router_in = norm(x, w(layer.ffn_gate_inp_scale), None, spec.norm_eps, _core.NormKind.RMS)
        if layer.n_expert and layer.expert_dense_branch:  # dense FFN and experts side by side
            def branch_norm(v, name):
                return norm(v, w(name), None, spec.norm_eps, spec.norm_kind) if name else v

            a = activation(h @ w(layer.ffn_gate).T, layer.activation) * (h @ w(layer.ffn_up).T)
            dense = branch_norm(a @ w(layer.ffn_down).T, layer.ffn_post_norm_1)
            h2 = norm(x, w(layer.ffn_pre_norm_2), None, spec.norm_eps, spec.norm_kind)
            f = dense + branch_norm(mixture_of_experts(layer, w, h2, router_in, layer_choices(il)), layer.ffn_post_norm_2)
        elif layer.n_expert:
            f = mixture_of_experts(layer, w, h, router_in, layer_choices(il))
        else:
            up = h @ w(layer.ffn_up).T
            if layer.ffn_up_bias:
                up = up + w(layer.ffn_up_bias)
            a = activation(h @ w(layer.ffn_gate).T, layer.activation) * up if layer.gated_ffn else activation(
                up, layer.activation)
            f = a @ w(layer.ffn_down).T
            if layer.ffn_down_bias:
                f = f + w(layer.ffn_down_bias)
        if layer.post_ffn_norm:
            f = norm(f, w(layer.post_ffn_norm), None, spec.norm_eps, spec.norm_kind)
        x = x + layer.residual_scale * f
        if layer.ple_gate:
            g = activation(x @ w(layer.ple_gate).T, layer.activation) * ple[:, il]
            p_out = g @ w(layer.ple_proj).T
            if layer.ple_post_norm:
                p_out = norm(p_out, w(layer.ple_post_norm), None, spec.norm_eps, spec.norm_kind)
            x = x + layer.residual_scale * p_out
        x = x * layer.output_scale
    x = norm(x, w(spec.output_norm), w(spec.output_norm_bias), spec.norm_eps, spec.norm_kind)
    logits = x @ w(spec.output).T
    if spec.final_softcap > 0:
        logits = spec.final_softcap * np.tanh(logits / spec.final_softcap)
    return logits * spec.logit_scale
