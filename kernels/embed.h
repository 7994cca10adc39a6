// Embedding lookup: dequantize one row of the raw table per token, times the embedding scale.
// Token ids are read from device memory (the decode graph feeds its own argmax back).
#pragma once

#include "kernels/params.h"
#include "kernels/quant.h"

// Grid: x = n_tokens; each thread decodes 32-element runs of its token's row.
template <class F>
KCAP_FN void kcap_embed(const KcapThread t, const KcapEmbedParams p, const KCAP_GLOBAL kcap_i32* tokens,
                        const KCAP_GLOBAL kcap_u8* table, KCAP_GLOBAL float* out) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    const int m = int(t.group_x);
    const KCAP_GLOBAL kcap_u8* row = table + kcap_u64(tokens[m]) * p.row_bytes;
    out += kcap_u64(m) * p.width;
    for (int run = int(t.thread); run < p.width / 32; run += int(t.threads)) {
        float v[32];
        F::decode32(row + unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes), run % kRunsPerBlock, v);
        KCAP_UNROLL for (int i = 0; i < 32; ++i) out[32 * run + i] = v[i] * p.scale;
    }
}
