// CUDA entry point of the argmax row (cuda.argmax): kernels/argmax.h, two launches. The
// backend routes its own argmax stage (k = n = vocabulary) through the table; with
// call.n_tokens == 1 and a non-null call.inout2 (the decode graph) the winner is fed back as
// the next token and the step moves on.
#include "cuda/cuda_context.h"
#include "kernels/argmax.h"

namespace kcap {
namespace {

using namespace cuda_rows;

__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_partial_kernel(KcapArgmaxParams p, const float* logits, float* partial_value, kcap_i32* partial_index) {
    __shared__ float scratch_value[32];
    __shared__ int scratch_index[32];
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_argmax_partial(kcap_cuda_thread(), p, logits, partial_value, partial_index, scratch_value, scratch_index);
}

__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_final_kernel(KcapArgmaxParams p, const float* partial_value, const kcap_i32* partial_index, kcap_i32* result,
                        kcap_i32* tokens, kcap_i32* step, kcap_i32* history) {
    __shared__ float scratch_value[32];
    __shared__ int scratch_index[32];
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_argmax_final(kcap_cuda_thread(), p, partial_value, partial_index, result, tokens, step, history, scratch_value,
                      scratch_index);
}

}  // namespace

// call.in: logits [n]; call.out: the winner as an int32 (reinterpreted); call.inout2 non-null: advance.
void kcap_cuda_argmax(const Stage& stage, const KernelCall& call) {
    const cuda::Context& ctx = cuda::context(call);
    KcapArgmaxParams p;
    p.count = int(stage.n);
    p.chunk = kArgmaxChunk;
    p.n_partials = int(cuda::ceil_div(p.count, kArgmaxChunk));
    p.advance = call.inout2 != nullptr;
    if (p.n_partials > ctx.argmax_partials)
        throw Error("cuda.argmax: " + std::to_string(p.count) + " logits need more partials than the context holds");
    cuda::launch(ctx, argmax_partial_kernel, dim3(p.n_partials), dim3(kArgmaxThreads), 0, p, call.in,
                 ctx.argmax_partial_value, ctx.argmax_partial_index);
    cuda::launch(ctx, argmax_final_kernel, dim3(1), dim3(kArgmaxThreads), 0, p, ctx.argmax_partial_value,
                 ctx.argmax_partial_index, reinterpret_cast<kcap_i32*>(call.out), ctx.tokens, ctx.step, ctx.history);
}

}  // namespace kcap
