// Mixture-of-experts bodies (CUDA and Metal entries, host tests):
//   kcap_moe_logits    the router's logits, times logit_scale, into [tokens][n_expert]: each simd
//                      group takes KCAP_MOE_LOGIT_EXPERTS experts' rows (its lanes 32-element runs of them) for up to
//                      KCAP_MOE_LOGIT_TOKENS tokens at once, against their x staged in threadgroup
//                      memory, so a group decodes its row once per KCAP_MOE_LOGIT_TOKENS tokens,
//                      and the grid spreads the router's rows over the device (one group reading
//                      all of them was 185 us a decode step on the H200 for Qwen3-30B-A3B's 1 MB
//                      F32 router).
//   kcap_moe_logits_tiled  the same logits for many tokens as a tiled matmul: a group per tile
//                      of 32 tokens x 32 experts and slice of K (the slices' partial sums added in
//                      order by kcap_moe_route), each weight run decoded once per tile and each x
//                      run staged once per tile (the simd groups above decode a row per
//                      KCAP_MOE_LOGIT_TOKENS tokens and stage x per expert pair); the slices give
//                      the grid enough groups (Qwen3-30B-A3B's 128 experts x 512 tokens are 64
//                      tiles; 512 groups with 8 slices of K 2048).
//   kcap_moe_route     one simd group per token, from its logits: the n_used largest (the lower
//                      index first on a tie, as the CPU row does; a sigmoid router's by their
//                      sigmoid plus a choice bias, within the best groups of group-limited
//                      routing), their softmax weights over every expert (or their sigmoids),
//                      optionally renormalized, times the scale and (expert_scaled)
//                      the chosen expert's entry of expert_scale: a Routing row (ids as floats,
//                      then weights).
//   kcap_moe_gate_up   act(gate_e x) * up_e x of one (token, chosen expert) slot per grid row
//                      (gate_up_merged: gate and up are one tensor, expert e's gate rows then its
//                      up rows)
//   kcap_moe_down      (group_y), then down_e of it: kernels/matvec.h's staged matvec on the
//                      chosen expert's rows, found from the Routing buffer in the kernel, so a
//                      call reads only the chosen experts' weights.
//   kcap_moe_combine   out[token][o] = sum over the token's slots of weight * down[row][o], row the
//                      slot itself or (slot_rows) where the grouped rows put it (+ shared[token][o],
//                      an ungated shared expert's output, where given).
//   kcap_moe_shared_gate  out = in + sigmoid(w . x) * shared, one group per token.
#pragma once

#include "kernels/matmul.h"
#include "kernels/matvec.h"
#include "kernels/params.h"


// Grid: x = ceil(n_expert / (simds * KCAP_MOE_LOGIT_EXPERTS)), y = ceil(n_tokens /
// KCAP_MOE_LOGIT_TOKENS). K a multiple of 32 (whole runs). shared: KCAP_MOE_LOGIT_SHARED_FLOATS.
// logits: [n_tokens - first_token][n_expert], from token first_token (a group's own tokens only:
// cuda.moe_route_cluster's cluster writes its tokens' rows into one group's threadgroup memory).
// The group stages its tokens' x, KCAP_MOE_LOGIT_CHUNK_RUNS runs at a time, in threadgroup
// memory (coalesced loads; runs padded to KCAP_MATVEC_RUN_STRIDE floats, so a lane's reads of its
// own run do not collide), as the decode matvec does: a lane reading its run of x straight from
// global memory touches 32 lines per load, which bounded the router at 840 us for 512 tokens.
// Each simd group takes KCAP_MOE_LOGIT_EXPERTS experts, so a staged run of x serves all of them.
// x_staged: one token whose whole row the caller already put in xs (run r at r *
// KCAP_MATVEC_RUN_STRIDE; K at most KCAP_MOE_LOGIT_TOKENS * KCAP_MOE_LOGIT_CHUNK_RUNS runs) and
// the group met at a barrier since; x is not read.
template <class F>
KCAP_FN void kcap_moe_logits(const KcapThread t, const KcapMoeParams p, const KCAP_GLOBAL kcap_u8* w,
                             const KCAP_GLOBAL float* x, KCAP_GLOBAL float* logits, KCAP_SHARED float* xs,
                             const KCAP_GLOBAL float* bias = nullptr, int first_token = 0, bool x_staged = false) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    constexpr int kChunk = KCAP_MOE_LOGIT_CHUNK_RUNS;
    constexpr int kExperts = KCAP_MOE_LOGIT_EXPERTS;
    constexpr int kTokens = KCAP_MOE_LOGIT_TOKENS;
    const int e0 = int(t.group_x * t.simds + t.simd) * kExperts;
    const bool active = e0 < p.n_expert;  // every simd group stages and meets the barriers
    const int token0 = int(t.group_y) * kTokens;
    const int tokens = p.n_tokens - token0 < kTokens ? p.n_tokens - token0 : kTokens;
    const int runs = p.k / 32;
    float acc[kExperts][kTokens];
    KCAP_UNROLL for (int i = 0; i < kExperts; ++i) KCAP_UNROLL for (int j = 0; j < kTokens; ++j) acc[i][j] = 0.0f;
    // Runs staged per token at a time: the threadgroup memory holds kTokens x kChunk runs, so a
    // call of fewer tokens (a decode's one) stages more of each token's x per pass (fewer
    // passes, each a global load and a barrier before its weights' loads).
    const int chunk = kTokens * kChunk / tokens;
    for (int chunk0 = 0; chunk0 < runs; chunk0 += chunk) {
        const int chunk_runs = runs - chunk0 < chunk ? runs - chunk0 : chunk;
        if (!x_staged) {
            if (chunk0 > 0) kcap_barrier();  // everyone is done with the previous chunk
            // float4 i: token i / (chunk_runs * 8), run (i / 8) % chunk_runs, values 4 (i % 8) ..
            for (int i = int(t.index); i < tokens * chunk_runs * 8; i += int(t.threads)) {
                const int j = i / (chunk_runs * 8), r = (i / 8) % chunk_runs;
                const float4 v = kcap_load_f32x4(x + kcap_u64(token0 + j) * kcap_u64(p.k) +
                                                 kcap_u64(chunk0 + r) * 32 + kcap_u64(4 * (i % 8)));
                KCAP_SHARED float* to = xs + (j * chunk + r) * KCAP_MATVEC_RUN_STRIDE + 4 * (i % 8);
                to[0] = v.x, to[1] = v.y, to[2] = v.z, to[3] = v.w;
            }
            kcap_barrier();
        }
        if (!active) continue;
        for (int r = int(t.lane); r < chunk_runs; r += KCAP_SIMD_WIDTH) {
            const int run = chunk0 + r;
            const unsigned block_offset = unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes);
            float wv[kExperts][32];
            KCAP_UNROLL for (int i = 0; i < kExperts; ++i) {
                const int e = e0 + i < p.n_expert ? e0 + i : e0;  // past the last expert: a copy, not written
                F::decode32(w + kcap_u64(e) * p.router_row_bytes + block_offset, run % kRunsPerBlock, wv[i]);
            }
            KCAP_UNROLL for (int j = 0; j < kTokens; ++j) {
                if (j < tokens) {
                    float xv[32];
                    const KCAP_SHARED float* from = xs + (j * chunk + r) * KCAP_MATVEC_RUN_STRIDE;
                    KCAP_UNROLL for (int i = 0; i < 32; ++i) xv[i] = from[i];
                    KCAP_UNROLL for (int i = 0; i < kExperts; ++i) acc[i][j] += kcap_dot32(wv[i], xv);
                }
            }
        }
    }
    if (!active) return;  // past the barriers: the whole simd group
    KCAP_UNROLL for (int i = 0; i < kExperts; ++i)
        KCAP_UNROLL for (int j = 0; j < kTokens; ++j) {
            if (j < tokens) {
                const float sum = kcap_simd_sum(acc[i][j]);
                if (t.lane == 0 && e0 + i < p.n_expert)
                    logits[kcap_u64(token0 + j - first_token) * kcap_u64(p.n_expert) + kcap_u64(e0 + i)] =
                        (bias ? sum + bias[e0 + i] : sum) * p.logit_scale;
            }
        }
}

// The number of K slices of kcap_moe_logits_tiled for K = k (a multiple of 32), and the runs of
// each (the last may be shorter): slices of KCAP_MOE_TILE_SPLIT_RUNS runs, at most
// KCAP_MOE_TILE_MAX_SPLITS (longer slices past that). A function of K only.
KCAP_HOST_FN int kcap_moe_tile_split_runs(int k) {
    const int runs = k / 32;
    const int per = (runs + KCAP_MOE_TILE_MAX_SPLITS - 1) / KCAP_MOE_TILE_MAX_SPLITS;
    return per > KCAP_MOE_TILE_SPLIT_RUNS ? per : KCAP_MOE_TILE_SPLIT_RUNS;
}
KCAP_HOST_FN int kcap_moe_tile_splits(int k) {
    const int per = kcap_moe_tile_split_runs(k);
    return (k / 32 + per - 1) / per;
}

// Grid: x = ceil(n_expert / KCAP_MOE_TILE) * splits (kcap_moe_tile_splits: the expert tile is
// group_x % tiles, the K slice group_x / tiles), y = ceil(n_tokens / KCAP_MOE_TILE);
// KCAP_MOE_TILE_THREADS threads; shared: KCAP_MOE_TILE_SHARED_FLOATS. K a multiple of 32.
// partials: [splits][n_tokens][n_expert], each slice's sums (no bias, no scale: kcap_moe_route
// adds the slices in order, then those). Thread i takes tokens i % 16 and i % 16 + 16 of the
// tile and its experts 4 (i / 16) .. + 3: in a simd group 16 tokens and 8 experts, so each
// staged value a lane reads is in a bank of its own or read by all its readers at once. Each
// stage: the tile's x (float4 loads along K) and one run of one expert's row decoded per thread
// (32 experts x 4 runs), then 128 products per output.
template <class F>
KCAP_FN void kcap_moe_logits_tiled(const KcapThread t, const KcapMoeParams p, const KCAP_GLOBAL kcap_u8* w,
                                   const KCAP_GLOBAL float* x, KCAP_GLOBAL float* partials, KCAP_SHARED float* shared) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    constexpr int kTile = KCAP_MOE_TILE, kStride = KCAP_MOE_TILE_STRIDE, kStageRuns = KCAP_MOE_TILE_STAGE_RUNS;
    KCAP_SHARED float* xs = shared;                  // [token][kStride]
    KCAP_SHARED float* ws = shared + kTile * kStride;  // [expert][kStride]
    const int tiles = (p.n_expert + kTile - 1) / kTile;
    const int split = int(t.group_x) / tiles;
    const int e0 = (int(t.group_x) % tiles) * kTile, token0 = int(t.group_y) * kTile;
    const int per = kcap_moe_tile_split_runs(p.k), runs = p.k / 32;
    const int run0 = split * per, run_end = run0 + per < runs ? run0 + per : runs;
    const int my_token = int(t.index) % 16, my_experts = 4 * (int(t.index) / 16);
    float acc[2][4];
    KCAP_UNROLL for (int i = 0; i < 2; ++i) KCAP_UNROLL for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int stage0 = run0; stage0 < run_end; stage0 += kStageRuns) {
        const int stage_runs = run_end - stage0 < kStageRuns ? run_end - stage0 : kStageRuns;
        if (stage0 > run0) kcap_barrier();  // everyone is done with the previous stage
        // x: float4 i of the stage is token i / (8 kStageRuns), values 4 (i % (8 kStageRuns)) ..;
        // zeros past the last token and the slice's last run.
        for (int i = int(t.index); i < kTile * 8 * kStageRuns; i += int(t.threads)) {
            const int token = i / (8 * kStageRuns), q = i % (8 * kStageRuns);
            KCAP_SHARED float* to = xs + token * kStride + 4 * q;
            if (token0 + token < p.n_tokens && q < 8 * stage_runs) {
                const float4 v = kcap_load_f32x4(x + kcap_u64(token0 + token) * kcap_u64(p.k) + kcap_u64(stage0) * 32 +
                                                 kcap_u64(4 * q));
                to[0] = v.x, to[1] = v.y, to[2] = v.z, to[3] = v.w;
            } else {
                to[0] = to[1] = to[2] = to[3] = 0.0f;
            }
        }
        // Weights: run i % kStageRuns of expert e0 + i / kStageRuns; zeros past the last expert
        // and the slice's last run.
        for (int i = int(t.index); i < kTile * kStageRuns; i += int(t.threads)) {
            const int e = e0 + i / kStageRuns, r = i % kStageRuns, run = stage0 + r;
            float v[32];
            if (e < p.n_expert && r < stage_runs) {
                F::decode32(w + kcap_u64(e) * p.router_row_bytes + kcap_u64(run / kRunsPerBlock) * F::block_bytes,
                            run % kRunsPerBlock, v);
            } else {
                KCAP_UNROLL for (int j = 0; j < 32; ++j) v[j] = 0.0f;
            }
            KCAP_SHARED float* to = ws + (i / kStageRuns) * kStride + 32 * r;
            KCAP_UNROLL for (int j = 0; j < 32; ++j) to[j] = v[j];
        }
        kcap_barrier();
        const int values = 32 * stage_runs;
        for (int k = 0; k < values; ++k) {
            const float xa = xs[my_token * kStride + k], xb = xs[(my_token + 16) * kStride + k];
            KCAP_UNROLL for (int j = 0; j < 4; ++j) {
                const float wv = ws[(my_experts + j) * kStride + k];
                acc[0][j] += xa * wv;
                acc[1][j] += xb * wv;
            }
        }
    }
    KCAP_UNROLL for (int i = 0; i < 2; ++i) {
        const int token = token0 + my_token + 16 * i;
        if (token >= p.n_tokens) continue;
        KCAP_UNROLL for (int j = 0; j < 4; ++j) {
            const int e = e0 + my_experts + j;
            if (e < p.n_expert)
                partials[(kcap_u64(split) * kcap_u64(p.n_tokens) + kcap_u64(token)) * kcap_u64(p.n_expert) + kcap_u64(e)] =
                    acc[i][j];
        }
    }
}

// Asks for the router rows this simd group of kcap_moe_logits reads (a hint): the router's
// weights never change, so a launch issues it before waiting on the kernel that writes x.
KCAP_FN void kcap_moe_logits_prefetch(const KcapThread t, const KcapMoeParams p, const KCAP_GLOBAL kcap_u8* w) {
    const int e0 = int(t.group_x * t.simds + t.simd) * KCAP_MOE_LOGIT_EXPERTS;
    for (int i = 0; i < KCAP_MOE_LOGIT_EXPERTS; ++i) {
        if (e0 + i >= p.n_expert) break;
        const KCAP_GLOBAL kcap_u8* row = w + kcap_u64(e0 + i) * p.router_row_bytes;
        for (unsigned offset = t.lane * 128u; offset < p.router_row_bytes; offset += 32u * 128u) kcap_prefetch(row + offset);
    }
}

// The (value, index) of the largest value over the simd group's lanes, the lower index on a tie,
// in every lane: a butterfly over the lanes' own (value, index).
KCAP_FN void kcap_moe_simd_argmax(KCAP_PRIVATE float& value, KCAP_PRIVATE int& best) {
    for (int offset = KCAP_SIMD_WIDTH / 2; offset > 0; offset >>= 1) {
        const float other_value = kcap_simd_shuffle_xor(value, offset);
        const int other = kcap_simd_shuffle_xor(best, offset);
        if (other_value > value || (other_value == value && other < best)) {
            value = other_value;
            best = other;
        }
    }
}

// Expert e's logit of the token whose row of logits (or of the first slice's partial sums) is row.
KCAP_FN float kcap_moe_token_logit(const KcapMoeParams p, const KCAP_GLOBAL float* row, int e,
                                   const KCAP_GLOBAL float* logit_bias) {
    if (p.logit_splits == 0) return row[e];
    // Partial sums over slices of K (kcap_moe_logits_tiled), added in slice order.
    const kcap_u64 slice = kcap_u64(p.n_tokens) * kcap_u64(p.n_expert);
    float sum = 0.0f;
    for (int s = 0; s < p.logit_splits; ++s) sum += row[kcap_u64(s) * slice + kcap_u64(e)];
    return (logit_bias ? sum + logit_bias[e] : sum) * p.logit_scale;
}

// The softmax's max and sum over a token's logits (a sigmoid router's: unused).
struct KcapMoeSoftmax {
    float top;
    float sum;
};

// One simd group (t.lane; no group barrier), on one token's logits in threadgroup memory: turns them into the choice scores in place (a sigmoid router's
// sigmoid(logit) + choice bias; the softmax's are the logits, which it keeps in order), with
// group-limited routing the experts of the groups left out at -infinity, and returns the
// softmax's max and sum. The lanes take experts lane, lane + 32, ...: butterfly reductions, no
// lane waits on global memory.
KCAP_FN KcapMoeSoftmax kcap_moe_route_scores(const KcapThread t, const KcapMoeParams p, KCAP_SHARED float* logits,
                                             const KCAP_GLOBAL float* choice_bias) {
    KcapMoeSoftmax softmax;
    softmax.top = KCAP_NEG_INFINITY;
    softmax.sum = 0.0f;
    if (p.sigmoid) {
        for (int e = int(t.lane); e < p.n_expert; e += KCAP_SIMD_WIDTH)
            logits[e] = 1.0f / (1.0f + kcap_exp(-logits[e])) + (choice_bias ? choice_bias[e] : 0.0f);
    } else {
        float top = KCAP_NEG_INFINITY, sum = 0.0f;
        for (int e = int(t.lane); e < p.n_expert; e += KCAP_SIMD_WIDTH) top = kcap_fmax(top, logits[e]);
        top = kcap_simd_max(top);
        for (int e = int(t.lane); e < p.n_expert; e += KCAP_SIMD_WIDTH) sum += kcap_exp(logits[e] - top);
        softmax.top = top;
        softmax.sum = kcap_simd_sum(sum);
    }
    kcap_simd_barrier();
    if (p.n_groups > 1) {
        // Group-limited routing: lane g scores group g (its largest choice score, or the sum of
        // its two largest), n_groups_used argmax rounds keep the best groups, and the experts of
        // the others leave the choice.
        const int size = p.n_expert / p.n_groups;
        float score = KCAP_NEG_INFINITY;
        if (int(t.lane) < p.n_groups) {
            float first = KCAP_NEG_INFINITY, second = KCAP_NEG_INFINITY;
            for (int i = 0; i < size; ++i) {
                const float c = logits[int(t.lane) * size + i];
                if (c > first) {
                    second = first;
                    first = c;
                } else if (c > second) {
                    second = c;
                }
            }
            score = p.group_top2 ? first + second : first;
        }
        int kept = 0;
        for (int k = 0; k < p.n_groups_used; ++k) {
            float value = score;
            int best = int(t.lane) < p.n_groups && !kept ? int(t.lane) : KCAP_SIMD_WIDTH;
            if (best == KCAP_SIMD_WIDTH) value = KCAP_NEG_INFINITY;
            kcap_moe_simd_argmax(value, best);
            if (best == int(t.lane)) kept = 1;
        }
        for (int base = 0; base < p.n_expert; base += KCAP_SIMD_WIDTH) {  // uniform: every lane shuffles
            const int e = base + int(t.lane);
            const int keep = kcap_simd_broadcast(kept, e < p.n_expert ? e / size : 0);
            if (e < p.n_expert && !keep) logits[e] = KCAP_NEG_INFINITY;
        }
        kcap_simd_barrier();
    }
    return softmax;
}

// A chosen expert (lane k's: round k's) and its choice score.
struct KcapMoeChoice {
    int expert;
    float value;
};

// One simd group: n_used rounds of a (score, index) argmax over the lanes (the lower index on a
// tie, as the CPU row), each round's expert masked out in the shared scores; lane k keeps round
// k's expert and score in registers (n_used <= KCAP_MOE_MAX_USED == the lanes).
KCAP_FN KcapMoeChoice kcap_moe_route_rounds(const KcapThread t, const KcapMoeParams p, KCAP_SHARED float* logits) {
    KcapMoeChoice mine;
    mine.expert = 0;
    mine.value = 0.0f;
    for (int k = 0; k < p.n_used; ++k) {
        float value = KCAP_NEG_INFINITY;
        int best = p.n_expert;  // none yet: loses every comparison below
        for (int e = int(t.lane); e < p.n_expert; e += KCAP_SIMD_WIDTH)
            if (logits[e] > value || (best == p.n_expert && logits[e] == value)) {
                value = logits[e];
                best = e;
            }
        kcap_moe_simd_argmax(value, best);
        if (best >= p.n_expert) best = 0;  // only where every logit is NaN: stay in bounds
        if (int(t.lane) == k) mine.expert = best, mine.value = value;
        kcap_simd_barrier();  // every lane has read logits[best] before it is masked
        if (t.lane == 0) logits[best] = KCAP_NEG_INFINITY;
        kcap_simd_barrier();
    }
    return mine;
}

// A choice score as the ranks compare it: NaN as -infinity (never above another score).
KCAP_FN float kcap_moe_rank_score(float s) { return s == s ? s : KCAP_NEG_INFINITY; }

// The whole group at once, the choice of `tokens` tokens by rank instead of rounds: expert e's
// rank is the number of experts with a higher choice score or an equal one at a lower index (the
// rounds' order: the highest first, the lower index on a tie), and the expert of rank k <
// n_used is chosen[token][k] (its index as a float). Each (token, expert) pair is ranked by
// `sub` neighbouring threads of one simd group (as many as the group's threads allow, a power of
// two up to 32), each against every sub-th score (broadcast reads of threadgroup memory: those
// below e counted where at least as high, those above where higher), their counts summed by
// shuffles; n_used argmax rounds of one simd group wait on a chain of shuffles each (Nsight
// Compute, 128 experts, top 8: the route kernel 6.8 us), and one thread per pair left the
// rank a serial loop over every score (about 3 us of a Qwen3-30B-A3B decode router with 128 of
// its 256 threads busy). scores: [tokens][n_expert], chosen: [tokens][KCAP_MOE_MAX_USED], both
// threadgroup memory; the caller's barriers go before and after. The group's threads: a multiple
// of the simd width.
KCAP_FN void kcap_moe_rank_choice(const KcapThread t, const KcapMoeParams p, int tokens,
                                  const KCAP_SHARED float* scores, KCAP_SHARED float* chosen) {
    const int pairs = tokens * p.n_expert;
    int sub = 1;
    while (sub < KCAP_SIMD_WIDTH && pairs * sub * 2 <= int(t.threads)) sub *= 2;
    const int slots = pairs * sub;
    for (int base = 0; base < slots; base += int(t.threads)) {  // uniform: every lane shuffles
        const int i = base + int(t.index);
        const int pair = i / sub, part = i % sub;
        int above = 0;
        if (pair < pairs) {
            const int j = pair / p.n_expert, e = pair % p.n_expert;
            const KCAP_SHARED float* s = scores + j * p.n_expert;
            const float mine = kcap_moe_rank_score(s[e]);
            int f = part;
            for (; f < e; f += sub) above += kcap_moe_rank_score(s[f]) >= mine ? 1 : 0;
            if (f == e) f += sub;
            for (; f < p.n_expert; f += sub) above += kcap_moe_rank_score(s[f]) > mine ? 1 : 0;
        }
        for (int offset = sub / 2; offset > 0; offset >>= 1) above += kcap_simd_shuffle_xor(above, offset);
        if (pair < pairs && part == 0 && above < p.n_used)
            chosen[(pair / p.n_expert) * KCAP_MOE_MAX_USED + above] = float(pair % p.n_expert);
    }
}

// One simd group: the token's Routing row (ids as floats, then weights) from lane k's choice
// (round or rank k's): the softmax over every expert, or the sigmoid of the chosen expert's logit
// (logit: the lane's; the choice score holds the choice bias); their sum in round order, as the
// CPU row adds them, for the renormalization; times the scale and (expert_scaled) the expert's
// entry of expert_scale. The lanes write side by side.
KCAP_FN void kcap_moe_route_write(const KcapThread t, const KcapMoeParams p, KcapMoeChoice choice, float logit,
                                  KcapMoeSoftmax softmax, const KCAP_GLOBAL float* expert_scale,
                                  KCAP_GLOBAL float* out) {
    const bool mine = int(t.lane) < p.n_used;
    const float weight = !mine       ? 0.0f
                         : p.sigmoid ? 1.0f / (1.0f + kcap_exp(-logit))
                                     : kcap_exp(choice.value - softmax.top) / softmax.sum;
    float chosen = 0.0f;
    for (int k = 0; k < p.n_used; ++k) chosen += kcap_simd_broadcast(weight, k);
    if (!mine) return;
    out[t.lane] = float(choice.expert);
    out[p.n_used + int(t.lane)] = (p.renormalize ? weight / chosen : weight) * p.scale *
                                  (p.expert_scaled ? expert_scale[choice.expert] : 1.0f);
}

// Threadgroup memory of kcap_moe_route_ranked besides the logits: each token's choice scores,
// choices and softmax (floats, for KCAP_MOE_LOGIT_TOKENS tokens of n_expert experts).
#define KCAP_MOE_RANKED_FLOATS(n_expert) (KCAP_MOE_LOGIT_TOKENS * ((n_expert) + KCAP_MOE_MAX_USED + 2))

// The top-k of up to KCAP_MOE_LOGIT_TOKENS tokens by one group (cuda.moe_route_cluster's), from
// their logits in threadgroup memory ([tokens][n_expert], as kcap_moe_logits writes them; not
// modified): simd group s turns a copy of token s's (s + simds, ...) into its choice scores
// (kcap_moe_route_scores), the whole group ranks them (kcap_moe_rank_choice: the experts of
// kcap_moe_route's rounds, in their order), then simd group s writes the token's Routing row
// (routing: the first token's). work: KCAP_MOE_RANKED_FLOATS(n_expert) floats.
KCAP_FN void kcap_moe_route_ranked(const KcapThread t, const KcapMoeParams p, int tokens, const KCAP_SHARED float* logits,
                                   KCAP_SHARED float* work, const KCAP_GLOBAL float* expert_scale,
                                   KCAP_GLOBAL float* routing, const KCAP_GLOBAL float* choice_bias) {
    KCAP_SHARED float* scores = work;                                                  // [tokens][n_expert]
    KCAP_SHARED float* chosen = work + KCAP_MOE_LOGIT_TOKENS * p.n_expert;             // [tokens][MAX_USED]
    KCAP_SHARED float* softmax = chosen + KCAP_MOE_LOGIT_TOKENS * KCAP_MOE_MAX_USED;  // [tokens][2]
    for (int j = int(t.simd); j < tokens; j += int(t.simds)) {
        KCAP_SHARED float* own = scores + j * p.n_expert;
        for (int e = int(t.lane); e < p.n_expert; e += KCAP_SIMD_WIDTH) own[e] = logits[j * p.n_expert + e];
        kcap_simd_barrier();
        const KcapMoeSoftmax sm = kcap_moe_route_scores(t, p, own, choice_bias);
        if (t.lane == 0) softmax[2 * j] = sm.top, softmax[2 * j + 1] = sm.sum;
    }
    kcap_barrier();
    kcap_moe_rank_choice(t, p, tokens, scores, chosen);
    kcap_barrier();
    for (int j = int(t.simd); j < tokens; j += int(t.simds)) {
        const bool mine = int(t.lane) < p.n_used;
        KcapMoeChoice choice;
        choice.expert = mine ? int(chosen[j * KCAP_MOE_MAX_USED + int(t.lane)]) : 0;
        choice.value = scores[j * p.n_expert + choice.expert];
        KcapMoeSoftmax sm;
        sm.top = softmax[2 * j], sm.sum = softmax[2 * j + 1];
        kcap_moe_route_write(t, p, choice, logits[j * p.n_expert + choice.expert], sm, expert_scale,
                             routing + kcap_u64(j) * kcap_u64(2 * p.n_used));
    }
}

// Grid: x = tokens, one simd group each. shared: KCAP_MOE_MAX_EXPERTS floats. logits: as
// kcap_moe_logits wrote them. choice_bias (sigmoid routers, or null): added to each expert's
// score for the choice, not to its weight. The token's logits are staged in threadgroup memory,
// turned into choice scores, chosen by n_used argmax rounds (each round's expert masked out),
// and written. With lane 0 writing each round's entry and reading them back for the
// renormalization, every round waited on global memory (6 us of a Qwen3-MoE decode layer's 8 in
// Nsight Compute): the lanes keep their rounds' choices in registers instead.
KCAP_FN void kcap_moe_route(const KcapThread t, const KcapMoeParams p, const KCAP_GLOBAL float* token_logits,
                            const KCAP_GLOBAL float* expert_scale, KCAP_GLOBAL float* routing,
                            KCAP_SHARED float* logits, const KCAP_GLOBAL float* choice_bias = nullptr,
                            const KCAP_GLOBAL float* logit_bias = nullptr) {
    const int token = int(t.group_x);
    const KCAP_GLOBAL float* row = token_logits + kcap_u64(token) * kcap_u64(p.n_expert);
    for (int e = int(t.index); e < p.n_expert; e += int(t.threads)) logits[e] = kcap_moe_token_logit(p, row, e, logit_bias);
    kcap_barrier();
    const KcapMoeSoftmax softmax = kcap_moe_route_scores(t, p, logits, choice_bias);
    const KcapMoeChoice choice = kcap_moe_route_rounds(t, p, logits);
    const float logit = p.sigmoid && int(t.lane) < p.n_used ? kcap_moe_token_logit(p, row, choice.expert, logit_bias) : 0.0f;
    kcap_moe_route_write(t, p, choice, logit, softmax, expert_scale, routing + kcap_u64(token) * kcap_u64(2 * p.n_used));
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

// Where a slot's gate and up matvec reads: its token, the byte offsets of its expert's gate rows
// and up rows in the stacked tensors (gate_up_merged: one tensor, the expert's ff gate rows then
// its ff up rows), and the offset of the expert's row of a [n_expert][ff] bias.
struct KcapMoeGateUpRows {
    int token;
    kcap_u64 gate;
    kcap_u64 up;
    kcap_u64 bias;
};
KCAP_FN KcapMoeGateUpRows kcap_moe_gate_up_rows(const KcapMoeParams moe, const KcapMatmulParams p,
                                                const KCAP_GLOBAL float* routing, int slot) {
    const KcapMoeSlot s = kcap_moe_slot(moe, routing, slot);
    const kcap_u64 expert_rows = kcap_u64(moe.gate_up_merged ? 2 * moe.ff : moe.ff);
    KcapMoeGateUpRows r;
    r.token = s.token;
    r.gate = kcap_u64(s.expert) * expert_rows * p.row_bytes;
    r.up = r.gate + (moe.gate_up_merged ? kcap_u64(moe.ff) * p.row_bytes : kcap_u64(0));
    r.bias = kcap_u64(s.expert) * kcap_u64(moe.ff);
    return r;
}

// Grid: x = the matvec's row groups over ff, y = n_tokens * n_used slots. p: the gate matvec
// (k = moe.k, n = moe.ff, row_bytes of gate and up). act: [slots][ff]. gate_bias, up_bias
// ([n_expert][ff], or null): the experts' biases (gpt-oss).
template <class F, int ROWS, bool TEAMS>
KCAP_FN void kcap_moe_gate_up(const KcapThread t, const KcapMoeParams moe, const KcapMatmulParams p, const KcapMatvecTeams teams,
                              int chunk_runs, const KCAP_GLOBAL kcap_u8* gate, const KCAP_GLOBAL kcap_u8* up,
                              const KCAP_GLOBAL float* routing, const KCAP_GLOBAL float* x, int activation,
                              KCAP_GLOBAL float* act, KCAP_SHARED float* shared,
                              const KCAP_GLOBAL float* gate_bias = nullptr, const KCAP_GLOBAL float* up_bias = nullptr) {
    const KcapMoeGateUpRows r = kcap_moe_gate_up_rows(moe, p, routing, int(t.group_y));
    // The expert's rows are known only from the Routing buffer: ask for them before staging x,
    // so their loads overlap the staging instead of following it.
    kcap_matvec_split_prefetch<ROWS, TEAMS>(t, p, teams, gate + r.gate);
    kcap_matvec_split_prefetch<ROWS, TEAMS>(t, p, teams, up + r.up);
    kcap_matvec_staged<F, ROWS, KCAP_MATVEC_GATE_UP, TEAMS>(t, p, teams, chunk_runs, gate + r.gate, up + r.up,
                                                     x + kcap_u64(r.token) * kcap_u64(moe.k),
                                                     gate_bias ? gate_bias + r.bias : nullptr, activation,
                                                     act + kcap_u64(t.group_y) * kcap_u64(moe.ff), shared,
                                                     up_bias ? up_bias + r.bias : nullptr, moe.swiglu_alpha,
                                                     moe.swiglu_limit);
}

// Grid: x = the matvec's row groups over n, y = slots. p: the down matvec (k = moe.ff, n = moe.n,
// the down matrix's row bytes; has_bias with down_bias). down_out: [slots][n]. down_bias
// ([n_expert][n], or null): the experts' down biases, added before the combine weighs the slot.
template <class F, int ROWS, bool TEAMS>
KCAP_FN void kcap_moe_down(const KcapThread t, const KcapMoeParams moe, const KcapMatmulParams p, const KcapMatvecTeams teams,
                           int chunk_runs, const KCAP_GLOBAL kcap_u8* down, const KCAP_GLOBAL float* routing,
                           const KCAP_GLOBAL float* act, KCAP_GLOBAL float* down_out, KCAP_SHARED float* shared,
                           const KCAP_GLOBAL float* down_bias = nullptr) {
    const KcapMoeSlot s = kcap_moe_slot(moe, routing, int(t.group_y));
    const kcap_u64 expert = kcap_u64(s.expert) * kcap_u64(moe.n) * p.row_bytes;
    kcap_matvec_split_prefetch<ROWS, TEAMS>(t, p, teams, down + expert);  // as in kcap_moe_gate_up
    kcap_matvec_staged<F, ROWS, KCAP_MATVEC_PLAIN, TEAMS>(t, p, teams, chunk_runs, down + expert, down + expert,
                                                   act + kcap_u64(t.group_y) * kcap_u64(moe.ff),
                                                   down_bias ? down_bias + kcap_u64(s.expert) * kcap_u64(moe.n) : nullptr,
                                                   0, down_out + kcap_u64(t.group_y) * kcap_u64(moe.n), shared);
}

// One thread per output value: grid x = ceil(n_tokens * n / threads).
// slot_rows (may be null): the row of down that holds each slot's output.
KCAP_FN void kcap_moe_combine(const KcapThread t, const KcapMoeParams p, const KCAP_GLOBAL float* routing,
                              const KCAP_GLOBAL float* down, const KCAP_GLOBAL int* slot_rows, KCAP_GLOBAL float* out,
                              const KCAP_GLOBAL float* shared = nullptr) {
    const kcap_u64 i = kcap_u64(t.group_x) * t.threads + t.index;
    if (i >= kcap_u64(p.n_tokens) * kcap_u64(p.n)) return;
    const int token = int(i / kcap_u64(p.n)), o = int(i % kcap_u64(p.n));
    const KCAP_GLOBAL float* weights = routing + kcap_u64(token) * kcap_u64(2 * p.n_used) + kcap_u64(p.n_used);
    float sum = 0.0f;
    for (int k = 0; k < p.n_used; ++k) {
        const int slot = token * p.n_used + k;
        const int row = slot_rows ? slot_rows[slot] : slot;
        sum += weights[k] * down[kcap_u64(row) * kcap_u64(p.n) + kcap_u64(o)];
    }
    out[i] = shared ? sum + shared[i] : sum;
}

// Grid: x = tokens; shared: one float per simd group. w null: the gate is 1.
KCAP_FN void kcap_moe_shared_gate(const KcapThread t, int width, const KCAP_GLOBAL float* w,
                                  const KCAP_GLOBAL float* x, const KCAP_GLOBAL float* in,
                                  const KCAP_GLOBAL float* shared_out, KCAP_GLOBAL float* out,
                                  KCAP_SHARED float* partial) {
    const kcap_u64 row = kcap_u64(t.group_x) * kcap_u64(width);
    float g = 1.0f;
    if (w) {
        float acc = 0.0f;
        for (int i = int(t.index); i < width; i += int(t.threads)) acc += w[i] * x[row + kcap_u64(i)];
        acc = kcap_simd_sum(acc);
        if (t.lane == 0) partial[t.simd] = acc;
        kcap_barrier();
        float dot = 0.0f;
        for (int i = 0; i < int(t.simds); ++i) dot += partial[i];
        g = 1.0f / (1.0f + kcap_exp(-dot));
    }
    for (int i = int(t.index); i < width; i += int(t.threads))
        out[row + kcap_u64(i)] = in[row + kcap_u64(i)] + g * shared_out[row + kcap_u64(i)];
}
