// Host helpers shared by the two CUDA attention entry files (attention.cu: decode and the tiled
// SIMT prefill; attention_mma.cu: the tensor-core prefill).
#pragma once

#include "cuda/cuda_context.h"
#include "cuda/matmul.h"
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
// tokens attends. ROPE: the stage owns its rope (planner: rope + attention fused), so Q and K are
// first rotated in place by the rope (or qk_norm_rope) kernel: only the one-token decode
// rotates them itself. The returned p.rope is 0 (Q and K arrive rotated).
template <AttnRope ROPE>
AttentionCall prefill_call(const Stage& stage, const KernelCall& call);

// The tensor-core prefill of cuda.attention_mma* (cuda/attention_mma.cu).
template <AttnRope ROPE, bool Q8>
void run_attention_mma(const Stage& stage, const KernelCall& call);

// The rope kernels (cuda/rope.cu) on a call's Q (call.out) and K (call.inout2), in place.
void run_rope(const Stage& stage, const KernelCall& call);
void run_qk_norm_rope(const Stage& stage, const KernelCall& call);

}  // namespace cuda
}  // namespace kcap
