// Metal launchers of the mixture-of-experts rows, as cuda/moe.cu: metal.moe_route (the logits in
// the entry of the router's format, plus the router's bias, then one simd group per token: a
// softmax or sigmoid router, group-limited routing, the choice bias), metal.moe_experts.<format>
// (the gate / up matvec of every (token, chosen expert) slot, the down matvec in the down
// matrix's format, each with the experts' biases where the stage has them, the weighted sum plus
// an ungated shared expert's output), metal.moe_shared_gate. Geometry from metal/rows.h.
#include "metal/metal_context.h"

namespace kcap {
namespace metal {
namespace {

using namespace metal_rows;

// A matvec over one slot per grid row (entry `entry` of the row): k inputs, n rows of row_bytes.
// gate / up (entry kMoeGateUp): w0, w1 and their biases bias0, bias1; down: w0 and bias0. A null
// bias is absent (its flag, or p.has_bias, unset).
void encode_slots(const Context& ctx, const Row& row, int entry, const KcapMoeParams& moe, int k, int n,
                  unsigned row_bytes, int activation, const void* w0, const void* w1, const float* routing,
                  const float* x, float* y, const void* bias0, const void* bias1) {
    const bool gate_up = entry == kMoeGateUp;
    KcapMatmulParams p{};
    p.k = k;
    p.n = n;
    p.m = 1;
    p.row_bytes = row_bytes;
    p.has_bias = !gate_up && bias0 != nullptr;  // the down matvec's bias (gate / up: their flags)
    KcapMetalMatvecArgs a;
    a.split = matvec_split(n);
    a.chunk_runs = matvec_chunk_runs(k);
    a.activation = activation;
    bind_params(ctx, 0, moe);
    bind_params(ctx, 1, p);
    bind_params(ctx, 2, a);
    bind(ctx, 3, w0);
    int next = 4;
    if (gate_up) bind(ctx, next++, w1);
    bind(ctx, next++, routing);
    bind(ctx, next++, x);
    bind(ctx, next++, y);
    bind(ctx, next++, bias0);
    if (gate_up) {
        const int has_gate_bias = bias0 != nullptr, has_up_bias = bias1 != nullptr;
        bind(ctx, next++, bias1);
        bind_params(ctx, next++, has_gate_bias);
        bind_params(ctx, next, has_up_bias);
    }
    [ctx.encoder setThreadgroupMemoryLength:(NSUInteger(matvec_shared_floats(k)) * 4 + 15) / 16 * 16 atIndex:0];
    dispatch(ctx, row, entry, MTLSizeMake(ceil_div(n, (kMatvecSimds / a.split) * kMatvecRows), NSUInteger(moe.n_tokens * moe.n_used), 1),
             kMatvecSimds * 32);
}

void run_moe_experts(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    const KcapMoeParams moe = moe_params(stage, call.n_tokens);
    // The experts' gate, up and down biases (operands 3-5, F32 [n_expert][rows]: gpt-oss), or null.
    encode_slots(ctx, *call.row, kMoeGateUp, moe, moe.k, moe.ff, unsigned(row_bytes(stage.operands[0]->format, moe.k)),
                 int(stage.params.activation), data.operands[0], data.operands[1], call.in2, call.in, ctx.moe_act,
                 data.operands[3], data.operands[4]);
    const Format down = stage.operands[2]->format;
    encode_slots(ctx, *call.row, kMoeDown + ple_combine_index(down), moe, moe.ff, moe.n,
                 unsigned(row_bytes(down, moe.ff)), 0, data.operands[2], nullptr, call.in2, ctx.moe_act, ctx.moe_down,
                 data.operands[5], nullptr);
    bind_params(ctx, 0, moe);
    bind(ctx, 1, call.in2);
    bind(ctx, 2, ctx.moe_down);
    bind(ctx, 3, call.out);  // the slots' own rows (no slot_rows)
    const int has_shared = (stage.features & kSharedExpertSum) != 0;  // an ungated shared expert's output
    bind(ctx, 4, has_shared ? call.in3 : nullptr);
    bind_params(ctx, 5, has_shared);
    dispatch(ctx, *call.row, moe_combine_entry(),
             MTLSizeMake(ceil_div(int64_t(moe.n_tokens) * moe.n, kElementwiseThreads), 1, 1), kElementwiseThreads);
}

}  // namespace
}  // namespace metal

void kcap_metal_moe_route(const Stage& stage, const KernelCall& call) {
    using namespace metal;
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    const KcapMoeParams p = moe_params(stage, call.n_tokens);
    const int has_bias = data.operands[2] != nullptr;         // the router's bias (gpt-oss)
    const int has_choice_bias = data.operands[3] != nullptr;  // a sigmoid router's choice bias (DeepSeek V3)
    bind_params(ctx, 0, p);
    bind(ctx, 1, data.operands[0]);
    bind(ctx, 2, call.in);
    bind(ctx, 3, ctx.moe_logits);
    bind(ctx, 4, data.operands[2]);
    bind_params(ctx, 5, has_bias);
    dispatch(ctx, *call.row, metal_rows::ple_combine_index(stage.operands[0]->format),
             MTLSizeMake(ceil_div(p.n_expert, metal_rows::kMoeLogitThreads / metal_rows::kSimdWidth * KCAP_MOE_LOGIT_EXPERTS),
                         ceil_div(p.n_tokens, KCAP_MOE_LOGIT_TOKENS), 1),
             metal_rows::kMoeLogitThreads);
    bind_params(ctx, 0, p);
    bind(ctx, 1, ctx.moe_logits);
    bind(ctx, 2, call.out);
    bind(ctx, 3, p.expert_scaled ? data.operands[1] : nullptr);  // the per-expert scales
    bind(ctx, 4, data.operands[3]);
    bind_params(ctx, 5, has_choice_bias);
    dispatch(ctx, *call.row, metal_rows::moe_route_entry(), MTLSizeMake(NSUInteger(call.n_tokens), 1, 1),
             metal_rows::kMoeRouteThreads);
}

void kcap_metal_moe_shared_gate(const Stage& stage, const KernelCall& call) {
    using namespace metal;
    const Context& ctx = context(call);
    const int width = int(stage.n), has_gate = stage_data(call).operands[0] != nullptr;
    bind_params(ctx, 0, width);
    bind_params(ctx, 1, has_gate);
    bind(ctx, 2, stage_data(call).operands[0]);
    bind(ctx, 3, call.in3);
    bind(ctx, 4, call.in);
    bind(ctx, 5, call.in2);
    bind(ctx, 6, call.out);
    dispatch(ctx, *call.row, 0, MTLSizeMake(NSUInteger(call.n_tokens), 1, 1), metal_rows::kElementwiseThreads);
}

#define KCAP_DEFINE_METAL_MOE(NAME, DECODER) \
    void kcap_metal_moe_experts_##NAME(const Stage& stage, const KernelCall& call) { metal::run_moe_experts(stage, call); }
KCAP_WEIGHT_FORMATS(KCAP_DEFINE_METAL_MOE)
#undef KCAP_DEFINE_METAL_MOE

}  // namespace kcap
