// Host helpers shared by the CUDA matmul entry files (matmul.cu, matmul_mma.cu, matmul_q8.cu).
#pragma once

#include "cuda/cuda_context.h"
#include "dispatch/kernel_params.h"
#include "cuda/decoders.h"
#include "kernels/dialect.h"
#include "kernels/matvec_q8.h"

namespace kcap {
namespace cuda {

inline KcapMatmulParams matmul_params(const Stage& stage, const KernelCall& call) {
    return kcap::matmul_params(stage, call.n_tokens);
}

// The teams of a decode matvec (kernels/matvec.h) of p's shape, ROWS rows a team, `units` units
// a row (the exact matvec's runs, or the q8_1 matvec's units: q8_units_per_row): lanes per team
// from the row's units (cuda_rows::matvec_lanes), then for whole simd groups the parts that
// cover the multiprocessors (cuda_rows::matvec_split) from the rows of the launch's whole grid:
// grid_rows where one launch holds several matrices (the experts' slots, the qkv segments), else
// p.n. Fixed by the stage's shape. Counting one matrix of a shared grid gave it parts the device
// had no room for (bench/results/cuda_h200_slot_split.txt). simds: the launch's simd groups per
// group (kMatvecSimds; the q8_1 matvecs' kMatvecQ8Simds).
inline KcapMatvecTeams matvec_teams(const Context& ctx, const KcapMatmulParams& p, int rows, long long units,
                                    int min_lanes = cuda_rows::kMatvecMinLanes, long long grid_rows = 0,
                                    int simds = cuda_rows::kMatvecSimds) {
    KcapMatvecTeams teams;
    teams.lanes = cuda_rows::matvec_lanes(units, min_lanes);
    teams.split = teams.lanes == 32
                      ? cuda_rows::matvec_split(grid_rows > 0 ? grid_rows : p.n, ctx.sm_count, rows, p.k, simds)
                      : 1;
    return teams;
}
// Groups of the launch: n rows over the teams' rows.
inline unsigned matvec_groups(const KcapMatmulParams& p, const KcapMatvecTeams& teams, int rows,
                              int simds = cuda_rows::kMatvecSimds) {
    return ceil_div(p.n, cuda_rows::matvec_group_rows(teams.split, teams.lanes, rows, simds));
}
// Units per row of the q8_1 matvec of a weight format (kernels/matvec_q8.h: KcapQ8Units).
template <class F>
constexpr long long q8_units_per_row(long long k) {
    return k / F::block_elems * KcapQ8Units<F>::per_block;
}

// A batch of gate_up after its gate and up matmuls: the gated activation of the plan's gate /
// up scratch (call.inout2, call.inout3) into call.out (cuda.ffn_activation's kernel).
void gate_up_activation(const Stage& stage, const KernelCall& call);
// The FFN activation kernel of a stage's call (cuda/activation.cu).
void run_ffn_activation(const Stage& stage, const KernelCall& call);

// qkv (cuda.qkv, cuda.qkv_q8) for one token: one launch whose grid's groups are cut into
// three segments (two for a latent attention's pair), one per matrix, each with its own format,
// rows and split; every group stages the shared x and runs the matvec of its segment's format (a
// switch over the formats: one kernel serves any mix, e.g. Gemma's Q5_0 q/k with a Q8_0 v). The
// batched qkv rows take each segment's matrix, bias and output from here too.
struct QkvSegment {
    const kcap_u8* w;
    const float* bias;  // the matrix's bias (p.has_bias), or null
    float* y;
    KcapMatmulParams p;
    int format;       // int(Format)
    KcapMatvecTeams teams;  // matvec_teams of this segment's rows
    int first_group;  // the segment's first group in the grid
};
struct QkvParams {
    QkvSegment segment[3];
    int count;  // segments: 3, or 2 (segment 2 unused, its first_group past every group)
    int chunk_runs;
};

// The segments of a qkv stage for one token; *groups: the grid's groups in all.
// chunk_runs_max: the runs of x the matvec stages at a time (kMatvecChunkRuns, kMatvecQ8ChunkRuns).
// q8: the segments of the q8_1 matvec (its units per row, q8_row_units), else of the exact one.
QkvParams qkv_segments(const Stage& stage, const KernelCall& call, int chunk_runs_max, int* groups, bool q8 = false);
// q8_units_per_row of a format with q8_1 rows (cuda/matmul_q8.cu).
long long q8_row_units(Format format, long long k);

// In the kernel: the segment of group t.group_x, which becomes the group's index in the segment.
__device__ __forceinline__ QkvSegment qkv_segment(const QkvParams& q, KcapThread& t) {
    const int which = int(t.group_x) >= q.segment[2].first_group ? 2 : int(t.group_x) >= q.segment[1].first_group ? 1 : 0;
    t.group_x -= unsigned(q.segment[which].first_group);
    return q.segment[which];
}

// m x k values at x rounded to q8_1 into the q8_1 scratch (cuda/matmul_q8.cu's quantize kernel):
// a prefill chunk's attention output for the output projection after it, the grouped q8_1
// experts' x.
void quantize_into_scratch(const Context& ctx, int m, int k, const float* x);

}  // namespace cuda
}  // namespace kcap
