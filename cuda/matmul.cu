// CUDA entry points of the exact matmul rows (cuda.matmul.<format>): kernels/matmul.h bodies
// launched with the geometry declared in cuda/rows.h. One token: the decode matvec with x
// staged in threadgroup memory (kernels/matvec.h; teams and parts from cuda_rows::matvec_split),
// which prefetches its weight rows into L2 before waiting on the previous kernel; more tokens: the
// few-token walk (each decoded run of weights reused for kTokensPerPass tokens).
#include "cuda/matmul.h"
#include <algorithm>

#include "kernels/matmul.h"
#include "kernels/matvec.h"

namespace kcap {
namespace cuda {
namespace {

using namespace cuda_rows;

template <class F>
__global__ void __launch_bounds__(kMatvecSimds * 32)
    matvec_kernel(KcapMatmulParams p, int split, int chunk_runs, const kcap_u8* w, const float* x, const float* bias,
                  float* y) {
    extern __shared__ float shared[];
    const KcapThread t = kcap_cuda_thread();
    kcap_matvec_split_prefetch<kMatvecRows>(t, p, split, w);  // weights never change: safe before the wait
    pdl_wait();
    pdl_trigger();
    kcap_matvec_staged<F, kMatvecRows>(t, p, split, chunk_runs, w, x, bias, y, shared);
}

template <class F>
__global__ void __launch_bounds__(kTokensSimds * 32)
    tokens_kernel(KcapMatmulParams p, const kcap_u8* w, const float* x, const float* bias, float* y) {
    const KcapThread t = kcap_cuda_thread();
    pdl_wait();
    pdl_trigger();
    kcap_matmul_tokens<F, kTokensRows, kTokensPerPass>(t, p, w, x, bias, y);
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
        const int split = matvec_split(p.n, ctx.sm_count);
        const int chunk_runs = std::min(p.k / 32, kMatvecChunkRuns);
        launch(ctx, matvec_kernel<F>, dim3(ceil_div(p.n, (kMatvecSimds / split) * kMatvecRows)), dim3(kMatvecSimds * 32),
               size_t(matvec_shared_floats(p.k)) * 4, p, split, chunk_runs, w, call.in, bias, call.out);
        return;
    }
    // Several tokens: each decoded run of weights serves kTokensPerPass of them.
    launch(ctx, tokens_kernel<F>, dim3(ceil_div(p.n, kTokensSimds * kTokensRows), ceil_div(p.m, kTokensPerPass)),
           dim3(kTokensSimds * 32), 0, p, w, call.in, bias, call.out);
}

}  // namespace cuda

#define KCAP_DEFINE_MATMUL(NAME, DECODER) \
    void kcap_cuda_matmul_##NAME(const Stage& stage, const KernelCall& call) { cuda::run_matmul_exact<DECODER>(stage, call); }
KCAP_WEIGHT_FORMATS(KCAP_DEFINE_MATMUL)
#undef KCAP_DEFINE_MATMUL

}  // namespace kcap
