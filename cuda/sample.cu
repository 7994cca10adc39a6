// CUDA entry point of the sampling row (cuda.sample): kernels/sample.h, two launches. The
// backend routes its own sample stage (k = n = vocabulary) through the table, as the argmax;
// the settings are read from device memory (Context::sample_settings), and with a non-null
// call.inout2 (the sampling decode graph) the drawn token is fed back and the step moves on.
#include "cuda/cuda_context.h"
#include "kernels/sample.h"

namespace kcap {
namespace {

__global__ void __launch_bounds__(KCAP_SAMPLE_THREADS)
    sample_partial_kernel(KcapSampleParams p, const KcapSampleSettings* settings, const float* logits,
                          float* partial_value, kcap_i32* partial_index) {
    __shared__ float top_value[KCAP_SAMPLE_MAX_TOP_K];
    __shared__ int top_index[KCAP_SAMPLE_MAX_TOP_K];
    __shared__ float scratch_value[32];
    __shared__ int scratch_index[32];
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_sample_partial(kcap_cuda_thread(), p, settings, logits, partial_value, partial_index, top_value, top_index,
                        scratch_value, scratch_index);
}

__global__ void __launch_bounds__(KCAP_SAMPLE_THREADS)
    sample_final_kernel(KcapSampleParams p, const KcapSampleSettings* settings, const float* partial_value,
                        const kcap_i32* partial_index, kcap_i32* result, kcap_i32* tokens, kcap_i32* step,
                        kcap_i32* history) {
    __shared__ float top_value[KCAP_SAMPLE_MAX_TOP_K];
    __shared__ int top_index[KCAP_SAMPLE_MAX_TOP_K];
    __shared__ float scratch_value[32];
    __shared__ int scratch_index[32];
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_sample_final(kcap_cuda_thread(), p, settings, partial_value, partial_index, result, tokens, step, history,
                      top_value, top_index, scratch_value, scratch_index);
}

}  // namespace

// call.in: logits [n]; call.out: the drawn token as an int32 (reinterpreted); call.inout2
// non-null: advance (the decode graph).
void kcap_cuda_sample(const Stage& stage, const KernelCall& call) {
    const cuda::Context& ctx = cuda::context(call);
    KcapSampleParams p;
    p.count = int(stage.n);
    p.n_partials = int(cuda::ceil_div(p.count, KCAP_SAMPLE_CHUNK));
    p.advance = call.inout2 != nullptr;
    if (p.n_partials > KCAP_SAMPLE_MAX_PARTIALS || !ctx.sample_settings)
        throw Error("cuda.sample: " + std::to_string(p.count) + " logits exceed what the row takes");
    cuda::launch(ctx, sample_partial_kernel, dim3(p.n_partials), dim3(KCAP_SAMPLE_THREADS), 0, p,
                 static_cast<const KcapSampleSettings*>(ctx.sample_settings), call.in, ctx.sample_partial_value,
                 ctx.sample_partial_index);
    cuda::launch(ctx, sample_final_kernel, dim3(1), dim3(KCAP_SAMPLE_THREADS), 0, p,
                 static_cast<const KcapSampleSettings*>(ctx.sample_settings), ctx.sample_partial_value,
                 ctx.sample_partial_index, reinterpret_cast<kcap_i32*>(call.out), ctx.tokens, ctx.step, ctx.history);
}

}  // namespace kcap
