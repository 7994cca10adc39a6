// CUDA entry point of the norm row (cuda.norm): kernels/norm.h, one group per row.
#include "cuda/cuda_context.h"
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

}  // namespace

void kcap_cuda_norm(const Stage& stage, const KernelCall& call) {
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    KcapNormParams p;
    p.width = int(stage.k);
    p.rows = int(call.n_tokens * stage.groups);
    p.eps = stage.params.eps;
    p.layer_norm = (stage.features & kLayerNorm) != 0;
    p.has_weight = data.operands[0] != nullptr;
    p.has_bias = data.operands[1] != nullptr;
    // Short rows (QK-norm over one head) need fewer threads than a hidden row.
    const int threads = p.width <= 64 ? 64 : p.width <= 128 ? 128 : kNormThreads;
    cuda::launch(ctx, norm_kernel, dim3(p.rows), dim3(threads), 0, p, call.in, static_cast<const float*>(data.operands[0]),
                 static_cast<const float*>(data.operands[1]), call.out);
}

}  // namespace kcap
