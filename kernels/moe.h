// Mixture-of-experts bodies (CUDA and Metal entries, host tests):
//   kcap_moe_route     one group per token: the router's logits (each simd group takes experts
//                      simd, simd + simds, ...; its lanes take 32-element runs of the row), then
//                      thread 0 picks the n_used largest logits (the lower index first on a tie,
//                      as the CPU row does), their softmax weights over every expert, optionally
//                      renormalized, times the scale: a Routing row (ids as floats, then weights).
//   kcap_moe_slot      which expert and token a group of the experts' matvecs works for: grid y
//                      runs over (token, chosen expert) slots, so a call reads only the chosen
//                      experts' weights (the gate / up and down matvecs are kernels/matvec.h's).
//   kcap_moe_combine   out[token][o] = sum over the token's slots of weight * down[slot][o].
#pragma once

#include "kernels/matmul.h"
#include "kernels/params.h"


// Grid: x = tokens. shared: KCAP_MOE_MAX_EXPERTS floats. K a multiple of 32 (whole runs).
template <class F>
KCAP_FN void kcap_moe_route(const KcapThread t, const KcapMoeParams p, const KCAP_GLOBAL kcap_u8* w,
                            const KCAP_GLOBAL float* x, KCAP_GLOBAL float* routing, KCAP_SHARED float* logits) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    const int token = int(t.group_x);
    const KCAP_GLOBAL float* xt = x + kcap_u64(token) * kcap_u64(p.k);
    const int runs = p.k / 32;
    for (int e = int(t.simd); e < p.n_expert; e += int(t.simds)) {
        const KCAP_GLOBAL kcap_u8* row = w + kcap_u64(e) * p.router_row_bytes;
        float acc = 0.0f;
        for (int run = int(t.lane); run < runs; run += KCAP_SIMD_WIDTH) {
            float wv[32], xv[32];
            F::decode32(row + unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes), run % kRunsPerBlock, wv);
            KCAP_UNROLL for (int i = 0; i < 32; ++i) xv[i] = xt[run * 32 + i];
            acc += kcap_dot32(wv, xv);
        }
        acc = kcap_simd_sum(acc);
        if (t.lane == 0) logits[e] = acc;
    }
    kcap_barrier();
    if (t.index != 0) return;
    float top = logits[0];
    for (int e = 1; e < p.n_expert; ++e) top = logits[e] > top ? logits[e] : top;
    float sum = 0.0f;
    for (int e = 0; e < p.n_expert; ++e) sum += kcap_exp(logits[e] - top);
    KCAP_GLOBAL float* out = routing + kcap_u64(token) * kcap_u64(2 * p.n_used);
    float chosen = 0.0f;
    for (int k = 0; k < p.n_used; ++k) {
        int best = -1;
        for (int e = 0; e < p.n_expert; ++e) {
            bool taken = false;
            for (int j = 0; j < k; ++j) taken = taken || int(out[j]) == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        const float weight = kcap_exp(logits[best] - top) / sum;
        out[k] = float(best);
        out[p.n_used + k] = weight;
        chosen += weight;
    }
    for (int k = 0; k < p.n_used; ++k)
        out[p.n_used + k] = (p.renormalize ? out[p.n_used + k] / chosen : out[p.n_used + k]) * p.scale;
}

// Grid y of the experts' matvecs: slot = token * n_used + k.
struct KcapMoeSlot {
    int token;
    int expert;
};
KCAP_FN KcapMoeSlot kcap_moe_slot(const KcapMoeParams p, const KCAP_GLOBAL float* routing, int slot) {
    KcapMoeSlot s;
    s.token = slot / p.n_used;
    s.expert = int(routing[kcap_u64(s.token) * kcap_u64(2 * p.n_used) + kcap_u64(slot % p.n_used)]);
    return s;
}

// One thread per output value: grid x = ceil(n_tokens * n / threads).
KCAP_FN void kcap_moe_combine(const KcapThread t, const KcapMoeParams p, const KCAP_GLOBAL float* routing,
                              const KCAP_GLOBAL float* down, KCAP_GLOBAL float* out) {
    const kcap_u64 i = kcap_u64(t.group_x) * t.threads + t.index;
    if (i >= kcap_u64(p.n_tokens) * kcap_u64(p.n)) return;
    const int token = int(i / kcap_u64(p.n)), o = int(i % kcap_u64(p.n));
    const KCAP_GLOBAL float* weights = routing + kcap_u64(token) * kcap_u64(2 * p.n_used) + kcap_u64(p.n_used);
    float sum = 0.0f;
    for (int k = 0; k < p.n_used; ++k)
        sum += weights[k] * down[(kcap_u64(token) * kcap_u64(p.n_used) + kcap_u64(k)) * kcap_u64(p.n) + kcap_u64(o)];
    out[i] = sum;
}
