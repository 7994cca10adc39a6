// FFN activation: out = act(gate) * up for gated FFNs, act(x) otherwise.
#pragma once

#include "kernels/params.h"
#include "kernels/dialect.h"

KCAP_FN float kcap_activate(int activation, float x) {
    switch (activation) {
        case 0: return x / (1.0f + kcap_exp(-x));  // SiLU
        case 1: {                                  // GELU, tanh approximation
            const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
            return 0.5f * x * (1.0f + kcap_tanh(inner));
        }
        case 2: return 0.5f * x * (1.0f + kcap_erf(x * 0.7071067811865476f));  // GELU, erf
        default: return x > 0.0f ? x : 0.0f;                                      // ReLU
    }
}

// A gated FFN's act(gate) * up; activation 4 (kcap::Activation::SwigluOai) is gpt-oss's clamped
// SwiGLU, (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g) with g = min(gate, limit): finite
// for every finite input (an overflowing exp gives a sigmoid of 0).
#define KCAP_ACTIVATION_SWIGLU_OAI 4
KCAP_FN float kcap_gated(int activation, float gate, float up, float alpha, float limit) {
    if (activation == KCAP_ACTIVATION_SWIGLU_OAI) {
        const float g = gate < limit ? gate : limit;
        const float u = up < -limit ? -limit : (up > limit ? limit : up);
        return (u + 1.0f) * (g / (1.0f + kcap_exp(-alpha * g)));
    }
    return kcap_activate(activation, gate) * up;
}

// One thread per value. Grid: x = ceil(count / threads).
KCAP_FN void kcap_ffn_activation(const KcapThread t, const KcapElementwiseParams p, const KCAP_GLOBAL float* gate,
                                 const KCAP_GLOBAL float* up, KCAP_GLOBAL float* out) {
    const kcap_u64 i = kcap_u64(t.group_x) * t.threads + t.index;
    if (i >= kcap_u64(p.count)) return;
    const float a = kcap_activate(p.activation, gate[i]);
    out[i] = p.gated ? a * up[i] : a;
}
