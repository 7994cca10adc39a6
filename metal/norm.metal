// Metal entry points of the norm rows: metal.norm (kernels/norm.h kcap_norm) and metal.add_norm
// (kcap_add_norm: [post-norm of the branch] + residual add + the next norm), one threadgroup per row.
#include "kernels/norm.h"
#include "metal/rows.h"

using namespace kcap::metal_rows;

// Grid: x = rows; up to kNormThreads threads (fewer for short rows, chosen by the host).
[[host_name(KCAP_METAL_ENTRY(norm))]] kernel void kcap_norm_entry(
    constant KcapNormParams& p [[buffer(0)]], device const float* x [[buffer(1)]], device const float* weight [[buffer(2)]],
    device const float* bias [[buffer(3)]], device float* y [[buffer(4)]], KCAP_METAL_THREAD_ARGS) {
    threadgroup float scratch[kNormScratchFloats];
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_norm(t, p, x, weight, bias, y, scratch);
}

// Grid: x = tokens; kNormThreads threads. `residual` is read and written; absent weights and
// biases are bound to a dummy (their has_* flags are 0).
[[host_name(KCAP_METAL_ENTRY(add_norm))]] kernel void kcap_add_norm_entry(
    constant KcapAddNormParams& p [[buffer(0)]], device float* residual [[buffer(1)]],
    device const float* branch [[buffer(2)]], device const float* post_weight [[buffer(3)]],
    device const float* post_bias [[buffer(4)]], device const float* weight [[buffer(5)]],
    device const float* bias [[buffer(6)]], device float* normed [[buffer(7)]], KCAP_METAL_THREAD_ARGS) {
    threadgroup float scratch[kNormScratchFloats];
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_add_norm(t, p, residual, branch, post_weight, post_bias, weight, bias, normed, scratch);
}
