// Embedding lookup: dequantize one row of the raw table per token, times the embedding scale,
// plus the learned position embedding of the token's position where the model has one.
// Token ids and positions are read from device memory (the decode graph feeds its own argmax
// back; step[0] is the position of token 0).
#pragma once

#include "kernels/params.h"
#include "kernels/quant.h"

// Position embedding value i of position pos (f32 or f16 rows of width values).
KCAP_FN float kcap_position_value(const KcapEmbedParams p, const KCAP_GLOBAL kcap_u8* positions, int pos, int i) {
    const kcap_u64 e = kcap_u64(pos) * kcap_u64(p.width) + kcap_u64(i);
    return p.positions == 2 ? kcap_half_to_float(reinterpret_cast<const KCAP_GLOBAL kcap_u16*>(positions)[e])
                            : reinterpret_cast<const KCAP_GLOBAL float*>(positions)[e];
}

// Grid: x = n_tokens; each thread decodes 32-element runs of its token's row, then the tail
// (width % 32 values, float formats only: width is a multiple of 4) one value per thread.
// The CPU row's order: out = table * scale, then out += position (same roundings).
template <class F>
KCAP_FN void kcap_embed(const KcapThread t, const KcapEmbedParams p, const KCAP_GLOBAL kcap_i32* tokens,
                        const KCAP_GLOBAL kcap_i32* step, const KCAP_GLOBAL kcap_u8* table,
                        const KCAP_GLOBAL kcap_u8* positions, KCAP_GLOBAL float* out) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    const int m = int(t.group_x);
    const KCAP_GLOBAL kcap_u8* row = table + kcap_u64(tokens[m]) * p.row_bytes;
    const int pos = p.positions ? step[0] + m : 0;
    out += kcap_u64(m) * p.width;
    const int runs = p.width / 32;
    for (int run = int(t.index); run < runs; run += int(t.threads)) {
        float v[32];
        F::decode32(row + unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes), run % kRunsPerBlock, v);
        KCAP_UNROLL for (int i = 0; i < 32; ++i) {
            float value = v[i] * p.scale;
            if (p.positions) value += kcap_position_value(p, positions, pos, 32 * run + i);
            out[32 * run + i] = value;
        }
    }
    for (int i = 32 * runs + int(t.index); i < p.width; i += int(t.threads)) {
        float value = KcapElem<F>::load(row, i) * p.scale;
        if (p.positions) value += kcap_position_value(p, positions, pos, i);
        out[i] = value;
    }
}
