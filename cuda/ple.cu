// CUDA entry points of the per-layer embedding rows: kernels/ple.h.
//   cuda.per_layer_embed.<proj format>: the projection of every token's embedding (the
//     few-token matmul body of kernels/matmul.h, for any number of tokens), then the combine
//     (per-layer RMS norm of the projection plus the token's table row), whose instantiation
//     follows the table's format (any format the row lists);
//   cuda.per_layer_gate: act(gate) * this layer's slice.
// Token ids come from the context's device token buffer, as for the embedding rows.
#include "cuda/cuda_context.h"
#include "cuda/decoders.h"
#include "kernels/matmul.h"
#include "kernels/ple.h"

namespace kcap {
namespace cuda {
namespace {

using namespace cuda_rows;

template <class F>
__global__ void __launch_bounds__(kTokensSimds * 32)
    ple_proj_kernel(KcapMatmulParams p, const kcap_u8* w, const float* x, float* y) {
    const KcapThread t = kcap_cuda_thread();
    pdl_wait();
    pdl_trigger();
    kcap_matmul_tokens<F, kTokensRows, kTokensPerPass>(t, p, w, x, nullptr, y);
}

template <class T>
__global__ void __launch_bounds__(32)
    ple_combine_kernel(KcapPleParams p, const kcap_i32* tokens, const kcap_u8* table, const float* norm_w, float* out) {
    pdl_wait();
    pdl_trigger();
    kcap_ple_combine<T>(kcap_cuda_thread(), p, tokens, table, norm_w, out);
}

__global__ void __launch_bounds__(kElementwiseThreads)
    ple_gate_kernel(KcapPleGateParams p, const float* gate, const float* ple, float* out) {
    pdl_wait();
    pdl_trigger();
    kcap_ple_gate(kcap_cuda_thread(), p, gate, ple, out);
}

template <class T>
void launch_combine(const Context& ctx, const KcapPleParams& p, int n_layer, const void* table, const void* norm_w,
                    float* out) {
    launch(ctx, ple_combine_kernel<T>, dim3(p.n_tokens, n_layer), dim3(32), 0, p, static_cast<const kcap_i32*>(ctx.tokens),
           static_cast<const kcap_u8*>(table), static_cast<const float*>(norm_w), out);
}

}  // namespace

template <class P>
void run_per_layer_embed(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    const KcapMatmulParams mp = ple_projection_params(stage, call.n_tokens);
    launch(ctx, ple_proj_kernel<P>, dim3(ceil_div(mp.n, kTokensSimds * kTokensRows), ceil_div(mp.m, kTokensPerPass)),
           dim3(kTokensSimds * 32), 0, mp, static_cast<const kcap_u8*>(data.operands[1]), call.in, call.out);
    const int n_layer = int(stage.groups);
    const KcapPleParams p = ple_params(stage, call.n_tokens);
    const Format table_format = stage.operands[0]->format;
    switch (table_format) {
#define KCAP_PLE_TABLE_CASE(NAME, DECODER)                                                                    \
    case Format::NAME:                                                                                        \
        launch_combine<DECODER>(ctx, p, n_layer, data.operands[0], data.operands[2], call.out);              \
        return;
        KCAP_WEIGHT_FORMATS(KCAP_PLE_TABLE_CASE)
#undef KCAP_PLE_TABLE_CASE
        default: throw Error(std::string("per_layer_embed: no GPU decoder for table format ") + format_name(table_format));
    }
}

}  // namespace cuda

template <Format FORMAT>
void kcap_cuda_per_layer_embed(const Stage& stage, const KernelCall& call) {
    cuda::run_per_layer_embed<cuda::Decoder<FORMAT>>(stage, call);
}
#define KCAP_INSTANTIATE_PLE(NAME, DECODER) \
    template void kcap_cuda_per_layer_embed<Format::NAME>(const Stage&, const KernelCall&);
KCAP_WEIGHT_FORMATS(KCAP_INSTANTIATE_PLE)
#undef KCAP_INSTANTIATE_PLE

void kcap_cuda_per_layer_gate(const Stage& stage, const KernelCall& call) {
    const KcapPleGateParams p = ple_gate_params(stage, call.n_tokens);
    const int64_t total = int64_t(p.n_tokens) * p.per;
    cuda::launch(cuda::context(call), cuda::ple_gate_kernel, dim3(cuda::ceil_div(total, cuda_rows::kElementwiseThreads)),
                 dim3(cuda_rows::kElementwiseThreads), 0, p, call.in, call.in2, call.out);
}

}  // namespace kcap
