// CUDA entry points of the exact matmul rows (cuda.matmul.<format>): kernels/matmul.h bodies
// launched with the geometry declared in cuda/rows.h. One token: the decode matvec with x
// staged in threadgroup memory (kernels/matvec.h; teams and parts from cuda_rows::matvec_split),
// which prefetches its weight rows into L2 before waiting on the previous kernel; more tokens: the
// few-token walk (each decoded run of weights reused for kTokensPerPass tokens).
#include "cuda/matmul.h"
#include "cuda/mma_tiles.h"
#include <algorithm>

#include "kernels/matmul.h"
#include "kernels/matvec.h"

namespace kcap {
namespace cuda {
namespace {

using namespace cuda_rows;

template <class F, int ROWS>
__global__ void __launch_bounds__(kMatvecSimds * 32)
    matvec_kernel(KcapMatmulParams p, int split, int chunk_runs, const kcap_u8* w, const float* x, const float* bias,
                  float* y) {
    extern __shared__ float shared[];
    const KcapThread t = kcap_cuda_thread();
    kcap_matvec_split_prefetch<ROWS>(t, p, split, w);  // weights never change: safe before the wait
    pdl_wait();
    pdl_trigger();
    kcap_matvec_staged<F, ROWS, KCAP_MATVEC_PLAIN>(t, p, split, chunk_runs, w, w, x, bias, 0, y, shared);
}

template <class F, int ROWS>
__global__ void __launch_bounds__(kMatvecSimds * 32)
    gate_up_kernel(KcapMatmulParams p, int split, int chunk_runs, const kcap_u8* gate, const kcap_u8* up,
                   const float* x, int activation, float* y) {
    extern __shared__ float shared[];
    const KcapThread t = kcap_cuda_thread();
    kcap_matvec_split_prefetch<ROWS>(t, p, split, gate);
    kcap_matvec_split_prefetch<ROWS>(t, p, split, up);
    pdl_wait();
    pdl_trigger();
    kcap_matvec_staged<F, ROWS, KCAP_MATVEC_GATE_UP>(t, p, split, chunk_runs, gate, up, x, nullptr, activation, y,
                                                    shared);
}

// One token: the staged matvec (plain or gate_up) with ctx.matvec_rows rows per team.
template <class F, int ROWS, bool GATE_UP, class... Args>
void launch_matvec(const Context& ctx, const KcapMatmulParams& p, Args... args) {
    const int split = matvec_split(p.n, ctx.sm_count, ROWS, p.k, ctx.matvec_warps);
    const int chunk_runs = std::min(p.k / 32, kMatvecChunkRuns);
    const dim3 grid(ceil_div(p.n, (kMatvecSimds / split) * ROWS)), block(kMatvecSimds * 32);
    const size_t shared = size_t(matvec_shared_floats(p.k, ROWS)) * 4;
    if constexpr (GATE_UP)
        launch(ctx, gate_up_kernel<F, ROWS>, grid, block, shared, p, split, chunk_runs, args...);
    else
        launch(ctx, matvec_kernel<F, ROWS>, grid, block, shared, p, split, chunk_runs, args...);
}

template <class F, bool GATE_UP, class... Args>
void launch_matvec_rows(const Context& ctx, const KcapMatmulParams& p, Args... args) {
    const int rows = matvec_rows_for(p.n, ctx.matvec_rows, ctx.matvec_wide_rows);
    if (rows == 1)
        launch_matvec<F, 1, GATE_UP>(ctx, p, args...);
    else if (rows == 2)
        launch_matvec<F, 2, GATE_UP>(ctx, p, args...);
    else if (rows == 8)
        launch_matvec<F, 8, GATE_UP>(ctx, p, args...);
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
#define KCAP_QKV_CASE(NAME, DECODER)                                                                             \
    case int(Format::NAME):                                                                                      \
        kcap_matvec_split_prefetch<kMatvecRows>(t, s.p, s.split, s.w);                                           \
        pdl_wait();                                                                                              \
        pdl_trigger();                                                                                           \
        kcap_matvec_staged<DECODER, kMatvecRows, KCAP_MATVEC_PLAIN>(t, s.p, s.split, q.chunk_runs, s.w, s.w, x,  \
                                                                    nullptr, 0, s.y, shared);                    \
        break;
        KCAP_WEIGHT_FORMATS(KCAP_QKV_CASE)
#undef KCAP_QKV_CASE
        default: pdl_wait(); pdl_trigger(); break;
    }
}

}  // namespace

template <class F>
void run_matmul_exact(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    const KcapMatmulParams p = matmul_params(stage, call);
    const auto* w = static_cast<const kcap_u8*>(data.operands[0]);
    const auto* bias = static_cast<const float*>(data.operands[1]);
    if (p.m == 1) {
        // Decode: x staged in threadgroup memory, each staged run reused for kMatvecRows rows.
        launch_matvec_rows<F, false>(ctx, p, w, call.in, bias, call.out);
        return;
    }
    // Several tokens: each decoded run of weights serves kTokensPerPass of them.
    launch(ctx, tokens_kernel<F>, dim3(ceil_div(p.n, kTokensSimds * kTokensRows), ceil_div(p.m, kTokensPerPass)),
           dim3(kTokensSimds * 32), 0, p, w, call.in, bias, call.out);
}

// The gate and up matmuls of a batch one at a time on the format's exact row (fewer than
// kMmaMinTokens tokens, or a format or K without tiles), into the plan's gate / up scratch.
void run_gate_up_matmuls(const Stage& stage, const KernelCall& call, KernelFn exact_matmul) {
    const StageData& data = stage_data(call);
    Stage matmul = stage;
    matmul.op = Op::MatMul;
    matmul.operands = {stage.operands[0], nullptr};
    matmul.features = 0;
    StageData matmul_data;
    KernelCall matmul_call = call;
    matmul_call.stage_state = &matmul_data;
    for (int which = 0; which < 2; ++which) {
        matmul.operands[0] = stage.operands[size_t(which)];
        matmul_data.operands[0] = data.operands[which];
        matmul_call.out = which == 0 ? call.inout2 : call.inout3;
        exact_matmul(matmul, matmul_call);
    }
}

// gate_up (cuda.gate_up.<format>): one token runs the fused matvec (both matrices' rows
// against one staged x, the activation applied to the sums); a batch runs the format's
// tensor-core tiles for both matrices in one launch (`tiles`: the format has them and they take
// K), else its exact row for each matrix, into the plan's gate/up scratch, then the activation.
template <class F>
void run_gate_up(const Stage& stage, const KernelCall& call, Format format, bool tiles, KernelFn exact_matmul) {
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    const KcapMatmulParams p = matmul_params(stage, call);  // operand 1 is the up matrix, not a bias
    const auto* gate = static_cast<const kcap_u8*>(data.operands[0]);
    const auto* up = static_cast<const kcap_u8*>(data.operands[1]);
    const int activation = int(stage.params.activation);
    if (p.m == 1) {
        launch_matvec_rows<F, true>(ctx, p, gate, up, call.in, activation, call.out);
        return;
    }
    if (tiles && p.m >= kMmaMinTokens) {  // both matrices' tiles in one launch
        mma_tiles::MmaGroup g = mma_tiles::mma_group(p, gate, nullptr, call.inout2);
        mma_tiles::mma_group_add(g, p, up, nullptr, call.inout3);
        mma_tiles::mma_group_bf16(ctx, format, g, call.in);
    } else {
        run_gate_up_matmuls(stage, call, exact_matmul);
    }
    gate_up_activation(stage, call);
}

void gate_up_activation(const Stage& stage, const KernelCall& call) {
    Stage act = stage;
    act.op = Op::FfnActivation;
    KernelCall act_call = call;
    act_call.in = call.inout2;
    act_call.in2 = call.inout3;
    kcap_cuda_ffn_activation(act, act_call);
}

QkvParams qkv_segments(const Stage& stage, const KernelCall& call, int chunk_runs_max, int* groups) {
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    float* outputs[3] = {call.out, call.inout2, call.inout3};
    Stage matmul = stage;
    matmul.op = Op::MatMul;
    matmul.features = 0;
    QkvParams q = {};
    *groups = 0;
    for (int which = 0; which < 3; ++which) {
        const TensorRef* w = stage.operands[size_t(which)];
        matmul.operands = {w, nullptr};
        matmul.n = w->n_rows();
        QkvSegment& s = q.segment[which];
        s.w = static_cast<const kcap_u8*>(data.operands[which]);
        s.y = outputs[which];
        s.p = matmul_params(matmul, call);
        s.format = int(w->format);
        s.split = matvec_split(s.p.n, ctx.sm_count, kMatvecRows, s.p.k, ctx.matvec_warps);
        s.first_group = *groups;
        *groups += int(ceil_div(s.p.n, (kMatvecSimds / s.split) * kMatvecRows));
    }
    q.chunk_runs = std::min(int(stage.k / 32), chunk_runs_max);
    return q;
}

}  // namespace cuda

// A batch of gate_up runs the format's tensor-core row where that row exists and its tiles
// take K (whole 32-element runs), else the exact row (float formats with a K tail).
#define KCAP_DEFINE_MATMUL(NAME, DECODER)                                                                            \
    void kcap_cuda_matmul_##NAME(const Stage& stage, const KernelCall& call) { cuda::run_matmul_exact<DECODER>(stage, call); } \
    void kcap_cuda_gate_up_##NAME(const Stage& stage, const KernelCall& call) {                                      \
        const bool tiles = cuda_rows::mma_format(Format::NAME) && stage.k % 32 == 0;                                 \
        cuda::run_gate_up<DECODER>(stage, call, Format::NAME, tiles, &kcap_cuda_matmul_##NAME);                      \
    }
KCAP_WEIGHT_FORMATS(KCAP_DEFINE_MATMUL)
#undef KCAP_DEFINE_MATMUL

namespace {

// The row a batch of one of qkv's matrices runs: the format's tensor-core row where its tiles
// take K, else its exact row (as gate_up).
KernelFn batched_matmul(Format format, int64_t k) {
    switch (format) {
#define KCAP_BATCHED_CASE(NAME, DECODER) \
    case Format::NAME: return cuda_rows::mma_format(format) && k % 32 == 0 ? &kcap_cuda_matmul_mma_##NAME : &kcap_cuda_matmul_##NAME;
        KCAP_WEIGHT_FORMATS(KCAP_BATCHED_CASE)
#undef KCAP_BATCHED_CASE
        default: throw Error(std::string("cuda.qkv: no matmul row for ") + format_name(format));
    }
}

}  // namespace

// qkv: one token runs the three-segment matvec; a batch, each format's tiles in one launch (or
// its exact row: batched_matmul).
void kcap_cuda_qkv(const Stage& stage, const KernelCall& call) {
    using namespace cuda_rows;
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    float* outputs[3] = {call.out, call.inout2, call.inout3};
    Stage matmul = stage;
    matmul.op = Op::MatMul;
    matmul.features = 0;
    if (call.n_tokens == 1) {
        int groups = 0;
        const cuda::QkvParams q = cuda::qkv_segments(stage, call, kMatvecChunkRuns, &groups);
        const size_t shared = size_t(matvec_shared_floats(stage.k, kMatvecRows)) * 4;
        cuda::launch(ctx, cuda::qkv_kernel, dim3(unsigned(groups)), dim3(kMatvecSimds * 32), shared, q, call.in);
        return;
    }
    // A batch: the formats with tiles that take K run them, one launch per format (all three
    // matrices where Q, K and V share one); the others their exact rows.
    const auto tiled = [&](Format format) {
        return call.n_tokens >= kMmaMinTokens && mma_format(format) && stage.k % 32 == 0;
    };
    int groups = 0;
    const cuda::mma_tiles::MmaFormatGroups by_format =
        cuda::mma_tiles::mma_groups_by_format(cuda::qkv_segments(stage, call, kMatvecChunkRuns, &groups));
    for (int i = 0; i < by_format.count; ++i)
        if (tiled(by_format.format[i])) cuda::mma_tiles::mma_group_bf16(ctx, by_format.format[i], by_format.group[i], call.in);
    cuda::StageData matmul_data;
    KernelCall matmul_call = call;
    matmul_call.stage_state = &matmul_data;
    for (int which = 0; which < 3; ++which) {
        const TensorRef* w = stage.operands[size_t(which)];
        if (tiled(w->format)) continue;
        matmul.operands = {w, nullptr};
        matmul.n = w->n_rows();
        matmul_data.operands[0] = data.operands[which];
        matmul_call.out = outputs[which];
        batched_matmul(w->format, stage.k)(matmul, matmul_call);
    }
}

}  // namespace kcap
