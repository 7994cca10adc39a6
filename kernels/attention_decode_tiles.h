// Decode attention with the split's keys staged in threadgroup memory, one query head per simd
// group (kcap_attention_decode_tiles): the body CUDA's decode rows run for heads of 64 or 128
// dims (K and V alike) with 4 or 8 query heads per KV head (cuda_rows::attn_decode_tiles; other
// shapes, and Metal, run kcap_attention_decode_dims).
//
// One group per (KV head, key split); its simd group s takes query head s of the KV head over
// all of the split's keys, so no simd group's state has to be merged with another's: each
// writes its head's (max, sum, output) as the split's partial (the layout kcap_attention_combine
// reads), or the head's output where one split covers every key. The split's keys go through in
// tiles of KCAP_ATTN_TILE_KEYS: the whole group copies a tile's K and V rows from the cache into
// threadgroup memory (f32) once, and every simd group reads them from there:
//   scores: lane (part, key) = (lane / 8, lane % 8) multiplies a quarter of the head's dims of
//     keys key, key + 8, key + 16, key + 24 (the query's quarter in registers), two shuffles sum
//     the quarters; one online-softmax update per tile;
//   values: lane l holds dims D / 32 * l .. of the output and adds each key's V row times its
//     weight (a broadcast from the lane holding it).
// The first tile's cached rows are read and staged before the kernel's wait (Wait::wait(): they
// are older than the launch before it, which they wait out under CUDA's programmatic dependent
// launch); after it come the query (QK-normed and rotated when the
// decode owns the rope) and, in the split holding the position, this token's K and V, which simd
// group 0 stages in their row (rounded as the cache stores them) and appends to the cache. A
// longer split stages its next tiles in turn (CUDA asks L2 for their rows before its wait).
#pragma once

#define KCAP_ATTN_TILE_KEYS 32
#define KCAP_ATTN_TILE_MAX_SIMDS 8
// Threadgroup memory (floats) at head dim `dim`: the K tile (rows padded by 4 floats, so the
// 8 lanes of one 16-byte load phase read 8 different rows in distinct banks), the V tile, and
// one query row per simd group.
#define KCAP_ATTN_TILE_K_STRIDE(dim) ((dim) + 4)
#define KCAP_ATTN_TILE_SHARED_FLOATS(dim) \
    (KCAP_ATTN_TILE_KEYS * KCAP_ATTN_TILE_K_STRIDE(dim) + KCAP_ATTN_TILE_KEYS * (dim) + KCAP_ATTN_TILE_MAX_SIMDS * (dim))

// A tile's K and V rows in 16-byte chunks (4 f32 or 8 f16 values); each thread of a group of at
// S simd groups holds `per_thread` of them.
template <int D, int F16, int S>
struct KcapAttnTileChunks {
    enum : int {
        values = F16 ? 8 : 4,
        per_row = D / values,
        total = 2 * KCAP_ATTN_TILE_KEYS * per_row,
        per_thread = total / (KCAP_SIMD_WIDTH * S),
    };
};

KCAP_FN float4 kcap_attn_shared4(const KCAP_SHARED float* at) { return *reinterpret_cast<const KCAP_SHARED float4*>(at); }
KCAP_FN void kcap_attn_shared4_store(KCAP_SHARED float* at, const float4 v) { *reinterpret_cast<KCAP_SHARED float4*>(at) = v; }

// Reads the cached K and V rows of keys j0 .. j0 + 31 (those before `end`, except fresh_pos,
// which is not in the cache yet) as raw 16-byte chunks, chunk c = t.index + i * t.threads:
// K rows' chunks first, then V rows'. head: the KV head's first value in a K or V row (the K
// and V heads have D dims alike).
template <int D, int F16, int S>
KCAP_FN void kcap_attn_tile_load(const KcapThread t, const KcapAttentionParams p, const KCAP_GLOBAL kcap_u8* k_cache,
                                 const KCAP_GLOBAL kcap_u8* v_cache, kcap_u64 head, int j0, int end,
                                 int fresh_pos, KCAP_PRIVATE uint4* raw) {
    typedef KcapAttnTileChunks<D, F16, S> C;
    KCAP_UNROLL for (int i = 0; i < C::per_thread; ++i) {
        raw[i] = uint4{0u, 0u, 0u, 0u};
        const int c = int(t.index) + i * int(t.threads);
        const int row = c / C::per_row, part = c % C::per_row;
        const int j = j0 + (row % KCAP_ATTN_TILE_KEYS);
        if (c >= C::total || j >= end || j == fresh_pos) continue;
        const bool is_v = row >= KCAP_ATTN_TILE_KEYS;
        const kcap_u64 e = kcap_u64(j) * (is_v ? p.v_width : p.k_width) + head +
                           kcap_u64(part) * C::values;
        raw[i] = kcap_load_u32x4((is_v ? v_cache : k_cache) + e * (F16 ? 2 : 4));
    }
}

// Stores what kcap_attn_tile_load read into the K and V tiles as f32 (rows of keys past `end`
// as zeros; the row of fresh_pos is left to the caller).
template <int D, int F16, int S>
KCAP_FN void kcap_attn_tile_store(const KcapThread t, int j0, int fresh_pos, const KCAP_PRIVATE uint4* raw,
                                  KCAP_SHARED float* k_tile, KCAP_SHARED float* v_tile) {
    typedef KcapAttnTileChunks<D, F16, S> C;
    KCAP_UNROLL for (int i = 0; i < C::per_thread; ++i) {
        const int c = int(t.index) + i * int(t.threads);
        const int row = c / C::per_row, part = c % C::per_row;
        const int key = row % KCAP_ATTN_TILE_KEYS;
        if (c >= C::total || j0 + key == fresh_pos) continue;
        KCAP_SHARED float* to = row >= KCAP_ATTN_TILE_KEYS ? v_tile + key * D + part * C::values
                                                           : k_tile + key * KCAP_ATTN_TILE_K_STRIDE(D) + part * C::values;
        const uint4 w = raw[i];
        if (F16) {
            kcap_attn_shared4_store(to, float4{kcap_half_to_float(kcap_u16(w.x & 0xffffu)), kcap_half_to_float(kcap_u16(w.x >> 16)),
                                               kcap_half_to_float(kcap_u16(w.y & 0xffffu)), kcap_half_to_float(kcap_u16(w.y >> 16))});
            kcap_attn_shared4_store(to + 4, float4{kcap_half_to_float(kcap_u16(w.z & 0xffffu)), kcap_half_to_float(kcap_u16(w.z >> 16)),
                                                   kcap_half_to_float(kcap_u16(w.w & 0xffffu)), kcap_half_to_float(kcap_u16(w.w >> 16))});
        } else {
            kcap_attn_shared4_store(to, float4{kcap_as_float(w.x), kcap_as_float(w.y), kcap_as_float(w.z), kcap_as_float(w.w)});
        }
    }
}

// Simd group 0 puts this token's K (k_fresh, as the lanes hold a head: dims 4 lane ..; rotated
// and rounded) and V (rounded from v_fresh) in tile row `key`.
template <int D>
KCAP_FN void kcap_attn_tile_fresh(const KcapThread t, const KcapAttentionParams p, int key, const float4 k_fresh,
                                  const KCAP_GLOBAL float* v_fresh, KCAP_SHARED float* k_tile, KCAP_SHARED float* v_tile) {
    const int d = 4 * int(t.lane);
    if (d >= D) return;
    kcap_attn_shared4_store(k_tile + key * KCAP_ATTN_TILE_K_STRIDE(D) + d, k_fresh);
    const float4 v = kcap_load_f32x4(v_fresh + d);
    kcap_attn_shared4_store(v_tile + key * D + d, float4{kcap_kv_round(v.x, p.kv_f16), kcap_kv_round(v.y, p.kv_f16),
                                                         kcap_kv_round(v.z, p.kv_f16), kcap_kv_round(v.w, p.kv_f16)});
}

// D: the heads' dims (64 or 128, K and V alike); F16: the cache holds f16 (p.kv_f16); S: the
// query heads per KV head (n_head / n_head_kv: 4 or 8), one simd group each. Grid: x = n_head_kv,
// y = n_splits; threads 32 S; shared: KCAP_ATTN_TILE_SHARED_FLOATS(D) floats. The other
// arguments as kcap_attention_decode_dims'.
template <int D, int F16, int S, class Wait = KcapNoWait>
KCAP_FN void kcap_attention_decode_tiles(const KcapThread t, const KcapAttentionParams p, const KCAP_GLOBAL kcap_i32* step,
                                         const KCAP_GLOBAL float* q, const KCAP_GLOBAL float* k_new,
                                         const KCAP_GLOBAL float* v_new, KCAP_GLOBAL kcap_u8* k_cache,
                                         KCAP_GLOBAL kcap_u8* v_cache, KCAP_GLOBAL float* partial_o,
                                         KCAP_GLOBAL float* partial_ml, KCAP_GLOBAL float* out, KCAP_SHARED float* shared,
                                         const KCAP_GLOBAL float2* cos_sin, const KCAP_GLOBAL float* q_norm,
                                         const KCAP_GLOBAL float* k_norm, const KCAP_GLOBAL float* sinks) {
    static_assert((D == 64 || D == 128) && (S == 4 || S == 8), "heads of 64 or 128 dims, 4 or 8 per KV head");
    typedef KcapAttnTileChunks<D, F16, S> C;
    constexpr int KT = KCAP_ATTN_TILE_KEYS;
    constexpr int QUARTER = D / 4;          // dims of a query quarter (a lane's share of a score)
    constexpr int PER_LANE = D / KCAP_SIMD_WIDTH;  // output dims per lane (2 or 4)
    KCAP_SHARED float* k_tile = shared;
    KCAP_SHARED float* v_tile = shared + KT * KCAP_ATTN_TILE_K_STRIDE(D);
    KCAP_SHARED float* q_rows = v_tile + KT * D;
    const int kv_head = int(t.group_x);
    const int split = int(t.group_y);
    const int pos = step[0];
    const KcapDecodeSplits splits = kcap_decode_splits(p, pos);
    const KcapDecodeRange range = kcap_decode_range(splits, split, pos);
    if (!range.active) {  // the whole group: past the keys at this position
        Wait::wait();
        return;
    }
    const int start = range.start, end = range.end;
    const int fresh_pos = p.append ? pos : -1;
    const bool fresh_split = p.append && split == splits.active - 1;
    const kcap_u64 kv_at = kcap_u64(kv_head) * D;  // the KV head's first value in a K, V or new K/V row
    const int head = kv_head * S + int(t.simd);  // this simd group's query head
    const KCAP_GLOBAL float2* cs_row = cos_sin + (p.rope ? kcap_u64(pos) * (D / 2) : 0);
    // Before the wait: the rope's and QK-norms' values, and the first tile's cached rows staged.
    const KcapAttnRopeLane<1> rope = kcap_attn_rope_lane<1>(t, p, cs_row, q_norm, k_norm, fresh_split && t.simd == 0);
    uint4 raw[C::per_thread];
    kcap_attn_tile_load<D, F16, S>(t, p, k_cache, v_cache, kv_at, start, end, fresh_pos, raw);
    kcap_attn_tile_store<D, F16, S>(t, start, fresh_pos, raw, k_tile, v_tile);
    Wait::wait();
    // The query (dims 4 lane ..), and in the split holding pos this token's K, rotated and rounded.
    float4 qv[1];
    qv[0] = 4 * int(t.lane) < D ? kcap_load_f32x4(q + kcap_u64(head) * D + 4 * t.lane) : float4{0.0f, 0.0f, 0.0f, 0.0f};
    float4 k_fresh[1];
    k_fresh[0] = float4{0.0f, 0.0f, 0.0f, 0.0f};
    const KCAP_GLOBAL float* v_fresh = v_new + kv_at;
    if (fresh_split && t.simd == 0) {
        kcap_attn_load_fresh_raw<1>(t, k_new + kv_at, D, k_fresh);
        if (p.rope) kcap_attn_rope_head<1>(t, p, rope.cs, rope.k_norm, k_fresh);
        kcap_attn_round_row<1>(p.kv_f16, k_fresh);
        // The cache append: one group per KV head holds pos.
        kcap_attn_append_fresh<1>(t, p, pos, kv_head, k_fresh, v_fresh, k_cache, v_cache);
    }
    if (fresh_split && t.simd == 0 && pos < start + KT)
        kcap_attn_tile_fresh<D>(t, p, pos - start, k_fresh[0], v_fresh, k_tile, v_tile);
    if (p.rope) kcap_attn_rope_head<1>(t, p, rope.cs, rope.q_norm, qv);
    KCAP_SHARED float* q_row = q_rows + int(t.simd) * D;
    if (4 * int(t.lane) < D) kcap_attn_shared4_store(q_row + 4 * t.lane, qv[0]);
    kcap_barrier();  // the first tile and every query row staged
    // The lane's quarter of the query: dims QUARTER * part ..
    const int part = int(t.lane) / 8, key8 = int(t.lane) % 8;
    float4 qq[QUARTER / 4];
    KCAP_UNROLL for (int i = 0; i < QUARTER / 4; ++i) qq[i] = kcap_attn_shared4(q_row + QUARTER * part + 4 * i);
    float m = KCAP_NEG_INFINITY, l = 0.0f;
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // the first PER_LANE are the lane's dims
    for (int j0 = start; j0 < end; j0 += KT) {
        if (j0 != start) {
            kcap_barrier();  // every simd group is done with the previous tile
            kcap_attn_tile_load<D, F16, S>(t, p, k_cache, v_cache, kv_at, j0, end, fresh_pos, raw);
            kcap_attn_tile_store<D, F16, S>(t, j0, fresh_pos, raw, k_tile, v_tile);
            if (fresh_split && t.simd == 0 && pos >= j0 && pos < j0 + KT)
                kcap_attn_tile_fresh<D>(t, p, pos - j0, k_fresh[0], v_fresh, k_tile, v_tile);
            kcap_barrier();
        }
        // Scores of keys j0 + 8 b + key8 (b = 0 .. 3), this lane's quarter, then summed over the quarters.
        float s[4];
        KCAP_UNROLL for (int b = 0; b < 4; ++b) {
            const KCAP_SHARED float* k_row = k_tile + (8 * b + key8) * KCAP_ATTN_TILE_K_STRIDE(D) + QUARTER * part;
            float acc0 = 0.0f, acc1 = 0.0f;
            KCAP_UNROLL for (int i = 0; i < QUARTER / 4; i += 2) {
                const float4 k0 = kcap_attn_shared4(k_row + 4 * i), k1 = kcap_attn_shared4(k_row + 4 * i + 4);
                acc0 += qq[i].x * k0.x + qq[i].y * k0.y + qq[i].z * k0.z + qq[i].w * k0.w;
                acc1 += qq[i + 1].x * k1.x + qq[i + 1].y * k1.y + qq[i + 1].z * k1.z + qq[i + 1].w * k1.w;
            }
            s[b] = acc0 + acc1;
        }
        KCAP_UNROLL for (int b = 0; b < 4; ++b) {
            s[b] += kcap_simd_shuffle_xor(s[b], 8);
            s[b] += kcap_simd_shuffle_xor(s[b], 16);
        }
        float m_tile = KCAP_NEG_INFINITY;
        KCAP_UNROLL for (int b = 0; b < 4; ++b) {
            s[b] *= p.scale;
            if (p.softcap > 0.0f) s[b] = p.softcap * kcap_tanh(s[b] / p.softcap);
            if (j0 + 8 * b + key8 < end) m_tile = kcap_fmax(m_tile, s[b]);
        }
        KCAP_UNROLL for (int mask = 1; mask < 8; mask <<= 1) m_tile = kcap_fmax(m_tile, kcap_simd_shuffle_xor(m_tile, mask));
        const float m_new = kcap_fmax(m, m_tile);  // key j0 < end: finite
        const float correction = kcap_exp(m - m_new);  // 0 while m is still -inf
        float w[4];
        float w_sum = 0.0f;
        KCAP_UNROLL for (int b = 0; b < 4; ++b) {
            w[b] = j0 + 8 * b + key8 < end ? kcap_exp(s[b] - m_new) : 0.0f;
            w_sum += w[b];
        }
        KCAP_UNROLL for (int mask = 1; mask < 8; mask <<= 1) w_sum += kcap_simd_shuffle_xor(w_sum, mask);
        l = l * correction + w_sum;
        m = m_new;
        KCAP_UNROLL for (int c = 0; c < PER_LANE; ++c) o[c] *= correction;
        // Each key's V row times its weight (lane key8 of the key's b holds it), keys in order.
        const int keys = end - j0 < KT ? end - j0 : KT;
        KCAP_UNROLL for (int b = 0; b < 4; ++b) KCAP_UNROLL for (int k8 = 0; k8 < 8; ++k8) {
            const int key = 8 * b + k8;
            if (key >= keys) break;
            const float wk = kcap_simd_broadcast(w[b], k8);
            const KCAP_SHARED float* v_row = v_tile + key * D + PER_LANE * int(t.lane);
            if (PER_LANE == 4) {
                const float4 v = kcap_attn_shared4(v_row);
                o[0] += wk * v.x, o[1] += wk * v.y, o[2] += wk * v.z, o[3] += wk * v.w;
            } else {
                KCAP_UNROLL for (int c = 0; c < PER_LANE; ++c) o[c] += wk * v_row[c];
            }
        }
    }
    const bool whole = splits.active == 1;
    const kcap_u64 slot = kcap_u64(head) * p.n_splits + split;
    KCAP_GLOBAL float* to = (whole ? out + kcap_u64(head) * D : partial_o + slot * D) + PER_LANE * t.lane;
    const float scale = whole ? 1.0f / kcap_attn_denominator(sinks, head, m, l) : 1.0f;
    KCAP_UNROLL for (int c = 0; c < PER_LANE; ++c) to[c] = o[c] * scale;
    if (!whole && t.lane == 0) {
        partial_ml[2 * slot] = m;
        partial_ml[2 * slot + 1] = l;
    }
}
