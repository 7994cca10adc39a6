// Metal entry points of the embedding rows (metal.embed.<format>): kernels/embed.h, one
// instantiation per format. Token ids come from the backend's token buffer (the decode step's
// argmax writes the next one there); positions, for a learned position embedding (operand 1,
// f32 or f16 rows), from the step buffer (step[0] = position of token 0).
#include "kernels/embed.h"
#include "metal/rows.h"

// Grid: x = n_tokens; kEmbedThreads threads. `positions` is a dummy when p.positions == 0.
template <class F>
kernel void kcap_embed_entry(constant KcapEmbedParams& p [[buffer(0)]], device const kcap_i32* tokens [[buffer(1)]],
                             device const kcap_i32* step [[buffer(2)]], device const kcap_u8* table [[buffer(3)]],
                             device const kcap_u8* positions [[buffer(4)]], device float* out [[buffer(5)]],
                             KCAP_METAL_THREAD_ARGS) {
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_embed<F>(t, p, tokens, step, table, positions, out);
}

typedef decltype(kcap_embed_entry<KcapF32>) kcap_embed_entry_t;

#define KCAP_METAL_EMBED_ENTRY(NAME, DECODER) \
    template [[host_name(KCAP_METAL_FORMAT_ENTRY(embed, NAME))]] kernel kcap_embed_entry_t kcap_embed_entry<DECODER>;
KCAP_WEIGHT_FORMATS(KCAP_METAL_EMBED_ENTRY)
#undef KCAP_METAL_EMBED_ENTRY
