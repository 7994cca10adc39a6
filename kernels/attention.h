// Attention bodies: KV append, split-K decode (flash-decoding) with its combine, and batched
// prefill. Causal, optional sliding window, score softcap and attention sinks, any GQA ratio,
// f32 or f16 cache.
//
// Decode (kcap_attention_decode): lanes over head dims, several keys and query heads of one
// KV head per simd step, an online softmax per head. Prefill (kernels/attention_prefill.h):
// query rows and K/V tiles staged in threadgroup memory. kcap_attend_range, the per-token
// walk both once used (lanes over keys for the scores, over dims for the values), stays for
// bench/cuda_attention_prefill.cu, which times the tiled prefill against it.
//
// No span ceiling: decode splits the visible keys over n_splits groups (chosen at load time
// from the longest span the stage can see) whose partial (max, sum, output) meet in
// kcap_attention_combine; a single split writes its output directly. Positions come from
// device memory (step[0] = position of token 0).
#pragma once

#include "kernels/params.h"
#include "kernels/dialect.h"
#include "kernels/group.h"

#define KCAP_ATTN_VALUES_PER_LANE (KCAP_ATTN_MAX_HEAD_DIM / KCAP_SIMD_WIDTH)

KCAP_FN float kcap_kv_round(float v, int f16) { return f16 ? kcap_half_to_float(kcap_float_to_half(v)) : v; }

// Element e of a cache (f32 or f16).
KCAP_FN float kcap_kv_load(const KCAP_GLOBAL kcap_u8* cache, kcap_u64 e, int f16) {
    return f16 ? kcap_half_to_float(reinterpret_cast<const KCAP_GLOBAL kcap_u16*>(cache)[e])
               : reinterpret_cast<const KCAP_GLOBAL float*>(cache)[e];
}

// Elements e .. e+3 (e a multiple of 4).
KCAP_FN float4 kcap_kv_load4(const KCAP_GLOBAL kcap_u8* cache, kcap_u64 e, int f16) {
    if (!f16) return kcap_load_f32x4(reinterpret_cast<const KCAP_GLOBAL float*>(cache) + e);
    const kcap_u32 lo = kcap_load_u32(cache + 2 * e), hi = kcap_load_u32(cache + 2 * e + 4);
    float4 v;
    v.x = kcap_half_to_float(kcap_u16(lo & 0xffffu));
    v.y = kcap_half_to_float(kcap_u16(lo >> 16));
    v.z = kcap_half_to_float(kcap_u16(hi & 0xffffu));
    v.w = kcap_half_to_float(kcap_u16(hi >> 16));
    return v;
}

KCAP_FN void kcap_kv_store(KCAP_GLOBAL kcap_u8* cache, kcap_u64 e, float v, int f16) {
    if (f16)
        reinterpret_cast<KCAP_GLOBAL kcap_u16*>(cache)[e] = kcap_float_to_half(v);
    else
        reinterpret_cast<KCAP_GLOBAL float*>(cache)[e] = v;
}

// The softmax's denominator of query head `head` whose scores' max is m and sum of exp(score -
// m) is l: with attention sinks (a learned logit per head that joins the denominator and
// weighs no value; null: none) l + exp(sink - m). An overflow to inf gives outputs of 0, the
// limit of a sink far above every score.
KCAP_FN float kcap_attn_denominator(const KCAP_GLOBAL float* sinks, int head, float m, float l) {
    return sinks ? l + kcap_exp(sinks[head] - m) : l;
}

// Online softmax of one query head over keys [start, end) of KV head kv_head, folded into
// (m, l, o): m the running max score, l the running sum of exp(score - m), o the running sum
// of exp(score - m) * value, lane-strided over head dims (o[i] is dim lane + 32 i).
// Key fresh_pos (or none when < 0) is read from k_fresh/v_fresh (this token's new K/V of
// this head, rounded as the cache would store them) instead of the cache.
// Every lane of the simd group must call this with the same arguments.
KCAP_FN void kcap_attend_range(const KcapThread t, const KcapAttentionParams p, int kv_head, int start, int end,
                               int fresh_pos, const KCAP_SHARED float* q, const KCAP_GLOBAL kcap_u8* k_cache,
                               const KCAP_GLOBAL kcap_u8* v_cache, const KCAP_GLOBAL float* k_fresh,
                               const KCAP_GLOBAL float* v_fresh, KCAP_PRIVATE float* m_io, KCAP_PRIVATE float* l_io,
                               KCAP_PRIVATE float* o) {
    float m = *m_io, l = *l_io;
    const kcap_u64 k_head = kcap_u64(kv_head) * p.head_dim;
    const kcap_u64 v_head = kcap_u64(kv_head) * p.head_dim_v;
    for (int base = start; base < end; base += KCAP_SIMD_WIDTH) {
        const int j = base + int(t.lane);
        float s = KCAP_NEG_INFINITY;
        if (j < end) {
            float dot = 0.0f;
            if (j == fresh_pos) {
                for (int d = 0; d < p.head_dim; d += 4) {
                    const float4 k = kcap_load_f32x4(k_fresh + d);
                    dot += q[d] * kcap_kv_round(k.x, p.kv_f16) + q[d + 1] * kcap_kv_round(k.y, p.kv_f16) +
                           q[d + 2] * kcap_kv_round(k.z, p.kv_f16) + q[d + 3] * kcap_kv_round(k.w, p.kv_f16);
                }
            } else {
                const kcap_u64 row = kcap_u64(j) * p.k_width + k_head;
                for (int d = 0; d < p.head_dim; d += 4) {
                    const float4 k = kcap_kv_load4(k_cache, row + d, p.kv_f16);
                    dot += q[d] * k.x + q[d + 1] * k.y + q[d + 2] * k.z + q[d + 3] * k.w;
                }
            }
            s = dot * p.scale;
            if (p.softcap > 0.0f) s = p.softcap * kcap_tanh(s / p.softcap);
        }
        const float m_new = kcap_fmax(m, kcap_simd_max(s));
        const float correction = kcap_exp(m - m_new);  // 0 while m is still -inf
        const float weight = j < end ? kcap_exp(s - m_new) : 0.0f;
        l = l * correction + kcap_simd_sum(weight);
        KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_VALUES_PER_LANE; ++i) o[i] *= correction;
        const int count = end - base < KCAP_SIMD_WIDTH ? end - base : KCAP_SIMD_WIDTH;
        for (int jj = 0; jj < count; ++jj) {
            const float w = kcap_simd_broadcast(weight, jj);
            const int key = base + jj;
            if (key == fresh_pos) {
                KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_VALUES_PER_LANE; ++i) {
                    const int d = int(t.lane) + KCAP_SIMD_WIDTH * i;
                    if (d < p.head_dim_v) o[i] += w * kcap_kv_round(v_fresh[d], p.kv_f16);
                }
            } else {
                const kcap_u64 row = kcap_u64(key) * p.v_width + v_head;
                KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_VALUES_PER_LANE; ++i) {
                    const int d = int(t.lane) + KCAP_SIMD_WIDTH * i;
                    if (d < p.head_dim_v) o[i] += w * kcap_kv_load(v_cache, row + d, p.kv_f16);
                }
            }
        }
        m = m_new;
    }
    *m_io = m;
    *l_io = l;
}

// How decode divides the keys a query at `pos` sees among the launch's n_splits groups:
// chunks of at least min_chunk keys (a multiple of 32), so at short spans only the first
// `active` splits have keys; the rest return at once and the combine reads only the active
// ones (a graph captured at one position replays correctly at any other).
struct KcapDecodeSplits {
    int first;   // first visible key
    int chunk;   // keys per split
    int active;  // splits with keys
};

KCAP_FN KcapDecodeSplits kcap_decode_splits(const KcapAttentionParams p, int pos) {
    KcapDecodeSplits s;
    s.first = p.window > 0 && pos - p.window + 1 > 0 ? pos - p.window + 1 : 0;
    const int span = pos - s.first + 1;
    int chunk = (span + p.n_splits - 1) / p.n_splits;
    chunk = (chunk + 31) / 32 * 32;
    s.chunk = chunk < p.min_chunk ? p.min_chunk : chunk;
    s.active = (span + s.chunk - 1) / s.chunk;
    return s;
}

// The keys [start, end) split `split` of a decode at `pos` takes; active == false: none (a split
// past the keys at this position).
struct KcapDecodeRange {
    int start, end;
    bool active;
};

KCAP_FN KcapDecodeRange kcap_decode_range(const KcapDecodeSplits splits, int split, int pos) {
    KcapDecodeRange r;
    r.active = split < splits.active;
    r.start = splits.first + split * splits.chunk;
    r.end = r.start + splits.chunk < pos + 1 ? r.start + splits.chunk : pos + 1;
    return r;
}

// Appends the new K/V rows of n_tokens tokens at positions step[0].. to the cache.
// One thread per element. Grid: x = ceil(n_tokens * (k_width + v_width) / threads).
KCAP_FN void kcap_kv_append(const KcapThread t, const KcapAttentionParams p, const KCAP_GLOBAL kcap_i32* step,
                            const KCAP_GLOBAL float* k_new, const KCAP_GLOBAL float* v_new, KCAP_GLOBAL kcap_u8* k_cache,
                            KCAP_GLOBAL kcap_u8* v_cache) {
    const kcap_u64 i = kcap_u64(t.group_x) * t.threads + t.index;
    const kcap_u64 per_token = kcap_u64(p.k_width) + p.v_width;
    if (!p.append || i >= per_token * p.n_tokens) return;  // a shared-KV layer stores nothing
    const int m = int(i / per_token);
    const int r = int(i % per_token);
    const kcap_u64 pos = kcap_u64(step[0] + m);
    if (r < p.k_width)
        kcap_kv_store(k_cache, pos * p.k_width + r, k_new[kcap_u64(m) * p.k_width + r], p.kv_f16);
    else
        kcap_kv_store(v_cache, pos * p.v_width + (r - p.k_width), v_new[kcap_u64(m) * p.v_width + (r - p.k_width)],
                      p.kv_f16);
}

// Decode (one token at position step[0]), flash-decoding. Grid: x = n_head_kv, y = n_splits;
// threads 32 * simd groups (KCAP_ATTN_DECODE_SIMDS, at most KCAP_ATTN_DECODE_MAX_SIMDS); shared: KCAP_ATTN_DECODE_SHARED_FLOATS floats.
// Split s takes the s-th chunk of the visible keys (kcap_decode_splits); its simd groups take
// KCAP_ATTN_KEYS_PER_STEP consecutive keys in turn (per key stream: see
// kcap_attention_decode_dims). Lanes split the head dims (lane l holds dims 4 l .. 4 l + 3 of
// each 128; with key streams, of a stream's share), so every K/V row is read with coalesced
// 16-byte (f32) or 8-byte (f16) loads, and each key's row serves up to KCAP_ATTN_HEADS_PER_PASS
// query heads of the KV head at once (more heads: another pass over the chunk). Scores are
// summed across the lanes; each simd group keeps an online softmax (max, sum, output) per head,
// and the groups merge theirs in threadgroup memory. The split holding pos appends this token's K/V
// to the cache (no group of this launch reads cache[pos]: the key at pos comes from the new
// K/V, rounded as the cache stores it); a shared-KV layer (p.append == 0) reads it from the
// cache. With p.rope the decode rotates the query heads and the new K itself (cos_sin: the
// stage's table; q_norm / k_norm: the QK-norm weights when p.qk_norm), so no rope launch
// precedes it; else cos_sin, q_norm and k_norm are unused (null).
// One active split writes out; several write partial_o [n_head][n_splits][head_dim_v] and
// partial_ml [n_head][n_splits][2] for kcap_attention_combine.
#define KCAP_ATTN_DECODE_SIMDS 4      // Metal's launch; CUDA: 4 or 8 (cuda_rows::attn_decode_simds)
#define KCAP_ATTN_DECODE_MAX_SIMDS 8  // the most simd groups a launch may have (threadgroup memory)
#define KCAP_ATTN_HEADS_PER_PASS 4
#define KCAP_ATTN_KEYS_PER_STEP 4  // keys a simd group (or key stream) loads and scores at once
#define KCAP_ATTN_DIM_GROUPS (KCAP_ATTN_MAX_HEAD_DIM / 128)  // 4-dim groups per lane
// The states of one pass's simd groups (max, sum, output per head), merged by every thread;
// a launch of `simds` simd groups needs KCAP_ATTN_DECODE_SHARED_FLOATS_FOR(simds) floats.
#define KCAP_ATTN_DECODE_SHARED_FLOATS_FOR(simds) ((simds) * KCAP_ATTN_HEADS_PER_PASS * (KCAP_ATTN_MAX_HEAD_DIM + 2))
#define KCAP_ATTN_DECODE_SHARED_FLOATS KCAP_ATTN_DECODE_SHARED_FLOATS_FOR(KCAP_ATTN_DECODE_MAX_SIMDS)

// The decode holds each head as DG groups of 4 dims per lane (dims 4 lane + 128 i): DG = 1 for
// heads of at most 128 dims, 2 up to KCAP_ATTN_MAX_HEAD_DIM (the launch picks it from the
// stage's head_dim; the helpers below take the same DG).

// Dims 4 lane + 128 i .. +3 of a row (f32 or f16 elements; zeros past `dim`).
template <int DG>
KCAP_FN void kcap_attn_load_row(const KcapThread t, const KCAP_GLOBAL kcap_u8* cache, kcap_u64 row, int dim, int f16,
                                KCAP_PRIVATE float4* out) {
    KCAP_UNROLL for (int i = 0; i < DG; ++i) {
        const int d = 4 * int(t.lane) + 128 * i;
        out[i] = d < dim ? kcap_kv_load4(cache, row + kcap_u64(d), f16) : float4{0.0f, 0.0f, 0.0f, 0.0f};
    }
}

// The same dims of this token's new K or V (f32), unrounded.
template <int DG>
KCAP_FN void kcap_attn_load_fresh_raw(const KcapThread t, const KCAP_GLOBAL float* fresh, int dim,
                                      KCAP_PRIVATE float4* out) {
    KCAP_UNROLL for (int i = 0; i < DG; ++i) {
        const int d = 4 * int(t.lane) + 128 * i;
        out[i] = d < dim ? kcap_load_f32x4(fresh + d) : float4{0.0f, 0.0f, 0.0f, 0.0f};
    }
}

// Rounds a row held as the lanes hold it as the cache stores it.
template <int DG>
KCAP_FN void kcap_attn_round_row(int f16, KCAP_PRIVATE float4* x) {
    KCAP_UNROLL for (int i = 0; i < DG; ++i) {
        x[i].x = kcap_kv_round(x[i].x, f16), x[i].y = kcap_kv_round(x[i].y, f16);
        x[i].z = kcap_kv_round(x[i].z, f16), x[i].w = kcap_kv_round(x[i].w, f16);
    }
}

// The same dims of this token's new K or V (f32), rounded as the cache would store them.
template <int DG>
KCAP_FN void kcap_attn_load_fresh(const KcapThread t, const KCAP_GLOBAL float* fresh, int dim, int f16,
                                  KCAP_PRIVATE float4* out) {
    kcap_attn_load_fresh_raw<DG>(t, fresh, dim, out);
    kcap_attn_round_row<DG>(f16, out);
}

// The decode's append of this token's K/V of KV head kv_head at pos, by one simd group: K as the
// lanes hold it (dims 4 lane + 128 i; rotated and rounded), V from v_fresh (the stage's f32 row).
template <int DG>
KCAP_FN void kcap_attn_append_fresh(const KcapThread t, const KcapAttentionParams p, int pos, int kv_head,
                                    const KCAP_PRIVATE float4* k_fresh, const KCAP_GLOBAL float* v_fresh,
                                    KCAP_GLOBAL kcap_u8* k_cache, KCAP_GLOBAL kcap_u8* v_cache) {
    const kcap_u64 k_row = kcap_u64(pos) * p.k_width + kcap_u64(kv_head) * p.head_dim;
    KCAP_UNROLL for (int i = 0; i < DG; ++i) {
        const int d = 4 * int(t.lane) + 128 * i;
        if (d < p.head_dim) {
            kcap_kv_store(k_cache, k_row + d, k_fresh[i].x, p.kv_f16);
            kcap_kv_store(k_cache, k_row + d + 1, k_fresh[i].y, p.kv_f16);
            kcap_kv_store(k_cache, k_row + d + 2, k_fresh[i].z, p.kv_f16);
            kcap_kv_store(k_cache, k_row + d + 3, k_fresh[i].w, p.kv_f16);
        }
    }
    for (int d = int(t.lane); d < p.head_dim_v; d += KCAP_SIMD_WIDTH)
        kcap_kv_store(v_cache, kcap_u64(pos) * p.v_width + kcap_u64(kv_head) * p.head_dim_v + d, v_fresh[d], p.kv_f16);
}

// The decode's own rope (p.rope, rope_dim == head_dim): what a lane needs of the position's
// cos/sin row and of a QK-norm weight for the dims it holds of a head (dims 4 lane + 128 i),
// read once per group and ahead of the kernel's wait (kcap_attention_decode_dims: neither
// depends on the launch before it).
//   normal rope: pairs (d, d + 1): cs[4 i .. 4 i + 1] = the pairs of dims d .. d + 3 of dim group i;
//   NeoX: pairs (d, d + half_dim): cs[0 .. 3] = those of the lane's dims of the lower half
//   (its own, or its partner lane's, or at head_dim 256 the lane's in both dim groups).
template <int DG>
struct KcapAttnRopeLane {
    float2 cs[DG * 4];  // [dim group i][pair c] at 4 i + c
    float4 q_norm[DG];
    float4 k_norm[DG];
};

// Dims 4 lane + 128 i .. +3 of a QK-norm weight (zeros without the norm or past head_dim).
KCAP_FN float4 kcap_attn_norm_lane(const KcapThread t, const KcapAttentionParams p, const KCAP_GLOBAL float* norm, int i) {
    const int d = 4 * int(t.lane) + 128 * i;
    if (!p.qk_norm || d >= p.head_dim) return float4{0.0f, 0.0f, 0.0f, 0.0f};
    return float4{norm[d], norm[d + 1], norm[d + 2], norm[d + 3]};
}

template <int DG>
KCAP_FN KcapAttnRopeLane<DG> kcap_attn_rope_lane(const KcapThread t, const KcapAttentionParams p,
                                                 const KCAP_GLOBAL float2* cs_row, const KCAP_GLOBAL float* q_norm,
                                                 const KCAP_GLOBAL float* k_norm, bool with_k) {
    KcapAttnRopeLane<DG> r;
    KCAP_UNROLL for (int i = 0; i < DG; ++i) {
        r.q_norm[i] = r.k_norm[i] = float4{0.0f, 0.0f, 0.0f, 0.0f};
        KCAP_UNROLL for (int c = 0; c < 4; ++c) r.cs[4 * i + c] = float2{0.0f, 0.0f};
    }
    if (!p.rope) return r;  // no rope of its own: cos_sin and the norms are null
    KCAP_UNROLL for (int i = 0; i < DG; ++i) {
        r.q_norm[i] = kcap_attn_norm_lane(t, p, q_norm, i);
        if (with_k) r.k_norm[i] = kcap_attn_norm_lane(t, p, k_norm, i);
    }
    const int d = 4 * int(t.lane);
    if (p.rope == 1) {
        KCAP_UNROLL for (int i = 0; i < DG; ++i) {
            const int di = d + 128 * i;
            if (di < p.head_dim) r.cs[4 * i] = cs_row[di / 2], r.cs[4 * i + 1] = cs_row[di / 2 + 1];
        }
        return r;
    }
    const int half_dim = p.head_dim / 2;
    if (half_dim == 128) {
        KCAP_UNROLL for (int c = 0; c < 4; ++c) r.cs[c] = cs_row[d + c];
        return r;
    }
    if (d >= p.head_dim) return r;
    const int mask = half_dim / 4;
    const int pair = (int(t.lane) & mask) == 0 ? d : d - half_dim;
    KCAP_UNROLL for (int c = 0; c < 4; ++c) r.cs[c] = cs_row[pair + c];
    return r;
}

// One head held as the lanes hold it, RMS-normed with `norm` (the lane's weights) first when
// p.qk_norm, then rotated by the lane's cos/sin pairs, as kcap_qk_norm_rope and kcap_rope
// compute it. Every lane of the simd group takes part (the norm's sum; NeoX's partner dims,
// which lie in lane lane ^ (head_dim / 8), or in the lane's other dim group at head_dim 256,
// where DG == 2).
#if KCAP_ATTN_DIM_GROUPS != 2
#error "kcap_attn_rope_head pairs NeoX halves across two dim groups at head_dim 256"
#endif
template <int DG>
KCAP_FN void kcap_attn_rope_head(const KcapThread t, const KcapAttentionParams p, const KCAP_PRIVATE float2* cs,
                                 const KCAP_PRIVATE float4* norm, KCAP_PRIVATE float4* x) {
    if (p.qk_norm) {
        float sq = 0.0f;
        KCAP_UNROLL for (int i = 0; i < DG; ++i)
            sq += x[i].x * x[i].x + x[i].y * x[i].y + x[i].z * x[i].z + x[i].w * x[i].w;  // zeros past head_dim
        const float inv = kcap_rsqrt(kcap_simd_sum(sq) / float(p.head_dim) + p.qk_norm_eps);
        KCAP_UNROLL for (int i = 0; i < DG; ++i) {
            const int d = 4 * int(t.lane) + 128 * i;
            if (d < p.head_dim) {
                x[i].x = x[i].x * inv * norm[i].x, x[i].y = x[i].y * inv * norm[i].y;
                x[i].z = x[i].z * inv * norm[i].z, x[i].w = x[i].w * inv * norm[i].w;
            }
        }
    }
    if (p.rope == 1) {  // normal: pairs (d, d + 1) lie in one lane's quad
        KCAP_UNROLL for (int i = 0; i < DG; ++i) {
            const int d = 4 * int(t.lane) + 128 * i;
            if (d >= p.head_dim) continue;
            const float2 c0 = cs[4 * i], c1 = cs[4 * i + 1];
            const float4 v = x[i];
            x[i] = float4{v.x * c0.x - v.y * c0.y, v.x * c0.y + v.y * c0.x, v.z * c1.x - v.w * c1.y,
                          v.z * c1.y + v.w * c1.x};
        }
        return;
    }
    const int half_dim = p.head_dim / 2;  // NeoX: pairs (d, d + half_dim)
    const float2 c0 = cs[0], c1 = cs[1], c2 = cs[2], c3 = cs[3];
    if (half_dim == 128) {  // head_dim 256, so DG == 2 (x[DG - 1]: an index valid at DG == 1 too)
        const float4 lo = x[0], hi = x[DG - 1];
        x[0] = float4{lo.x * c0.x - hi.x * c0.y, lo.y * c1.x - hi.y * c1.y, lo.z * c2.x - hi.z * c2.y,
                      lo.w * c3.x - hi.w * c3.y};
        x[DG - 1] = float4{lo.x * c0.y + hi.x * c0.x, lo.y * c1.y + hi.y * c1.x, lo.z * c2.y + hi.z * c2.x,
                           lo.w * c3.y + hi.w * c3.x};
        return;
    }
    const int mask = half_dim / 4;  // the partner lane's offset (head_dim a power of two, at most 128)
    const float4 v = x[0];
    const float4 other = float4{kcap_simd_shuffle_xor(v.x, mask), kcap_simd_shuffle_xor(v.y, mask),
                                kcap_simd_shuffle_xor(v.z, mask), kcap_simd_shuffle_xor(v.w, mask)};
    const int d = 4 * int(t.lane);
    if (d >= p.head_dim) return;
    const bool low = (int(t.lane) & mask) == 0;
    if (low)
        x[0] = float4{v.x * c0.x - other.x * c0.y, v.y * c1.x - other.y * c1.y, v.z * c2.x - other.z * c2.y,
                      v.w * c3.x - other.w * c3.y};
    else
        x[0] = float4{other.x * c0.y + v.x * c0.x, other.y * c1.y + v.y * c1.x, other.z * c2.y + v.z * c2.x,
                      other.w * c3.y + v.w * c3.x};
}

// The query heads group group_x takes: p.head_blocks groups per KV head (grid x = n_head_kv *
// head_blocks; 0 counts as 1) share its query heads in consecutive runs of whole passes
// (KCAP_ATTN_HEADS_PER_PASS each), so a KV head with many query heads (8 in Qwen3-MoE and
// gpt-oss) is several groups of one pass each, not one group that takes its passes in turn.
struct KcapDecodeHeads {
    int kv_head;
    int first;  // the first query head of the KV head's group this group takes (0 .. group)
    int end;    // one past its last; first == end: none (the group returns at once)
};

KCAP_FN KcapDecodeHeads kcap_decode_heads(const KcapAttentionParams p, int group_x) {
    const int blocks = p.head_blocks > 1 ? p.head_blocks : 1;
    const int group = p.n_head / p.n_head_kv;
    const int passes = (group + KCAP_ATTN_HEADS_PER_PASS - 1) / KCAP_ATTN_HEADS_PER_PASS;
    const int per_block = (passes + blocks - 1) / blocks * KCAP_ATTN_HEADS_PER_PASS;
    KcapDecodeHeads h;
    h.kv_head = group_x / blocks;
    h.first = (group_x % blocks) * per_block;
    if (h.first > group) h.first = group;
    h.end = h.first + per_block < group ? h.first + per_block : group;
    return h;
}

// Key streams (KS): with KS > 1 a simd group is KS streams of 32 / KS lanes, each taking its own
// keys, for heads of at most 128 / KS dims: a lane holds dims 4 (lane % (32 / KS)) .. +3 of a
// row, the dot products are summed over the stream, and each stream keeps its own online
// softmax; the streams merge theirs before the simd groups merge. At heads of at most 64 dims a
// lane's 4 dims of one row (KS = 1) leave half the simd group idle. The query and the new K are
// loaded (and rotated) as the whole simd group holds a head (dims 4 lane ..), then each lane
// takes its stream's dims from the lane holding them.
template <int KS>
KCAP_FN KcapThread kcap_attn_stream_thread(const KcapThread t) {
    KcapThread s = t;
    s.lane = t.lane % unsigned(KCAP_SIMD_WIDTH / KS);
    return s;
}

// A head held as the whole simd group holds it (`full`: dims 4 lane .. +3), as the lane's key
// stream holds it (dims 4 (lane % L) .., L = 32 / KS lanes per stream): lane lane % L's, which is
// lane ^ (L stream): KS - 1 shuffles of uniform masks.
template <int KS>
KCAP_FN float4 kcap_attn_to_stream(const KcapThread t, const float4 full) {
    constexpr int lanes = KCAP_SIMD_WIDTH / KS;
    const int stream = int(t.lane) / lanes;
    float4 x = full;
    KCAP_UNROLL for (int j = 1; j < KS; ++j) {
        const float4 v = float4{kcap_simd_shuffle_xor(full.x, lanes * j), kcap_simd_shuffle_xor(full.y, lanes * j),
                                kcap_simd_shuffle_xor(full.z, lanes * j), kcap_simd_shuffle_xor(full.w, lanes * j)};
        if (stream == j) x = v;
    }
    return x;
}

// Where a kernel body starts reading what the launch before it wrote: nothing to wait for
// here; CUDA's decode passes its programmatic-dependent-launch wait.
struct KcapNoWait {
    static KCAP_FN void wait() {}
};

// A step's keys as a lane of a key stream holds them: the K and V rows' dims of KPS keys.
template <int DG>
struct KcapAttnKeys {
    float4 k[KCAP_ATTN_KEYS_PER_STEP][DG];
    float4 v[KCAP_ATTN_KEYS_PER_STEP][DG];
};

// The keys j0 .. j0 + KPS - 1 from the cache as the lane's key stream holds them (ts), zeros
// for a key past `end` and for the new key (fresh_pos, which the caller fills in): their K and
// V rows, or only the K rows (KV_ROWS 1) or only the V rows (2).
template <int DG, int KV_ROWS = 3>
KCAP_FN void kcap_attn_load_keys(const KcapThread ts, const KcapAttentionParams p, const KCAP_GLOBAL kcap_u8* k_cache,
                                 const KCAP_GLOBAL kcap_u8* v_cache, kcap_u64 k_head, kcap_u64 v_head, int j0, int end,
                                 int fresh_pos, KCAP_PRIVATE KcapAttnKeys<DG>& keys) {
    KCAP_UNROLL for (int b = 0; b < KCAP_ATTN_KEYS_PER_STEP; ++b) {
        const int j = j0 + b;
        const bool cached = j < end && j != fresh_pos;
        if (KV_ROWS & 1) {
            if (cached) kcap_attn_load_row<DG>(ts, k_cache, kcap_u64(j) * p.k_width + k_head, p.head_dim, p.kv_f16, keys.k[b]);
            else KCAP_UNROLL for (int i = 0; i < DG; ++i) keys.k[b][i] = float4{0.0f, 0.0f, 0.0f, 0.0f};
        }
        if (KV_ROWS & 2) {
            if (cached) kcap_attn_load_row<DG>(ts, v_cache, kcap_u64(j) * p.v_width + v_head, p.head_dim_v, p.kv_f16, keys.v[b]);
            else KCAP_UNROLL for (int i = 0; i < DG; ++i) keys.v[b][i] = float4{0.0f, 0.0f, 0.0f, 0.0f};
        }
    }
}

// DG: the dim groups of the stage's heads (DG * 128 >= head_dim and head_dim_v); KS: key streams
// per simd group (KS > 1: DG == 1 and heads of at most 128 / KS dims). Wait::wait() where the
// body starts reading the launch before's outputs (q, the new K/V): before it, each simd group
// reads what is older than that launch (the position, its cos/sin row, the QK-norm weights and
// the cached K/V rows of its first step of keys), so that their latency overlaps the wait.
template <int DG, int KS = 1, class Wait = KcapNoWait>
KCAP_FN void kcap_attention_decode_dims(const KcapThread t, const KcapAttentionParams p, const KCAP_GLOBAL kcap_i32* step,
                                        const KCAP_GLOBAL float* q, const KCAP_GLOBAL float* k_new,
                                        const KCAP_GLOBAL float* v_new, KCAP_GLOBAL kcap_u8* k_cache,
                                        KCAP_GLOBAL kcap_u8* v_cache, KCAP_GLOBAL float* partial_o,
                                        KCAP_GLOBAL float* partial_ml, KCAP_GLOBAL float* out, KCAP_SHARED float* shared,
                                        const KCAP_GLOBAL float2* cos_sin, const KCAP_GLOBAL float* q_norm,
                                        const KCAP_GLOBAL float* k_norm, const KCAP_GLOBAL float* sinks) {
    const KcapDecodeHeads heads_of_group = kcap_decode_heads(p, int(t.group_x));
    if (heads_of_group.first >= heads_of_group.end) {  // the whole group: no query heads left
        Wait::wait();
        return;
    }
    const int kv_head = heads_of_group.kv_head;
    const int split = int(t.group_y);
    const int pos = step[0];
    const KcapDecodeSplits splits = kcap_decode_splits(p, pos);
    const KcapDecodeRange range = kcap_decode_range(splits, split, pos);
    if (!range.active) {  // the whole group: past the keys at this position
        Wait::wait();
        return;
    }
    const int start = range.start, end = range.end;
    const KCAP_GLOBAL float* v_fresh = v_new + kcap_u64(kv_head) * p.head_dim_v;
    const KCAP_GLOBAL float2* cs_row = cos_sin + (p.rope ? kcap_u64(pos) * (p.head_dim / 2) : 0);
    // The last split holds the new key (pos): its simd groups hold the new K row, rotated when
    // the decode owns the rope and rounded as the cache stores it, and simd group 0 of the KV
    // head's first group appends the new K and V to the cache (no group of this launch reads
    // cache[pos]).
    static_assert(KS == 1 || DG == 1, "key streams hold heads of at most 128 / KS dims");
    constexpr int KPS = KCAP_ATTN_KEYS_PER_STEP;
    const int fresh_pos = p.append ? pos : -1;
    const KcapThread ts = kcap_attn_stream_thread<KS>(t);  // the lane's place in its key stream
    const int stream = int(t.lane) / (KCAP_SIMD_WIDTH / KS);
    const bool fresh_split = p.append && split == splits.active - 1;
    const kcap_u64 k_head = kcap_u64(kv_head) * p.head_dim;
    const kcap_u64 v_head = kcap_u64(kv_head) * p.head_dim_v;
    // Before the wait: the rope's and the QK-norms' values, and (one key stream per simd group)
    // the K rows of the simd group's first step of keys: the first pass's first iteration below
    // loads only their V rows, which it needs after the dot products (holding them too through
    // the wait spilled registers). Qwen3-30B-A3B's 12-layer slice decodes 3% faster from empty
    // with it; with two key streams (gpt-oss-20b) the preloaded K rows gained nothing from empty
    // and lost 1% after 4,096 tokens.
    const KcapAttnRopeLane<DG> rope = kcap_attn_rope_lane<DG>(t, p, cs_row, q_norm, k_norm, fresh_split);
    KcapAttnKeys<DG> keys;
    bool preloaded = KS == 1;
    if (preloaded)
        kcap_attn_load_keys<DG, 1>(ts, p, k_cache, v_cache, k_head, v_head, start + int(t.simd) * KPS, end, fresh_pos,
                                   keys);
    Wait::wait();
    float4 k_fresh[DG];
    if (fresh_split) {
        kcap_attn_load_fresh_raw<DG>(t, k_new + k_head, p.head_dim, k_fresh);
        if (p.rope) kcap_attn_rope_head<DG>(t, p, rope.cs, rope.k_norm, k_fresh);
        kcap_attn_round_row<DG>(p.kv_f16, k_fresh);
        if (t.simd == 0 && heads_of_group.first == 0)
            kcap_attn_append_fresh<DG>(t, p, pos, kv_head, k_fresh, v_fresh, k_cache, v_cache);
        if (KS > 1) k_fresh[0] = kcap_attn_to_stream<KS>(t, k_fresh[0]);
    }
    const int group = p.n_head / p.n_head_kv;
    for (int g0 = heads_of_group.first; g0 < heads_of_group.end; g0 += KCAP_ATTN_HEADS_PER_PASS) {
        const int heads =
            heads_of_group.end - g0 < KCAP_ATTN_HEADS_PER_PASS ? heads_of_group.end - g0 : KCAP_ATTN_HEADS_PER_PASS;
        float4 qv[KCAP_ATTN_HEADS_PER_PASS][DG];
        float m[KCAP_ATTN_HEADS_PER_PASS], l[KCAP_ATTN_HEADS_PER_PASS];
        float4 o[KCAP_ATTN_HEADS_PER_PASS][DG];
        KCAP_UNROLL for (int h = 0; h < KCAP_ATTN_HEADS_PER_PASS; ++h) {
            m[h] = KCAP_NEG_INFINITY;
            l[h] = 0.0f;
            const int head = kv_head * group + g0 + (h < heads ? h : 0);
            KCAP_UNROLL for (int i = 0; i < DG; ++i) {
                const int d = 4 * int(t.lane) + 128 * i;
                qv[h][i] = d < p.head_dim ? kcap_load_f32x4(q + kcap_u64(head) * p.head_dim + d) : float4{0.0f, 0.0f, 0.0f, 0.0f};
                o[h][i] = float4{0.0f, 0.0f, 0.0f, 0.0f};
            }
            if (p.rope) kcap_attn_rope_head<DG>(t, p, rope.cs, rope.q_norm, qv[h]);
            if (KS > 1) qv[h][0] = kcap_attn_to_stream<KS>(t, qv[h][0]);
        }
        // Each step a simd group loads KPS keys' K and V rows per key stream at once (so that
        // many row loads are in flight, not one memory latency per key), reduces all their heads'
        // dot products across the stream's lanes together (independent shuffles), then folds the
        // keys into the stream's online softmax with one rescale.
        for (int j_simd = start + int(t.simd) * KS * KPS; j_simd < end;
             j_simd += int(t.simds) * KS * KPS) {
            const int j0 = j_simd + stream * KPS;  // this stream's first key
            if (preloaded) kcap_attn_load_keys<DG, 2>(ts, p, k_cache, v_cache, k_head, v_head, j0, end, fresh_pos, keys);
            else kcap_attn_load_keys<DG>(ts, p, k_cache, v_cache, k_head, v_head, j0, end, fresh_pos, keys);
            preloaded = false;
            KCAP_UNROLL for (int b = 0; b < KPS; ++b) {
                if (j0 + b < end && j0 + b == fresh_pos) {
                    KCAP_UNROLL for (int i = 0; i < DG; ++i) keys.k[b][i] = k_fresh[i];
                    kcap_attn_load_fresh<DG>(ts, v_fresh, p.head_dim_v, p.kv_f16, keys.v[b]);
                }
            }
            float dot[KPS][KCAP_ATTN_HEADS_PER_PASS];
            KCAP_UNROLL for (int b = 0; b < KPS; ++b) KCAP_UNROLL for (int h = 0; h < KCAP_ATTN_HEADS_PER_PASS; ++h) {
                dot[b][h] = 0.0f;
                KCAP_UNROLL for (int i = 0; i < DG; ++i)
                    dot[b][h] += qv[h][i].x * keys.k[b][i].x + qv[h][i].y * keys.k[b][i].y + qv[h][i].z * keys.k[b][i].z +
                                 qv[h][i].w * keys.k[b][i].w;
            }
            KCAP_UNROLL for (int offset = KCAP_SIMD_WIDTH / (2 * KS); offset > 0; offset >>= 1)
                KCAP_UNROLL for (int b = 0; b < KPS; ++b)
                    KCAP_UNROLL for (int h = 0; h < KCAP_ATTN_HEADS_PER_PASS; ++h)
                        dot[b][h] += kcap_simd_shuffle_xor(dot[b][h], offset);
            // Heads past `heads`: uniform over the simd group; a stream whose first key is past
            // the chunk (only the last stream of the last step can be) has nothing to fold. No
            // shuffles below, so the streams may part.
            KCAP_UNROLL for (int h = 0; h < KCAP_ATTN_HEADS_PER_PASS; ++h) {
                if (h >= heads || j0 >= end) continue;
                float s[KPS];
                float m_new = m[h];
                KCAP_UNROLL for (int b = 0; b < KPS; ++b) {
                    s[b] = dot[b][h] * p.scale;
                    if (p.softcap > 0.0f) s[b] = p.softcap * kcap_tanh(s[b] / p.softcap);
                    if (j0 + b < end) m_new = kcap_fmax(m_new, s[b]);  // key j0 < end: m_new is finite
                }
                const float correction = kcap_exp(m[h] - m_new);  // 0 while m is still -inf
                float weight[KPS];
                float weight_sum = 0.0f;
                KCAP_UNROLL for (int b = 0; b < KPS; ++b) {
                    weight[b] = j0 + b < end ? kcap_exp(s[b] - m_new) : 0.0f;
                    weight_sum += weight[b];
                }
                l[h] = l[h] * correction + weight_sum;
                KCAP_UNROLL for (int i = 0; i < DG; ++i) {
                    float4 acc = float4{o[h][i].x * correction, o[h][i].y * correction, o[h][i].z * correction,
                                        o[h][i].w * correction};
                    KCAP_UNROLL for (int b = 0; b < KPS; ++b) {
                        acc.x += weight[b] * keys.v[b][i].x;
                        acc.y += weight[b] * keys.v[b][i].y;
                        acc.z += weight[b] * keys.v[b][i].z;
                        acc.w += weight[b] * keys.v[b][i].w;
                    }
                    o[h][i] = acc;
                }
                m[h] = m_new;
            }
        }
        // Merge the simd groups' states: each writes its (max, sum) and output per head to
        // threadgroup memory, then every thread merges output dims of every head (one barrier;
        // a single simd group folding the others in was most of the decode's time at short spans).
        // With key streams, the streams first merge their states in pairs (a stream without keys
        // has m = -inf and l = 0: weight 0); every stream then holds the simd group's state.
        KCAP_UNROLL for (int mask = KCAP_SIMD_WIDTH / KS; mask < KCAP_SIMD_WIDTH; mask <<= 1) {
            KCAP_UNROLL for (int h = 0; h < KCAP_ATTN_HEADS_PER_PASS; ++h) {
                if (h >= heads) break;
                const float m_other = kcap_simd_shuffle_xor(m[h], mask), l_other = kcap_simd_shuffle_xor(l[h], mask);
                const float m_both = kcap_fmax(m[h], m_other);
                const float w_self = l[h] > 0.0f ? kcap_exp(m[h] - m_both) : 0.0f;
                const float w_other = l_other > 0.0f ? kcap_exp(m_other - m_both) : 0.0f;
                KCAP_UNROLL for (int i = 0; i < DG; ++i) {
                    const float4 x = o[h][i];
                    o[h][i] = float4{x.x * w_self + kcap_simd_shuffle_xor(x.x, mask) * w_other,
                                     x.y * w_self + kcap_simd_shuffle_xor(x.y, mask) * w_other,
                                     x.z * w_self + kcap_simd_shuffle_xor(x.z, mask) * w_other,
                                     x.w * w_self + kcap_simd_shuffle_xor(x.w, mask) * w_other};
                }
                l[h] = l[h] * w_self + l_other * w_other;
                m[h] = m_both;
            }
        }
        KCAP_SHARED float* shared_ml = shared;                                                // [simds][heads][2]
        KCAP_SHARED float* shared_o = shared + int(t.simds) * KCAP_ATTN_HEADS_PER_PASS * 2;  // [simds][heads][dv]
        KCAP_UNROLL for (int h = 0; h < KCAP_ATTN_HEADS_PER_PASS; ++h) {
            if (h >= heads) break;
            const int state = int(t.simd) * KCAP_ATTN_HEADS_PER_PASS + h;
            if (t.lane == 0) shared_ml[2 * state] = m[h], shared_ml[2 * state + 1] = l[h];
            KCAP_SHARED float* slot = shared_o + state * p.head_dim_v;
            KCAP_UNROLL for (int i = 0; i < DG; ++i) {
                const int d = 4 * int(ts.lane) + 128 * i;
                if (stream == 0 && d < p.head_dim_v)
                    slot[d] = o[h][i].x, slot[d + 1] = o[h][i].y, slot[d + 2] = o[h][i].z, slot[d + 3] = o[h][i].w;
            }
        }
        kcap_barrier();
        const bool whole = splits.active == 1;
        for (int h = 0; h < heads; ++h) {
            // Lane s holds simd group s's weight exp(m_s - m): a group without keys has m = -inf
            // and l = 0, weight 0 (simd group 0 always has the chunk's first key: m is finite).
            const int s = int(t.lane) < int(t.simds) ? int(t.lane) : 0;
            const float m_s = shared_ml[2 * (s * KCAP_ATTN_HEADS_PER_PASS + h)];
            const float l_s = int(t.lane) < int(t.simds) ? shared_ml[2 * (s * KCAP_ATTN_HEADS_PER_PASS + h) + 1] : 0.0f;
            const float m_all = kcap_simd_max(l_s > 0.0f ? m_s : KCAP_NEG_INFINITY);
            const float w_s = l_s > 0.0f ? kcap_exp(m_s - m_all) : 0.0f;
            const float l_all = kcap_simd_sum(l_s * w_s);
            const int head = kv_head * group + g0 + h;
            const kcap_u64 slot = kcap_u64(head) * p.n_splits + split;
            KCAP_GLOBAL float* to = whole ? out + kcap_u64(head) * p.head_dim_v : partial_o + slot * p.head_dim_v;
            const float scale = whole ? 1.0f / kcap_attn_denominator(sinks, head, m_all, l_all) : 1.0f;
            float w[KCAP_ATTN_DECODE_MAX_SIMDS];  // every lane takes part in the broadcasts
            KCAP_UNROLL for (int g = 0; g < KCAP_ATTN_DECODE_MAX_SIMDS; ++g) w[g] = kcap_simd_broadcast(w_s, g);
            for (int d = int(t.index); d < p.head_dim_v; d += int(t.threads)) {
                float acc = 0.0f;
                KCAP_UNROLL for (int g = 0; g < KCAP_ATTN_DECODE_MAX_SIMDS; ++g)
                    if (g < int(t.simds)) acc += w[g] * shared_o[(g * KCAP_ATTN_HEADS_PER_PASS + h) * p.head_dim_v + d];
                to[d] = acc * scale;
            }
            if (!whole && t.index == 0) {
                partial_ml[2 * slot] = m_all;
                partial_ml[2 * slot + 1] = l_all;
            }
        }
        kcap_barrier();  // shared is reused by the next pass
    }
}

// The decode at the most dims (Metal's entry and the host tests; CUDA picks DG per stage).
KCAP_FN void kcap_attention_decode(const KcapThread t, const KcapAttentionParams p, const KCAP_GLOBAL kcap_i32* step,
                                   const KCAP_GLOBAL float* q, const KCAP_GLOBAL float* k_new,
                                   const KCAP_GLOBAL float* v_new, KCAP_GLOBAL kcap_u8* k_cache,
                                   KCAP_GLOBAL kcap_u8* v_cache, KCAP_GLOBAL float* partial_o,
                                   KCAP_GLOBAL float* partial_ml, KCAP_GLOBAL float* out, KCAP_SHARED float* shared,
                                   const KCAP_GLOBAL float2* cos_sin, const KCAP_GLOBAL float* q_norm,
                                   const KCAP_GLOBAL float* k_norm, const KCAP_GLOBAL float* sinks = nullptr) {
    kcap_attention_decode_dims<KCAP_ATTN_DIM_GROUPS>(t, p, step, q, k_new, v_new, k_cache, v_cache, partial_o,
                                                     partial_ml, out, shared, cos_sin, q_norm, k_norm, sinks);
}

// The decode with its keys staged in threadgroup memory, one query head per simd group.
#include "kernels/attention_decode_tiles.h"

// Merges the active splits of kcap_attention_decode (none to merge when one split covered
// every key: it wrote the output itself). Grid: x = n_head; any multiple of 32 threads.
// Threadgroup memory of the combine: the weights of a chunk of splits, and one slot per simd
// group for the block reductions.
#define KCAP_ATTN_COMBINE_CHUNK 256
#define KCAP_ATTN_COMBINE_SHARED_FLOATS (KCAP_ATTN_COMBINE_CHUNK + 32)

// Grid: x = n_head; threads >= head_dim_v (a multiple of 32, at most 1024); shared:
// KCAP_ATTN_COMBINE_SHARED_FLOATS floats. Returns the value the thread wrote (dim t.index of
// the head; 0 where it wrote none), for an epilogue.
// Up to KCAP_SIMD_WIDTH active splits (decode at short spans), every simd group takes the max
// and sum of all of them, one split per lane, and each thread its dim: no barrier, two rounds
// of loads. More: the threads take the splits in turn for the max and the weights exp(m_s - m)
// (staged a chunk at a time), then each thread one output dim, with four splits' partial
// outputs loaded at once: at long spans a head has dozens of splits, and one dependent load per
// split was most of the decode attention's time.
KCAP_FN float kcap_attention_combine(const KcapThread t, const KcapAttentionParams p, const KCAP_GLOBAL kcap_i32* step,
                                     const KCAP_GLOBAL float* partial_o, const KCAP_GLOBAL float* partial_ml,
                                     KCAP_GLOBAL float* out, KCAP_SHARED float* shared,
                                     const KCAP_GLOBAL float* sinks = nullptr) {
    const int active = kcap_decode_splits(p, step[0]).active;
    if (active == 1) return 0.0f;
    const kcap_u64 head = t.group_x;
    const KCAP_GLOBAL float* ml = partial_ml + head * p.n_splits * 2;
    const int d = int(t.index);
    const int dv = p.head_dim_v;
    const KCAP_GLOBAL float* po = partial_o + head * p.n_splits * dv + kcap_u64(d < dv ? d : 0);
    float l = 0.0f, acc = 0.0f, m_all = 0.0f;
    if (active <= KCAP_SIMD_WIDTH) {
        // The first four splits' outputs are read with their (max, sum), not after them: at
        // short spans (up to 128 keys: four splits) the combine is then one round of loads.
        float first[4];
        KCAP_UNROLL for (int j = 0; j < 4; ++j) first[j] = j < active ? po[kcap_u64(j) * dv] : 0.0f;
        const int s = int(t.lane);
        const float m_s = s < active ? ml[2 * s] : KCAP_NEG_INFINITY;
        const float l_s = s < active ? ml[2 * s + 1] : 0.0f;
        const float m = kcap_simd_max(m_s);  // every active split saw keys: m is finite
        m_all = m;
        const float w_s = s < active ? kcap_exp(m_s - m) : 0.0f;
        l = kcap_simd_sum(l_s * w_s);
        KCAP_UNROLL for (int j = 0; j < 4; ++j) acc += first[j] * kcap_simd_broadcast(w_s, j);  // 0 past active
        int i = 4;
        for (; i + 4 <= active; i += 4) {
            const float w0 = kcap_simd_broadcast(w_s, i), w1 = kcap_simd_broadcast(w_s, i + 1);
            const float w2 = kcap_simd_broadcast(w_s, i + 2), w3 = kcap_simd_broadcast(w_s, i + 3);
            const float a = po[kcap_u64(i) * dv], b = po[kcap_u64(i + 1) * dv];
            const float c = po[kcap_u64(i + 2) * dv], e = po[kcap_u64(i + 3) * dv];
            acc += a * w0 + b * w1 + c * w2 + e * w3;
        }
        for (; i < active; ++i) acc += po[kcap_u64(i) * dv] * kcap_simd_broadcast(w_s, i);
    } else {
        KCAP_SHARED float* weight = shared;                            // [chunk]
        KCAP_SHARED float* reduce = shared + KCAP_ATTN_COMBINE_CHUNK;  // [simds]
        float m = KCAP_NEG_INFINITY;
        for (int s = int(t.index); s < active; s += int(t.threads)) m = kcap_fmax(m, ml[2 * s]);
        m = kcap_group_max(t, m, reduce);  // every active split saw keys: m is finite
        m_all = m;
        for (int c0 = 0; c0 < active; c0 += KCAP_ATTN_COMBINE_CHUNK) {
            const int n = active - c0 < KCAP_ATTN_COMBINE_CHUNK ? active - c0 : KCAP_ATTN_COMBINE_CHUNK;
            if (c0 > 0) kcap_barrier();  // the previous chunk's weights are consumed
            for (int i = int(t.index); i < n; i += int(t.threads)) {
                const float w = kcap_exp(ml[2 * (c0 + i)] - m);
                weight[i] = w;
                l += ml[2 * (c0 + i) + 1] * w;
            }
            kcap_barrier();
            if (d < dv) {
                const KCAP_GLOBAL float* pc = po + kcap_u64(c0) * dv;
                int i = 0;
                for (; i + 4 <= n; i += 4) {
                    const float a = pc[kcap_u64(i) * dv], b = pc[kcap_u64(i + 1) * dv];
                    const float c = pc[kcap_u64(i + 2) * dv], e = pc[kcap_u64(i + 3) * dv];
                    acc += a * weight[i] + b * weight[i + 1] + c * weight[i + 2] + e * weight[i + 3];
                }
                for (; i < n; ++i) acc += pc[kcap_u64(i) * dv] * weight[i];
            }
        }
        l = kcap_group_sum(t, l, reduce);
    }
    if (d >= dv) return 0.0f;
    const float v = acc * (1.0f / kcap_attn_denominator(sinks, int(head), m_all, l));
    out[head * dv + kcap_u64(d)] = v;
    return v;
}

// Prefill (a chunk of tokens attends to the cache): kernels/attention_prefill.h, tiled.
#include "kernels/attention_prefill.h"
