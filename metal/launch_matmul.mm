// Metal launchers of the matmul, gate_up and embedding rows (metal.matvec.<format>,
// metal.matmul_tokens.<format>, metal.gate_up[_tokens].<format>, metal.embed.<format>), as
// cuda/matmul.cu and cuda/embed.cu. Which
// format: the row (its entry points are that format's instantiations in matmul.metal /
// embed.metal), so one launcher body serves every format. Geometry: metal/rows.h.
#include "metal/metal_context.h"

namespace kcap {
namespace metal {
namespace {

using namespace metal_rows;

// One token: kcap_matvec_staged with x staged in threadgroup memory (entry `entry` of `row`:
// the plain matvec or gate_up), teams and parts from metal_rows::matvec_split.
void encode_matvec(const Context& ctx, const Row& row, int entry, const KcapMatmulParams& p, const void* w0,
                   const void* w1, const float* x, const void* bias, int activation, float* y) {
    KcapMetalMatvecArgs a;
    a.split = matvec_split(p.n);
    a.chunk_runs = matvec_chunk_runs(p.k);
    a.activation = activation;
    bind_params(ctx, 0, p);
    bind_params(ctx, 1, a);
    bind(ctx, 2, w0);
    bind(ctx, 3, w1);
    bind(ctx, 4, x);
    bind(ctx, 5, bias);
    bind(ctx, 6, y);
    // Lengths of threadgroup memory are multiples of 16 bytes (these already are: 36-float runs
    // and 64 partials, but round anyway).
    const NSUInteger bytes = (NSUInteger(matvec_shared_floats(p.k)) * 4 + 15) / 16 * 16;
    [ctx.encoder setThreadgroupMemoryLength:bytes atIndex:0];
    dispatch(ctx, row, entry, MTLSizeMake(ceil_div(p.n, (kMatvecSimds / a.split) * kMatvecRows), 1, 1),
             kMatvecSimds * 32);
}

// Several tokens: the few-token walk, each decoded run of weights serving kTokensPerPass tokens.
void encode_tokens(const Context& ctx, const Row& row, int entry, const KcapMatmulParams& p, const void* w,
                   const float* x, const void* bias, float* y) {
    bind_params(ctx, 0, p);
    bind(ctx, 1, w);
    bind(ctx, 2, x);
    bind(ctx, 3, bias);
    bind(ctx, 4, y);
    dispatch(ctx, row, entry, MTLSizeMake(ceil_div(p.n, kTokensSimds * kTokensRows), ceil_div(p.m, kTokensPerPass), 1),
             kTokensSimds * 32);
}

// metal.matvec.<format>: one token.
void run_matvec(const Stage& stage, const KernelCall& call) {
    const StageData& data = stage_data(call);
    encode_matvec(context(call), *call.row, 0, kcap::matmul_params(stage, call.n_tokens), data.operands[0],
                  data.operands[0], call.in, data.operands[1], 0, call.out);
}

// metal.matmul_tokens.<format>: the few-token walk, any number of tokens.
void run_matmul_tokens(const Stage& stage, const KernelCall& call) {
    const StageData& data = stage_data(call);
    encode_tokens(context(call), *call.row, 0, kcap::matmul_params(stage, call.n_tokens), data.operands[0], call.in,
                  data.operands[1], call.out);
}

// metal.gate_up.<format>: one token, the fused matvec (both matrices' rows against one staged x,
// the activation applied to the sums).
void run_gate_up(const Stage& stage, const KernelCall& call) {
    const StageData& data = stage_data(call);
    const KcapMatmulParams p = kcap::matmul_params(stage, call.n_tokens);  // operand 1 is up, not a bias
    encode_matvec(context(call), *call.row, 0, p, data.operands[0], data.operands[1], call.in, nullptr,
                  int(stage.params.activation), call.out);
}

// metal.gate_up_tokens.<format>: the few-token walk for each matrix into the plan's gate/up
// scratch (call.inout2 / inout3), then the gated activation into call.out.
void run_gate_up_tokens(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    const KcapMatmulParams p = kcap::matmul_params(stage, call.n_tokens);
    encode_tokens(ctx, *call.row, kGateUpTokens, p, data.operands[0], call.in, nullptr, call.inout2);
    encode_tokens(ctx, *call.row, kGateUpTokens + 1, p, data.operands[1], call.in, nullptr, call.inout3);
    const KcapElementwiseParams a = activation_params(stage, call.n_tokens, true);
    encode_ffn_activation(ctx, *call.row, kGateUpActivation, a, call.inout2, call.inout3, call.out);
}

void run_embed(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    const TensorRef* positions = stage_operand(stage, 1);
    const KcapEmbedParams p = embed_params(stage, call.n_tokens);
    bind_params(ctx, 0, p);
    bind(ctx, 1, ctx.tokens);
    bind(ctx, 2, ctx.step);
    bind(ctx, 3, data.operands[0]);
    bind(ctx, 4, positions ? data.operands[1] : nullptr);
    bind(ctx, 5, call.out);
    dispatch(ctx, *call.row, 0, MTLSizeMake(NSUInteger(p.n_tokens), 1, 1), kEmbedThreads);
}

}  // namespace
}  // namespace metal

#define KCAP_DEFINE_METAL_FORMAT_LAUNCHERS(NAME, DECODER)                                                                \
    void kcap_metal_matvec_##NAME(const Stage& stage, const KernelCall& call) { metal::run_matvec(stage, call); }         \
    void kcap_metal_matmul_tokens_##NAME(const Stage& stage, const KernelCall& call) { metal::run_matmul_tokens(stage, call); } \
    void kcap_metal_gate_up_##NAME(const Stage& stage, const KernelCall& call) { metal::run_gate_up(stage, call); }       \
    void kcap_metal_gate_up_tokens_##NAME(const Stage& stage, const KernelCall& call) { metal::run_gate_up_tokens(stage, call); } \
    void kcap_metal_embed_##NAME(const Stage& stage, const KernelCall& call) { metal::run_embed(stage, call); }
KCAP_WEIGHT_FORMATS(KCAP_DEFINE_METAL_FORMAT_LAUNCHERS)
#undef KCAP_DEFINE_METAL_FORMAT_LAUNCHERS

}  // namespace kcap
