// Metal entry points of the attention rows (metal.attention_decode, metal.attention_prefill):
// kernels/attention.h, the bodies cuda.attention_decode and cuda.attention_prefill run.
//   one token: flash-decoding decode (split 0 also appends the token's K/V unless the layer
//     shares another layer's cache, p.append == 0), then the combine when the stage has more
//     than one split (the split count is fixed at load time by the host; the combine reads the
//     step to know how many splits had keys);
//   a prefill chunk: append the chunk's K/V (not for a shared-KV layer), then every token
//     attends to the cache (tiled: kernels/attention_prefill.h).
// Every entry that normalizes a softmax takes the stage's attention sinks (F32 [n_head]) where
// has_sinks is set; an unbound sinks buffer (the host's placeholder) is never read.
#include "kernels/attention.h"
#include "metal/rows.h"

using namespace kcap::metal_rows;

static_assert(kAttnDecodeSimds == KCAP_ATTN_DECODE_SIMDS, "the host launches 32 * kAttnDecodeSimds threads");
static_assert(kAttnMaxSimds == KCAP_ATTN_MAX_SIMDS, "the row's threads: the most simd groups of a launch");
static_assert(kAttnPrefillRowsPerSimd == KCAP_ATTN_PREFILL_ROWS && kAttnPrefillMaxSimds == KCAP_ATTN_PREFILL_MAX_SIMDS &&
                  kAttnPrefillQFloats == KCAP_ATTN_PREFILL_Q_FLOATS &&
                  kAttnPrefillSharedBytes == KCAP_ATTN_PREFILL_SHARED_FLOATS * 4,
              "metal_rows states the prefill body's geometry");

// Grid: x = n_head_kv, y = n_splits; 32 * kAttnDecodeSimds threads.
[[host_name(KCAP_METAL_ENTRY(attention_decode))]] kernel void kcap_attention_decode_entry(
    constant KcapAttentionParams& p [[buffer(0)]], device const kcap_i32* step [[buffer(1)]],
    device const float* q [[buffer(2)]], device const float* k_new [[buffer(3)]], device const float* v_new [[buffer(4)]],
    device kcap_u8* k_cache [[buffer(5)]], device kcap_u8* v_cache [[buffer(6)]], device float* partial_o [[buffer(7)]],
    device float* partial_ml [[buffer(8)]], device float* out [[buffer(9)]], device const float* sinks [[buffer(10)]],
    constant int& has_sinks [[buffer(11)]], KCAP_METAL_THREAD_ARGS) {
    threadgroup float merge[KCAP_ATTN_DECODE_SHARED_FLOATS_FOR(KCAP_ATTN_DECODE_SIMDS)];
    const KcapThread t = KCAP_METAL_THREAD();
    // No Metal row owns a rope (p.rope == 0): no table, no QK-norm weights.
    kcap_attention_decode(t, p, step, q, k_new, v_new, k_cache, v_cache, partial_o, partial_ml, out, merge, nullptr,
                          nullptr, nullptr, has_sinks ? sinks : nullptr);
}

// Grid: x = n_head; kAttnCombineThreads threads (a multiple of 32, at least head_dim_v).
[[host_name(KCAP_METAL_ENTRY(attention_combine))]] kernel void kcap_attention_combine_entry(
    constant KcapAttentionParams& p [[buffer(0)]], device const kcap_i32* step [[buffer(1)]],
    device const float* partial_o [[buffer(2)]], device const float* partial_ml [[buffer(3)]],
    device float* out [[buffer(4)]], device const float* sinks [[buffer(5)]], constant int& has_sinks [[buffer(6)]],
    KCAP_METAL_THREAD_ARGS) {
    threadgroup float shared[KCAP_ATTN_COMBINE_SHARED_FLOATS];
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_attention_combine(t, p, step, partial_o, partial_ml, out, shared, has_sinks ? sinks : nullptr);
}

// Grid: x = ceil(n_tokens * (k_width + v_width) / kElementwiseThreads).
[[host_name(KCAP_METAL_ENTRY(kv_append))]] kernel void kcap_kv_append_entry(
    constant KcapAttentionParams& p [[buffer(0)]], device const kcap_i32* step [[buffer(1)]],
    device const float* k_new [[buffer(2)]], device const float* v_new [[buffer(3)]], device kcap_u8* k_cache [[buffer(4)]],
    device kcap_u8* v_cache [[buffer(5)]], KCAP_METAL_THREAD_ARGS) {
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_kv_append(t, p, step, k_new, v_new, k_cache, v_cache);
}

// Tiled prefill. Grid: x = ceil(n_tokens * (n_head / n_head_kv) / attn_prefill_rows(head_dim)),
// y = n_head_kv; 32 * attn_prefill_simds(head_dim) threads (metal_rows).
[[host_name(KCAP_METAL_ENTRY(attention_prefill))]] kernel void kcap_attention_prefill_entry(
    constant KcapAttentionParams& p [[buffer(0)]], device const kcap_i32* step [[buffer(1)]],
    device const float* q [[buffer(2)]], device const kcap_u8* k_cache [[buffer(3)]],
    device const kcap_u8* v_cache [[buffer(4)]], device float* out [[buffer(5)]], device const float* sinks [[buffer(6)]],
    constant int& has_sinks [[buffer(7)]], KCAP_METAL_THREAD_ARGS) {
    threadgroup float4 shared[KCAP_ATTN_PREFILL_SHARED_FLOATS / 4];  // float4: 16-byte aligned
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_attention_prefill(t, p, step, q, k_cache, v_cache, out, reinterpret_cast<threadgroup float*>(shared),
                           has_sinks ? sinks : nullptr);
}
