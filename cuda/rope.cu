// CUDA entry points of the rope rows (cuda.rope, cuda.qk_norm_rope): kernels/rope.h with the
// stage's cos/sin table (made by the backend at load time, cuda_backend.cu) and positions from
// device memory. The attention rows that own a rope launch the same kernels through
// cuda::run_rope / run_qk_norm_rope for a prefill chunk.
#include "cuda/attention.h"
#include "kernels/rope.h"

namespace kcap {
namespace {

using namespace cuda_rows;

__global__ void __launch_bounds__(kElementwiseThreads)
    rope_kernel(KcapRopeParams p, const kcap_i32* step, const float2* cos_sin, float* q, float* k) {
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_rope(kcap_cuda_thread(), p, step, cos_sin, q, k);
}

__global__ void __launch_bounds__(kQkNormRopeSimds * 32)
    qk_norm_rope_kernel(KcapRopeParams p, float eps, const kcap_i32* step, const float2* cos_sin, const float* q_weight,
                        const float* k_weight, float* q, float* k) {
    extern __shared__ float shared[];
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_qk_norm_rope(kcap_cuda_thread(), p, eps, step, cos_sin, q_weight, k_weight, q, k, shared);
}

}  // namespace

namespace cuda {

// qk_norm_rope: operands (q_norm weight, k_norm weight, rope factors: folded into the table);
// out = Q, inout2 = K, both in place.
void run_qk_norm_rope(const Stage& stage, const KernelCall& call) {
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    const KcapRopeParams p = rope_params(stage, call.n_tokens, call.inout2 != nullptr);
    const int64_t rows = int64_t(p.n_tokens) * (p.n_head + p.n_head_kv);
    cuda::launch(ctx, qk_norm_rope_kernel, dim3(cuda::ceil_div(rows, kQkNormRopeSimds)), dim3(kQkNormRopeSimds * 32),
                 size_t(kQkNormRopeSimds) * size_t(p.head_dim) * 4, p, stage.params.eps, ctx.step,
                 reinterpret_cast<const float2*>(data.rope_table), static_cast<const float*>(data.operands[0]),
                 static_cast<const float*>(data.operands[1]), call.out, call.inout2);
}

void run_rope(const Stage& stage, const KernelCall& call) {
    const cuda::Context& ctx = cuda::context(call);
    const KcapRopeParams p = rope_params(stage, call.n_tokens, call.inout2 != nullptr);
    const int64_t total = int64_t(p.n_tokens) * (p.n_head + p.n_head_kv) * (p.rope_dim / 2);
    cuda::launch(ctx, rope_kernel, dim3(cuda::ceil_div(total, kElementwiseThreads)), dim3(kElementwiseThreads), 0, p,
                 ctx.step, reinterpret_cast<const float2*>(cuda::stage_data(call).rope_table), call.out, call.inout2);
}

}  // namespace cuda

void kcap_cuda_qk_norm_rope(const Stage& stage, const KernelCall& call) { cuda::run_qk_norm_rope(stage, call); }
void kcap_cuda_rope(const Stage& stage, const KernelCall& call) { cuda::run_rope(stage, call); }

}  // namespace kcap
