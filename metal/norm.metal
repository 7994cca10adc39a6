// Metal entry point of the norm row (metal.norm): kernels/norm.h, one threadgroup per row.
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
