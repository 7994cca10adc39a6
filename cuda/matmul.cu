// CUDA entry points of the exact matmul rows: kernels/matmul.h bodies launched with the geometry
// declared in cuda/rows.h. cuda.matvec.<format> (one token): the decode matvec with x staged in
// threadgroup memory (kernels/matvec.h; teams from matvec_teams, cuda/matmul.h), which
// prefetches its weight rows into L2 before waiting on the previous kernel;
// cuda.matmul_tokens.<format> (any tokens): the few-token walk (each decoded run of weights
// reused for kTokensPerPass tokens); the gate_up and qkv forms of both.
#include "cuda/matmul.h"
#include "cuda/mma_tiles.h"
#include <algorithm>
#include <climits>

#include "kernels/matmul.h"
#include "kernels/matvec.h"

namespace kcap {
namespace cuda {
namespace {

using namespace cuda_rows;

template <class F, int ROWS>
__global__ void __launch_bounds__(kMatvecSimds * 32)
    matvec_kernel(KcapMatmulParams p, KcapMatvecTeams teams, int chunk_runs, const kcap_u8* w, const float* x,
                  const float* bias, float* y) {
    extern __shared__ float shared[];
    const KcapThread t = kcap_cuda_thread();
    kcap_matvec_split_prefetch<ROWS, false>(t, p, teams, w);  // weights never change: safe before the wait
    pdl_wait();
    pdl_trigger();
    kcap_matvec_staged<F, ROWS, KCAP_MATVEC_PLAIN, false>(t, p, teams, chunk_runs, w, w, x, bias, 0, y, shared);
}

template <class F, int ROWS>
__global__ void __launch_bounds__(kMatvecSimds * 32)
    gate_up_kernel(KcapMatmulParams p, KcapMatvecTeams teams, int chunk_runs, const kcap_u8* gate, const kcap_u8* up,
                   const float* x, int activation, float* y) {
    extern __shared__ float shared[];
    const KcapThread t = kcap_cuda_thread();
    kcap_matvec_split_prefetch<ROWS, false>(t, p, teams, gate);
    kcap_matvec_split_prefetch<ROWS, false>(t, p, teams, up);
    pdl_wait();
    pdl_trigger();
    kcap_matvec_staged<F, ROWS, KCAP_MATVEC_GATE_UP, false>(t, p, teams, chunk_runs, gate, up, x, nullptr, activation,
                                                            y, shared);
}

// One token: the staged matvec (plain or gate_up) with ROWS rows per team.
template <class F, int ROWS, bool GATE_UP, class... Args>
void launch_matvec(const Context& ctx, const KcapMatmulParams& p, Args... args) {
    const KcapMatvecTeams teams = matvec_teams(ctx, p, ROWS, p.k / 32);
    const int chunk_runs = std::min(p.k / 32, kMatvecChunkRuns);
    const dim3 grid(matvec_groups(p, teams, ROWS)), block(kMatvecSimds * 32);
    const size_t shared = size_t(matvec_shared_floats(p.k, ROWS)) * 4;
    if constexpr (GATE_UP)
        launch(ctx, gate_up_kernel<F, ROWS>, grid, block, shared, p, teams, chunk_runs, args...);
    else
        launch(ctx, matvec_kernel<F, ROWS>, grid, block, shared, p, teams, chunk_runs, args...);
}

// The rows per team follow the matrix's height (matvec_rows_for), fixed per stage.
template <class F, bool GATE_UP, class... Args>
void launch_matvec_rows(const Context& ctx, const KcapMatmulParams& p, Args... args) {
    static_assert(kMatvecRows == 1 && kMatvecWideRows == 2, "the instantiations below");
    if (matvec_rows_for(p.n) == kMatvecWideRows)
        launch_matvec<F, kMatvecWideRows, GATE_UP>(ctx, p, args...);
    else
        launch_matvec<F, kMatvecRows, GATE_UP>(ctx, p, args...);
}

template <class F>
__global__ void __launch_bounds__(kTokensSimds * 32)
    tokens_kernel(KcapMatmulParams p, const kcap_u8* w, const float* x, const float* bias, float* y) {
    const KcapThread t = kcap_cuda_thread();
    pdl_wait();
    pdl_trigger();
    kcap_matmul_tokens<F, kTokensRows, kTokensPerPass>(t, p, w, x, bias, y);
}

// qkv (cuda.qkv): the Q, K and V matvecs of one token in one launch (segments: cuda/matmul.h).
__global__ void __launch_bounds__(kMatvecSimds * 32) qkv_kernel(QkvParams q, const float* x) {
    extern __shared__ float shared[];
    KcapThread t = kcap_cuda_thread();
    const QkvSegment s = qkv_segment(q, t);
    switch (s.format) {
#define KCAP_QKV_CASE(NAME, DECODER)                                                                                   \
    case int(Format::NAME):                                                                                            \
        kcap_matvec_split_prefetch<kMatvecRows, false>(t, s.p, s.teams, s.w);                                          \
        pdl_wait();                                                                                                    \
        pdl_trigger();                                                                                                 \
        kcap_matvec_staged<DECODER, kMatvecRows, KCAP_MATVEC_PLAIN, false>(t, s.p, s.teams, q.chunk_runs, s.w, s.w, x, \
                                                                           s.bias, 0, s.y, shared);                    \
        break;
        KCAP_WEIGHT_FORMATS(KCAP_QKV_CASE)
#undef KCAP_QKV_CASE
        default: pdl_wait(); pdl_trigger(); break;
    }
}

}  // namespace

// cuda.matvec.<format>: one token, x staged in threadgroup memory.
template <class F>
void run_matvec(const Stage& stage, const KernelCall& call) {
    const StageData& data = stage_data(call);
    launch_matvec_rows<F, false>(context(call), matmul_params(stage, call), static_cast<const kcap_u8*>(data.operands[0]),
                                 call.in, static_cast<const float*>(data.operands[1]), call.out);
}

// The few-token walk of one matrix w (rows p.n) into y: each decoded run of weights serves
// kTokensPerPass tokens.
template <class F>
void launch_tokens(const Context& ctx, const KcapMatmulParams& p, const kcap_u8* w, const float* x, const float* bias,
                   float* y) {
    launch(ctx, tokens_kernel<F>, dim3(ceil_div(p.n, kTokensSimds * kTokensRows), ceil_div(p.m, kTokensPerPass)),
           dim3(kTokensSimds * 32), 0, p, w, x, bias, y);
}

// cuda.matmul_tokens.<format>: the few-token walk, any number of tokens.
template <class F>
void run_matmul_tokens(const Stage& stage, const KernelCall& call) {
    const StageData& data = stage_data(call);
    launch_tokens<F>(context(call), matmul_params(stage, call), static_cast<const kcap_u8*>(data.operands[0]), call.in,
                     static_cast<const float*>(data.operands[1]), call.out);
}

// cuda.gate_up.<format>: one token, the fused matvec (both matrices' rows against one staged x,
// the activation applied to the sums).
template <class F>
void run_gate_up(const Stage& stage, const KernelCall& call) {
    const StageData& data = stage_data(call);
    const KcapMatmulParams p = matmul_params(stage, call);  // operand 1 is the up matrix, not a bias
    launch_matvec_rows<F, true>(context(call), p, static_cast<const kcap_u8*>(data.operands[0]),
                                static_cast<const kcap_u8*>(data.operands[1]), call.in, int(stage.params.activation),
                                call.out);
}

// cuda.gate_up_tokens.<format>: the walk for the gate and the up matrix into the plan's gate / up
// scratch, then the gated activation.
template <class F>
void run_gate_up_tokens(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    const KcapMatmulParams p = matmul_params(stage, call);
    launch_tokens<F>(ctx, p, static_cast<const kcap_u8*>(data.operands[0]), call.in, nullptr, call.inout2);
    launch_tokens<F>(ctx, p, static_cast<const kcap_u8*>(data.operands[1]), call.in, nullptr, call.inout3);
    gate_up_activation(stage, call);
}

void gate_up_activation(const Stage& stage, const KernelCall& call) {
    Stage act = stage;
    act.op = Op::FfnActivation;
    KernelCall act_call = call;
    act_call.in = call.inout2;
    act_call.in2 = call.inout3;
    run_ffn_activation(act, act_call);
}

QkvParams qkv_segments(const Stage& stage, const KernelCall& call, int chunk_runs_max, int* groups, bool q8) {
    const int simds = q8 ? cuda_rows::kMatvecQ8Simds : cuda_rows::kMatvecSimds;  // per group
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    float* outputs[3] = {call.out, call.inout2, call.inout3};
    Stage matmul = stage;
    matmul.op = Op::MatMul;
    matmul.features = 0;
    QkvParams q = {};
    q.count = qkv_matrices(stage);
    q.segment[2].first_group = INT_MAX;  // a pair's groups never reach segment 2
    *groups = 0;
    int all_rows = 0;  // the segments share one grid
    for (int which = 0; which < q.count; ++which) all_rows += int(stage.operands[size_t(which)]->n_rows());
    for (int which = 0; which < q.count; ++which) {
        const TensorRef* w = stage.operands[size_t(which)];
        const TensorRef* bias = qkv_bias(stage, which);
        matmul.operands = {w, bias};  // p.has_bias where the matrix has one
        matmul.n = w->n_rows();
        QkvSegment& s = q.segment[which];
        s.w = static_cast<const kcap_u8*>(data.operands[which]);
        s.bias = bias ? static_cast<const float*>(data.operands[3 + which]) : nullptr;
        s.y = outputs[which];
        s.p = matmul_params(matmul, call);
        s.format = int(w->format);
        s.teams = matvec_teams(ctx, s.p, kMatvecRows, q8 ? q8_row_units(w->format, s.p.k) : s.p.k / 32, kMatvecMinLanes,
                               all_rows, simds);
        s.first_group = *groups;
        *groups += int(matvec_groups(s.p, s.teams, kMatvecRows, simds));
    }
    q.chunk_runs = std::min(int(stage.k / 32), chunk_runs_max);
    return q;
}

}  // namespace cuda

template <Format FORMAT>
void kcap_cuda_matvec(const Stage& stage, const KernelCall& call) {
    cuda::run_matvec<cuda::Decoder<FORMAT>>(stage, call);
}
template <Format FORMAT>
void kcap_cuda_matmul_tokens(const Stage& stage, const KernelCall& call) {
    cuda::run_matmul_tokens<cuda::Decoder<FORMAT>>(stage, call);
}
template <Format FORMAT>
void kcap_cuda_gate_up(const Stage& stage, const KernelCall& call) {
    cuda::run_gate_up<cuda::Decoder<FORMAT>>(stage, call);
}
template <Format FORMAT>
void kcap_cuda_gate_up_tokens(const Stage& stage, const KernelCall& call) {
    cuda::run_gate_up_tokens<cuda::Decoder<FORMAT>>(stage, call);
}
#define KCAP_INSTANTIATE_EXACT(NAME, DECODER)                                                   \
    template void kcap_cuda_matvec<Format::NAME>(const Stage&, const KernelCall&);             \
    template void kcap_cuda_matmul_tokens<Format::NAME>(const Stage&, const KernelCall&);      \
    template void kcap_cuda_gate_up<Format::NAME>(const Stage&, const KernelCall&);            \
    template void kcap_cuda_gate_up_tokens<Format::NAME>(const Stage&, const KernelCall&);
KCAP_WEIGHT_FORMATS(KCAP_INSTANTIATE_EXACT)
#undef KCAP_INSTANTIATE_EXACT

// cuda.qkv: one token, the three-segment matvec (each segment its own format).
void kcap_cuda_qkv(const Stage& stage, const KernelCall& call) {
    using namespace cuda_rows;
    int groups = 0;
    const cuda::QkvParams q = cuda::qkv_segments(stage, call, kMatvecChunkRuns, &groups);
    const size_t shared = size_t(matvec_shared_floats(stage.k, kMatvecRows)) * 4;
    cuda::launch(cuda::context(call), cuda::qkv_kernel, dim3(unsigned(groups)), dim3(kMatvecSimds * 32), shared, q,
                 call.in);
}

// cuda.qkv_tokens: the walk of each matrix in its own format.
void kcap_cuda_qkv_tokens(const Stage& stage, const KernelCall& call) {
    int groups = 0;
    const cuda::QkvParams q = cuda::qkv_segments(stage, call, cuda_rows::kMatvecChunkRuns, &groups);
    for (int which = 0; which < q.count; ++which) {
        const cuda::QkvSegment& s = q.segment[which];
        switch (Format(s.format)) {
#define KCAP_QKV_TOKENS_CASE(NAME, DECODER)                                                        \
    case Format::NAME:                                                                             \
        cuda::launch_tokens<DECODER>(cuda::context(call), s.p, s.w, call.in, s.bias, s.y);        \
        break;
            KCAP_WEIGHT_FORMATS(KCAP_QKV_TOKENS_CASE)
#undef KCAP_QKV_TOKENS_CASE
            default: throw Error(std::string("cuda.qkv_tokens: no body for ") + format_name(Format(s.format)));
        }
    }
}

}  // namespace kcap
