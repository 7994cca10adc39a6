// Per-layer embeddings (PLE, Gemma 4 E-models): the per-token input every layer mixes in
// after its FFN. The CPU rows are cpp/cpu/ple.cpp; these bodies compute the same values.
//
// per_layer_embed runs in two launches: the projection proj . e of every token (a matmul body
// of kernels/matmul.h, written raw to the output), then kcap_ple_combine, which scales it,
// RMS-normalizes each layer's slice, adds the token's table row and scales the sum:
//   ple = (rms_norm_per_layer(norm_w, (proj . e) * proj_scale) + table[id] * token_scale) * combine_scale
// per_layer_gate: act(gate) * this layer's slice of ple (kcap_ple_gate).
#pragma once

#include "kernels/activation.h"
#include "kernels/params.h"
#include "kernels/quant.h"

// Grid: x = n_tokens, y = n_layer; one simd group (32 threads). Lane l takes values
// l, l + 32, .. of its layer's slice of its token's row of `out` (the raw projection), in place.
// The table (format T) is read one element at a time: a slice need not start on a run.
template <class T>
KCAP_FN void kcap_ple_combine(const KcapThread t, const KcapPleParams p, const KCAP_GLOBAL kcap_i32* tokens,
                              const KCAP_GLOBAL kcap_u8* table, const KCAP_GLOBAL float* norm_w,
                              KCAP_GLOBAL float* out) {
    const int m = int(t.group_x);
    const int layer = int(t.group_y);
    KCAP_GLOBAL float* x = out + kcap_u64(m) * kcap_u64(p.width) + kcap_u64(layer) * kcap_u64(p.per);
    const KCAP_GLOBAL kcap_u8* row = table + kcap_u64(tokens[m]) * p.table_row_bytes;
    float sum_sq = 0.0f;
    for (int i = int(t.lane); i < p.per; i += KCAP_SIMD_WIDTH) {
        const float v = x[i] * p.proj_scale;
        sum_sq += v * v;
    }
    sum_sq = kcap_simd_sum(sum_sq);
    const float inv = kcap_rsqrt(sum_sq / float(p.per) + p.eps);
    for (int i = int(t.lane); i < p.per; i += KCAP_SIMD_WIDTH) {
        const float v = x[i] * p.proj_scale;
        const float tok = KcapElem<T>::load(row, layer * p.per + i);
        x[i] = (v * inv * norm_w[i] + tok * p.token_scale) * p.combine_scale;
    }
}

// One thread per output value. Grid: x = ceil(n_tokens * per / threads).
KCAP_FN void kcap_ple_gate(const KcapThread t, const KcapPleGateParams p, const KCAP_GLOBAL float* gate,
                           const KCAP_GLOBAL float* ple, KCAP_GLOBAL float* out) {
    const kcap_u64 index = kcap_u64(t.group_x) * t.threads + t.index;
    if (index >= kcap_u64(p.n_tokens) * kcap_u64(p.per)) return;
    const kcap_u64 m = index / kcap_u64(p.per);
    const kcap_u64 i = index % kcap_u64(p.per);
    out[index] = kcap_activate(p.activation, gate[index]) * ple[m * kcap_u64(p.stride) + kcap_u64(p.offset) + i];
}
