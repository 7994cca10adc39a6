// Metal entry points of the argmax row (metal.argmax): kernels/argmax.h, two passes. With
// p.advance (the decode step) the final pass feeds the winner back as the next token and
// moves the step buffer on, so a decode step's command buffer needs nothing from the host.
#include "kernels/argmax.h"
#include "metal/rows.h"

// Grid: x = n_partials; kArgmaxThreads threads.
[[host_name(KCAP_METAL_ENTRY(argmax_partial))]] kernel void kcap_argmax_partial_entry(
    constant KcapArgmaxParams& p [[buffer(0)]], device const float* logits [[buffer(1)]],
    device float* partial_value [[buffer(2)]], device kcap_i32* partial_index [[buffer(3)]], KCAP_METAL_THREAD_ARGS) {
    threadgroup float scratch_value[32];
    threadgroup int scratch_index[32];
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_argmax_partial(t, p, logits, partial_value, partial_index, scratch_value, scratch_index);
}

// Grid: x = 1; kArgmaxThreads threads.
[[host_name(KCAP_METAL_ENTRY(argmax_final))]] kernel void kcap_argmax_final_entry(
    constant KcapArgmaxParams& p [[buffer(0)]], device const float* partial_value [[buffer(1)]],
    device const kcap_i32* partial_index [[buffer(2)]], device kcap_i32* result [[buffer(3)]],
    device kcap_i32* tokens [[buffer(4)]], device kcap_i32* step [[buffer(5)]], device kcap_i32* history [[buffer(6)]],
    KCAP_METAL_THREAD_ARGS) {
    threadgroup float scratch_value[32];
    threadgroup int scratch_index[32];
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_argmax_final(t, p, partial_value, partial_index, result, tokens, step, history, scratch_value, scratch_index);
}
