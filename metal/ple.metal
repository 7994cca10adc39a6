// Metal entry points of the per-layer embedding rows (Gemma 4 E-models): kernels/ple.h, as
// cuda/ple.cu.
//   metal.per_layer_embed.<proj format>: the projection of every token's embedding (the
//     few-token walk, entry matmul_tokens_<FORMAT> of matmul.metal), then ple_combine_<TABLE>
//     (per-layer RMS norm of the projection plus the token's table row), instantiated here for
//     every weight format because the row takes a table of any of them;
//   metal.per_layer_gate: act(gate) * this layer's slice.
// Token ids come from the backend's token buffer, as for the embedding rows.
#include "kernels/ple.h"
#include "metal/rows.h"

// Grid: x = n_tokens, y = n_layer; one simd group (32 threads). `out` holds the raw projection
// and is combined in place.
template <class T>
kernel void kcap_ple_combine_entry(constant KcapPleParams& p [[buffer(0)]], device const kcap_i32* tokens [[buffer(1)]],
                                   device const kcap_u8* table [[buffer(2)]], device const float* norm_w [[buffer(3)]],
                                   device float* out [[buffer(4)]], KCAP_METAL_THREAD_ARGS) {
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_ple_combine<T>(t, p, tokens, table, norm_w, out);
}

typedef decltype(kcap_ple_combine_entry<KcapF32>) kcap_ple_combine_entry_t;

#define KCAP_METAL_PLE_COMBINE_ENTRY(NAME, DECODER)                                                   \
    template [[host_name(KCAP_METAL_FORMAT_ENTRY(ple_combine, NAME))]] kernel kcap_ple_combine_entry_t \
        kcap_ple_combine_entry<DECODER>;
KCAP_WEIGHT_FORMATS(KCAP_METAL_PLE_COMBINE_ENTRY)
#undef KCAP_METAL_PLE_COMBINE_ENTRY

// Grid: x = ceil(n_tokens * per / kElementwiseThreads).
[[host_name(KCAP_METAL_ENTRY(ple_gate))]] kernel void kcap_ple_gate_entry(
    constant KcapPleGateParams& p [[buffer(0)]], device const float* gate [[buffer(1)]],
    device const float* ple [[buffer(2)]], device float* out [[buffer(3)]], KCAP_METAL_THREAD_ARGS) {
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_ple_gate(t, p, gate, ple, out);
}
