// CUDA entry point of the norm row (cuda.norm): kernels/norm.h, one group per row.
#include "cuda/cuda_context.h"
#include "kernels/matvec_q8.h"
#include "kernels/norm.h"

namespace kcap {
namespace {

using namespace cuda_rows;

__global__ void __launch_bounds__(kNormThreads)
    norm_kernel(KcapNormParams p, const float* x, const float* weight, const float* bias, float* y) {
    __shared__ float scratch[32];
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_norm(kcap_cuda_thread(), p, x, weight, bias, y, scratch);
}

__global__ void __launch_bounds__(kNormThreads)
    add_norm_kernel(KcapAddNormParams p, float* residual, const float* branch, const float* post_weight,
                    const float* post_bias, const float* weight, const float* bias, float* normed, cuda::Q8Rows q8) {
    __shared__ float scratch[32];
    cuda::pdl_wait();
    cuda::pdl_trigger();
    const KcapThread t = kcap_cuda_thread();
    kcap_add_norm(t, p, residual, branch, post_weight, post_bias, weight, bias, normed, scratch);
    if (q8.codes) {  // the row's q8_1, for the next stage's q8_1 matmul
        __syncthreads();  // the group's writes of the normed row are visible to it
        const kcap_u64 row = blockIdx.x;
        kcap_q8_quantize_row(t, normed + row * kcap_u64(p.width), p.width, q8.codes + row * kcap_u64(p.width / 4),
                             q8.d + row * kcap_u64(p.width / 32), q8.half_sums + row * kcap_u64(p.width / 16));
    }
}

// The same with the row in registers (kcap_add_norm_vec: V float4 per thread); the q8_1 epilogue
// quantizes the registers (lanes 8r .. 8r + 7 hold a run), not a re-read of the written row.
template <int V>
__global__ void __launch_bounds__(kNormThreads)
    add_norm_vec_kernel(KcapAddNormParams p, float* residual, const float* branch, const float* post_weight,
                        const float* post_bias, const float* weight, const float* bias, float* normed, cuda::Q8Rows q8) {
    __shared__ float scratch[32];
    cuda::pdl_wait();
    cuda::pdl_trigger();
    const KcapThread t = kcap_cuda_thread();
    float4 v[V];
    kcap_add_norm_vec<V>(t, p, residual, branch, post_weight, post_bias, weight, bias, normed, scratch, v);
    if (!q8.codes) return;
    const kcap_u64 row = blockIdx.x;
    const int n4 = p.width / 4;
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int i = int(t.index) + k * int(t.threads);
        const KcapQ8Quad q = kcap_q8_quantize_quad(v[k]);  // every lane takes part (zeros past the row)
        if (i < n4)
            kcap_q8_store_quad(q, i, q8.codes + row * kcap_u64(n4), q8.d + row * kcap_u64(p.width / 32),
                               q8.half_sums + row * kcap_u64(p.width / 16));
    }
}

}  // namespace

// add_norm: operands (post weight, post bias, weight, bias); in = the residual (call.inout2,
// read and written), in2 = the branch output, out = the normed row. cuda.add_norm_q8 (Q8) also
// writes the normed rows' q8_1 into the context's scratch for the q8_1 matmuls the planner linked
// to it (kQ8Output / kQ8Input), which then need no quantize launch. The row held in registers
// (add_norm_vec_kernel) where the width and the buffers allow, a fixed function of the stage.
template <bool Q8>
void kcap_cuda_add_norm(const Stage& stage, const KernelCall& call) {
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    auto operand = [&](size_t i) -> const float* {
        return i < stage.operands.size() && stage.operands[i] ? static_cast<const float*>(data.operands[i]) : nullptr;
    };
    const KcapAddNormParams p = add_norm_params(stage);
    const cuda::Q8Rows q8 = Q8 ? cuda::q8_rows_layout(ctx, call.n_tokens, p.width) : cuda::Q8Rows{nullptr, nullptr, nullptr};
    const int threads = norm_threads(p.width);
    const int per_thread = (p.width / 4 + threads - 1) / threads;  // float4s
    const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    const bool vec = p.width % 4 == 0 && per_thread <= kAddNormVecMax && aligned(call.inout2) &&
                     aligned(call.in2) && aligned(call.out) && aligned(operand(0)) && aligned(operand(1)) &&
                     aligned(operand(2)) && aligned(operand(3));
    auto* kernel = !vec ? add_norm_kernel : per_thread == 1 ? add_norm_vec_kernel<1> : add_norm_vec_kernel<2>;
    cuda::launch(ctx, kernel, dim3(call.n_tokens), dim3(threads), 0, p, call.inout2, call.in2, operand(0), operand(1),
                 operand(2), operand(3), call.out, q8);
}

template void kcap_cuda_add_norm<false>(const Stage&, const KernelCall&);
template void kcap_cuda_add_norm<true>(const Stage&, const KernelCall&);

void kcap_cuda_norm(const Stage& stage, const KernelCall& call) {
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    const KcapNormParams p = norm_params(stage, call.n_tokens);
    // Short rows (QK-norm over one head) need fewer threads than a hidden row.
    const int threads = norm_threads(p.width);
    cuda::launch(ctx, norm_kernel, dim3(p.rows), dim3(threads), 0, p, call.in, static_cast<const float*>(data.operands[0]),
                 static_cast<const float*>(data.operands[1]), call.out);
}

}  // namespace kcap
