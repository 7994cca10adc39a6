// Metal entry points of the elementwise rows (metal.add, metal.softcap, metal.scale):
// kernels/elementwise.h. Grid of each: x = ceil(count / kElementwiseThreads).
#include "kernels/elementwise.h"
#include "metal/rows.h"

[[host_name(KCAP_METAL_ENTRY(add))]] kernel void kcap_add_entry(constant KcapElementwiseParams& p [[buffer(0)]],
                                                                device const float* a [[buffer(1)]],
                                                                device const float* b [[buffer(2)]],
                                                                device float* out [[buffer(3)]], KCAP_METAL_THREAD_ARGS) {
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_add(t, p, a, b, out);
}

[[host_name(KCAP_METAL_ENTRY(softcap))]] kernel void kcap_softcap_entry(constant KcapElementwiseParams& p [[buffer(0)]],
                                                                        device const float* in [[buffer(1)]],
                                                                        device float* out [[buffer(2)]],
                                                                        KCAP_METAL_THREAD_ARGS) {
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_softcap(t, p, in, out);
}

[[host_name(KCAP_METAL_ENTRY(scale))]] kernel void kcap_scale_entry(constant KcapElementwiseParams& p [[buffer(0)]],
                                                                    device const float* in [[buffer(1)]],
                                                                    device float* out [[buffer(2)]],
                                                                    KCAP_METAL_THREAD_ARGS) {
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_scale(t, p, in, out);
}
