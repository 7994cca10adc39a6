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

// y[r] = W[first + r] . x for the group's rows r: row0 + [0, KCAP_MLA_ROWS_PER_GROUP(k)), those
// under n_rows. W rows of k values (k a multiple of 32) in format F, row_bytes each; x staged by
// kcap_mla_stage_runs. A simd group takes KCAP_MLA_ROWS_PER_SIMD(k) rows: each row's lanes (an
// aligned segment of k / 32 lanes, or all 32 when a row is longer than 32 runs or its runs are
// not a power of two) take its runs in turn and meet by shuffles.
template <class F>
KCAP_FN void kcap_mla_rows(const KcapThread t, const KCAP_GLOBAL kcap_u8* w, kcap_u64 row_bytes, int first, int n_rows,
                           int k, int row0, const KCAP_SHARED float* xs, KCAP_GLOBAL float* y) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    const int runs = k / 32, per_simd = KCAP_MLA_ROWS_PER_SIMD(k);
    const int lanes = per_simd == 1 ? KCAP_SIMD_WIDTH : runs;
    const int r = row0 + int(t.simd) * per_simd + int(t.lane) / lanes, own = int(t.lane) % lanes;
    float acc = 0.0f;
    if (r < n_rows) {
        const KCAP_GLOBAL kcap_u8* row = w + kcap_u64(first + r) * row_bytes;
        float wv[32];
        for (int run = own; run < runs; run += lanes) {
            F::decode32(row + unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes), run % kRunsPerBlock, wv);
            const KCAP_SHARED float* xr = xs + run * KCAP_MLA_RUN_STRIDE;
            KCAP_UNROLL for (int i = 0; i < 32; ++i) acc += wv[i] * xr[i];
        }
    }
    for (int offset = lanes / 2; offset > 0; offset /= 2) acc += kcap_simd_shuffle_xor(acc, offset);
    if (own == 0 && r < n_rows) y[r] = acc;
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

// The groups along y of the absorb, combine and V up launches (host and device).
#define KCAP_MLA_ABSORB_BLOCKS(p) \
    ((p).combined ? 1 : ((p).lora + KCAP_MLA_ROWS_PER_GROUP((p).nope) - 1) / KCAP_MLA_ROWS_PER_GROUP((p).nope))
#define KCAP_MLA_COMBINE_BLOCKS(p) (((p).lora + KCAP_MLA_COMBINE_COLS - 1) / KCAP_MLA_COMBINE_COLS)
#define KCAP_MLA_V_UP_BLOCKS(p) (((p).dv + KCAP_MLA_ROWS_PER_GROUP((p).lora) - 1) / KCAP_MLA_ROWS_PER_GROUP((p).lora))
