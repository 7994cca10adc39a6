// Multi-head latent attention bodies (CUDA entries in cuda/attention.cu; the CPU row in
// cpp/cpu/attention.cpp is the reference). One call of n_tokens tokens at positions step[0] ..:
//   kcap_mla_append   one group per token: the RMS norm of its latent (times the norm weight) and
//                     the rotation of its rope key (adjacent pairs, the rope table's angle for the
//                     position), written as the cache row of its position (f32 or f16).
//   kcap_mla_absorb   grid x = (token, head), y = blocks of KCAP_MLA_ROWS_PER_GROUP(nope) latent
//                     values: the absorbed query [W_kb[h]^T q_nope, rotated q_rope] (width
//                     values), W_kb[h] q_nope by kcap_mla_rows; the combined W_kv_b in one block.
//   kcap_mla_attend   one group per (token, group of heads, split of the keys): the absorbed
//                     queries against the cache rows of the split's share of the causal span, each
//                     row loaded once for the group's heads, an online softmax per head: partial
//                     weighted latents with their max and sum.
//   kcap_mla_combine  grid x = (token, head), y = blocks of KCAP_MLA_COMBINE_COLS latent values:
//                     the splits merged into the head's weighted latent.
//   kcap_mla_v_up     grid x = (token, head), y = blocks of KCAP_MLA_ROWS_PER_GROUP(lora) outputs:
//                     W_vb[h] times the weighted latent, the head's output (dv values).
// Every group has KCAP_MLA_THREADS threads. Legal dims (the row checks them): lora and nope
// multiples of 32, lora <= KCAP_MLA_MAX_LORA, width and nope <= KCAP_MLA_MAX_WIDTH.
#pragma once

#include "kernels/attention.h"
#include "kernels/params.h"
#include "kernels/quant.h"  // the decoders of W_k_b and W_v_b

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
    const int pairs = p.rope / 2;
    for (int i = int(t.index); i < pairs; i += int(t.threads)) {
        const float2 cs = cos_sin[kcap_u64(pos) * kcap_u64(pairs) + kcap_u64(i)];
        const float x0 = src[p.lora + 2 * i], x1 = src[p.lora + 2 * i + 1];
        kcap_kv_store(cache, row + kcap_u64(p.lora + 2 * i), x0 * cs.x - x1 * cs.y, p.kv_f16);
        kcap_kv_store(cache, row + kcap_u64(p.lora + 2 * i + 1), x0 * cs.y + x1 * cs.x, p.kv_f16);
    }
}

// Stages n values of x into threadgroup memory in runs of KCAP_MLA_RUN_STRIDE floats.
KCAP_FN void kcap_mla_stage_runs(const KcapThread t, const KCAP_GLOBAL float* x, int n, KCAP_SHARED float* xs) {
    for (int i = int(t.index); i < n; i += int(t.threads)) xs[(i / 32) * KCAP_MLA_RUN_STRIDE + i % 32] = x[i];
}

// y_j[r] = W[first + r] . x_j for the group's rows r: row0 + [0, KCAP_MLA_ROWS_PER_GROUP(k)), those
// under n_rows, and the vectors j < n of T (y_j at y + j * y_stride). W rows of k values (k a
// multiple of 32) in format F, row_bytes each; the x_j staged by kcap_mla_stage_runs (one) or
// kcap_mla_stage_tokens (x_j's runs at xs + j * (k / 32) * KCAP_MLA_RUN_STRIDE). A simd group
// takes KCAP_MLA_ROWS_PER_SIMD(k) rows: each row's lanes (an aligned segment of k / 32 lanes, or
// all 32 when a row is longer than 32 runs or its runs are not a power of two) take its runs in
// turn and meet by shuffles. Each decoded weight run is used for all T vectors.
template <class F, int T>
KCAP_FN void kcap_mla_rows_tokens(const KcapThread t, const KCAP_GLOBAL kcap_u8* w, kcap_u64 row_bytes, int first,
                                  int n_rows, int k, int row0, const KCAP_SHARED float* xs, int n, KCAP_GLOBAL float* y,
                                  kcap_u64 y_stride) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    const int runs = k / 32, per_simd = KCAP_MLA_ROWS_PER_SIMD(k);
    const int lanes = per_simd == 1 ? KCAP_SIMD_WIDTH : runs;
    const int x_stride = runs * KCAP_MLA_RUN_STRIDE;
    const int r = row0 + int(t.simd) * per_simd + int(t.lane) / lanes, own = int(t.lane) % lanes;
    float acc[T];
    KCAP_UNROLL for (int j = 0; j < T; ++j) acc[j] = 0.0f;
    if (r < n_rows) {
        const KCAP_GLOBAL kcap_u8* row = w + kcap_u64(first + r) * row_bytes;
        float wv[32];
        for (int run = own; run < runs; run += lanes) {
            F::decode32(row + unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes), run % kRunsPerBlock, wv);
            const KCAP_SHARED float* xr = xs + run * KCAP_MLA_RUN_STRIDE;
            KCAP_UNROLL for (int j = 0; j < T; ++j) KCAP_UNROLL for (int i = 0; i < 32; ++i) acc[j] +=
                wv[i] * xr[j * x_stride + i];
        }
    }
    for (int offset = lanes / 2; offset > 0; offset /= 2)
        KCAP_UNROLL for (int j = 0; j < T; ++j) acc[j] += kcap_simd_shuffle_xor(acc[j], offset);
    if (own == 0 && r < n_rows)
        KCAP_UNROLL for (int j = 0; j < T; ++j) if (j < n) y[kcap_u64(j) * y_stride + kcap_u64(r)] = acc[j];
}

// One vector: y[r] = W[first + r] . x (the per-slot forms).
template <class F>
KCAP_FN void kcap_mla_rows(const KcapThread t, const KCAP_GLOBAL kcap_u8* w, kcap_u64 row_bytes, int first, int n_rows,
                           int k, int row0, const KCAP_SHARED float* xs, KCAP_GLOBAL float* y) {
    kcap_mla_rows_tokens<F, 1>(t, w, row_bytes, first, n_rows, k, row0, xs, 1, y, 0);
}

// shared: KCAP_MLA_ROWS_SHARED_FLOATS. kb: W_k_b (or W_kv_b, combined) in format F.
template <class F>
KCAP_FN void kcap_mla_absorb(const KcapThread t, const KcapMlaParams p, const KCAP_GLOBAL kcap_i32* step,
                             const KCAP_GLOBAL float* q, const KCAP_GLOBAL kcap_u8* kb,
                             const KCAP_GLOBAL float2* cos_sin, KCAP_GLOBAL float* absorbed, KCAP_SHARED float* qs) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    const int slot = int(t.group_x);  // token * n_head + head
    const int token = slot / p.n_head, head = slot % p.n_head;
    const KCAP_GLOBAL float* qh = q + kcap_u64(slot) * kcap_u64(p.nope + p.rope);
    KCAP_GLOBAL float* out = absorbed + kcap_u64(slot) * kcap_u64(p.width);
    kcap_mla_stage_runs(t, qh, p.nope, qs);
    kcap_barrier();
    if (!p.combined) {
        // Latent value c: row head * lora + c of W_k_b (nope values) . q_nope.
        kcap_mla_rows<F>(t, kb, p.kb_row_bytes, head * p.lora, p.lora, p.nope,
                         int(t.group_y) * KCAP_MLA_ROWS_PER_GROUP(p.nope), qs, out);
    } else {
        // W_kv_b's K rows of the head (nope rows of lora values), each times its q_nope value:
        // a thread takes one 32-value run of the latent.
        float w[32];
        for (int run = int(t.index); run < p.lora / 32; run += int(t.threads)) {
            float acc[32];
            for (int j = 0; j < 32; ++j) acc[j] = 0.0f;
            for (int i = 0; i < p.nope; ++i) {
                const KCAP_GLOBAL kcap_u8* row = kb + kcap_u64(head * (p.nope + p.dv) + i) * kcap_u64(p.kb_row_bytes);
                F::decode32(row + unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes), run % kRunsPerBlock, w);
                const float qi = qs[(i / 32) * KCAP_MLA_RUN_STRIDE + i % 32];
                for (int j = 0; j < 32; ++j) acc[j] += qi * w[j];
            }
            for (int j = 0; j < 32; ++j) out[run * 32 + j] = acc[j];
        }
    }
    if (t.group_y != 0) return;
    const int pos = step[0] + token, pairs = p.rope / 2;
    for (int i = int(t.index); i < pairs; i += int(t.threads)) {
        const float2 cs = cos_sin[kcap_u64(pos) * kcap_u64(pairs) + kcap_u64(i)];
        const float x0 = qh[p.nope + 2 * i], x1 = qh[p.nope + 2 * i + 1];
        out[p.lora + 2 * i] = x0 * cs.x - x1 * cs.y;
        out[p.lora + 2 * i + 1] = x0 * cs.y + x1 * cs.x;
    }
}

// The splits a token at the end of a span of `span` rows uses: those of at least
// KCAP_MLA_MIN_CHUNK rows each, at most n_splits (the launch's), so a short span's decode does not
// pay for the splits of the longest.
KCAP_FN int kcap_mla_active_splits(int span, int n_splits) {
    const int by_span = (span + KCAP_MLA_MIN_CHUNK - 1) / KCAP_MLA_MIN_CHUNK;
    return by_span < n_splits ? by_span : n_splits;
}

// The values lane `lane` holds of cache row `row` (element offset): the latent's runs
// (KCAP_MLA_LATENT_PER_LANE slots, element i * 32 + lane), then the rope key's
// (KCAP_MLA_ROPE_PER_LANE slots, element lora + r * 32 + lane); 0 in slots past the row. The
// loads are issued together (no branch between them) so their latencies overlap.
#define KCAP_MLA_ROW_PER_LANE (KCAP_MLA_LATENT_PER_LANE + KCAP_MLA_ROPE_PER_LANE)
KCAP_FN int kcap_mla_slot_element(const KcapMlaParams p, int slot, int lane) {
    return slot < KCAP_MLA_LATENT_PER_LANE ? slot * 32 + lane : p.lora + (slot - KCAP_MLA_LATENT_PER_LANE) * 32 + lane;
}
KCAP_FN bool kcap_mla_slot_valid(const KcapMlaParams p, int slot, int lane) {
    return slot < KCAP_MLA_LATENT_PER_LANE ? slot * 32 < p.lora : kcap_mla_slot_element(p, slot, lane) < p.width;
}
KCAP_FN void kcap_mla_load_row(const KcapMlaParams p, const KCAP_GLOBAL kcap_u8* cache, kcap_u64 row, int lane,
                               KCAP_PRIVATE float (&v)[KCAP_MLA_ROW_PER_LANE]) {
    if (p.kv_f16) {
        const KCAP_GLOBAL kcap_u16* c = reinterpret_cast<const KCAP_GLOBAL kcap_u16*>(cache) + row;
        KCAP_UNROLL for (int i = 0; i < KCAP_MLA_ROW_PER_LANE; ++i) {
            const bool valid = kcap_mla_slot_valid(p, i, lane);
            const float x = kcap_half_to_float(c[valid ? kcap_mla_slot_element(p, i, lane) : lane]);
            v[i] = valid ? x : 0.0f;
        }
    } else {
        const KCAP_GLOBAL float* c = reinterpret_cast<const KCAP_GLOBAL float*>(cache) + row;
        KCAP_UNROLL for (int i = 0; i < KCAP_MLA_ROW_PER_LANE; ++i) {
            const bool valid = kcap_mla_slot_valid(p, i, lane);
            const float x = c[valid ? kcap_mla_slot_element(p, i, lane) : lane];
            v[i] = valid ? x : 0.0f;
        }
    }
}

// Grid: x = tokens x head groups (KCAP_MLA_HEADS_PER_GROUP query heads each), y = key splits.
// shared: KCAP_MLA_ATTEND_SHARED_FLOATS. The group's heads score the cache rows of its split of
// the causal span (rows 0 .. the token's position, in kcap_mla_active_splits equal ranges; the
// launch's other splits return at once): each simd group takes every simds-th row, loads it once
// for all the group's heads (the next two rows' loads issued before this row's sums, so a
// row's latency hides behind the previous ones' work), and keeps an online softmax per head
// (max, sum, the weighted latent in registers); the simd groups are merged at the end into one partial per
// (token, head, split): the unnormalized weighted latent, its max and sum (partial_o
// [slot][split][lora], partial_ml [slot][split][2], slot = token * n_head + head). A split with
// no rows writes a zero sum. kcap_mla_combine merges the splits.
KCAP_FN void kcap_mla_attend(const KcapThread t, const KcapMlaParams p, const KCAP_GLOBAL kcap_i32* step,
                             const KCAP_GLOBAL float* absorbed, const KCAP_GLOBAL kcap_u8* cache, int n_splits,
                             KCAP_GLOBAL float* partial_o, KCAP_GLOBAL float* partial_ml, KCAP_SHARED float* shared) {
    constexpr int kHeads = KCAP_MLA_HEADS_PER_GROUP;
    const int groups = (p.n_head + kHeads - 1) / kHeads;
    const int token = int(t.group_x) / groups, head0 = (int(t.group_x) % groups) * kHeads;
    const int heads = p.n_head - head0 < kHeads ? p.n_head - head0 : kHeads;
    const int split = int(t.group_y);
    const int span = step[0] + token + 1;
    const int active = kcap_mla_active_splits(span, n_splits);
    if (split >= active) return;  // the whole group: this position needs fewer splits
    const int chunk = (span + active - 1) / active;
    const int start = split * chunk, end = start + chunk < span ? start + chunk : span;
    KCAP_SHARED float* qs = shared;                                            // [kHeads][KCAP_MLA_MAX_WIDTH]
    KCAP_SHARED float* merge = shared + kHeads * KCAP_MLA_MAX_WIDTH;           // [simds][lora]
    KCAP_SHARED float* merge_ml = merge + KCAP_MLA_MAX_SIMDS * KCAP_MLA_MAX_LORA;  // [simds][2]
    // The queries, 0 past each head's width and for heads past the last: every slot's product
    // below is then finite (a cache slot past the row holds 0, and 0 x NaN would be NaN).
    // (A fixed count per thread, unrolled: the loads go out together, not one latency each.)
    constexpr int kQueryFloats = kHeads * KCAP_MLA_MAX_WIDTH;
    KCAP_UNROLL for (int r = 0; r < (kQueryFloats + KCAP_MLA_THREADS - 1) / KCAP_MLA_THREADS; ++r) {
        const int i = int(t.index) + r * KCAP_MLA_THREADS;
        const int g = i / KCAP_MLA_MAX_WIDTH, e = i % KCAP_MLA_MAX_WIDTH;
        const bool valid = i < kQueryFloats && g < heads && e < p.width;
        const float v = absorbed[valid ? kcap_u64(token * p.n_head + head0 + g) * kcap_u64(p.width) + kcap_u64(e) : 0];
        if (i < kQueryFloats) qs[i] = valid ? v : 0.0f;
    }
    kcap_barrier();
    const int runs = p.lora / 32;
    const int lane = int(t.lane);
    float m[kHeads], l[kHeads], acc[kHeads][KCAP_MLA_LATENT_PER_LANE];
    KCAP_UNROLL for (int g = 0; g < kHeads; ++g) {
        m[g] = KCAP_NEG_INFINITY;
        l[g] = 0.0f;
        KCAP_UNROLL for (int i = 0; i < KCAP_MLA_LATENT_PER_LANE; ++i) acc[g][i] = 0.0f;
    }
    // Rows j, j + simds and j + 2 simds in flight: cur is summed while the next two load.
    float cur[KCAP_MLA_ROW_PER_LANE], next[KCAP_MLA_ROW_PER_LANE];
    const int step_rows = int(t.simds);
    int j = start + int(t.simd);
    if (j < end) kcap_mla_load_row(p, cache, kcap_u64(j) * kcap_u64(p.width), lane, cur);
    if (j + step_rows < end) kcap_mla_load_row(p, cache, kcap_u64(j + step_rows) * kcap_u64(p.width), lane, next);
    for (; j < end; j += step_rows) {
        float after[KCAP_MLA_ROW_PER_LANE];
        const int ja = j + 2 * step_rows;
        if (ja < end) kcap_mla_load_row(p, cache, kcap_u64(ja) * kcap_u64(p.width), lane, after);
        float dot[kHeads];
        KCAP_UNROLL for (int g = 0; g < kHeads; ++g) {
            dot[g] = 0.0f;
            KCAP_UNROLL for (int i = 0; i < KCAP_MLA_ROW_PER_LANE; ++i)
                dot[g] += qs[g * KCAP_MLA_MAX_WIDTH + kcap_mla_slot_element(p, i, lane)] * cur[i];
        }
        KCAP_UNROLL for (int g = 0; g < kHeads; ++g) {
            const float s = kcap_simd_sum(dot[g]) * p.scale;
            const float m_new = kcap_fmax(m[g], s);
            const float correction = kcap_exp(m[g] - m_new), weight = kcap_exp(s - m_new);
            l[g] = l[g] * correction + weight;
            KCAP_UNROLL for (int i = 0; i < KCAP_MLA_LATENT_PER_LANE; ++i)
                acc[g][i] = acc[g][i] * correction + weight * cur[i];
            m[g] = m_new;
        }
        KCAP_UNROLL for (int i = 0; i < KCAP_MLA_ROW_PER_LANE; ++i) {
            cur[i] = next[i];
            next[i] = after[i];
        }
    }
    // Merge the simd groups, one head at a time (unrolled: the heads' registers are indexed by
    // constants, never spilled to local memory; every thread reaches every barrier).
    KCAP_UNROLL for (int g = 0; g < kHeads; ++g) {
        if (g < heads) {
            KCAP_UNROLL for (int i = 0; i < KCAP_MLA_LATENT_PER_LANE; ++i)
                if (i < runs) merge[int(t.simd) * KCAP_MLA_MAX_LORA + i * 32 + int(t.lane)] = acc[g][i];
            if (t.lane == 0) {
                merge_ml[2 * int(t.simd)] = m[g];
                merge_ml[2 * int(t.simd) + 1] = l[g];
            }
        }
        kcap_barrier();
        if (g < heads) {
            float top = KCAP_NEG_INFINITY;
            for (int s = 0; s < int(t.simds); ++s)
                if (merge_ml[2 * s + 1] > 0.0f) top = kcap_fmax(top, merge_ml[2 * s]);
            const kcap_u64 at = kcap_u64(token * p.n_head + head0 + g) * kcap_u64(n_splits) + kcap_u64(split);
            for (int d = int(t.index); d < p.lora; d += int(t.threads)) {
                float o = 0.0f;
                for (int s = 0; s < int(t.simds); ++s)
                    if (merge_ml[2 * s + 1] > 0.0f) o += merge[s * KCAP_MLA_MAX_LORA + d] * kcap_exp(merge_ml[2 * s] - top);
                partial_o[at * kcap_u64(p.lora) + kcap_u64(d)] = o;
            }
            if (t.index == 0) {
                float total = 0.0f;
                for (int s = 0; s < int(t.simds); ++s)
                    if (merge_ml[2 * s + 1] > 0.0f) total += merge_ml[2 * s + 1] * kcap_exp(merge_ml[2 * s] - top);
                partial_ml[2 * at] = top;
                partial_ml[2 * at + 1] = total;
            }
        }
        kcap_barrier();  // the merge buffer is free for the next head
    }
}

// Grid: x = tokens x heads, y = blocks of KCAP_MLA_COMBINE_COLS latent values. The head's
// weighted latent: its splits' partials merged, normalized by the merged sum, into latent_out
// [slot][lora]. The group first weighs the used splits (exp(max_s - max), in threadgroup
// memory), then its threads take KCAP_MLA_COMBINE_COLS columns in KCAP_MLA_THREADS /
// KCAP_MLA_COMBINE_COLS phases of the splits, summed at the end. shared:
// KCAP_MLA_COMBINE_SHARED_FLOATS.
KCAP_FN void kcap_mla_combine(const KcapThread t, const KcapMlaParams p, const KCAP_GLOBAL kcap_i32* step, int n_splits,
                              const KCAP_GLOBAL float* partial_o, const KCAP_GLOBAL float* partial_ml,
                              KCAP_GLOBAL float* latent_out, KCAP_SHARED float* shared) {
    KCAP_SHARED float* weight = shared;                     // [KCAP_MLA_MAX_SPLITS]
    KCAP_SHARED float* spare = shared + KCAP_MLA_MAX_SPLITS;  // [threads]
    const kcap_u64 slot = kcap_u64(t.group_x);
    const KCAP_GLOBAL float* ml = partial_ml + slot * kcap_u64(2 * n_splits);
    const int used = kcap_mla_active_splits(step[0] + int(t.group_x) / p.n_head + 1, n_splits);
    float top = KCAP_NEG_INFINITY;
    for (int s = int(t.index); s < used; s += int(t.threads))
        if (ml[2 * s + 1] > 0.0f) top = kcap_fmax(top, ml[2 * s]);
    top = kcap_simd_max(top);
    if (t.lane == 0) spare[t.simd] = top;
    kcap_barrier();
    top = KCAP_NEG_INFINITY;
    for (int s = 0; s < int(t.simds); ++s) top = kcap_fmax(top, spare[s]);
    kcap_barrier();
    float total = 0.0f;
    for (int s = int(t.index); s < used; s += int(t.threads)) {
        const float w = ml[2 * s + 1] > 0.0f ? kcap_exp(ml[2 * s] - top) : 0.0f;
        weight[s] = w;
        if (w > 0.0f) total += w * ml[2 * s + 1];
    }
    total = kcap_simd_sum(total);
    if (t.lane == 0) spare[t.simd] = total;
    kcap_barrier();
    total = 0.0f;
    for (int s = 0; s < int(t.simds); ++s) total += spare[s];
    kcap_barrier();
    const int phases = int(t.threads) / KCAP_MLA_COMBINE_COLS, phase = int(t.index) / KCAP_MLA_COMBINE_COLS;
    const int col = int(t.group_y) * KCAP_MLA_COMBINE_COLS + int(t.index) % KCAP_MLA_COMBINE_COLS;
    float o = 0.0f;
    if (col < p.lora)
        for (int s = phase; s < used; s += phases)
            if (weight[s] > 0.0f)
                o += partial_o[(slot * kcap_u64(n_splits) + kcap_u64(s)) * kcap_u64(p.lora) + kcap_u64(col)] * weight[s];
    spare[t.index] = o;
    kcap_barrier();
    if (phase != 0 || col >= p.lora) return;
    for (int f = 1; f < phases; ++f) o += spare[f * KCAP_MLA_COMBINE_COLS + int(t.index)];
    latent_out[slot * kcap_u64(p.lora) + kcap_u64(col)] = o / total;
}

// Grid: x = tokens x heads, y = blocks of KCAP_MLA_ROWS_PER_GROUP(lora) outputs. shared:
// KCAP_MLA_ROWS_SHARED_FLOATS (the head's weighted latent). vb: W_v_b (or W_kv_b, combined) in
// format F.
template <class F>
KCAP_FN void kcap_mla_v_up(const KcapThread t, const KcapMlaParams p, const KCAP_GLOBAL float* latent,
                           const KCAP_GLOBAL kcap_u8* vb, KCAP_GLOBAL float* out, KCAP_SHARED float* ls) {
    const int slot = int(t.group_x), head = slot % p.n_head;
    kcap_mla_stage_runs(t, latent + kcap_u64(slot) * kcap_u64(p.lora), p.lora, ls);
    kcap_barrier();
    const int first = p.combined ? head * (p.nope + p.dv) + p.nope : head * p.dv;
    kcap_mla_rows<F>(t, vb, p.vb_row_bytes, first, p.dv, p.lora, int(t.group_y) * KCAP_MLA_ROWS_PER_GROUP(p.lora), ls,
                     out + kcap_u64(slot) * kcap_u64(p.dv));
}

// A prefill chunk's forms (CUDA's cuda.attention_mla_tiled; the other backends run the per-slot
// bodies above for every token count).

// Stages k values of T tokens' vectors (token j's at x + j * x_stride; zeros for j >= n) in
// runs of KCAP_MLA_RUN_STRIDE floats, token j's at xs + j * (k / 32) * KCAP_MLA_RUN_STRIDE.
template <int T>
KCAP_FN void kcap_mla_stage_tokens(const KcapThread t, const KCAP_GLOBAL float* x, kcap_u64 x_stride, int n, int k,
                                   KCAP_SHARED float* xs) {
    const int per_token = k / 32 * KCAP_MLA_RUN_STRIDE;
    for (int i = int(t.index); i < T * k; i += int(t.threads)) {
        const int j = i / k, e = i % k;
        xs[j * per_token + (e / 32) * KCAP_MLA_RUN_STRIDE + e % 32] =
            j < n ? x[kcap_u64(j) * x_stride + kcap_u64(e)] : 0.0f;
    }
}

// kcap_mla_absorb for KCAP_MLA_TOKENS tokens of one head. Grid: x = token tiles x heads
// (group_x = tile * n_head + head), y = KCAP_MLA_ABSORB_BLOCKS(p). shared:
// KCAP_MLA_TOKENS_SHARED_FLOATS(KCAP_MLA_MAX_WIDTH).
template <class F>
KCAP_FN void kcap_mla_absorb_tokens(const KcapThread t, const KcapMlaParams p, const KCAP_GLOBAL kcap_i32* step,
                                    const KCAP_GLOBAL float* q, const KCAP_GLOBAL kcap_u8* kb,
                                    const KCAP_GLOBAL float2* cos_sin, KCAP_GLOBAL float* absorbed,
                                    KCAP_SHARED float* qs) {
    constexpr int T = KCAP_MLA_TOKENS;
    constexpr int kRunsPerBlock = F::block_elems / 32;
    const int tile = int(t.group_x) / p.n_head, head = int(t.group_x) % p.n_head;
    const int token0 = tile * T, n = p.n_tokens - token0 < T ? p.n_tokens - token0 : T;
    const kcap_u64 q_stride = kcap_u64(p.n_head) * kcap_u64(p.nope + p.rope);
    const kcap_u64 out_stride = kcap_u64(p.n_head) * kcap_u64(p.width);
    const KCAP_GLOBAL float* q0 =
        q + (kcap_u64(token0) * kcap_u64(p.n_head) + kcap_u64(head)) * kcap_u64(p.nope + p.rope);
    KCAP_GLOBAL float* out0 = absorbed + (kcap_u64(token0) * kcap_u64(p.n_head) + kcap_u64(head)) * kcap_u64(p.width);
    kcap_mla_stage_tokens<T>(t, q0, q_stride, n, p.nope, qs);
    kcap_barrier();
    if (!p.combined) {
        kcap_mla_rows_tokens<F, T>(t, kb, p.kb_row_bytes, head * p.lora, p.lora, p.nope,
                                   int(t.group_y) * KCAP_MLA_ROWS_PER_GROUP(p.nope), qs, n, out0, out_stride);
    } else {
        // W_kv_b's K rows of the head, transposed, one token at a time (as kcap_mla_absorb).
        const int per_token = p.nope / 32 * KCAP_MLA_RUN_STRIDE;
        float w[32];
        for (int item = int(t.index); item < n * (p.lora / 32); item += int(t.threads)) {
            const int j = item / (p.lora / 32), run = item % (p.lora / 32);
            float acc[32];
            for (int e = 0; e < 32; ++e) acc[e] = 0.0f;
            for (int i = 0; i < p.nope; ++i) {
                const KCAP_GLOBAL kcap_u8* row = kb + kcap_u64(head * (p.nope + p.dv) + i) * kcap_u64(p.kb_row_bytes);
                F::decode32(row + unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes), run % kRunsPerBlock, w);
                const float qi = qs[j * per_token + (i / 32) * KCAP_MLA_RUN_STRIDE + i % 32];
                for (int e = 0; e < 32; ++e) acc[e] += qi * w[e];
            }
            for (int e = 0; e < 32; ++e) out0[kcap_u64(j) * out_stride + kcap_u64(run * 32 + e)] = acc[e];
        }
    }
    if (t.group_y != 0) return;
    const int pairs = p.rope / 2;
    for (int i = int(t.index); i < n * pairs; i += int(t.threads)) {
        const int j = i / pairs, pair = i % pairs;
        const int pos = step[0] + token0 + j;
        const float2 cs = cos_sin[kcap_u64(pos) * kcap_u64(pairs) + kcap_u64(pair)];
        const KCAP_GLOBAL float* qr = q0 + kcap_u64(j) * q_stride + kcap_u64(p.nope);
        const float x0 = qr[2 * pair], x1 = qr[2 * pair + 1];
        KCAP_GLOBAL float* o = out0 + kcap_u64(j) * out_stride + kcap_u64(p.lora);
        o[2 * pair] = x0 * cs.x - x1 * cs.y;
        o[2 * pair + 1] = x0 * cs.y + x1 * cs.x;
    }
}

// kcap_mla_v_up for KCAP_MLA_TOKENS tokens of one head. Grid: x = token tiles x heads (as the
// absorb), y = KCAP_MLA_V_UP_BLOCKS(p). shared: KCAP_MLA_TOKENS_SHARED_FLOATS(KCAP_MLA_MAX_LORA).
template <class F>
KCAP_FN void kcap_mla_v_up_tokens(const KcapThread t, const KcapMlaParams p, const KCAP_GLOBAL float* latent,
                                  const KCAP_GLOBAL kcap_u8* vb, KCAP_GLOBAL float* out, KCAP_SHARED float* ls) {
    constexpr int T = KCAP_MLA_TOKENS;
    const int tile = int(t.group_x) / p.n_head, head = int(t.group_x) % p.n_head;
    const int token0 = tile * T, n = p.n_tokens - token0 < T ? p.n_tokens - token0 : T;
    const kcap_u64 slot0 = kcap_u64(token0) * kcap_u64(p.n_head) + kcap_u64(head);
    kcap_mla_stage_tokens<T>(t, latent + slot0 * kcap_u64(p.lora), kcap_u64(p.n_head) * kcap_u64(p.lora), n, p.lora,
                             ls);
    kcap_barrier();
    const int first = p.combined ? head * (p.nope + p.dv) + p.nope : head * p.dv;
    kcap_mla_rows_tokens<F, T>(t, vb, p.vb_row_bytes, first, p.dv, p.lora,
                               int(t.group_y) * KCAP_MLA_ROWS_PER_GROUP(p.lora), ls, n, out + slot0 * kcap_u64(p.dv),
                               kcap_u64(p.n_head) * kcap_u64(p.dv));
}

// A prefill chunk's attend, tiled: grid x = tiles of KCAP_MLA_TILE_ROWS consecutive rows
// (row = token * n_head + head, the absorb's slots), the tiles of the last tokens, which see
// the most keys, first; KCAP_MLA_THREADS threads; shared: KCAP_MLA_TILE_SHARED_FLOATS(p.width).
// The tile's absorbed queries are staged once; the causal span's cache rows are staged
// KCAP_MLA_TILE_KEYS at a time (zeros past the tile's last position), and every staged row
// serves all of the tile's rows. Per step:
//   scores   each thread a 4 x 4 block of (row, key) over a quarter of the width (rows rg + 8i,
//            keys kg + 8j: a simd group's float4 reads land on distinct banks), the quarters'
//            partial sums through threadgroup memory;
//   softmax  simd group w owns rows 4w .. 4w + 3, lane = key: the masked scores, the online
//            max and sum (f32, as kcap_mla_attend), the weights to threadgroup memory;
//   P V      the same simd group, lanes over the latent's values (4 per lane per 128), adds
//            the step's weighted rows to its rows' latents (64 values per thread).
// Writes each row's normalized weighted latent to latent_out [slot][lora] (no key splits, no
// combine). Legal dims as kcap_mla_attend's, and the width a multiple of 4.
KCAP_FN void kcap_mla_attend_tiled(const KcapThread t, const KcapMlaParams p, const KCAP_GLOBAL kcap_i32* step,
                                   const KCAP_GLOBAL float* absorbed, const KCAP_GLOBAL kcap_u8* cache,
                                   KCAP_GLOBAL float* latent_out, KCAP_SHARED float* shared) {
    constexpr int R = KCAP_MLA_TILE_ROWS, KT = KCAP_MLA_TILE_KEYS;
    const int ws = KCAP_MLA_TILE_STRIDE(p.width);
    KCAP_SHARED float* qs = shared;           // [R][ws]
    KCAP_SHARED float* cs = qs + R * ws;      // [KT][ws]
    KCAP_SHARED float* ss = cs + KT * ws;     // [4][R][KT]
    KCAP_SHARED float* ps = ss + 4 * R * KT;  // [KT][R]
    const int total = p.n_tokens * p.n_head;
    const int tiles = (total + R - 1) / R;
    const int row0 = (tiles - 1 - int(t.group_x)) * R;
    const int last_row = row0 + R < total ? row0 + R - 1 : total - 1;
    const int pos0 = step[0];
    const int pos_hi = pos0 + last_row / p.n_head;  // the last key any row of the tile sees
    const int f4 = p.width / 4;
    for (int i = int(t.index); i < R * f4; i += int(t.threads)) {
        const int r = i / f4, e = 4 * (i % f4);
        const int row = row0 + r;
        const float4 v = row < total ? kcap_load_f32x4(absorbed + kcap_u64(row) * kcap_u64(p.width) + kcap_u64(e))
                                     : float4{0.0f, 0.0f, 0.0f, 0.0f};
        *reinterpret_cast<KCAP_SHARED float4*>(qs + r * ws + e) = v;
    }
    // Score roles: a 4 x 4 block (rows rg + 8i, keys kg + 8j) over depth quarter dq.
    const int block = int(t.index) % 64, dq = int(t.index) / 64;
    const int rg = block / 8, kg = block % 8;
    const int per_quarter = (f4 + 3) / 4;
    const int f_begin = dq * per_quarter, f_end = f_begin + per_quarter < f4 ? f_begin + per_quarter : f4;
    // Softmax and P V roles: simd group w's rows 4w + r, their positions (-1: past the chunk).
    const int w = int(t.simd), lane = int(t.lane);
    int pos_r[4];
    float m[4], l[4];
    float4 o[4][4];
    KCAP_UNROLL for (int r = 0; r < 4; ++r) {
        const int row = row0 + 4 * w + r;
        pos_r[r] = row < total ? pos0 + row / p.n_head : -1;
        m[r] = KCAP_NEG_INFINITY;
        l[r] = 0.0f;
        KCAP_UNROLL for (int i = 0; i < 4; ++i) o[r][i] = float4{0.0f, 0.0f, 0.0f, 0.0f};
    }
    for (int kb = 0; kb <= pos_hi; kb += KT) {
        kcap_barrier();  // the previous step's reads of cs, ss and ps are done (and qs is staged)
        for (int i = int(t.index); i < KT * f4; i += int(t.threads)) {
            const int k = i / f4, e = 4 * (i % f4);
            const float4 v = kb + k <= pos_hi
                                 ? kcap_kv_load4(cache, kcap_u64(kb + k) * kcap_u64(p.width) + kcap_u64(e), p.kv_f16)
                                 : float4{0.0f, 0.0f, 0.0f, 0.0f};
            *reinterpret_cast<KCAP_SHARED float4*>(cs + k * ws + e) = v;
        }
        kcap_barrier();
        float acc[4][4];
        KCAP_UNROLL for (int i = 0; i < 4; ++i) KCAP_UNROLL for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
        for (int f = f_begin; f < f_end; ++f) {
            float4 qv[4], kv[4];
            KCAP_UNROLL for (int i = 0; i < 4; ++i) qv[i] =
                *reinterpret_cast<const KCAP_SHARED float4*>(qs + (rg + 8 * i) * ws + 4 * f);
            KCAP_UNROLL for (int j = 0; j < 4; ++j) kv[j] =
                *reinterpret_cast<const KCAP_SHARED float4*>(cs + (kg + 8 * j) * ws + 4 * f);
            KCAP_UNROLL for (int i = 0; i < 4; ++i) KCAP_UNROLL for (int j = 0; j < 4; ++j) acc[i][j] +=
                qv[i].x * kv[j].x + qv[i].y * kv[j].y + qv[i].z * kv[j].z + qv[i].w * kv[j].w;
        }
        KCAP_UNROLL for (int i = 0; i < 4; ++i) KCAP_UNROLL for (int j = 0; j < 4; ++j)
            ss[(dq * R + rg + 8 * i) * KT + kg + 8 * j] = acc[i][j];
        kcap_barrier();
        float corr[4];
        KCAP_UNROLL for (int r = 0; r < 4; ++r) {
            const int row = 4 * w + r;
            const bool seen = kb + lane <= pos_r[r];
            const float s = (ss[row * KT + lane] + ss[(R + row) * KT + lane] + ss[(2 * R + row) * KT + lane] +
                             ss[(3 * R + row) * KT + lane]) *
                            p.scale;
            const float m_new = kcap_fmax(m[r], kcap_simd_max(seen ? s : KCAP_NEG_INFINITY));
            // 1 while no key was seen (no -inf - -inf), 0 when the first ones are
            corr[r] = m_new == KCAP_NEG_INFINITY ? 1.0f : kcap_exp(m[r] - m_new);
            const float weight = seen ? kcap_exp(s - m_new) : 0.0f;
            l[r] = l[r] * corr[r] + kcap_simd_sum(weight);
            m[r] = m_new;
            ps[lane * R + row] = weight;
        }
        kcap_barrier();  // (the weights are the simd group's own; a group barrier keeps the dialect simple)
        KCAP_UNROLL for (int r = 0; r < 4; ++r) KCAP_UNROLL for (int i = 0; i < 4; ++i) {
            o[r][i].x *= corr[r], o[r][i].y *= corr[r], o[r][i].z *= corr[r], o[r][i].w *= corr[r];
        }
        const int keys = pos_hi - kb + 1 < KT ? pos_hi - kb + 1 : KT;
        for (int k = 0; k < keys; ++k) {
            const float4 pw = *reinterpret_cast<const KCAP_SHARED float4*>(ps + k * R + 4 * w);
            KCAP_UNROLL for (int i = 0; i < 4; ++i) {
                const int d = 4 * lane + 128 * i;
                if (d >= p.lora) continue;
                const float4 c = *reinterpret_cast<const KCAP_SHARED float4*>(cs + k * ws + d);
                o[0][i].x += pw.x * c.x, o[0][i].y += pw.x * c.y, o[0][i].z += pw.x * c.z, o[0][i].w += pw.x * c.w;
                o[1][i].x += pw.y * c.x, o[1][i].y += pw.y * c.y, o[1][i].z += pw.y * c.z, o[1][i].w += pw.y * c.w;
                o[2][i].x += pw.z * c.x, o[2][i].y += pw.z * c.y, o[2][i].z += pw.z * c.z, o[2][i].w += pw.z * c.w;
                o[3][i].x += pw.w * c.x, o[3][i].y += pw.w * c.y, o[3][i].z += pw.w * c.z, o[3][i].w += pw.w * c.w;
            }
        }
    }
    KCAP_UNROLL for (int r = 0; r < 4; ++r) {
        const int row = row0 + 4 * w + r;
        if (row >= total) continue;
        const float inv = 1.0f / l[r];
        KCAP_UNROLL for (int i = 0; i < 4; ++i) {
            const int d = 4 * lane + 128 * i;
            if (d < p.lora)
                kcap_store_f32x4(latent_out + kcap_u64(row) * kcap_u64(p.lora) + kcap_u64(d),
                                 float4{o[r][i].x * inv, o[r][i].y * inv, o[r][i].z * inv, o[r][i].w * inv});
        }
    }
}

// The groups along y of the absorb, combine and V up launches (host and device).
#define KCAP_MLA_ABSORB_BLOCKS(p) \
    ((p).combined ? 1 : ((p).lora + KCAP_MLA_ROWS_PER_GROUP((p).nope) - 1) / KCAP_MLA_ROWS_PER_GROUP((p).nope))
#define KCAP_MLA_COMBINE_BLOCKS(p) (((p).lora + KCAP_MLA_COMBINE_COLS - 1) / KCAP_MLA_COMBINE_COLS)
#define KCAP_MLA_V_UP_BLOCKS(p) (((p).dv + KCAP_MLA_ROWS_PER_GROUP((p).lora) - 1) / KCAP_MLA_ROWS_PER_GROUP((p).lora))
// A prefill chunk's: token tiles of the absorb and V up (times the heads), row tiles of the attend.
#define KCAP_MLA_TOKEN_TILES(p) (((p).n_tokens + KCAP_MLA_TOKENS - 1) / KCAP_MLA_TOKENS)
#define KCAP_MLA_ATTEND_TILES(p) (((p).n_tokens * (p).n_head + KCAP_MLA_TILE_ROWS - 1) / KCAP_MLA_TILE_ROWS)
