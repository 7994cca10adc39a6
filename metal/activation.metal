// Metal entry point of the FFN activation row (metal.ffn_activation): kernels/activation.h.
#include "kernels/activation.h"
#include "metal/rows.h"

// Grid: x = ceil(count / kElementwiseThreads). `up` is bound to `gate` when the FFN is not gated.
[[host_name(KCAP_METAL_ENTRY(ffn_activation))]] kernel void kcap_ffn_activation_entry(
    constant KcapElementwiseParams& p [[buffer(0)]], device const float* gate [[buffer(1)]],
    device const float* up [[buffer(2)]], device float* out [[buffer(3)]], KCAP_METAL_THREAD_ARGS) {
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_ffn_activation(t, p, gate, up, out);
}
