// CUDA entry points of the mixture-of-experts rows (kernels/moe.h, kernels/matvec.h):
//   cuda.moe_route           one group per token: the router's logits (times a logit scale), the
//                            top n_used, their weights (times a per-expert scale where the stage
//                            has one), into the Routing buffer on the device (no host round trip:
//                            the decode step stays one captured graph).
//   cuda.moe_experts.<fmt>   the chosen experts' gated FFNs: the staged gate_up matvec of each
//                            (token, chosen expert) slot (grid y = slots, the expert's rows found
//                            from the Routing buffer in the kernel), the down matvec of each slot
//                            (the down matrix's own format), then the weighted sum per token. A
//                            call reads only the chosen experts' weights; each slot reads its
//                            expert's rows once.
//   cuda.moe_shared_gate     out = in + sigmoid(w . x) * shared, one group per token.
#include <algorithm>

#include "cuda/matmul.h"
#include "kernels/moe.h"

namespace kcap {
namespace cuda {
namespace {

using namespace cuda_rows;

template <class F>
__global__ void __launch_bounds__(kMoeRouteThreads)
    route_kernel(KcapMoeParams p, const kcap_u8* w, const float* x, const float* expert_scale, float* routing) {
    __shared__ float logits[KCAP_MOE_MAX_EXPERTS];
    pdl_wait();
    pdl_trigger();
    kcap_moe_route<F>(kcap_cuda_thread(), p, w, x, expert_scale, routing, logits);
}

// The (token, chosen expert) slot blockIdx.y's gate and up matvec: act into act[slot].
template <class F>
__global__ void __launch_bounds__(kMatvecSimds * 32)
    experts_gate_up_kernel(KcapMoeParams moe, KcapMatmulParams p, int split, int chunk_runs, const kcap_u8* gate,
                           const kcap_u8* up, const float* routing, const float* x, int activation, float* act) {
    extern __shared__ float shared[];
    pdl_wait();
    pdl_trigger();
    kcap_moe_gate_up<F, kMatvecRows>(kcap_cuda_thread(), moe, p, split, chunk_runs, gate, up, routing, x, activation,
                                     act, shared);
}

// The slot's down matvec into down[slot].
template <class F>
__global__ void __launch_bounds__(kMatvecSimds * 32)
    experts_down_kernel(KcapMoeParams moe, KcapMatmulParams p, int split, int chunk_runs, const kcap_u8* down,
                        const float* routing, const float* act, float* out) {
    extern __shared__ float shared[];
    pdl_wait();
    pdl_trigger();
    kcap_moe_down<F, kMatvecRows>(kcap_cuda_thread(), moe, p, split, chunk_runs, down, routing, act, out, shared);
}

__global__ void __launch_bounds__(kElementwiseThreads)
    combine_kernel(KcapMoeParams p, const float* routing, const float* down, float* out) {
    pdl_wait();
    pdl_trigger();
    kcap_moe_combine(kcap_cuda_thread(), p, routing, down, out);
}

__global__ void __launch_bounds__(kElementwiseThreads)
    shared_gate_kernel(int width, const float* w, const float* x, const float* in, const float* shared, float* out) {
    __shared__ float partial[kElementwiseThreads / 32];
    pdl_wait();
    pdl_trigger();
    kcap_moe_shared_gate(kcap_cuda_thread(), width, w, x, in, shared, out, partial);
}

// The down matvec of every slot in the down matrix's format (fixed per stage).
void launch_experts_down(const Context& ctx, const Stage& stage, const KcapMoeParams& moe, const kcap_u8* down,
                         const float* routing, unsigned slots) {
    KcapMatmulParams p{};
    p.k = moe.ff;
    p.n = moe.n;
    p.m = 1;
    p.row_bytes = unsigned(row_bytes(stage.operands[2]->format, moe.ff));
    const int split = matvec_split(p.n, ctx.sm_count, kMatvecRows, p.k);
    const int chunk_runs = std::min(p.k / 32, kMatvecChunkRuns);
    const dim3 grid(ceil_div(p.n, (kMatvecSimds / split) * kMatvecRows), slots);
    const size_t shared = size_t(matvec_shared_floats(p.k, kMatvecRows)) * 4;
    switch (stage.operands[2]->format) {
#define KCAP_MOE_DOWN_CASE(NAME, DECODER)                                                                      \
    case Format::NAME:                                                                                         \
        launch(ctx, experts_down_kernel<DECODER>, grid, dim3(kMatvecSimds * 32), shared, moe, p, split, chunk_runs, \
               down, routing, static_cast<const float*>(ctx.moe_act), ctx.moe_down);                          \
        return;
        KCAP_WEIGHT_FORMATS(KCAP_MOE_DOWN_CASE)
#undef KCAP_MOE_DOWN_CASE
        default: throw Error(std::string("cuda.moe_experts: no body for ") + format_name(stage.operands[2]->format));
    }
}

}  // namespace
}  // namespace cuda

void kcap_cuda_moe_route(const Stage& stage, const KernelCall& call) {
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    const KcapMoeParams p = moe_params(stage, call.n_tokens);
    const auto* w = static_cast<const kcap_u8*>(data.operands[0]);
    // The per-expert scale vector (F32), where the stage has one.
    const auto* expert_scale = p.expert_scaled ? static_cast<const float*>(data.operands[1]) : nullptr;
    switch (stage.operands[0]->format) {
#define KCAP_MOE_ROUTE_CASE(NAME, DECODER)                                                                     \
    case Format::NAME:                                                                                         \
        cuda::launch(ctx, cuda::route_kernel<DECODER>, dim3(unsigned(p.n_tokens)), dim3(cuda_rows::kMoeRouteThreads), \
                     0, p, w, call.in, expert_scale, call.out);                                                \
        return;
        KCAP_WEIGHT_FORMATS(KCAP_MOE_ROUTE_CASE)
#undef KCAP_MOE_ROUTE_CASE
        default: throw Error(std::string("cuda.moe_route: no body for ") + format_name(stage.operands[0]->format));
    }
}

template <Format FORMAT>
void kcap_cuda_moe_experts(const Stage& stage, const KernelCall& call) {
    using namespace cuda_rows;
    using F = cuda::Decoder<FORMAT>;
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    const KcapMoeParams moe = moe_params(stage, call.n_tokens);
    const unsigned slots = unsigned(moe.n_tokens * moe.n_used);
    KcapMatmulParams p{};
    p.k = moe.k;
    p.n = moe.ff;
    p.m = 1;
    p.row_bytes = unsigned(row_bytes(FORMAT, moe.k));
    const int split = matvec_split(p.n, ctx.sm_count, kMatvecRows, p.k);
    const int chunk_runs = std::min(p.k / 32, kMatvecChunkRuns);
    cuda::launch(ctx, cuda::experts_gate_up_kernel<F>, dim3(cuda::ceil_div(p.n, (kMatvecSimds / split) * kMatvecRows), slots),
                 dim3(kMatvecSimds * 32), size_t(matvec_shared_floats(p.k, kMatvecRows)) * 4, moe, p, split, chunk_runs,
                 static_cast<const kcap_u8*>(data.operands[0]), static_cast<const kcap_u8*>(data.operands[1]), call.in2,
                 call.in, int(stage.params.activation), ctx.moe_act);
    cuda::launch_experts_down(ctx, stage, moe, static_cast<const kcap_u8*>(data.operands[2]), call.in2, slots);
    const int64_t outputs = int64_t(moe.n_tokens) * moe.n;
    cuda::launch(ctx, cuda::combine_kernel, dim3(cuda::ceil_div(outputs, kElementwiseThreads)), dim3(kElementwiseThreads),
                 0, moe, call.in2, static_cast<const float*>(ctx.moe_down), call.out);
}
#define KCAP_INSTANTIATE_MOE(NAME, DECODER) template void kcap_cuda_moe_experts<Format::NAME>(const Stage&, const KernelCall&);
KCAP_WEIGHT_FORMATS(KCAP_INSTANTIATE_MOE)
#undef KCAP_INSTANTIATE_MOE

void kcap_cuda_moe_shared_gate(const Stage& stage, const KernelCall& call) {
    const cuda::StageData& data = cuda::stage_data(call);
    cuda::launch(cuda::context(call), cuda::shared_gate_kernel, dim3(unsigned(call.n_tokens)),
                 dim3(cuda_rows::kElementwiseThreads), 0, int(stage.n), static_cast<const float*>(data.operands[0]),
                 call.in3, call.in, call.in2, call.out);
}

}  // namespace kcap
