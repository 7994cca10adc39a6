// Metal launchers of the small rows: norm, add_norm, rope, FFN activation, add/softcap/scale and argmax
// (the .metal entries of the same names). Geometry from metal/rows.h, as cuda/*.cu read
// cuda/rows.h; every launcher encodes into the backend's open command buffer.
#include "metal/metal_context.h"

namespace kcap {

using namespace metal_rows;

void kcap_metal_norm(const Stage& stage, const KernelCall& call) {
    const metal::Context& ctx = metal::context(call);
    const metal::StageData& data = metal::stage_data(call);
    const KcapNormParams p = norm_params(stage, call.n_tokens);
    // Short rows (QK-norm over one head) need fewer threads than a hidden row (as on CUDA).
    const int threads = p.width <= 64 ? 64 : p.width <= 128 ? 128 : kNormThreads;
    metal::bind_params(ctx, 0, p);
    metal::bind(ctx, 1, call.in);
    metal::bind(ctx, 2, data.operands[0]);
    metal::bind(ctx, 3, data.operands[1]);
    metal::bind(ctx, 4, call.out);
    metal::dispatch(ctx, *call.row, 0, MTLSizeMake(NSUInteger(p.rows), 1, 1), threads);
}

// add_norm: operands (post weight, post bias, weight, bias); call.inout2 = the residual (read
// and written), call.in2 = the branch output, call.out = the normed row (as cuda/norm.cu).
void kcap_metal_add_norm(const Stage& stage, const KernelCall& call) {
    const metal::Context& ctx = metal::context(call);
    const metal::StageData& data = metal::stage_data(call);
    auto operand = [&](size_t i) -> const void* { return i < stage.operands.size() ? data.operands[i] : nullptr; };
    const KcapAddNormParams p = add_norm_params(stage);
    metal::bind_params(ctx, 0, p);
    metal::bind(ctx, 1, call.inout2);
    metal::bind(ctx, 2, call.in2);
    for (int i = 0; i < 4; ++i) metal::bind(ctx, 3 + i, operand(size_t(i)));
    metal::bind(ctx, 7, call.out);
    metal::dispatch(ctx, *call.row, 0, MTLSizeMake(NSUInteger(call.n_tokens), 1, 1), kNormThreads);
}

void kcap_metal_rope(const Stage& stage, const KernelCall& call) {
    const metal::Context& ctx = metal::context(call);
    const metal::StageData& data = metal::stage_data(call);
    // No K buffer: a shared-KV layer (its source layer rotated the keys it reads).
    const KcapRopeParams p = rope_params(stage, call.n_tokens, call.inout2 != nullptr);
    const int64_t total = int64_t(p.n_tokens) * (p.n_head + p.n_head_kv) * (p.rope_dim / 2);
    metal::bind_params(ctx, 0, p);
    metal::bind(ctx, 1, ctx.step);
    metal::bind(ctx, 2, data.rope_table);
    metal::bind(ctx, 3, call.out);
    metal::bind(ctx, 4, call.inout2);
    metal::dispatch(ctx, *call.row, 0, MTLSizeMake(metal::ceil_div(total, kElementwiseThreads), 1, 1), kElementwiseThreads);
}

namespace metal {

void encode_ffn_activation(const Context& ctx, const Row& row, int entry, const KcapElementwiseParams& p,
                           const float* gate, const float* up, float* out) {
    bind_params(ctx, 0, p);
    bind(ctx, 1, gate);
    bind(ctx, 2, up ? up : gate);  // unread when not gated
    bind(ctx, 3, out);
    dispatch(ctx, row, entry, MTLSizeMake(ceil_div(p.count, kElementwiseThreads), 1, 1), kElementwiseThreads);
}

}  // namespace metal

void kcap_metal_ffn_activation(const Stage& stage, const KernelCall& call) {
    const KcapElementwiseParams p = activation_params(stage, call.n_tokens, call.in2 != nullptr);
    metal::encode_ffn_activation(metal::context(call), *metal::stage_data(call).row, 0, p, call.in, call.in2, call.out);
}

namespace {


// One pass over count values: the row's only entry; `b` is bound only for add.
void run_elementwise(const Stage& stage, const KernelCall& call, bool two_inputs) {
    const metal::Context& ctx = metal::context(call);
    const KcapElementwiseParams p = elementwise_params(stage, call.n_tokens);
    metal::bind_params(ctx, 0, p);
    metal::bind(ctx, 1, call.in);
    int next = 2;
    if (two_inputs) metal::bind(ctx, next++, call.in2);
    metal::bind(ctx, next, call.out);
    metal::dispatch(ctx, *metal::stage_data(call).row, 0, MTLSizeMake(metal::ceil_div(p.count, kElementwiseThreads), 1, 1),
                    kElementwiseThreads);
}

}  // namespace

void kcap_metal_add(const Stage& stage, const KernelCall& call) { run_elementwise(stage, call, true); }
void kcap_metal_softcap(const Stage& stage, const KernelCall& call) { run_elementwise(stage, call, false); }
void kcap_metal_scale(const Stage& stage, const KernelCall& call) { run_elementwise(stage, call, false); }

// call.in: logits [n]; call.out: the winner (int32, reinterpreted); call.inout2 non-null: advance.
void kcap_metal_argmax(const Stage& stage, const KernelCall& call) {
    const metal::Context& ctx = metal::context(call);
    const Row& row = *metal::stage_data(call).row;
    KcapArgmaxParams p;
    p.count = int(stage.n);
    p.chunk = kArgmaxChunk;
    p.n_partials = int(metal::ceil_div(p.count, kArgmaxChunk));
    p.advance = call.inout2 != nullptr;
    if (p.n_partials > ctx.argmax_partials)
        throw Error("metal.argmax: " + std::to_string(p.count) + " logits need more partials than the context holds");
    metal::bind_params(ctx, 0, p);
    metal::bind(ctx, 1, call.in);
    metal::bind(ctx, 2, ctx.argmax_partial_value);
    metal::bind(ctx, 3, ctx.argmax_partial_index);
    metal::dispatch(ctx, row, kArgmaxPartial, MTLSizeMake(NSUInteger(p.n_partials), 1, 1), kArgmaxThreads);
    metal::bind_params(ctx, 0, p);
    metal::bind(ctx, 1, ctx.argmax_partial_value);
    metal::bind(ctx, 2, ctx.argmax_partial_index);
    metal::bind(ctx, 3, call.out);
    metal::bind(ctx, 4, ctx.tokens);
    metal::bind(ctx, 5, ctx.step);
    metal::bind(ctx, 6, ctx.history);
    metal::dispatch(ctx, row, kArgmaxFinal, MTLSizeMake(1, 1, 1), kArgmaxThreads);
}

}  // namespace kcap
