// Multi-head latent attention bodies (CUDA entries in cuda/attention.cu; the CPU row in
// cpp/cpu/attention.cpp is the reference). One call of n_tokens tokens at positions step[0] ..:
//   kcap_mla_append   one group per token: the RMS norm of its latent (times the norm weight) and
//                     the rotation of its rope key (adjacent pairs, the rope table's angle for the
//                     position), written as the cache row of its position (f32 or f16).
//   kcap_mla_absorb   one group per (token, head): the absorbed query [W_kb[h]^T q_nope, rotated
//                     q_rope], width values, from the head's query.
//   kcap_mla_attend   one group per (token, head): the absorbed query against every cache row up
//                     to its position (the causal span), one simd group per key at a time with an
//                     online softmax, the simd groups merged at the end: the head's weighted
//                     latent (lora values).
//   kcap_mla_v_up     one group per (token, head): W_vb[h] times the weighted latent, the head's
//                     output (dv values).
// Every group has KCAP_MLA_THREADS threads. Legal dims (the row checks them): lora and nope
// multiples of 32, lora <= KCAP_MLA_MAX_LORA, width <= KCAP_MLA_MAX_WIDTH.
#pragma once

#include "kernels/attention.h"
#include "kernels/params.h"

#define KCAP_MLA_LATENT_PER_LANE (KCAP_MLA_MAX_LORA / KCAP_SIMD_WIDTH)

// shared: KCAP_MLA_MAX_SIMDS floats. cos_sin: the rope table [n_ctx][rope / 2] (cos, sin).
KCAP_FN void kcap_mla_append(const KcapThread t, const KcapMlaParams p, const KCAP_GLOBAL kcap_i32* step,
                             const KCAP_GLOBAL float* kv_new, const KCAP_GLOBAL float* norm,
                             const KCAP_GLOBAL float2* cos_sin, KCAP_GLOBAL kcap_u8* cache, KCAP_SHARED float* partial) {
    const int token = int(t.group_x);
    const int pos = step[0] + token;
    const KCAP_GLOBAL float* src = kv_new + kcap_u64(token) * kcap_u64(p.width);
    float squares = 0.0f;
    for (int i = int(t.index); i < p.lora; i += int(t.threads)) squares += src[i] * src[i];
    squares = kcap_simd_sum(squares);
    if (t.lane == 0) partial[t.simd] = squares;
    kcap_barrier();
    float total = 0.0f;
    for (int s = 0; s < int(t.simds); ++s) total += partial[s];
    const float inv = kcap_rsqrt(total / float(p.lora) + p.eps);
    const kcap_u64 row = kcap_u64(pos) * kcap_u64(p.width);
    for (int i = int(t.index); i < p.lora; i += int(t.threads))
        kcap_kv_store(cache, row + kcap_u64(i), src[i] * inv * norm[i], p.kv_f16);
    const int half = p.rope / 2;
    for (int i = int(t.index); i < half; i += int(t.threads)) {
        const float2 cs = cos_sin[kcap_u64(pos) * kcap_u64(half) + kcap_u64(i)];
        const float x0 = src[p.lora + 2 * i], x1 = src[p.lora + 2 * i + 1];
        kcap_kv_store(cache, row + kcap_u64(p.lora + 2 * i), x0 * cs.x - x1 * cs.y, p.kv_f16);
        kcap_kv_store(cache, row + kcap_u64(p.lora + 2 * i + 1), x0 * cs.y + x1 * cs.x, p.kv_f16);
    }
}

// shared: nope floats (the head's q_nope). kb: W_k_b (or W_kv_b, combined) in format F.
template <class F>
KCAP_FN void kcap_mla_absorb(const KcapThread t, const KcapMlaParams p, const KCAP_GLOBAL kcap_i32* step,
                             const KCAP_GLOBAL float* q, const KCAP_GLOBAL kcap_u8* kb,
                             const KCAP_GLOBAL float2* cos_sin, KCAP_GLOBAL float* absorbed, KCAP_SHARED float* qs) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    const int slot = int(t.group_x);  // token * n_head + head
    const int token = slot / p.n_head, head = slot % p.n_head;
    const KCAP_GLOBAL float* qh = q + kcap_u64(slot) * kcap_u64(p.nope + p.rope);
    for (int i = int(t.index); i < p.nope; i += int(t.threads)) qs[i] = qh[i];
    kcap_barrier();
    KCAP_GLOBAL float* out = absorbed + kcap_u64(slot) * kcap_u64(p.width);
    float w[32];
    if (!p.combined) {
        // Latent value c: row head * lora + c of W_k_b (nope values) . q_nope.
        for (int c = int(t.index); c < p.lora; c += int(t.threads)) {
            const KCAP_GLOBAL kcap_u8* row = kb + kcap_u64(head * p.lora + c) * kcap_u64(p.kb_row_bytes);
            float acc = 0.0f;
            for (int run = 0; run < p.nope / 32; ++run) {
                F::decode32(row + unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes), run % kRunsPerBlock, w);
                for (int i = 0; i < 32; ++i) acc += w[i] * qs[run * 32 + i];
            }
            out[c] = acc;
        }
    } else {
        // W_kv_b's K rows of the head (nope rows of lora values), each times its q_nope value:
        // a thread takes one 32-value run of the latent.
        for (int run = int(t.index); run < p.lora / 32; run += int(t.threads)) {
            float acc[32];
            for (int j = 0; j < 32; ++j) acc[j] = 0.0f;
            for (int i = 0; i < p.nope; ++i) {
                const KCAP_GLOBAL kcap_u8* row = kb + kcap_u64(head * (p.nope + p.dv) + i) * kcap_u64(p.kb_row_bytes);
                F::decode32(row + unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes), run % kRunsPerBlock, w);
                for (int j = 0; j < 32; ++j) acc[j] += qs[i] * w[j];
            }
            for (int j = 0; j < 32; ++j) out[run * 32 + j] = acc[j];
        }
    }
    const int pos = step[0] + token, half = p.rope / 2;
    for (int i = int(t.index); i < half; i += int(t.threads)) {
        const float2 cs = cos_sin[kcap_u64(pos) * kcap_u64(half) + kcap_u64(i)];
        const float x0 = qh[p.nope + 2 * i], x1 = qh[p.nope + 2 * i + 1];
        out[p.lora + 2 * i] = x0 * cs.x - x1 * cs.y;
        out[p.lora + 2 * i + 1] = x0 * cs.y + x1 * cs.x;
    }
}

// shared: KCAP_MLA_ATTEND_SHARED_FLOATS. Scores q . row * scale over the rows 0 .. the query's
// position, softmax, the weighted sum of the rows' latents into latent_out [slot][lora].
KCAP_FN void kcap_mla_attend(const KcapThread t, const KcapMlaParams p, const KCAP_GLOBAL kcap_i32* step,
                             const KCAP_GLOBAL float* absorbed, const KCAP_GLOBAL kcap_u8* cache,
                             KCAP_GLOBAL float* latent_out, KCAP_SHARED float* shared) {
    const int slot = int(t.group_x);
    const int pos = step[0] + slot / p.n_head;
    KCAP_SHARED float* qs = shared;
    KCAP_SHARED float* acc_all = shared + KCAP_MLA_MAX_WIDTH;
    KCAP_SHARED float* ml = acc_all + KCAP_MLA_MAX_SIMDS * KCAP_MLA_MAX_LORA;
    const KCAP_GLOBAL float* q = absorbed + kcap_u64(slot) * kcap_u64(p.width);
    for (int d = int(t.index); d < p.width; d += int(t.threads)) qs[d] = q[d];
    kcap_barrier();
    float m = KCAP_NEG_INFINITY, l = 0.0f;
    float acc[KCAP_MLA_LATENT_PER_LANE];
    KCAP_UNROLL for (int i = 0; i < KCAP_MLA_LATENT_PER_LANE; ++i) acc[i] = 0.0f;
    const int runs = p.lora / 32;
    for (int j = int(t.simd); j <= pos; j += int(t.simds)) {
        const kcap_u64 row = kcap_u64(j) * kcap_u64(p.width);
        float dot = 0.0f;
        for (int d = int(t.lane); d < p.width; d += KCAP_SIMD_WIDTH) dot += qs[d] * kcap_kv_load(cache, row + kcap_u64(d), p.kv_f16);
        const float s = kcap_simd_sum(dot) * p.scale;
        const float m_new = kcap_fmax(m, s);
        const float correction = kcap_exp(m - m_new), weight = kcap_exp(s - m_new);
        l = l * correction + weight;
        KCAP_UNROLL for (int i = 0; i < KCAP_MLA_LATENT_PER_LANE; ++i)
            if (i < runs) acc[i] = acc[i] * correction + weight * kcap_kv_load(cache, row + kcap_u64(i * 32 + int(t.lane)), p.kv_f16);
        m = m_new;
    }
    KCAP_UNROLL for (int i = 0; i < KCAP_MLA_LATENT_PER_LANE; ++i)
        if (i < runs) acc_all[int(t.simd) * KCAP_MLA_MAX_LORA + i * 32 + int(t.lane)] = acc[i];
    if (t.lane == 0) {
        ml[2 * int(t.simd)] = m;
        ml[2 * int(t.simd) + 1] = l;
    }
    kcap_barrier();
    float top = KCAP_NEG_INFINITY;
    for (int s = 0; s < int(t.simds); ++s) top = kcap_fmax(top, ml[2 * s]);
    float total = 0.0f;
    for (int s = 0; s < int(t.simds); ++s)
        if (ml[2 * s + 1] > 0.0f) total += ml[2 * s + 1] * kcap_exp(ml[2 * s] - top);
    KCAP_GLOBAL float* out = latent_out + kcap_u64(slot) * kcap_u64(p.lora);
    for (int d = int(t.index); d < p.lora; d += int(t.threads)) {
        float o = 0.0f;
        for (int s = 0; s < int(t.simds); ++s)
            if (ml[2 * s + 1] > 0.0f) o += acc_all[s * KCAP_MLA_MAX_LORA + d] * kcap_exp(ml[2 * s] - top);
        out[d] = o / total;
    }
}

// shared: lora floats (the head's weighted latent). vb: W_v_b (or W_kv_b, combined) in format F.
template <class F>
KCAP_FN void kcap_mla_v_up(const KcapThread t, const KcapMlaParams p, const KCAP_GLOBAL float* latent,
                           const KCAP_GLOBAL kcap_u8* vb, KCAP_GLOBAL float* out, KCAP_SHARED float* ls) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    const int slot = int(t.group_x), head = slot % p.n_head;
    for (int i = int(t.index); i < p.lora; i += int(t.threads)) ls[i] = latent[kcap_u64(slot) * kcap_u64(p.lora) + kcap_u64(i)];
    kcap_barrier();
    const int first = p.combined ? head * (p.nope + p.dv) + p.nope : head * p.dv;
    float w[32];
    for (int j = int(t.index); j < p.dv; j += int(t.threads)) {
        const KCAP_GLOBAL kcap_u8* row = vb + kcap_u64(first + j) * kcap_u64(p.vb_row_bytes);
        float acc = 0.0f;
        for (int run = 0; run < p.lora / 32; ++run) {
            F::decode32(row + unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes), run % kRunsPerBlock, w);
            for (int i = 0; i < 32; ++i) acc += w[i] * ls[run * 32 + i];
        }
        out[kcap_u64(slot) * kcap_u64(p.dv) + kcap_u64(j)] = acc;
    }
}
