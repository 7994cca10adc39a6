// CUDA entry point of the FFN activation row (cuda.ffn_activation): kernels/activation.h. The
// gate_up rows that end in the same kernel launch it through cuda::run_ffn_activation.
#include "cuda/cuda_context.h"
#include "cuda/matmul.h"
#include "kernels/activation.h"

namespace kcap {
namespace {

using namespace cuda_rows;

__global__ void __launch_bounds__(kElementwiseThreads)
    activation_kernel(KcapElementwiseParams p, const float* gate, const float* up, float* out) {
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_ffn_activation(kcap_cuda_thread(), p, gate, up, out);
}

}  // namespace

namespace cuda {

void run_ffn_activation(const Stage& stage, const KernelCall& call) {
    const KcapElementwiseParams p = activation_params(stage, call.n_tokens, call.in2 != nullptr);
    launch(context(call), activation_kernel, dim3(ceil_div(p.count, kElementwiseThreads)), dim3(kElementwiseThreads), 0,
           p, call.in, call.in2, call.out);
}

}  // namespace cuda

void kcap_cuda_ffn_activation(const Stage& stage, const KernelCall& call) { cuda::run_ffn_activation(stage, call); }

}  // namespace kcap
