// Prefill attention, tiled (flash attention in SIMT f32: no tensor cores, so the result is the
// CPU's up to summation order). Included by kernels/attention.h (kcap_kv_load4).
//
// Every token of the call attends to the cache (kcap_kv_append ran first; a shared-KV layer
// reads another layer's cache): causal (a token at position pos sees keys <= pos), optional
// sliding window (keys > pos - window), score softcap, any GQA ratio, head_dim_v != head_dim.
//
// Why tiled: walking keys per query row (the old body) read every K/V row once per query row,
// with scattered loads. Here a group owns `rows` consecutive query rows of one KV head, where
// the KV head's query rows are numbered token-major (row = token * group + query head of the
// KV head), so the query heads that share K/V (GQA) and neighbouring tokens share one staged
// copy of each K/V row, and no row tile is padded for an odd GQA ratio (3:1, 10:1 ...).
//
// Geometry (launch: grid x = ceil(n_tokens * group / rows), y = n_head_kv; threads
// 32 * row_simds * key_split):
//   - each simd group owns KCAP_ATTN_PREFILL_ROWS query rows; row_simds simd groups cover the
//     group's rows = 4 * row_simds (the queries are staged once, rows * head_dim floats <=
//     KCAP_ATTN_PREFILL_Q_FLOATS: 32 rows at head_dim 128, 16 at 256);
//   - keys go in tiles of 32 * key_split; with key_split 2 (head_dim > 204: few rows per group,
//     so each group is given more simd groups), the second set of row_simds simd groups takes
//     keys 32..63 of each tile for the same rows, and the two halves merge at the end;
//   - K and V are staged through one threadgroup buffer in chunks of 2048 values (the tile's
//     keys x 64 / key_split dims), f32 whatever the cache type, rows padded by 4 floats (no bank
//     conflicts); the next chunk is loaded into registers while this one is used, so each
//     chunk costs two barriers and no exposed memory latency;
//   - scores: lane = key (a whole q.k dot per lane, q broadcast from threadgroup memory);
//     online softmax per row (max across lanes, the sum kept per lane until the end); the
//     weights go through threadgroup memory (one broadcast float4 per key), then lane = value
//     dim (dims lane + 32 i) for the output.
// Key tiles outside [first visible key of the group's first token, last token's position] are
// never staged; within the range a simd group skips a tile none of its rows can see.
// Threadgroup memory: KCAP_ATTN_PREFILL_SHARED_FLOATS floats (29 KB, under Metal's 32 KB).
#pragma once

#define KCAP_ATTN_PREFILL_ROWS 4          // query rows per simd group
#define KCAP_ATTN_PREFILL_MAX_SIMDS 8     // simd groups per group (row_simds * key_split)
#define KCAP_ATTN_PREFILL_Q_FLOATS 4096   // staged queries: rows * head_dim <= this
#define KCAP_ATTN_PREFILL_CHUNK 2048      // K or V values staged at a time (keys x dims)
#define KCAP_ATTN_PREFILL_CHUNK_FLOATS 2304  // with the padding: 64 x (32 + 4) or 32 x (64 + 4)
#define KCAP_ATTN_PREFILL_P_FLOATS (KCAP_ATTN_PREFILL_MAX_SIMDS * KCAP_SIMD_WIDTH * KCAP_ATTN_PREFILL_ROWS)
#define KCAP_ATTN_PREFILL_SHARED_FLOATS \
    (KCAP_ATTN_PREFILL_Q_FLOATS + KCAP_ATTN_PREFILL_CHUNK_FLOATS + KCAP_ATTN_PREFILL_P_FLOATS)
// float4 slots of a chunk each thread stages: row_simds >= 4 (head_dim <= 256), so >= 128 threads.
#define KCAP_ATTN_PREFILL_STAGE (KCAP_ATTN_PREFILL_CHUNK / 4 / 128)
#define KCAP_ATTN_PREFILL_DV_SLOTS (KCAP_ATTN_MAX_HEAD_DIM / KCAP_SIMD_WIDTH)
#if KCAP_ATTN_PREFILL_ROWS != 4
#error "the weights of a key are one float4 (one per row of a simd group)"
#endif

// Simd groups that own rows (the host's launch reads the same rule: cuda_rows, metal_rows).
KCAP_FN int kcap_attn_prefill_row_simds(int head_dim) {
    const int s = KCAP_ATTN_PREFILL_Q_FLOATS / (KCAP_ATTN_PREFILL_ROWS * head_dim);
    return s < KCAP_ATTN_PREFILL_MAX_SIMDS ? s : KCAP_ATTN_PREFILL_MAX_SIMDS;
}

// This thread's share of one chunk: keys kb .. kb + tile - 1 (zeros past last_key, so masked
// keys never bring a NaN into the weighted sum) and dims c0 .. c0 + chunk - 1 (zeros past dim).
KCAP_FN void kcap_attn_prefill_load(const KcapThread t, const KCAP_GLOBAL kcap_u8* cache, int width, kcap_u64 head_off,
                                    int dim, int f16, int kb, int last_key, int c0, int chunk,
                                    KCAP_PRIVATE float4* stage) {
    const int quads = chunk / 4;
    KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_PREFILL_STAGE; ++i) {
        const int slot = int(t.index) + i * int(t.threads);
        const int key = kb + slot / quads;
        const int d = c0 + 4 * (slot % quads);
        float4 v = float4{0.0f, 0.0f, 0.0f, 0.0f};
        if (slot < KCAP_ATTN_PREFILL_CHUNK / 4 && key <= last_key && d < dim)
            v = kcap_kv_load4(cache, kcap_u64(key) * kcap_u64(width) + head_off + kcap_u64(d), f16);
        stage[i] = v;
    }
}

KCAP_FN void kcap_attn_prefill_store(const KcapThread t, int chunk, const KCAP_PRIVATE float4* stage,
                                     KCAP_SHARED float* buf) {
    const int quads = chunk / 4;
    KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_PREFILL_STAGE; ++i) {
        const int slot = int(t.index) + i * int(t.threads);
        if (slot < KCAP_ATTN_PREFILL_CHUNK / 4)
            *reinterpret_cast<KCAP_SHARED float4*>(buf + (slot / quads) * (chunk + 4) + 4 * (slot % quads)) = stage[i];
    }
}

// Grid: x = ceil(n_tokens * (n_head / n_head_kv) / (KCAP_ATTN_PREFILL_ROWS * row_simds)),
// y = n_head_kv; threads 32 * row_simds * key_split (key_split 1 or 2);
// shared: KCAP_ATTN_PREFILL_SHARED_FLOATS floats, 16-byte aligned.
KCAP_FN void kcap_attention_prefill(const KcapThread t, const KcapAttentionParams p, const KCAP_GLOBAL kcap_i32* step,
                                    const KCAP_GLOBAL float* q, const KCAP_GLOBAL kcap_u8* k_cache,
                                    const KCAP_GLOBAL kcap_u8* v_cache, KCAP_GLOBAL float* out,
                                    KCAP_SHARED float* shared, const KCAP_GLOBAL float* sinks = nullptr) {
    const int group = p.n_head / p.n_head_kv;
    const int row_simds = kcap_attn_prefill_row_simds(p.head_dim);
    const int key_split = int(t.simds) / row_simds;
    const int rows = KCAP_ATTN_PREFILL_ROWS * row_simds;
    const int total_rows = p.n_tokens * group;
    const int kv_head = int(t.group_y);
    // The last tokens see the most keys: their tiles take the lowest group indexes, which
    // start first, so the long groups do not run alone at the end.
    const int row0 = int(t.groups_x - 1 - t.group_x) * rows;
    const int last_row = (row0 + rows < total_rows ? row0 + rows : total_rows) - 1;
    const int pos0 = step[0];
    const int pos_hi = pos0 + last_row / group;  // the last key any row of the group sees
    const int pos_lo = pos0 + row0 / group;
    const int first_key = p.window > 0 && pos_lo - p.window + 1 > 0 ? pos_lo - p.window + 1 : 0;
    const int key_tile = KCAP_SIMD_WIDTH * key_split;
    const int chunk = KCAP_ATTN_PREFILL_CHUNK / key_tile;  // dims per staged chunk: 64 or 32
    const int stride = chunk + 4;
    const kcap_u64 k_head = kcap_u64(kv_head) * kcap_u64(p.head_dim);
    const kcap_u64 v_head = kcap_u64(kv_head) * kcap_u64(p.head_dim_v);

    KCAP_SHARED float* qs = shared;                                  // [rows][head_dim]
    KCAP_SHARED float* buf = shared + KCAP_ATTN_PREFILL_Q_FLOATS;    // [key_tile][stride]
    KCAP_SHARED float* weights = buf + KCAP_ATTN_PREFILL_CHUNK_FLOATS +
                                 t.simd * (KCAP_SIMD_WIDTH * KCAP_ATTN_PREFILL_ROWS);  // [32 keys][rows]

    // The group's queries (zeros for rows past the call's last token).
    const int quads = p.head_dim / 4;
    for (int i = int(t.index); i < rows * quads; i += int(t.threads)) {
        const int r = i / quads, d = 4 * (i % quads);
        const int gr = row0 + r;
        float4 v = float4{0.0f, 0.0f, 0.0f, 0.0f};
        if (gr < total_rows) {
            const kcap_u64 head = kcap_u64(gr / group) * kcap_u64(p.n_head) + kcap_u64(kv_head * group + gr % group);
            v = kcap_load_f32x4(q + head * kcap_u64(p.head_dim) + kcap_u64(d));
        }
        *reinterpret_cast<KCAP_SHARED float4*>(qs + r * p.head_dim + d) = v;
    }

    // This simd group's rows and key half.
    const int row_simd = int(t.simd) % row_simds, key_half = int(t.simd) / row_simds;
    const int first_row = row_simd * KCAP_ATTN_PREFILL_ROWS;  // in the group
    int rpos[KCAP_ATTN_PREFILL_ROWS], rfirst[KCAP_ATTN_PREFILL_ROWS];
    int see_hi = -1, see_lo = pos_hi + 1;  // keys any of its rows sees
    float m[KCAP_ATTN_PREFILL_ROWS], l[KCAP_ATTN_PREFILL_ROWS], s[KCAP_ATTN_PREFILL_ROWS];
    float o[KCAP_ATTN_PREFILL_ROWS][KCAP_ATTN_PREFILL_DV_SLOTS];
    KCAP_UNROLL for (int r = 0; r < KCAP_ATTN_PREFILL_ROWS; ++r) {
        const int gr = row0 + first_row + r;
        rpos[r] = gr < total_rows ? pos0 + gr / group : -1;  // a missing row sees no key
        rfirst[r] = p.window > 0 ? rpos[r] - p.window + 1 : 0;
        if (gr < total_rows) {
            see_hi = rpos[r] > see_hi ? rpos[r] : see_hi;
            see_lo = rfirst[r] < see_lo ? rfirst[r] : see_lo;
        }
        m[r] = KCAP_NEG_INFINITY;
        l[r] = 0.0f;
        s[r] = 0.0f;
        KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_PREFILL_DV_SLOTS; ++i) o[r][i] = 0.0f;
    }

    const int k_chunks = (p.head_dim + chunk - 1) / chunk;
    const int parts = k_chunks + (p.head_dim_v + chunk - 1) / chunk;  // K chunks, then V chunks
    float4 stage[KCAP_ATTN_PREFILL_STAGE];
    if (first_key <= pos_hi)
        kcap_attn_prefill_load(t, k_cache, p.k_width, k_head, p.head_dim, p.kv_f16, first_key, pos_hi, 0, chunk, stage);
    for (int kb = first_key; kb <= pos_hi; kb += key_tile) {
        const int key0 = kb + KCAP_SIMD_WIDTH * key_half;  // this simd group's 32 keys
        const bool live = key0 <= see_hi && key0 + KCAP_SIMD_WIDTH - 1 >= see_lo;  // uniform per simd group
        const int keys = pos_hi - key0 + 1 < KCAP_SIMD_WIDTH ? pos_hi - key0 + 1 : KCAP_SIMD_WIDTH;
        const int key = key0 + int(t.lane);
        const KCAP_SHARED float* mine = buf + (KCAP_SIMD_WIDTH * key_half) * stride;  // its keys' rows
        for (int part = 0; part < parts; ++part) {
            kcap_barrier();  // every simd group is done with the previous chunk
            kcap_attn_prefill_store(t, chunk, stage, buf);
            kcap_barrier();
            {  // the next chunk, in flight while this one is used
                const int next_kb = part + 1 == parts ? kb + key_tile : kb;
                const int next = part + 1 == parts ? 0 : part + 1;
                if (next_kb <= pos_hi) {
                    if (next < k_chunks)
                        kcap_attn_prefill_load(t, k_cache, p.k_width, k_head, p.head_dim, p.kv_f16, next_kb, pos_hi,
                                               next * chunk, chunk, stage);
                    else
                        kcap_attn_prefill_load(t, v_cache, p.v_width, v_head, p.head_dim_v, p.kv_f16, next_kb, pos_hi,
                                               (next - k_chunks) * chunk, chunk, stage);
                }
            }
            if (!live) continue;
            if (part < k_chunks) {
                // Scores: lane = key, q broadcast.
                const int c0 = part * chunk;
                const int dims = p.head_dim - c0 < chunk ? p.head_dim - c0 : chunk;
                const KCAP_SHARED float* krow = mine + int(t.lane) * stride;
                for (int d = 0; d < dims; d += 4) {
                    const float4 k = *reinterpret_cast<const KCAP_SHARED float4*>(krow + d);
                    KCAP_UNROLL for (int r = 0; r < KCAP_ATTN_PREFILL_ROWS; ++r) {
                        const float4 qv =
                            *reinterpret_cast<const KCAP_SHARED float4*>(qs + (first_row + r) * p.head_dim + c0 + d);
                        s[r] += qv.x * k.x + qv.y * k.y + qv.z * k.z + qv.w * k.w;
                    }
                }
                if (part == k_chunks - 1) {
                    // Scores complete: fold the tile into each row's online softmax.
                    float w[KCAP_ATTN_PREFILL_ROWS];
                    KCAP_UNROLL for (int r = 0; r < KCAP_ATTN_PREFILL_ROWS; ++r) {
                        const bool seen = key <= rpos[r] && key >= rfirst[r];
                        float score = s[r] * p.scale;
                        if (p.softcap > 0.0f) score = p.softcap * kcap_tanh(score / p.softcap);
                        score = seen ? score : KCAP_NEG_INFINITY;
                        const float m_new = kcap_fmax(m[r], kcap_simd_max(score));
                        // 0 while m is still -inf; 1 while no key was seen at all (no -inf - -inf)
                        const float correction = m_new == KCAP_NEG_INFINITY ? 1.0f : kcap_exp(m[r] - m_new);
                        w[r] = seen ? kcap_exp(score - m_new) : 0.0f;
                        l[r] = l[r] * correction + w[r];  // per lane; summed across lanes at the end
                        KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_PREFILL_DV_SLOTS; ++i) o[r][i] *= correction;
                        m[r] = m_new;
                        s[r] = 0.0f;
                    }
                    *reinterpret_cast<KCAP_SHARED float4*>(weights + int(t.lane) * KCAP_ATTN_PREFILL_ROWS) =
                        float4{w[0], w[1], w[2], w[3]};
                    kcap_simd_barrier();
                }
            } else {
                // Output: lane = value dim (dims 32 i + lane of this chunk's slots).
                const int c0 = (part - k_chunks) * chunk;
                const int dims = p.head_dim_v - c0 < chunk ? p.head_dim_v - c0 : chunk;
                KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_PREFILL_DV_SLOTS; ++i) {
                    const int dl = KCAP_SIMD_WIDTH * i - c0 + int(t.lane);
                    if (KCAP_SIMD_WIDTH * i >= c0 && dl < dims) {
                        float acc0 = o[0][i], acc1 = o[1][i], acc2 = o[2][i], acc3 = o[3][i];
                        for (int j = 0; j < keys; ++j) {
                            const float4 wj = *reinterpret_cast<const KCAP_SHARED float4*>(weights + j * KCAP_ATTN_PREFILL_ROWS);
                            const float v = mine[j * stride + dl];
                            acc0 += wj.x * v;
                            acc1 += wj.y * v;
                            acc2 += wj.z * v;
                            acc3 += wj.w * v;
                        }
                        o[0][i] = acc0, o[1][i] = acc1, o[2][i] = acc2, o[3][i] = acc3;
                    }
                }
            }
        }
    }
    KCAP_UNROLL for (int r = 0; r < KCAP_ATTN_PREFILL_ROWS; ++r) l[r] = kcap_simd_sum(l[r]);

    // The key halves meet in the first half's simd groups (threadgroup memory reused: a
    // [rows][head_dim_v + 2] slot per row, at most 16 x 258 floats).
    const int slot_stride = p.head_dim_v + 2;
    for (int from = 1; from < key_split; ++from) {
        kcap_barrier();
        if (key_half == from) {
            KCAP_UNROLL for (int r = 0; r < KCAP_ATTN_PREFILL_ROWS; ++r) {
                KCAP_SHARED float* slot = shared + (first_row + r) * slot_stride;
                if (t.lane == 0) slot[0] = m[r], slot[1] = l[r];
                KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_PREFILL_DV_SLOTS; ++i) {
                    const int d = KCAP_SIMD_WIDTH * i + int(t.lane);
                    if (d < p.head_dim_v) slot[2 + d] = o[r][i];
                }
            }
        }
        kcap_barrier();
        if (key_half == 0) {
            KCAP_UNROLL for (int r = 0; r < KCAP_ATTN_PREFILL_ROWS; ++r) {
                const KCAP_SHARED float* slot = shared + (first_row + r) * slot_stride;
                const float m_other = slot[0], l_other = slot[1];
                const float m_new = kcap_fmax(m[r], m_other);
                // A side without keys has l = 0 (and m = -inf): its scale is 0, never NaN.
                const float a = l[r] > 0.0f ? kcap_exp(m[r] - m_new) : 0.0f;
                const float b = l_other > 0.0f ? kcap_exp(m_other - m_new) : 0.0f;
                l[r] = l[r] * a + l_other * b;
                KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_PREFILL_DV_SLOTS; ++i) {
                    const int d = KCAP_SIMD_WIDTH * i + int(t.lane);
                    if (d < p.head_dim_v) o[r][i] = o[r][i] * a + slot[2 + d] * b;
                }
                m[r] = m_new;
            }
        }
    }
    if (key_half != 0) return;
    KCAP_UNROLL for (int r = 0; r < KCAP_ATTN_PREFILL_ROWS; ++r) {
        const int gr = row0 + first_row + r;
        if (gr >= total_rows) break;
        const kcap_u64 head = kcap_u64(gr / group) * kcap_u64(p.n_head) + kcap_u64(kv_head * group + gr % group);
        const float inv = 1.0f / kcap_attn_denominator(sinks, kv_head * group + gr % group, m[r], l[r]);
        KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_PREFILL_DV_SLOTS; ++i) {
            const int d = KCAP_SIMD_WIDTH * i + int(t.lane);
            if (d < p.head_dim_v) out[head * kcap_u64(p.head_dim_v) + kcap_u64(d)] = o[r][i] * inv;
        }
    }
}
