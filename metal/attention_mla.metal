// Metal entry points of the multi-head latent attention rows (metal.attention_mla_decode,
// metal.attention_mla): kernels/attention_mla.h, the bodies cuda.attention_mla_decode and
// cuda.attention_mla run, under the names metal/rows.cpp derives from the rows' launches. One
// call, four launches: the call's latent rows appended and its queries absorbed through W_k_b
// (or the combined W_kv_b), the attend over the latent cache (the decode in key splits fixed at
// load time, a prefill chunk in one), the splits merged, the V up-projection. The append and
// absorb and the V up-projection have an entry per weight format (W_k_b's and W_v_b's formats are
// the stage's own).
#include "kernels/attention_mla.h"
#include "metal/rows.h"

using namespace kcap::metal_rows;

static_assert(kMlaThreads == KCAP_MLA_THREADS, "the host launches KCAP_MLA_THREADS threads");
static_assert(kMlaAttendSharedBytes == KCAP_MLA_ATTEND_SHARED_FLOATS * 4, "the row's threadgroup memory is the attend's");
static_assert(KCAP_MLA_COMBINE_SHARED_FLOATS <= KCAP_MLA_ATTEND_SHARED_FLOATS &&
                  KCAP_MLA_ROWS_SHARED_FLOATS <= KCAP_MLA_ATTEND_SHARED_FLOATS,
              "the attend takes the most threadgroup memory of the four launches");

// The host's launch extents (metal_rows::mla_*_blocks) against the body's, at the dims of
// DeepSeek V2/V3 (latent 512, heads of 128 + 64 and 128), V2-Lite's and the test fixtures'
// (latent 64, 32 + 16 and 32), both W_kv_b layouts.
struct KcapMlaDims {
    int lora, nope, dv, combined;
};
constexpr bool kcap_mla_blocks_agree(KcapMlaDims p) {
    return KCAP_MLA_ABSORB_BLOCKS(p) == mla_absorb_blocks(p.lora, p.nope, p.combined) &&
           KCAP_MLA_COMBINE_BLOCKS(p) == mla_combine_blocks(p.lora) && KCAP_MLA_V_UP_BLOCKS(p) == mla_v_up_blocks(p.lora, p.dv);
}
static_assert(kcap_mla_blocks_agree(KcapMlaDims{512, 128, 128, 0}) && kcap_mla_blocks_agree(KcapMlaDims{512, 128, 128, 1}) &&
                  kcap_mla_blocks_agree(KcapMlaDims{64, 32, 32, 0}) && kcap_mla_blocks_agree(KcapMlaDims{64, 32, 32, 1}) &&
                  kcap_mla_blocks_agree(KcapMlaDims{96, 64, 96, 0}),
              "metal_rows::mla_*_blocks restate KCAP_MLA_*_BLOCKS");

#define KCAP_MLA_APPEND_ABSORB_SHARED_FLOATS \
    (KCAP_MLA_ROWS_SHARED_FLOATS > KCAP_MLA_MAX_SIMDS ? KCAP_MLA_ROWS_SHARED_FLOATS : KCAP_MLA_MAX_SIMDS)

// The call's cache rows appended (groups x >= n_tokens * n_head, y = 0: one per token) and its
// queries absorbed (groups x < n_tokens * n_head: one per (token, head), y: blocks of latent
// values), in one launch: the attend needs both. Grid: x = n_tokens * (n_head + 1), y =
// KCAP_MLA_ABSORB_BLOCKS(p); kMlaThreads threads. cos_sin: the stage's rope table.
template <class F>
kernel void kcap_mla_append_absorb_entry(constant KcapMlaParams& p [[buffer(0)]], device const kcap_i32* step [[buffer(1)]],
                                         device const float* q [[buffer(2)]], device const float* kv_new [[buffer(3)]],
                                         device const float* norm [[buffer(4)]], device const kcap_u8* kb [[buffer(5)]],
                                         device const float2* cos_sin [[buffer(6)]], device kcap_u8* cache [[buffer(7)]],
                                         device float* absorbed [[buffer(8)]], KCAP_METAL_THREAD_ARGS) {
    threadgroup float shared[KCAP_MLA_APPEND_ABSORB_SHARED_FLOATS];
    KcapThread t = KCAP_METAL_THREAD();
    const uint slots = uint(p.n_tokens * p.n_head);
    if (t.group_x < slots) {
        kcap_mla_absorb<F>(t, p, step, q, kb, cos_sin, absorbed, shared);
    } else if (t.group_y == 0) {
        t.group_x -= slots;  // the token
        kcap_mla_append(t, p, step, kv_new, norm, cos_sin, cache, shared);
    }
}

// Grid: x = n_tokens * ceil(n_head / KCAP_MLA_HEADS_PER_GROUP), y = n_splits; kMlaThreads threads.
[[host_name(KCAP_METAL_ENTRY(mla_attend))]] kernel void kcap_mla_attend_entry(
    constant KcapMlaParams& p [[buffer(0)]], device const kcap_i32* step [[buffer(1)]],
    device const float* absorbed [[buffer(2)]], device const kcap_u8* cache [[buffer(3)]],
    constant int& n_splits [[buffer(4)]], device float* partial_o [[buffer(5)]], device float* partial_ml [[buffer(6)]],
    KCAP_METAL_THREAD_ARGS) {
    threadgroup float shared[KCAP_MLA_ATTEND_SHARED_FLOATS];
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_mla_attend(t, p, step, absorbed, cache, n_splits, partial_o, partial_ml, shared);
}

// Grid: x = n_tokens * n_head, y = KCAP_MLA_COMBINE_BLOCKS(p); kMlaThreads threads.
[[host_name(KCAP_METAL_ENTRY(mla_combine))]] kernel void kcap_mla_combine_entry(
    constant KcapMlaParams& p [[buffer(0)]], device const kcap_i32* step [[buffer(1)]], constant int& n_splits [[buffer(2)]],
    device const float* partial_o [[buffer(3)]], device const float* partial_ml [[buffer(4)]],
    device float* latent [[buffer(5)]], KCAP_METAL_THREAD_ARGS) {
    threadgroup float shared[KCAP_MLA_COMBINE_SHARED_FLOATS];
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_mla_combine(t, p, step, n_splits, partial_o, partial_ml, latent, shared);
}

// Grid: x = n_tokens * n_head, y = KCAP_MLA_V_UP_BLOCKS(p); kMlaThreads threads. out: [tokens][n_head][dv].
template <class F>
kernel void kcap_mla_v_up_entry(constant KcapMlaParams& p [[buffer(0)]], device const float* latent [[buffer(1)]],
                                device const kcap_u8* vb [[buffer(2)]], device float* out [[buffer(3)]],
                                KCAP_METAL_THREAD_ARGS) {
    threadgroup float ls[KCAP_MLA_ROWS_SHARED_FLOATS];
    const KcapThread t = KCAP_METAL_THREAD();
    kcap_mla_v_up<F>(t, p, latent, vb, out, ls);
}

typedef decltype(kcap_mla_append_absorb_entry<KcapF32>) kcap_mla_append_absorb_entry_t;
typedef decltype(kcap_mla_v_up_entry<KcapF32>) kcap_mla_v_up_entry_t;

#define KCAP_METAL_MLA_ENTRIES(NAME, DECODER)                                                                       \
    template [[host_name(KCAP_METAL_FORMAT_ENTRY(mla_append_absorb, NAME))]] kernel kcap_mla_append_absorb_entry_t    \
        kcap_mla_append_absorb_entry<DECODER>;                                                                       \
    template [[host_name(KCAP_METAL_FORMAT_ENTRY(mla_v_up, NAME))]] kernel kcap_mla_v_up_entry_t                      \
        kcap_mla_v_up_entry<DECODER>;
KCAP_WEIGHT_FORMATS(KCAP_METAL_MLA_ENTRIES)
#undef KCAP_METAL_MLA_ENTRIES
