// What the Metal launchers share (Objective-C++, included only by metal/*.mm): the device
// context of one engine and what the backend bound to each stage at load time.
//
// Pointers stay pointers: every buffer the backend allocates is an MTLBuffer in shared
// storage (Apple Silicon's unified memory), so a KernelCall carries the same float* it carries
// on CUDA and the CPU, and `resolve` turns any pointer into (MTLBuffer, offset) for binding.
// Weights are registered under their host (memory-mapped) address, whether the MTLBuffer
// wraps those pages or holds a copy.
#pragma once

#import <Metal/Metal.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/kernel_params.h"
#include "dispatch/stage.h"
#include "kcap/errors.h"
#include "kernels/params.h"
#include "metal/rows.h"

namespace kcap {
namespace metal {

// One layer's KV cache: [n_ctx][k_width] and [n_ctx][v_width] elements of the plan's kv_format.
struct KvCache {
    id<MTLBuffer> k = nil;
    id<MTLBuffer> v = nil;
};

// A host address range and the MTLBuffer bytes it stands for.
struct Allocation {
    const uint8_t* base = nullptr;
    size_t length = 0;
    id<MTLBuffer> buffer = nil;
    size_t buffer_offset = 0;  // where `base` sits in the buffer (wrapped pages start earlier)
};

struct Context {
    id<MTLDevice> device = nil;
    id<MTLCommandQueue> queue = nil;
    id<MTLLibrary> library = nil;
    // Open while a step (a decode token or a prefill chunk) is being encoded.
    id<MTLCommandBuffer> command_buffer = nil;
    id<MTLComputeCommandEncoder> encoder = nil;
    // Pipeline cache keyed by (capability row, entry index); filled at load time for every
    // routed row, so executing a token never compiles or decides anything.
    std::map<std::pair<const Row*, int>, id<MTLComputePipelineState>> pipelines;
    std::vector<Allocation> allocations;  // sorted by base
    id<MTLBuffer> dummy = nil;            // bound where an optional operand is absent
    // Decode-step state in shared memory, as on CUDA: step[0] = position of token 0,
    // step[1] = tokens generated (the history index); the argmax writes both.
    int32_t* step = nullptr;
    int32_t* tokens = nullptr;
    int32_t* history = nullptr;
    int32_t* argmax_result = nullptr;
    float* argmax_partial_value = nullptr;
    int32_t* argmax_partial_index = nullptr;
    int argmax_partials = 0;
    float* attn_partial_o = nullptr;
    float* attn_partial_ml = nullptr;
    float* moe_logits = nullptr;  // mixture of experts: the router's logits [tokens][n_expert],
    float* moe_act = nullptr;     // [slots][ff] activations, [slots][n] down outputs
    float* moe_down = nullptr;
    // Multi-head latent attention, for max_batch tokens of the widest stage: the absorbed queries
    // [tokens][n_head][kv_lora_rank + rope_dim] and the heads' weighted latents [tokens][n_head][kv_lora_rank].
    float* mla_absorbed = nullptr;
    float* mla_latent = nullptr;
    Format kv_format = Format::F32;
    int64_t n_ctx = 0;
    std::vector<KvCache> kv;  // one per layer (nil for a shared-KV layer: it reads its source's;
                              // a latent-attention layer's latent rows are in k, v is unused)

    // The buffer and offset that hold host address p (throws if p was never registered).
    std::pair<id<MTLBuffer>, size_t> resolve(const void* p) const;
    id<MTLComputePipelineState> pipeline(const Row& row, int entry) const;
};

// Bound to one stage when the backend is built.
struct StageData {
    // Host addresses of the operands (resolve them; null where absent): the most any row takes
    // is six (the experts: gate, up, down and their three biases).
    const void* operands[6] = {};
    const float* rope_table = nullptr;  // rope, latent attention: [n_ctx][rope_dim / 2] (cos, sin)
    int attn_splits = 1;                // attention, latent attention: the decode's key splits
};

inline Context& context(const KernelCall& call) { return *static_cast<Context*>(call.backend_state); }
inline const StageData& stage_data(const KernelCall& call) { return *static_cast<const StageData*>(call.stage_state); }
inline NSUInteger ceil_div(int64_t a, int64_t b) { return NSUInteger((a + b - 1) / b); }

// Encoding helpers for launchers: a pointer argument (nil-safe), the params struct, a dispatch
// of one row entry with the threadgroup size the caller takes from metal/rows.h.
void bind(const Context& ctx, int index, const void* p);
template <class P>
void bind_params(const Context& ctx, int index, const P& params) {
    [ctx.encoder setBytes:&params length:sizeof(P) atIndex:NSUInteger(index)];
}
void dispatch(const Context& ctx, const Row& row, int entry, MTLSize groups, int threads);
// The FFN activation body (kernels/activation.h) as entry `entry` of `row`: metal.ffn_activation's
// only entry, and the last of metal.gate_up.*'s batched path. `up` may be null (not gated).
void encode_ffn_activation(const Context& ctx, const Row& row, int entry, const KcapElementwiseParams& p,
                           const float* gate, const float* up, float* out);

}  // namespace metal
}  // namespace kcap
