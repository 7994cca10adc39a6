// Metal entry points of the mixture-of-experts rows (metal.moe_route, metal.moe_experts.<format>,
// metal.moe_shared_gate): the bodies cuda/moe.cu runs (kernels/moe.h), under the names
// metal/rows.cpp derives from the rows' launches. The router's logits and the down matvec have an
// entry per weight format (the router's and the down matrix's format are the stage's own); the
// gate / up matvec one per format of its row.
// Optional F32 operands (the router's bias and choice bias, the experts' gate, up and down
// biases) come with an int flag: an absent one is bound to the host's placeholder buffer, which
// the flag keeps the body from reading.
#include "kernels/moe.h"
#include "metal/rows.h"

using namespace kcap::metal_rows;

// Grid: x = ceil(n_expert / simds), y = ceil(tokens / KCAP_MOE_LOGIT_TOKENS); kMoeLogitThreads threads.
template <class F>
kernel void kcap_moe_logits_entry(constant KcapMoeParams& p [[buffer(0)]], device const kcap_u8* w [[buffer(1)]],
                                  device const float* x [[buffer(2)]], device float* logits [[buffer(3)]],
                                  device const float* bias [[buffer(4)]], constant int& has_bias [[buffer(5)]],
                                  KCAP_METAL_THREAD_ARGS) {
    threadgroup float xs[KCAP_MOE_LOGIT_SHARED_FLOATS];
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_moe_logits<F>(t, p, w, x, logits, xs, has_bias ? bias : nullptr);
}

// Grid: x = tokens; kMoeRouteThreads threads (one simd group). choice_bias: a sigmoid router's
// per-expert bias on the scores that choose (DeepSeek V3).
[[host_name(KCAP_METAL_ENTRY(moe_route))]] kernel void kcap_moe_route_entry(
    constant KcapMoeParams& p [[buffer(0)]], device const float* token_logits [[buffer(1)]],
    device float* routing [[buffer(2)]], device const float* expert_scale [[buffer(3)]],
    device const float* choice_bias [[buffer(4)]], constant int& has_choice_bias [[buffer(5)]], KCAP_METAL_THREAD_ARGS) {
    threadgroup float logits[KCAP_MOE_MAX_EXPERTS];
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_moe_route(t, p, token_logits, expert_scale, routing, logits, has_choice_bias ? choice_bias : nullptr);
}

// Grid: x = the matvec's row groups over ff, y = slots (tokens x experts per token); threadgroup
// memory 0: matvec_shared_floats(k) floats. gate_bias, up_bias: [n_expert][ff] (gpt-oss), each
// read where its flag is set; the clamped SwiGLU's alpha and limit come in moe.
template <class F>
kernel void kcap_moe_gate_up_entry(constant KcapMoeParams& moe [[buffer(0)]], constant KcapMatmulParams& p [[buffer(1)]],
                                   constant KcapMetalMatvecArgs& a [[buffer(2)]], device const kcap_u8* gate [[buffer(3)]],
                                   device const kcap_u8* up [[buffer(4)]], device const float* routing [[buffer(5)]],
                                   device const float* x [[buffer(6)]], device float* act [[buffer(7)]],
                                   device const float* gate_bias [[buffer(8)]], device const float* up_bias [[buffer(9)]],
                                   constant int& has_gate_bias [[buffer(10)]], constant int& has_up_bias [[buffer(11)]],
                                   threadgroup float* shared KCAP_METAL_THREADGROUP_INDEX(0), KCAP_METAL_THREAD_ARGS) {
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_moe_gate_up<F, kMatvecRows, false>(t, moe, p, kcap_matvec_parts(a.split), a.chunk_runs, gate, up, routing, x, a.activation, act, shared,
                                     has_gate_bias ? gate_bias : nullptr, has_up_bias ? up_bias : nullptr);
}

// Grid: x = the matvec's row groups over n, y = slots. down_bias: [n_expert][n], read where
// p.has_bias is set.
template <class F>
kernel void kcap_moe_down_entry(constant KcapMoeParams& moe [[buffer(0)]], constant KcapMatmulParams& p [[buffer(1)]],
                                constant KcapMetalMatvecArgs& a [[buffer(2)]], device const kcap_u8* down [[buffer(3)]],
                                device const float* routing [[buffer(4)]], device const float* act [[buffer(5)]],
                                device float* down_out [[buffer(6)]], device const float* down_bias [[buffer(7)]],
                                threadgroup float* shared KCAP_METAL_THREADGROUP_INDEX(0), KCAP_METAL_THREAD_ARGS) {
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_moe_down<F, kMatvecRows, false>(t, moe, p, kcap_matvec_parts(a.split), a.chunk_runs, down, routing, act, down_out, shared,
                                  p.has_bias ? down_bias : nullptr);
}

// Grid: x = ceil(tokens * n / kElementwiseThreads). has_shared 0: no shared expert's output to
// add (shared unbound).
[[host_name(KCAP_METAL_ENTRY(moe_combine))]] kernel void kcap_moe_combine_entry(
    constant KcapMoeParams& p [[buffer(0)]], device const float* routing [[buffer(1)]],
    device const float* down [[buffer(2)]], device float* out [[buffer(3)]], device const float* shared [[buffer(4)]],
    constant int& has_shared [[buffer(5)]], KCAP_METAL_THREAD_ARGS) {
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_moe_combine(t, p, routing, down, nullptr, out, has_shared ? shared : nullptr);
}

// Grid: x = tokens; kElementwiseThreads threads. has_gate 0: the gate is 1 (w unbound).
[[host_name(KCAP_METAL_ENTRY(moe_shared_gate))]] kernel void kcap_moe_shared_gate_entry(
    constant int& width [[buffer(0)]], constant int& has_gate [[buffer(1)]], device const float* w [[buffer(2)]],
    device const float* x [[buffer(3)]], device const float* in [[buffer(4)]], device const float* shared_out [[buffer(5)]],
    device float* out [[buffer(6)]], KCAP_METAL_THREAD_ARGS) {
    threadgroup float partial[kElementwiseThreads / kSimdWidth];
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_moe_shared_gate(t, width, has_gate ? w : nullptr, x, in, shared_out, out, partial);
}

typedef decltype(kcap_moe_logits_entry<KcapF32>) kcap_moe_logits_entry_t;
typedef decltype(kcap_moe_gate_up_entry<KcapF32>) kcap_moe_gate_up_entry_t;
typedef decltype(kcap_moe_down_entry<KcapF32>) kcap_moe_down_entry_t;

#define KCAP_METAL_MOE_ENTRIES(NAME, DECODER)                                                                     \
    template [[host_name(KCAP_METAL_FORMAT_ENTRY(moe_logits, NAME))]] kernel kcap_moe_logits_entry_t               \
        kcap_moe_logits_entry<DECODER>;                                                                            \
    template [[host_name(KCAP_METAL_FORMAT_ENTRY(moe_gate_up, NAME))]] kernel kcap_moe_gate_up_entry_t             \
        kcap_moe_gate_up_entry<DECODER>;                                                                           \
    template [[host_name(KCAP_METAL_FORMAT_ENTRY(moe_down, NAME))]] kernel kcap_moe_down_entry_t                   \
        kcap_moe_down_entry<DECODER>;
KCAP_WEIGHT_FORMATS(KCAP_METAL_MOE_ENTRIES)
#undef KCAP_METAL_MOE_ENTRIES
