// Metal launchers of the per-layer embedding rows (metal.per_layer_embed.<format>,
// metal.per_layer_gate), as cuda/ple.cu: the projection of every token's embedding with the
// few-token walk, then the combine instantiated for the table's format (entry kPleCombine +
// its index in KCAP_WEIGHT_FORMATS); the gate is one thread per value.
#include "metal/metal_context.h"

namespace kcap {
namespace metal {
namespace {

using namespace metal_rows;

// Operands: (table, projection, norm weight); call.in = the scaled embeddings, call.out = the
// per-layer buffer [n_tokens][n_layer * per].
void run_per_layer_embed(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    const KcapMatmulParams mp = ple_projection_params(stage, call.n_tokens);
    bind_params(ctx, 0, mp);
    bind(ctx, 1, data.operands[1]);
    bind(ctx, 2, call.in);
    bind(ctx, 3, nullptr);
    bind(ctx, 4, call.out);
    dispatch(ctx, *call.row, kPleProjection,
             MTLSizeMake(ceil_div(mp.n, kTokensSimds * kTokensRows), ceil_div(mp.m, kTokensPerPass), 1), kTokensSimds * 32);
    const Format table_format = stage.operands[0]->format;
    const int combine = ple_combine_index(table_format);
    if (combine < 0)
        throw Error(std::string("per_layer_embed: no GPU decoder for table format ") + format_name(table_format));
    const KcapPleParams p = ple_params(stage, call.n_tokens);
    bind_params(ctx, 0, p);
    bind(ctx, 1, ctx.tokens);
    bind(ctx, 2, data.operands[0]);
    bind(ctx, 3, data.operands[2]);
    bind(ctx, 4, call.out);
    dispatch(ctx, *call.row, kPleCombine + combine, MTLSizeMake(NSUInteger(p.n_tokens), NSUInteger(stage.groups), 1),
             kSimdWidth);
}

}  // namespace
}  // namespace metal

#define KCAP_DEFINE_METAL_PLE(NAME, DECODER)                                              \
    void kcap_metal_per_layer_embed_##NAME(const Stage& stage, const KernelCall& call) { \
        metal::run_per_layer_embed(stage, call);                                          \
    }
KCAP_WEIGHT_FORMATS(KCAP_DEFINE_METAL_PLE)
#undef KCAP_DEFINE_METAL_PLE

// call.in = the gate projection [n_tokens][per], call.in2 = the per-layer buffer (row stride
// stage.k, this layer's slice at stage.groups * per), call.out = [n_tokens][per].
void kcap_metal_per_layer_gate(const Stage& stage, const KernelCall& call) {
    using namespace metal_rows;
    const metal::Context& ctx = metal::context(call);
    const KcapPleGateParams p = ple_gate_params(stage, call.n_tokens);
    const int64_t total = int64_t(p.n_tokens) * p.per;
    metal::bind_params(ctx, 0, p);
    metal::bind(ctx, 1, call.in);
    metal::bind(ctx, 2, call.in2);
    metal::bind(ctx, 3, call.out);
    metal::dispatch(ctx, *metal::stage_data(call).row, 0, MTLSizeMake(metal::ceil_div(total, kElementwiseThreads), 1, 1),
                    kElementwiseThreads);
}

}  // namespace kcap
