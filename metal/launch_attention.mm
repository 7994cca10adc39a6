// Metal launchers of the attention rows, as cuda/attention.cu: metal.attention_decode (one
// token) runs the flash-decoding decode (which appends the token's K/V) and, with several
// splits, the combine; metal.attention_prefill (a chunk) appends its K/V, then every token
// attends to the cache. A shared-KV
// layer (stage.params.kv_layer >= 0) binds the cache of layer kv_layer, filled earlier in this
// same pass, and appends nothing (p.append = 0). The KV cache buffers are the layer's
// MTLBuffers, bound directly. The stage's attention sinks (operand 3, F32 [n_head], gpt-oss)
// are bound to the decode, the combine and the prefill, with has_sinks set, where it has them.
#include "metal/metal_context.h"

namespace kcap {

namespace {

struct MetalAttention {
    KcapAttentionParams p;
    const metal::KvCache* kv;
};

// The stage's attention sinks (operand 3) and whether it has them, bound at `index` and index + 1.
void bind_sinks(const metal::Context& ctx, const KernelCall& call, int index) {
    const void* sinks = metal::stage_data(call).operands[3];
    const int has_sinks = sinks != nullptr;
    metal::bind(ctx, index, sinks);
    metal::bind_params(ctx, index + 1, has_sinks);
}

MetalAttention attention_call(const Stage& stage, const KernelCall& call) {
    using namespace metal_rows;
    const metal::Context& ctx = metal::context(call);
    const metal::StageData& data = metal::stage_data(call);
    const StageParams& s = stage.params;
    const bool shared = s.kv_layer >= 0;
    return {attention_params(stage, call.n_tokens, ctx.kv_format, data.attn_splits, kAttnMinChunk),
            &ctx.kv.at(size_t(shared ? s.kv_layer : stage.layer))};
}

}  // namespace

void kcap_metal_attention_decode(const Stage& stage, const KernelCall& call) {
    using namespace metal_rows;
    const metal::Context& ctx = metal::context(call);
    const MetalAttention a = attention_call(stage, call);
    const KcapAttentionParams& p = a.p;
    const metal::KvCache& kv = *a.kv;
    id<MTLComputeCommandEncoder> e = ctx.encoder;
    metal::bind_params(ctx, 0, p);
    {
        metal::bind(ctx, 1, ctx.step);
        metal::bind(ctx, 2, call.in);
        metal::bind(ctx, 3, call.in2);
        metal::bind(ctx, 4, call.in3);
        [e setBuffer:kv.k offset:0 atIndex:5];
        [e setBuffer:kv.v offset:0 atIndex:6];
        metal::bind(ctx, 7, ctx.attn_partial_o);
        metal::bind(ctx, 8, ctx.attn_partial_ml);
        metal::bind(ctx, 9, call.out);
        bind_sinks(ctx, call, 10);
        metal::dispatch(ctx, *call.row, kAttnDecode, MTLSizeMake(NSUInteger(p.n_head_kv), NSUInteger(p.n_splits), 1),
                        32 * kAttnDecodeSimds);
        if (p.n_splits > 1) {
            metal::bind_params(ctx, 0, p);
            metal::bind(ctx, 1, ctx.step);
            metal::bind(ctx, 2, ctx.attn_partial_o);
            metal::bind(ctx, 3, ctx.attn_partial_ml);
            metal::bind(ctx, 4, call.out);
            bind_sinks(ctx, call, 5);
            metal::dispatch(ctx, *call.row, kAttnCombine, MTLSizeMake(NSUInteger(p.n_head), 1, 1), kAttnCombineThreads);
        }
    }
}

void kcap_metal_attention_prefill(const Stage& stage, const KernelCall& call) {
    using namespace metal_rows;
    const metal::Context& ctx = metal::context(call);
    const MetalAttention a = attention_call(stage, call);
    const KcapAttentionParams& p = a.p;
    const metal::KvCache& kv = *a.kv;
    id<MTLComputeCommandEncoder> e = ctx.encoder;
    metal::bind_params(ctx, 0, p);
    if (p.append) {
        const int64_t appended = int64_t(p.n_tokens) * (p.k_width + p.v_width);
        metal::bind(ctx, 1, ctx.step);
        metal::bind(ctx, 2, call.in2);
        metal::bind(ctx, 3, call.in3);
        [e setBuffer:kv.k offset:0 atIndex:4];
        [e setBuffer:kv.v offset:0 atIndex:5];
        metal::dispatch(ctx, *call.row, kAttnAppend, MTLSizeMake(metal::ceil_div(appended, kElementwiseThreads), 1, 1),
                        kElementwiseThreads);
        metal::bind_params(ctx, 0, p);
    }
    metal::bind(ctx, 1, ctx.step);
    metal::bind(ctx, 2, call.in);
    [e setBuffer:kv.k offset:0 atIndex:3];
    [e setBuffer:kv.v offset:0 atIndex:4];
    metal::bind(ctx, 5, call.out);
    bind_sinks(ctx, call, 6);
    // Tiled prefill (kernels/attention_prefill.h): row tiles of the KV head's query rows.
    const int64_t query_rows = int64_t(p.n_tokens) * (p.n_head / p.n_head_kv);
    metal::dispatch(ctx, *call.row, kAttnPrefill,
                    MTLSizeMake(metal::ceil_div(query_rows, attn_prefill_rows(p.head_dim)), NSUInteger(p.n_head_kv), 1),
                    32 * attn_prefill_simds(p.head_dim));
}

}  // namespace kcap
