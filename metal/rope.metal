// Metal entry point of the rope row (metal.rope): kernels/rope.h with the stage's cos/sin
// table (made on the host in double precision, as for CUDA) and positions from the step buffer.
#include "kernels/rope.h"
#include "metal/rows.h"

// Grid: x = ceil(n_tokens * (n_head + n_head_kv) * rope_dim / 2 / kElementwiseThreads).
[[host_name(KCAP_METAL_ENTRY(rope))]] kernel void kcap_rope_entry(
    constant KcapRopeParams& p [[buffer(0)]], device const kcap_i32* step [[buffer(1)]],
    device const float2* cos_sin [[buffer(2)]], device float* q [[buffer(3)]], device float* k [[buffer(4)]],
    KCAP_METAL_THREAD_ARGS) {
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_rope(t, p, step, cos_sin, q, k);
}
