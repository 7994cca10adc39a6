// Host helpers shared by the two CUDA attention entry files (attention.cu: decode and the tiled
// SIMT prefill; attention_mma.cu: the tensor-core prefill).
#pragma once

#include "cuda/cuda_context.h"
#include "kernels/dialect.h"

namespace kcap {
namespace cuda {

// One attention call's parameters and the KV cache it reads: a shared-KV layer (kv_shared)
// reads the cache of layer kv_layer, filled earlier in this same pass, and appends nothing.
struct AttentionCall {
    KcapAttentionParams p;
    kcap_u8* k_cache;
    kcap_u8* v_cache;
};
AttentionCall attention_call(const Stage& stage, const KernelCall& call);

// A prefill chunk's attention call, its K/V in the cache (when p.append) before any of its
// tokens attends. A stage that owns its rope (planner: rope + attention fused, p.rope) first
// has Q and K rotated in place by the rope (or qk_norm_rope) row's kernel: only the one-token
// decode rotates them itself. The returned p.rope is 0 (Q and K arrive rotated).
AttentionCall prefill_call(const Stage& stage, const KernelCall& call);

}  // namespace cuda
}  // namespace kcap
