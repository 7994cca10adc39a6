// Metal launchers of the matmul and embedding rows (metal.matmul.<format>, metal.embed.<format>).
// Which format: the row (its entry points are that format's instantiations in matmul.metal /
// embed.metal), so one launcher body serves every format. Geometry: metal/rows.h.
#include "metal/metal_context.h"

namespace kcap {
namespace metal {
namespace {

using namespace metal_rows;

void run_matmul(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    KcapMatmulParams p;
    p.k = int(stage.k);
    p.n = int(stage.n);
    p.m = call.n_tokens;
    p.row_bytes = unsigned(row_bytes(stage.operands[0]->format, stage.k));
    p.has_bias = data.operands[1] != nullptr;
    bind_params(ctx, 0, p);
    if (p.m == 1) {
        // Decode: a team of `split` simd groups per kMatvecRows rows (matvec_kernel on CUDA).
        const int split = matvec_split(p.k);
        bind_params(ctx, 1, split);
        bind(ctx, 2, data.operands[0]);
        bind(ctx, 3, call.in);
        bind(ctx, 4, data.operands[1]);
        bind(ctx, 5, call.out);
        dispatch(ctx, *data.row, kMatvec, MTLSizeMake(ceil_div(p.n, (kMatvecSimds / split) * kMatvecRows), 1, 1),
                 kMatvecSimds * 32);
        return;
    }
    bind(ctx, 1, data.operands[0]);
    bind(ctx, 2, call.in);
    bind(ctx, 3, data.operands[1]);
    bind(ctx, 4, call.out);
    dispatch(ctx, *data.row, kMatmulTokens,
             MTLSizeMake(ceil_div(p.n, kTokensSimds * kTokensRows), ceil_div(p.m, kTokensPerPass), 1), kTokensSimds * 32);
}

void run_embed(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    KcapEmbedParams p;
    p.n_tokens = call.n_tokens;
    p.width = int(stage.n);
    p.row_bytes = unsigned(row_bytes(stage.operands[0]->format, stage.n));
    p.scale = stage.params.scale;
    bind_params(ctx, 0, p);
    bind(ctx, 1, ctx.tokens);
    bind(ctx, 2, data.operands[0]);
    bind(ctx, 3, call.out);
    dispatch(ctx, *data.row, 0, MTLSizeMake(NSUInteger(p.n_tokens), 1, 1), kEmbedThreads);
}

}  // namespace
}  // namespace metal

#define KCAP_DEFINE_METAL_FORMAT_LAUNCHERS(NAME, DECODER)                                                        \
    void kcap_metal_matmul_##NAME(const Stage& stage, const KernelCall& call) { metal::run_matmul(stage, call); } \
    void kcap_metal_embed_##NAME(const Stage& stage, const KernelCall& call) { metal::run_embed(stage, call); }
KCAP_WEIGHT_FORMATS(KCAP_DEFINE_METAL_FORMAT_LAUNCHERS)
#undef KCAP_DEFINE_METAL_FORMAT_LAUNCHERS

}  // namespace kcap
