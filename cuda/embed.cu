// CUDA entry points of the embedding rows (cuda.embed.<format>): kernels/embed.h.
// Token ids come from the context's device token buffer (the decode graph's argmax feeds it),
// positions (for a learned position embedding, operand 1) from the device step.
#include "cuda/cuda_context.h"
#include "cuda/decoders.h"
#include "kernels/embed.h"

namespace kcap {
namespace cuda {
namespace {

using namespace cuda_rows;

template <class F>
__global__ void __launch_bounds__(kEmbedThreads)
    embed_kernel(KcapEmbedParams p, const kcap_i32* tokens, const kcap_i32* step, const kcap_u8* table,
                 const kcap_u8* positions, float* out) {
    pdl_wait();
    pdl_trigger();
    kcap_embed<F>(kcap_cuda_thread(), p, tokens, step, table, positions, out);
}

}  // namespace

template <class F>
void run_embed(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    const KcapEmbedParams p = embed_params(stage, call.n_tokens);
    const TensorRef* positions = stage_operand(stage, 1);
    const StageData& data = stage_data(call);
    launch(ctx, embed_kernel<F>, dim3(p.n_tokens), dim3(kEmbedThreads), 0, p, static_cast<const kcap_i32*>(ctx.tokens),
           static_cast<const kcap_i32*>(ctx.step), static_cast<const kcap_u8*>(data.operands[0]),
           static_cast<const kcap_u8*>(positions ? data.operands[1] : nullptr), call.out);
}

}  // namespace cuda

template <Format FORMAT>
void kcap_cuda_embed(const Stage& stage, const KernelCall& call) {
    cuda::run_embed<cuda::Decoder<FORMAT>>(stage, call);
}
#define KCAP_INSTANTIATE_EMBED(NAME, DECODER) template void kcap_cuda_embed<Format::NAME>(const Stage&, const KernelCall&);
KCAP_WEIGHT_FORMATS(KCAP_INSTANTIATE_EMBED)
#undef KCAP_INSTANTIATE_EMBED

}  // namespace kcap
