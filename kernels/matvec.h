// Decode matvec (one token) with the activations staged in threadgroup memory:
//   y[n] = W[n, :] . x (+ bias[n]),  W: [n][k] raw GGUF blocks, f32 x and accumulation.
//
// Why staged: when each lane reads the 32 activations of its own 32-element run straight
// from global memory, one load instruction of a simd group touches 32 different 128-byte
// lines; on the H200 that, not DRAM, bounded the 8B model's matvecs (~0.65 TB/s; staged:
// about 1.1-1.3 TB/s). Here the group first copies a chunk of x into threadgroup memory with
// coalesced loads, each run padded to 36 floats so that the 16-byte reads of 8 lanes (one
// memory wavefront) land in 8 different bank groups, then every simd group reads its runs
// from there and reuses them for ROWS weight rows.
//
// Formats of integer codes (KcapCodes<F>::has_codes8: the block formats) are multiplied as codes:
// per 16- or 32-value sub-block, scale * sum(q x) (+ offset * sum(x)), q the codes less their
// bias (codes32), so each value takes its conversion and one FMA where the decoded weight took a
// multiply more (decode32: q * scale + offset, then the FMA). The x sums the offsets need are
// staged beside each run, in its padding. The same products up to f32 rounding.
//
// Layout (KcapMatvecTeams): the group's teams each own ROWS consecutive rows. A team is `split`
// simd groups (parts), or for short rows `lanes` lanes of one simd group; lane l of part s of a
// team takes runs lanes s + l, lanes s + l + lanes split, ... of each chunk. The parts of a team
// meet in threadgroup memory at the end. Exact up to summation order, like kcap_matvec.
#pragma once

#include "kernels/activation.h"
#include "kernels/matmul.h"
#include "kernels/quant_codes.h"

#define KCAP_MATVEC_RUN_STRIDE 36  // floats per staged run: 32 + 4 of padding

// How a staged matvec's group shares out its weight rows: teams of ROWS rows each, a team either
// `split` whole simd groups (parts; lanes == KCAP_SIMD_WIDTH) or, where a row has too few units
// (runs, or kernels/matvec_q8.h's units) to keep 32 lanes busy, `lanes` lanes of one simd group
// (4, 8 or 16: KCAP_SIMD_WIDTH / lanes teams per simd group; split == 1). The host picks both per
// stage from its shape (cuda_rows::matvec_teams).
struct KcapMatvecTeams {
    int split;  // simd groups per team
    int lanes;  // lanes per team
};
// Teams of `split` whole simd groups.
KCAP_FN KcapMatvecTeams kcap_matvec_parts(int split) {
    KcapMatvecTeams teams;
    teams.split = split;
    teams.lanes = KCAP_SIMD_WIDTH;
    return teams;
}
// Where this thread works: its team's first row, its part of the team and its lane in the team.
struct KcapMatvecTeam {
    int row0;
    int part;
    int lane;
};
KCAP_FN int kcap_matvec_group_teams(const KcapMatvecTeams teams, int simds) {
    return simds / teams.split * (KCAP_SIMD_WIDTH / teams.lanes);
}
// A body's teams, fixed at compile time by TEAMS: false, whole simd groups (lanes is
// KCAP_SIMD_WIDTH, a constant; teams.lanes must be too), true, the short rows' teams of fewer
// lanes (teams.lanes 4, 8 or 16; split 1). The launchers take the body the host's teams call for
// (cuda_rows::with_matvec_body): with whole simd groups a constant, the lanes' indices and the lane
// sums fold to plain simd-group code; as a runtime value they cost decode 2-5%
// (bench/results/cuda_h200_matvec_bodies.txt).
template <bool TEAMS>
KCAP_FN int kcap_matvec_team_lanes(const KcapMatvecTeams teams) {
    return TEAMS ? teams.lanes : KCAP_SIMD_WIDTH;
}
template <bool TEAMS>
KCAP_FN int kcap_matvec_team_split(const KcapMatvecTeams teams) {
    return TEAMS ? 1 : teams.split;
}
// log2 of a team's lanes (a power of two, 4 to KCAP_SIMD_WIDTH = 32): shifts and masks, not
// divisions, place the lanes.
KCAP_FN int kcap_matvec_lane_shift(int lanes) {
    return lanes >= 32 ? 5 : lanes >= 16 ? 4 : lanes >= 8 ? 3 : 2;
}
template <int ROWS, bool TEAMS>
KCAP_FN KcapMatvecTeam kcap_matvec_team(const KcapThread t, const KcapMatvecTeams teams) {
    const int lanes = kcap_matvec_team_lanes<TEAMS>(teams), split = kcap_matvec_team_split<TEAMS>(teams);
    const int shift = kcap_matvec_lane_shift(lanes), per_simd_shift = 5 - shift;  // log2 teams per simd group
    const int team = ((int(t.simd) / split) << per_simd_shift) + (int(t.lane) >> shift);
    KcapMatvecTeam out;
    out.row0 = (((int(t.group_x) * (int(t.simds) / split)) << per_simd_shift) + team) * ROWS;
    out.part = int(t.simd) % split;
    out.lane = int(t.lane) & (lanes - 1);
    return out;
}
// Asks for the weight rows this thread's team will read in the staged decode matvec (ROWS rows
// per team; the q8_1 matvec's teams too): a hint, issued before waiting on the previous kernel
// so the bytes are on their way while it finishes.
template <int ROWS, bool TEAMS>
KCAP_FN void kcap_matvec_split_prefetch(const KcapThread t, const KcapMatmulParams p, const KcapMatvecTeams teams,
                                        const KCAP_GLOBAL kcap_u8* w) {
    const KcapMatvecTeam me = kcap_matvec_team<ROWS, TEAMS>(t, teams);
    const unsigned lanes = unsigned(kcap_matvec_team_lanes<TEAMS>(teams));
    const unsigned first = (unsigned(me.part) * lanes + unsigned(me.lane)) * 128u;
    const unsigned stride = unsigned(kcap_matvec_team_split<TEAMS>(teams)) * lanes * 128u;
    for (int j = 0; j < ROWS; ++j) {
        if (me.row0 + j >= p.n) break;
        const KCAP_GLOBAL kcap_u8* row = w + kcap_u64(me.row0 + j) * p.row_bytes;
        for (unsigned offset = first; offset < p.row_bytes; offset += stride) kcap_prefetch(row + offset);
    }
}

// The sum of v over a team's lanes (every lane of the simd group calls it; each team's lanes
// get their team's sum). Whole simd groups: kcap_simd_sum's order.
KCAP_FN float kcap_matvec_team_sum(float v, int lanes) {
    KCAP_UNROLL for (int offset = KCAP_SIMD_WIDTH / 2; offset > 0; offset >>= 1)
        if (offset < lanes) v += kcap_simd_shuffle_xor(v, offset);
    return v;
}

// Floats of threadgroup memory for chunks of chunk_runs runs and simds * sums partials.
KCAP_FN int kcap_matvec_staged_floats(int chunk_runs, int simds, int sums) {
    return chunk_runs * KCAP_MATVEC_RUN_STRIDE + simds * sums;
}

// What a staged matvec writes per output row: y = W x (+ bias), or the gated FFN
// activation act(W_gate x) * (W_up x) of two matrices with the same format and shape.
#define KCAP_MATVEC_PLAIN 0
#define KCAP_MATVEC_GATE_UP 1

// The end of a staged matvec, whatever the activation encoding: each lane holds its runs' partial
// sums acc[mat][j]; each team's lanes sum them, the parts of a team meet in `partials` (uniform
// over the group: every thread reaches the barrier or none does) and lane 0 of part 0 writes the
// team's rows: y = acc (+ bias), or kcap_gated(act, gate (+ bias), up (+ bias2)) with the clamped
// SwiGLU's alpha and limit (null biases: none).
template <int ROWS, int MODE, bool TEAMS>
KCAP_FN void kcap_matvec_finish(const KcapThread t, const KcapMatmulParams p, const KcapMatvecTeams teams,
                                KCAP_PRIVATE float (&acc)[MODE == KCAP_MATVEC_GATE_UP ? 2 : 1][ROWS],
                                KCAP_SHARED float* partials, const KCAP_GLOBAL float* bias, int activation,
                                KCAP_GLOBAL float* y, const KCAP_GLOBAL float* bias2 = nullptr, float alpha = 0.0f,
                                float limit = 0.0f) {
    constexpr int kMats = MODE == KCAP_MATVEC_GATE_UP ? 2 : 1;
    const int split = kcap_matvec_team_split<TEAMS>(teams);
    const KcapMatvecTeam me = kcap_matvec_team<ROWS, TEAMS>(t, teams);
    const int team = int(t.simd) / split, part = me.part, row0 = me.row0;  // team: of whole simd groups
    KCAP_UNROLL for (int mat = 0; mat < kMats; ++mat) KCAP_UNROLL for (int j = 0; j < ROWS; ++j)
        acc[mat][j] = kcap_matvec_team_sum(acc[mat][j], kcap_matvec_team_lanes<TEAMS>(teams));
    if (split > 1) {  // whole simd groups only (lanes == KCAP_SIMD_WIDTH)
        if (t.lane == 0) {
            KCAP_UNROLL for (int mat = 0; mat < kMats; ++mat) KCAP_UNROLL for (int j = 0; j < ROWS; ++j)
                partials[(int(t.simd) * kMats + mat) * ROWS + j] = acc[mat][j];
        }
        kcap_barrier();
        if (part != 0) return;
        KCAP_UNROLL for (int mat = 0; mat < kMats; ++mat) KCAP_UNROLL for (int j = 0; j < ROWS; ++j) {
            float total = 0.0f;
            for (int s = 0; s < split; ++s) total += partials[((team * split + s) * kMats + mat) * ROWS + j];
            acc[mat][j] = total;
        }
    }
    if (me.lane != 0) return;
    KCAP_UNROLL for (int j = 0; j < ROWS; ++j) {
        if (row0 + j >= p.n) continue;
        if (MODE == KCAP_MATVEC_GATE_UP)
            y[row0 + j] = kcap_gated(activation, bias ? acc[0][j] + bias[row0 + j] : acc[0][j],
                                     bias2 ? acc[kMats - 1][j] + bias2[row0 + j] : acc[kMats - 1][j], alpha, limit);
        else
            y[row0 + j] = p.has_bias ? acc[0][j] + bias[row0 + j] : acc[0][j];
    }
}

// One run of one weight row times the staged run xv (xsum: its two 16-value sums, where
// `offsets`): decoded (decode32) and multiplied, or for formats of integer codes multiplied as
// codes, scale * sum(q x) (+ offset * sum(x)) per sub-block (see the top).
template <class F, bool CODES = KcapCodes<F>::has_codes8>
struct KcapMatvecRun {
    static constexpr bool offsets = false;
    static KCAP_FN float dot(const KCAP_GLOBAL kcap_u8* block, int run, const KCAP_PRIVATE float* xv,
                             const KCAP_PRIVATE float*) {
        float wv[32];
        F::decode32(block, run, wv);
        return kcap_dot32(wv, xv);
    }
};
template <class F>
struct KcapMatvecRun<F, true> {
    typedef KcapCodes<F> C;
    static constexpr bool offsets = C::has_offset;
    static KCAP_FN float dot(const KCAP_GLOBAL kcap_u8* block, int run, const KCAP_PRIVATE float* xv,
                             const KCAP_PRIVATE float* xsum) {
        float q[32], scale[2], offset[2];
        C::codes32(block, run, q, scale, offset);
        const float d0 = kcap_dot16(q, xv), d1 = kcap_dot16(q + 16, xv + 16);
        float sum = C::sub == 32 ? scale[0] * (d0 + d1) : scale[0] * d0 + scale[1] * d1;
        if (C::has_offset)
            sum += C::sub == 32 ? offset[0] * (xsum[0] + xsum[1]) : offset[0] * xsum[0] + offset[1] * xsum[1];
        return sum;
    }
};

// Grid: x = ceil(n / (kcap_matvec_group_teams(teams, simds) * ROWS)), y = 1. chunk_runs: runs
// staged at a time.
// MODE KCAP_MATVEC_PLAIN: w0 and bias; KCAP_MATVEC_GATE_UP: w0 = gate, w1 = up (same row
// bytes), `activation` as in kcap_gated, with the gate's bias (bias) and up's (bias2) where not
// null. shared: kcap_matvec_staged_floats(chunk_runs, simds, ROWS * (MODE == KCAP_MATVEC_GATE_UP
// ? 2 : 1)) floats.
template <class F, int ROWS, int MODE, bool TEAMS>
KCAP_FN void kcap_matvec_staged(const KcapThread t, const KcapMatmulParams p, const KcapMatvecTeams teams, int chunk_runs,
                                const KCAP_GLOBAL kcap_u8* w0, const KCAP_GLOBAL kcap_u8* w1,
                                const KCAP_GLOBAL float* x, const KCAP_GLOBAL float* bias, int activation,
                                KCAP_GLOBAL float* y, KCAP_SHARED float* shared, const KCAP_GLOBAL float* bias2 = nullptr,
                                float alpha = 0.0f, float limit = 0.0f) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    constexpr int kMats = MODE == KCAP_MATVEC_GATE_UP ? 2 : 1;
    constexpr bool kOffsets = KcapMatvecRun<F>::offsets;  // the x sums beside each run
    KCAP_SHARED float* xs = shared;
    KCAP_SHARED float* partials = shared + chunk_runs * KCAP_MATVEC_RUN_STRIDE;
    const KcapMatvecTeam me = kcap_matvec_team<ROWS, TEAMS>(t, teams);
    const int lanes = kcap_matvec_team_lanes<TEAMS>(teams), split = kcap_matvec_team_split<TEAMS>(teams);
    const int row0 = me.row0;
    const int runs = p.k / 32;
    float acc[kMats][ROWS];
    KCAP_UNROLL for (int mat = 0; mat < kMats; ++mat) KCAP_UNROLL for (int j = 0; j < ROWS; ++j) acc[mat][j] = 0.0f;
    for (int chunk0 = 0; chunk0 < runs; chunk0 += chunk_runs) {
        const int chunk_end = chunk0 + chunk_runs < runs ? chunk0 + chunk_runs : runs;
        if (chunk0 > 0) kcap_barrier();  // everyone is done with the previous chunk
        // Every lane in every round (kOffsets: the 16-value sums take 4 lanes of a run, threads a
        // multiple of 32, and land at floats 32 and 33 of the run).
        const int n4 = (chunk_end - chunk0) * 8;
        for (int base = 0; base < n4; base += int(t.threads)) {
            const int i = base + int(t.index);
            const bool in = i < n4;
            float4 v = {0.0f, 0.0f, 0.0f, 0.0f};
            if (in) v = kcap_load_f32x4(x + kcap_u64(chunk0) * 32 + 4 * kcap_u64(i));
            float sum = 0.0f;
            if (kOffsets) {
                sum = (v.x + v.y) + (v.z + v.w);
                sum += kcap_simd_shuffle_xor(sum, 1);
                sum += kcap_simd_shuffle_xor(sum, 2);
            }
            if (!in) continue;
            KCAP_SHARED float* run = xs + (i / 8) * KCAP_MATVEC_RUN_STRIDE;
            KCAP_SHARED float* to = run + 4 * (i % 8);
            to[0] = v.x, to[1] = v.y, to[2] = v.z, to[3] = v.w;
            if (kOffsets && i % 4 == 0) run[32 + (i % 8) / 4] = sum;
        }
        kcap_barrier();
        if (row0 < p.n) {
            for (int run = chunk0 + me.part * lanes + me.lane; run < chunk_end; run += lanes * split) {
                float xv[32], xsum[2] = {0.0f, 0.0f};
                const KCAP_SHARED float* from = xs + (run - chunk0) * KCAP_MATVEC_RUN_STRIDE;
                KCAP_UNROLL for (int i = 0; i < 32; ++i) xv[i] = from[i];
                if (kOffsets) xsum[0] = from[32], xsum[1] = from[33];
                const unsigned block_offset = unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes);
                KCAP_UNROLL for (int mat = 0; mat < kMats; ++mat) {
                    const KCAP_GLOBAL kcap_u8* w = mat == 0 ? w0 : w1;
                    KCAP_UNROLL for (int j = 0; j < ROWS; ++j) {
                        if (row0 + j < p.n)
                            acc[mat][j] += KcapMatvecRun<F>::dot(w + kcap_u64(row0 + j) * p.row_bytes + block_offset,
                                                                 run % kRunsPerBlock, xv, xsum);
                    }
                }
            }
        }
    }
    // Float formats may end in a partial run (K % 32 elements, K a multiple of 4): part 0 of
    // each team takes them from global memory, one per lane a round (kcap_matmul_tail).
    if (me.part == 0 && row0 < p.n) {
        kcap_matmul_tail<F, ROWS>(me.lane, lanes, p, row0, w0, x, acc[0]);
        if (kMats == 2) kcap_matmul_tail<F, ROWS>(me.lane, lanes, p, row0, w1, x, acc[kMats - 1]);
    }
    kcap_matvec_finish<ROWS, MODE, TEAMS>(t, p, teams, acc, partials, bias, activation, y, bias2, alpha, limit);
}
