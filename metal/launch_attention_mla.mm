// Metal launchers of the multi-head latent attention rows, as cuda/attention.cu's
// kcap_cuda_attention_mla: metal.attention_mla_decode (one token) and metal.attention_mla (a
// prefill chunk), four launches each (kernels/attention_mla.h, entries in
// metal/attention_mla.metal): the call's latent rows normed, rotated and appended to the layer's
// cache while its queries are absorbed through W_k_b (or the combined W_kv_b), each (token, group
// of heads) attending over its causal span of cache rows (the decode in the key splits the backend
// fixed at load time from the stage's longest span, a prefill chunk in one), the splits merged into
// each head's weighted latent, then W_v_b. Positions come from the step buffer (step[0]), so a
// decode step encodes the same launches at any position. The layer's cache is its KV cache's k
// buffer (kv_widths: the latent and the rope key per token, no values); the rope table is the
// stage's (StageData::rope_table, the frequency factors folded in).
#include "metal/metal_context.h"

namespace kcap {
namespace metal {
namespace {

using namespace metal_rows;

void run_attention_mla(const Stage& stage, const KernelCall& call, bool decode) {
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    const Row& row = *call.row;
    const KcapMlaParams p = mla_params(stage, call.n_tokens, ctx.kv_format);
    id<MTLComputeCommandEncoder> e = ctx.encoder;
    id<MTLBuffer> cache = ctx.kv.at(size_t(stage.layer)).k;
    // Operands: the latent's norm weight, W_k_b (or W_kv_b), W_v_b (absent with W_kv_b).
    const void* kb = data.operands[1];
    const void* vb = p.combined ? kb : data.operands[2];
    const Format kb_format = stage.operands[1]->format;
    const Format vb_format = (p.combined ? stage.operands[1] : stage.operands[2])->format;
    const NSUInteger slots = NSUInteger(p.n_tokens) * NSUInteger(p.n_head);  // (token, head)

    // Append (groups past the slots, one per token) and absorb (one per slot, blocks of latent values).
    bind_params(ctx, 0, p);
    bind(ctx, 1, ctx.step);
    bind(ctx, 2, call.in);   // the queries [tokens][n_head][nope + rope]
    bind(ctx, 3, call.in2);  // the new latent rows [tokens][lora + rope]
    bind(ctx, 4, data.operands[0]);
    bind(ctx, 5, kb);
    bind(ctx, 6, data.rope_table);
    [e setBuffer:cache offset:0 atIndex:7];
    bind(ctx, 8, ctx.mla_absorbed);
    dispatch(ctx, row, ple_combine_index(kb_format),
             MTLSizeMake(slots + NSUInteger(p.n_tokens), NSUInteger(mla_absorb_blocks(p.lora, p.nope, p.combined)), 1),
             kMlaThreads);

    // Attend: the decode in its key splits, a prefill chunk in one.
    const int splits = decode ? data.attn_splits : 1;
    const int head_groups = (p.n_head + KCAP_MLA_HEADS_PER_GROUP - 1) / KCAP_MLA_HEADS_PER_GROUP;
    bind_params(ctx, 0, p);
    bind(ctx, 1, ctx.step);
    bind(ctx, 2, ctx.mla_absorbed);
    [e setBuffer:cache offset:0 atIndex:3];
    bind_params(ctx, 4, splits);
    bind(ctx, 5, ctx.attn_partial_o);
    bind(ctx, 6, ctx.attn_partial_ml);
    dispatch(ctx, row, mla_attend_entry(),
             MTLSizeMake(NSUInteger(p.n_tokens) * NSUInteger(head_groups), NSUInteger(splits), 1), kMlaThreads);

    // Combine the splits into each head's weighted latent.
    bind_params(ctx, 0, p);
    bind(ctx, 1, ctx.step);
    bind_params(ctx, 2, splits);
    bind(ctx, 3, ctx.attn_partial_o);
    bind(ctx, 4, ctx.attn_partial_ml);
    bind(ctx, 5, ctx.mla_latent);
    dispatch(ctx, row, mla_combine_entry(), MTLSizeMake(slots, NSUInteger(mla_combine_blocks(p.lora)), 1), kMlaThreads);

    // V up-projection: the heads' outputs [tokens][n_head][dv].
    bind_params(ctx, 0, p);
    bind(ctx, 1, ctx.mla_latent);
    bind(ctx, 2, vb);
    bind(ctx, 3, call.out);
    dispatch(ctx, row, mla_v_up_entry(vb_format), MTLSizeMake(slots, NSUInteger(mla_v_up_blocks(p.lora, p.dv)), 1),
             kMlaThreads);
}

}  // namespace
}  // namespace metal

void kcap_metal_attention_mla_decode(const Stage& stage, const KernelCall& call) {
    metal::run_attention_mla(stage, call, true);
}

void kcap_metal_attention_mla(const Stage& stage, const KernelCall& call) {
    metal::run_attention_mla(stage, call, false);
}

}  // namespace kcap
