// Attention bodies: KV append, split-K decode (flash-decoding) with its combine, and batched
// prefill. Causal, optional sliding window and score softcap, any GQA ratio, f32 or f16 cache.
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
// KCAP_ATTN_KEYS_PER_STEP consecutive keys in turn. Lanes split the head dims (lane l holds
// dims 4 l .. 4 l + 3 of each 128), so every K/V row is read with coalesced 16-byte (f32) or
// 8-byte (f16) loads, and each key's row serves up to KCAP_ATTN_HEADS_PER_PASS query heads
// of the KV head at once (more heads: another pass over the chunk). Scores are summed across
// the lanes; each simd group keeps an online softmax (max, sum, output) per head, and the
// groups merge theirs in threadgroup memory. Split 0 appends this token's K/V to the cache
// (no group of this launch reads cache[pos]: the key at pos comes from the new K/V, rounded
// as the cache stores it); a shared-KV layer (p.append == 0) reads it from the cache.
// One active split writes out; several write partial_o [n_head][n_splits][head_dim_v] and
// partial_ml [n_head][n_splits][2] for kcap_attention_combine.
#define KCAP_ATTN_DECODE_SIMDS 4      // Metal's launch; CUDA: 4 or 8 (cuda_rows::attn_decode_simds)
#define KCAP_ATTN_DECODE_MAX_SIMDS 8  // the most simd groups a launch may have (threadgroup memory)
#define KCAP_ATTN_HEADS_PER_PASS 4
#define KCAP_ATTN_KEYS_PER_STEP 4  // keys a simd group loads and scores at once
#define KCAP_ATTN_DIM_GROUPS (KCAP_ATTN_MAX_HEAD_DIM / 128)  // 4-dim groups per lane
// The states of simd groups 1.. of one pass (max, sum, output per head), merged by group 0.
#define KCAP_ATTN_DECODE_SHARED_FLOATS \
    ((KCAP_ATTN_DECODE_MAX_SIMDS - 1) * KCAP_ATTN_HEADS_PER_PASS * (KCAP_ATTN_MAX_HEAD_DIM + 2))

// Dims 4 lane + 128 i .. +3 of a row (f32 or f16 elements; zeros past `dim`).
KCAP_FN void kcap_attn_load_row(const KcapThread t, const KCAP_GLOBAL kcap_u8* cache, kcap_u64 row, int dim, int f16,
                                KCAP_PRIVATE float4* out) {
    KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_DIM_GROUPS; ++i) {
        const int d = 4 * int(t.lane) + 128 * i;
        out[i] = d < dim ? kcap_kv_load4(cache, row + kcap_u64(d), f16) : float4{0.0f, 0.0f, 0.0f, 0.0f};
    }
}

// The same dims of this token's new K or V (f32), rounded as the cache would store them.
KCAP_FN void kcap_attn_load_fresh(const KcapThread t, const KCAP_GLOBAL float* fresh, int dim, int f16,
                                  KCAP_PRIVATE float4* out) {
    KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_DIM_GROUPS; ++i) {
        const int d = 4 * int(t.lane) + 128 * i;
        float4 v = float4{0.0f, 0.0f, 0.0f, 0.0f};
        if (d < dim) {
            v = kcap_load_f32x4(fresh + d);
            v.x = kcap_kv_round(v.x, f16), v.y = kcap_kv_round(v.y, f16);
            v.z = kcap_kv_round(v.z, f16), v.w = kcap_kv_round(v.w, f16);
        }
        out[i] = v;
    }
}

KCAP_FN void kcap_attention_decode(const KcapThread t, const KcapAttentionParams p, const KCAP_GLOBAL kcap_i32* step,
                                   const KCAP_GLOBAL float* q, const KCAP_GLOBAL float* k_new,
                                   const KCAP_GLOBAL float* v_new, KCAP_GLOBAL kcap_u8* k_cache,
                                   KCAP_GLOBAL kcap_u8* v_cache, KCAP_GLOBAL float* partial_o,
                                   KCAP_GLOBAL float* partial_ml, KCAP_GLOBAL float* out, KCAP_SHARED float* shared) {
    const int kv_head = int(t.group_x);
    const int split = int(t.group_y);
    const int pos = step[0];
    const KcapDecodeSplits splits = kcap_decode_splits(p, pos);
    if (split >= splits.active) return;  // the whole group: past the keys at this position
    const int start = splits.first + split * splits.chunk;
    const int end = start + splits.chunk < pos + 1 ? start + splits.chunk : pos + 1;
    const KCAP_GLOBAL float* k_fresh = k_new + kcap_u64(kv_head) * p.head_dim;
    const KCAP_GLOBAL float* v_fresh = v_new + kcap_u64(kv_head) * p.head_dim_v;
    const int fresh_pos = p.append ? pos : -1;
    if (split == 0 && p.append) {
        for (int d = int(t.index); d < p.head_dim; d += int(t.threads))
            kcap_kv_store(k_cache, kcap_u64(pos) * p.k_width + kcap_u64(kv_head) * p.head_dim + d, k_fresh[d], p.kv_f16);
        for (int d = int(t.index); d < p.head_dim_v; d += int(t.threads))
            kcap_kv_store(v_cache, kcap_u64(pos) * p.v_width + kcap_u64(kv_head) * p.head_dim_v + d, v_fresh[d],
                          p.kv_f16);
    }
    const int group = p.n_head / p.n_head_kv;
    const kcap_u64 k_head = kcap_u64(kv_head) * p.head_dim;
    const kcap_u64 v_head = kcap_u64(kv_head) * p.head_dim_v;
    for (int g0 = 0; g0 < group; g0 += KCAP_ATTN_HEADS_PER_PASS) {
        const int heads = group - g0 < KCAP_ATTN_HEADS_PER_PASS ? group - g0 : KCAP_ATTN_HEADS_PER_PASS;
        float4 qv[KCAP_ATTN_HEADS_PER_PASS][KCAP_ATTN_DIM_GROUPS];
        float m[KCAP_ATTN_HEADS_PER_PASS], l[KCAP_ATTN_HEADS_PER_PASS];
        float4 o[KCAP_ATTN_HEADS_PER_PASS][KCAP_ATTN_DIM_GROUPS];
        KCAP_UNROLL for (int h = 0; h < KCAP_ATTN_HEADS_PER_PASS; ++h) {
            m[h] = KCAP_NEG_INFINITY;
            l[h] = 0.0f;
            const int head = kv_head * group + g0 + (h < heads ? h : 0);
            KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_DIM_GROUPS; ++i) {
                const int d = 4 * int(t.lane) + 128 * i;
                qv[h][i] = d < p.head_dim ? kcap_load_f32x4(q + kcap_u64(head) * p.head_dim + d) : float4{0.0f, 0.0f, 0.0f, 0.0f};
                o[h][i] = float4{0.0f, 0.0f, 0.0f, 0.0f};
            }
        }
        // Each step a simd group loads KCAP_ATTN_KEYS_PER_STEP keys' K and V rows at once (so
        // that many row loads are in flight, not one memory latency per key), reduces all their
        // heads' dot products across the lanes together (independent shuffles), then folds the
        // keys into the online softmax with one rescale.
        for (int j0 = start + int(t.simd) * KCAP_ATTN_KEYS_PER_STEP; j0 < end;
             j0 += int(t.simds) * KCAP_ATTN_KEYS_PER_STEP) {
            float4 k[KCAP_ATTN_KEYS_PER_STEP][KCAP_ATTN_DIM_GROUPS], v[KCAP_ATTN_KEYS_PER_STEP][KCAP_ATTN_DIM_GROUPS];
            KCAP_UNROLL for (int b = 0; b < KCAP_ATTN_KEYS_PER_STEP; ++b) {
                const int j = j0 + b;
                if (j < end && j == fresh_pos) {
                    kcap_attn_load_fresh(t, k_fresh, p.head_dim, p.kv_f16, k[b]);
                    kcap_attn_load_fresh(t, v_fresh, p.head_dim_v, p.kv_f16, v[b]);
                } else if (j < end) {
                    kcap_attn_load_row(t, k_cache, kcap_u64(j) * p.k_width + k_head, p.head_dim, p.kv_f16, k[b]);
                    kcap_attn_load_row(t, v_cache, kcap_u64(j) * p.v_width + v_head, p.head_dim_v, p.kv_f16, v[b]);
                } else {
                    KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_DIM_GROUPS; ++i)
                        k[b][i] = float4{0.0f, 0.0f, 0.0f, 0.0f}, v[b][i] = float4{0.0f, 0.0f, 0.0f, 0.0f};
                }
            }
            float dot[KCAP_ATTN_KEYS_PER_STEP][KCAP_ATTN_HEADS_PER_PASS];
            KCAP_UNROLL for (int b = 0; b < KCAP_ATTN_KEYS_PER_STEP; ++b) KCAP_UNROLL for (int h = 0; h < KCAP_ATTN_HEADS_PER_PASS; ++h) {
                dot[b][h] = 0.0f;
                KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_DIM_GROUPS; ++i)
                    dot[b][h] += qv[h][i].x * k[b][i].x + qv[h][i].y * k[b][i].y + qv[h][i].z * k[b][i].z +
                                 qv[h][i].w * k[b][i].w;
            }
            KCAP_UNROLL for (int offset = KCAP_SIMD_WIDTH / 2; offset > 0; offset >>= 1)
                KCAP_UNROLL for (int b = 0; b < KCAP_ATTN_KEYS_PER_STEP; ++b)
                    KCAP_UNROLL for (int h = 0; h < KCAP_ATTN_HEADS_PER_PASS; ++h)
                        dot[b][h] += kcap_simd_shuffle_xor(dot[b][h], offset);
            KCAP_UNROLL for (int h = 0; h < KCAP_ATTN_HEADS_PER_PASS; ++h) {
                if (h >= heads) continue;  // uniform over the simd group
                float s[KCAP_ATTN_KEYS_PER_STEP];
                float m_new = m[h];
                KCAP_UNROLL for (int b = 0; b < KCAP_ATTN_KEYS_PER_STEP; ++b) {
                    s[b] = dot[b][h] * p.scale;
                    if (p.softcap > 0.0f) s[b] = p.softcap * kcap_tanh(s[b] / p.softcap);
                    if (j0 + b < end) m_new = kcap_fmax(m_new, s[b]);  // key j0 < end always: m_new is finite
                }
                const float correction = kcap_exp(m[h] - m_new);  // 0 while m is still -inf
                float weight[KCAP_ATTN_KEYS_PER_STEP];
                float weight_sum = 0.0f;
                KCAP_UNROLL for (int b = 0; b < KCAP_ATTN_KEYS_PER_STEP; ++b) {
                    weight[b] = j0 + b < end ? kcap_exp(s[b] - m_new) : 0.0f;
                    weight_sum += weight[b];
                }
                l[h] = l[h] * correction + weight_sum;
                KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_DIM_GROUPS; ++i) {
                    float4 acc = float4{o[h][i].x * correction, o[h][i].y * correction, o[h][i].z * correction,
                                        o[h][i].w * correction};
                    KCAP_UNROLL for (int b = 0; b < KCAP_ATTN_KEYS_PER_STEP; ++b) {
                        acc.x += weight[b] * v[b][i].x;
                        acc.y += weight[b] * v[b][i].y;
                        acc.z += weight[b] * v[b][i].z;
                        acc.w += weight[b] * v[b][i].w;
                    }
                    o[h][i] = acc;
                }
                m[h] = m_new;
            }
        }
        // Merge the simd groups' states into simd group 0's: the others write theirs to
        // threadgroup memory, then group 0 folds them in (one barrier, not one per group).
        const int stride = p.head_dim_v + 2;
        if (t.simd != 0) {
            KCAP_UNROLL for (int h = 0; h < KCAP_ATTN_HEADS_PER_PASS; ++h) {
                if (h >= heads) break;
                KCAP_SHARED float* slot = shared + ((int(t.simd) - 1) * KCAP_ATTN_HEADS_PER_PASS + h) * stride;
                if (t.lane == 0) slot[0] = m[h], slot[1] = l[h];
                KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_DIM_GROUPS; ++i) {
                    const int d = 4 * int(t.lane) + 128 * i;
                    if (d < p.head_dim_v)
                        slot[2 + d] = o[h][i].x, slot[3 + d] = o[h][i].y, slot[4 + d] = o[h][i].z, slot[5 + d] = o[h][i].w;
                }
            }
        }
        kcap_barrier();
        if (t.simd == 0) {
            for (int from = 1; from < int(t.simds); ++from) {
                KCAP_UNROLL for (int h = 0; h < KCAP_ATTN_HEADS_PER_PASS; ++h) {
                    if (h >= heads) break;
                    const KCAP_SHARED float* slot = shared + ((from - 1) * KCAP_ATTN_HEADS_PER_PASS + h) * stride;
                    const float m_other = slot[0], l_other = slot[1];
                    const float m_new = kcap_fmax(m[h], m_other);
                    // A group without keys has m = -inf and l = 0: its scale is 0 (no NaN as long
                    // as one side has keys; simd group 0 always has the chunk's first key).
                    const float a = kcap_exp(m[h] - m_new), b = l_other > 0.0f ? kcap_exp(m_other - m_new) : 0.0f;
                    l[h] = l[h] * a + l_other * b;
                    KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_DIM_GROUPS; ++i) {
                        const int d = 4 * int(t.lane) + 128 * i;
                        if (d < p.head_dim_v) {
                            o[h][i].x = o[h][i].x * a + slot[2 + d] * b;
                            o[h][i].y = o[h][i].y * a + slot[3 + d] * b;
                            o[h][i].z = o[h][i].z * a + slot[4 + d] * b;
                            o[h][i].w = o[h][i].w * a + slot[5 + d] * b;
                        }
                    }
                    m[h] = m_new;
                }
            }
        }
        if (t.simd == 0) {
            KCAP_UNROLL for (int h = 0; h < KCAP_ATTN_HEADS_PER_PASS; ++h) {
                if (h >= heads) break;
                const int head = kv_head * group + g0 + h;
                const bool whole = splits.active == 1;
                const float inv = whole ? 1.0f / l[h] : 1.0f;
                const kcap_u64 slot = kcap_u64(head) * p.n_splits + split;
                KCAP_GLOBAL float* to = whole ? out + kcap_u64(head) * p.head_dim_v : partial_o + slot * p.head_dim_v;
                KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_DIM_GROUPS; ++i) {
                    const int d = 4 * int(t.lane) + 128 * i;
                    if (d < p.head_dim_v)
                        to[d] = o[h][i].x * inv, to[d + 1] = o[h][i].y * inv, to[d + 2] = o[h][i].z * inv,
                        to[d + 3] = o[h][i].w * inv;
                }
                if (!whole && t.lane == 0) {
                    partial_ml[2 * slot] = m[h];
                    partial_ml[2 * slot + 1] = l[h];
                }
            }
        }
        kcap_barrier();  // shared is reused by the next pass
    }
}

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
                                     KCAP_GLOBAL float* out, KCAP_SHARED float* shared) {
    const int active = kcap_decode_splits(p, step[0]).active;
    if (active == 1) return 0.0f;
    const kcap_u64 head = t.group_x;
    const KCAP_GLOBAL float* ml = partial_ml + head * p.n_splits * 2;
    const int d = int(t.index);
    const int dv = p.head_dim_v;
    const KCAP_GLOBAL float* po = partial_o + head * p.n_splits * dv + kcap_u64(d < dv ? d : 0);
    float l = 0.0f, acc = 0.0f;
    if (active <= KCAP_SIMD_WIDTH) {
        const int s = int(t.lane);
        const float m_s = s < active ? ml[2 * s] : KCAP_NEG_INFINITY;
        const float l_s = s < active ? ml[2 * s + 1] : 0.0f;
        const float m = kcap_simd_max(m_s);  // every active split saw keys: m is finite
        const float w_s = s < active ? kcap_exp(m_s - m) : 0.0f;
        l = kcap_simd_sum(l_s * w_s);
        int i = 0;
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
    const float v = acc * (1.0f / l);
    out[head * dv + kcap_u64(d)] = v;
    return v;
}

// Prefill (a chunk of tokens attends to the cache): kernels/attention_prefill.h, tiled.
#include "kernels/attention_prefill.h"
