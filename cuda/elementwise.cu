// CUDA entry points of the elementwise rows (cuda.add, cuda.softcap, cuda.scale): kernels/elementwise.h.
#include "cuda/cuda_context.h"
#include "kernels/elementwise.h"

namespace kcap {
namespace {

using namespace cuda_rows;

__global__ void __launch_bounds__(kElementwiseThreads)
    add_kernel(KcapElementwiseParams p, const float* a, const float* b, float* out) {
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_add(kcap_cuda_thread(), p, a, b, out);
}

__global__ void __launch_bounds__(kElementwiseThreads) softcap_kernel(KcapElementwiseParams p, const float* in, float* out) {
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_softcap(kcap_cuda_thread(), p, in, out);
}

__global__ void __launch_bounds__(kElementwiseThreads) scale_kernel(KcapElementwiseParams p, const float* in, float* out) {
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_scale(kcap_cuda_thread(), p, in, out);
}

KcapElementwiseParams params(const Stage& stage, const KernelCall& call) { return elementwise_params(stage, call.n_tokens); }

}  // namespace

void kcap_cuda_add(const Stage& stage, const KernelCall& call) {
    const KcapElementwiseParams p = params(stage, call);
    cuda::launch(cuda::context(call), add_kernel, dim3(cuda::ceil_div(p.count, kElementwiseThreads)),
                 dim3(kElementwiseThreads), 0, p, call.in, call.in2, call.out);
}

void kcap_cuda_softcap(const Stage& stage, const KernelCall& call) {
    const KcapElementwiseParams p = params(stage, call);
    cuda::launch(cuda::context(call), softcap_kernel, dim3(cuda::ceil_div(p.count, kElementwiseThreads)),
                 dim3(kElementwiseThreads), 0, p, call.in, call.out);
}

void kcap_cuda_scale(const Stage& stage, const KernelCall& call) {
    const KcapElementwiseParams p = params(stage, call);
    cuda::launch(cuda::context(call), scale_kernel, dim3(cuda::ceil_div(p.count, kElementwiseThreads)),
                 dim3(kElementwiseThreads), 0, p, call.in, call.out);
}

}  // namespace kcap
