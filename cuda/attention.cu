// CUDA entry points of the attention rows: kernels/attention.h. Every row takes attention sinks
// (operand 3).
//   cuda.attention_decode* (one token: decode, and every step of the decode graph): split-K
//     decode, which also appends the token's K/V, then the combine when the stage has more than
//     one split;
//   cuda.attention_prefill* (a prefill chunk): append the chunk's K/V, then every token attends
//     to the cache (tiled: kernels/attention_prefill.h, geometry in cuda_rows::attn_prefill_*);
//   cuda.attention_mma* (cuda/attention_mma.cu): the same on the tensor cores;
//   cuda.attention_mla (multi-head latent attention, every token count): kernels/attention_mla.h.
// The split count was fixed at load time from the stage's longest span (cuda_backend.cu),
// so the captured graph replays at any position; each split's share of keys follows the
// position read from device memory.
#include "cuda/attention.h"
#include "dispatch/kernel_params.h"
#include "kernels/attention.h"
#include "kernels/attention_mla.h"
#include "kernels/matvec_q8.h"

namespace kcap {
namespace {

using namespace cuda_rows;

static_assert(cuda_rows::kAttnDecodeSimds == KCAP_ATTN_DECODE_SIMDS, "cuda_rows states the decode body's default");
static_assert(cuda_rows::kAttnHeadsPerPass == KCAP_ATTN_HEADS_PER_PASS && cuda_rows::attn_decode_dim_groups(256, 256) ==
                  KCAP_ATTN_DIM_GROUPS, "cuda_rows states the decode body's passes and dim groups");

// Asks L2 for the cached K and V rows this group's split reads (rows [start, min(end, pos)):
// the new key at pos is not in the cache yet), one 128-byte line per request, all issued before
// the first row is needed: the simd groups' own loads, a few keys per step, then find their
// lines on the way instead of paying one memory latency per step. A hint only (no value is
// read), so the body in kernels/attention.h stays the same on every backend. Measured on the
// H200 (q8_1, 12-layer slices): tg128 at 4096 keys +4% Qwen3-30B-A3B, +8% gpt-oss-20b and
// SmolLM2, from empty +2-6% (bench/results/cuda_h200_attn_prefetch.txt).
// `skip`: the split's first keys not to ask for (the tiled body reads its first tile at once).
__device__ __forceinline__ void decode_prefetch(const KcapAttentionParams& p, int pos, const kcap_u8* k_cache,
                                                const kcap_u8* v_cache, int skip = 0) {
    const KcapDecodeHeads heads = kcap_decode_heads(p, int(blockIdx.x));
    if (heads.first != 0) return;  // one group per KV head asks: its other groups read the same rows
    const KcapDecodeRange range = kcap_decode_range(kcap_decode_splits(p, pos), int(blockIdx.y), pos);
    if (!range.active) return;
    const int start = range.start + skip;
    const int end = range.end < pos ? range.end : pos;  // the new key (pos) is not in the cache yet
    const int elem = p.kv_f16 ? 2 : 4;
    const int k_lines = (p.head_dim * elem + 127) / 128, v_lines = (p.head_dim_v * elem + 127) / 128;
    const int per_row = k_lines + v_lines;
    for (int i = int(threadIdx.x); i < (end - start) * per_row; i += int(blockDim.x)) {
        const int row = start + i / per_row, line = i % per_row;
        const kcap_u8* at =
            line < k_lines
                ? k_cache + (kcap_u64(row) * p.k_width + kcap_u64(heads.kv_head) * p.head_dim) * elem + line * 128
                : v_cache + (kcap_u64(row) * p.v_width + kcap_u64(heads.kv_head) * p.head_dim_v) * elem +
                      (line - k_lines) * 128;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(at));
    }
}

// The position (step[0]) into L1 before a kernel's PDL wait: the step's last kernel (the
// argmax) wrote it before the step's first kernel ran, so a kernel of the step reads the same
// value before and after its wait, and after the wait reads it from L1 instead of L2.
__device__ __forceinline__ void prefetch_position(const kcap_i32* step) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(step));
}

// The decode body's wait (kcap_attention_decode_dims' Wait): the launch before it complete.
struct PdlWait {
    static __device__ __forceinline__ void wait() {
        cuda::pdl_wait();
        cuda::pdl_trigger();
    }
};

// Where one split covered every key, a decode group wrote the outputs of query heads first ..
// first + heads - 1 (contiguous) itself, so the first split's group also writes their q8_1 for
// the output projection (q8.codes null: not a _q8 row).
__device__ __forceinline__ void decode_q8_output(const KcapThread& t, const KcapAttentionParams& p, const kcap_i32* step,
                                                 const cuda::Q8Rows& q8, const float* out, int first, int heads) {
    if (!q8.codes || blockIdx.y != 0 || kcap_decode_splits(p, step[0]).active != 1) return;
    __syncthreads();  // the group's writes of the output are visible to it
    const kcap_u64 base = kcap_u64(first) * p.head_dim_v;
    kcap_q8_quantize_row(t, out + base, heads * p.head_dim_v, q8.codes + base / 4, q8.d + base / 32,
                         q8.half_sums + base / 16);
}

template <int DG, int KS>
__global__ void __launch_bounds__(KCAP_ATTN_DECODE_MAX_SIMDS * 32, DG == 1 ? 2 : 1)
    decode_kernel(KcapAttentionParams p, const kcap_i32* step, const float* q, const float* k_new, const float* v_new,
                  kcap_u8* k_cache, kcap_u8* v_cache, float* partial_o, float* partial_ml, float* out, cuda::Q8Rows q8,
                  const float2* cos_sin, const float* q_norm, const float* k_norm, const float* sinks) {
    __shared__ float merge[KCAP_ATTN_DECODE_SHARED_FLOATS];
    // Before the wait: the position (see prefetch_position) and the cached rows it reads
    // (written by earlier steps); the prefetch is a hint, the body reads the position again,
    // and its cos/sin row, the QK-norm weights and each simd group's first keys before it
    // waits (PdlWait).
    decode_prefetch(p, step[0], k_cache, v_cache);
    const KcapThread t = kcap_cuda_thread();
    kcap_attention_decode_dims<DG, KS, PdlWait>(t, p, step, q, k_new, v_new, k_cache, v_cache, partial_o, partial_ml,
                                                out, merge, cos_sin, q_norm, k_norm, sinks);
    const KcapDecodeHeads heads = kcap_decode_heads(p, int(blockIdx.x));
    if (heads.first < heads.end)
        decode_q8_output(t, p, step, q8, out, heads.kv_head * (p.n_head / p.n_head_kv) + heads.first,
                         heads.end - heads.first);
}

// The decode with staged key tiles (kcap_attention_decode_tiles): grid x = n_head_kv, y = n_splits,
// S simd groups (the KV head's S query heads, whose q8_1 it writes where one split covers every key).
template <int D, int F16, int S>
__global__ void __launch_bounds__(S * 32)
    decode_tiles_kernel(KcapAttentionParams p, const kcap_i32* step, const float* q, const float* k_new,
                        const float* v_new, kcap_u8* k_cache, kcap_u8* v_cache, float* partial_o, float* partial_ml,
                        float* out, cuda::Q8Rows q8, const float2* cos_sin, const float* q_norm, const float* k_norm,
                        const float* sinks) {
    __shared__ __align__(16) float shared[KCAP_ATTN_TILE_SHARED_FLOATS(D)];
    decode_prefetch(p, step[0], k_cache, v_cache, KCAP_ATTN_TILE_KEYS);
    const KcapThread t = kcap_cuda_thread();
    kcap_attention_decode_tiles<D, F16, S, PdlWait>(t, p, step, q, k_new, v_new, k_cache, v_cache, partial_o,
                                                    partial_ml, out, shared, cos_sin, q_norm, k_norm, sinks);
    decode_q8_output(t, p, step, q8, out, int(blockIdx.x) * S, S);
}

__global__ void __launch_bounds__(256) combine_kernel(KcapAttentionParams p, const kcap_i32* step, const float* partial_o,
                                                      const float* partial_ml, float* out, cuda::Q8Rows q8,
                                                      const float* sinks) {
    __shared__ float shared[KCAP_ATTN_COMBINE_SHARED_FLOATS];
    prefetch_position(step);
    cuda::pdl_wait();
    cuda::pdl_trigger();
    const KcapThread t = kcap_cuda_thread();
    const float v = kcap_attention_combine(t, p, step, partial_o, partial_ml, out, shared, sinks);
    // The merged head's q8_1 for the output projection, from the registers: thread d holds dim d,
    // so a simd group holds one 32-value run (head_dim_v % 32 == 0; groups past it hold none).
    if (q8.codes && kcap_decode_splits(p, step[0]).active > 1 && int(t.simd) * 32 < p.head_dim_v) {
        const kcap_u64 e = kcap_u64(blockIdx.x) * p.head_dim_v + t.index;  // the value's index in the row
        kcap_q8_quantize_lane(t, v, e, q8.codes, q8.d, q8.half_sums);
    }
}

__global__ void __launch_bounds__(kElementwiseThreads)
    append_kernel(KcapAttentionParams p, const kcap_i32* step, const float* k_new, const float* v_new, kcap_u8* k_cache,
                  kcap_u8* v_cache) {
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_kv_append(kcap_cuda_thread(), p, step, k_new, v_new, k_cache, v_cache);
}

static_assert(kAttnPrefillRowsPerSimd == KCAP_ATTN_PREFILL_ROWS && kAttnPrefillMaxSimds == KCAP_ATTN_PREFILL_MAX_SIMDS &&
                  kAttnPrefillQFloats == KCAP_ATTN_PREFILL_Q_FLOATS &&
                  kAttnPrefillSharedBytes == KCAP_ATTN_PREFILL_SHARED_FLOATS * 4,
              "cuda_rows states the prefill body's geometry");

// Tiled prefill: grid x = row tiles of the KV head's query rows, y = n_head_kv.
__global__ void __launch_bounds__(KCAP_ATTN_PREFILL_MAX_SIMDS * 32)
    prefill_kernel(KcapAttentionParams p, const kcap_i32* step, const float* q, const kcap_u8* k_cache,
                   const kcap_u8* v_cache, float* out, const float* sinks) {
    __shared__ __align__(16) float shared[KCAP_ATTN_PREFILL_SHARED_FLOATS];
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_attention_prefill(kcap_cuda_thread(), p, step, q, k_cache, v_cache, out, shared, sinks);
}

// The call's cache rows appended and the queries absorbed, in one launch (the attend needs both):
// groups x < the absorb's (one per (token, head), or with TOKENS one per KCAP_MLA_TOKENS tokens of
// a head; y: blocks of latent values) absorb, the next n_tokens groups (y = 0) append a row each.
template <class F, bool TOKENS>
__global__ void __launch_bounds__(KCAP_MLA_THREADS)
    mla_append_absorb_kernel(KcapMlaParams p, const kcap_i32* step, const float* q, const float* kv_new,
                             const float* norm, const kcap_u8* kb, const float2* cos_sin, kcap_u8* cache,
                             float* absorbed) {
    constexpr int kAbsorbFloats =
        TOKENS ? KCAP_MLA_TOKENS_SHARED_FLOATS(KCAP_MLA_MAX_WIDTH) : KCAP_MLA_ROWS_SHARED_FLOATS;
    __shared__ float shared[kAbsorbFloats > KCAP_MLA_MAX_SIMDS ? kAbsorbFloats : KCAP_MLA_MAX_SIMDS];
    cuda::pdl_wait();
    cuda::pdl_trigger();
    KcapThread t = kcap_cuda_thread();
    const unsigned groups = unsigned(TOKENS ? KCAP_MLA_TOKEN_TILES(p) * p.n_head : p.n_tokens * p.n_head);
    if (t.group_x < groups) {
        if constexpr (TOKENS)
            kcap_mla_absorb_tokens<F>(t, p, step, q, kb, cos_sin, absorbed, shared);
        else
            kcap_mla_absorb<F>(t, p, step, q, kb, cos_sin, absorbed, shared);
    } else if (t.group_y == 0) {
        t.group_x -= groups;
        kcap_mla_append(t, p, step, kv_new, norm, cos_sin, cache, shared);
    }
}

__global__ void __launch_bounds__(KCAP_MLA_THREADS)
    mla_attend_kernel(KcapMlaParams p, const kcap_i32* step, const float* absorbed, const kcap_u8* cache, int n_splits,
                      float* partial_o, float* partial_ml) {
    __shared__ float shared[KCAP_MLA_ATTEND_SHARED_FLOATS];
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_mla_attend(kcap_cuda_thread(), p, step, absorbed, cache, n_splits, partial_o, partial_ml, shared);
}

__global__ void __launch_bounds__(KCAP_MLA_THREADS)
    mla_combine_kernel(KcapMlaParams p, const kcap_i32* step, int n_splits, const float* partial_o,
                       const float* partial_ml, float* latent) {
    __shared__ float shared[KCAP_MLA_COMBINE_SHARED_FLOATS];
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_mla_combine(kcap_cuda_thread(), p, step, n_splits, partial_o, partial_ml, latent, shared);
}

template <class F>
__global__ void __launch_bounds__(KCAP_MLA_THREADS)
    mla_v_up_kernel(KcapMlaParams p, const float* latent, const kcap_u8* vb, float* out) {
    __shared__ float ls[KCAP_MLA_ROWS_SHARED_FLOATS];
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_mla_v_up<F>(kcap_cuda_thread(), p, latent, vb, out, ls);
}

// A prefill chunk's tiled forms (cuda.attention_mla_tiled, after mla_append_absorb_kernel<F, true>):
// the tiled attend, then the V up-projection in token tiles.
__global__ void __launch_bounds__(KCAP_MLA_THREADS)
    mla_attend_tiled_kernel(KcapMlaParams p, const kcap_i32* step, const float* absorbed, const kcap_u8* cache,
                            float* latent) {
    extern __shared__ __align__(16) float tile_shared[];
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_mla_attend_tiled(kcap_cuda_thread(), p, step, absorbed, cache, latent, tile_shared);
}

template <class F>
__global__ void __launch_bounds__(KCAP_MLA_THREADS)
    mla_v_up_tokens_kernel(KcapMlaParams p, const float* latent, const kcap_u8* vb, float* out) {
    __shared__ float ls[KCAP_MLA_TOKENS_SHARED_FLOATS(KCAP_MLA_MAX_LORA)];
    cuda::pdl_wait();
    cuda::pdl_trigger();
    kcap_mla_v_up_tokens<F>(kcap_cuda_thread(), p, latent, vb, out, ls);
}

}  // namespace

namespace cuda {

AttentionCall attention_call(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    const StageParams& s = stage.params;
    const KvCache& kv = ctx.kv.at(size_t(s.kv_layer >= 0 ? s.kv_layer : stage.layer));
    return {attention_params(stage, call.n_tokens, ctx.kv_format, data.attn_splits, cuda_rows::kAttnMinChunk),
            static_cast<kcap_u8*>(kv.k), static_cast<kcap_u8*>(kv.v)};
}

template <AttnRope ROPE>
AttentionCall prefill_call(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    AttentionCall a = attention_call(stage, call);
    if constexpr (ROPE != AttnRope::None) {
        // Q and K (call.in, call.in2: the stage's own buffers) rotated in place, as the rope or
        // qk_norm_rope stage the planner folded into this one would have.
        KernelCall rope = call;
        rope.out = const_cast<float*>(call.in);
        rope.inout2 = const_cast<float*>(call.in2);
        if constexpr (ROPE == AttnRope::QkNormRope)
            run_qk_norm_rope(stage, rope);
        else
            run_rope(stage, rope);
    }
    a.p.rope = a.p.qk_norm = 0;
    if (a.p.append) {
        const int64_t appended = int64_t(a.p.n_tokens) * (a.p.k_width + a.p.v_width);
        launch(ctx, append_kernel, dim3(ceil_div(appended, cuda_rows::kElementwiseThreads)),
               dim3(cuda_rows::kElementwiseThreads), 0, a.p, ctx.step, call.in2, call.in3, a.k_cache, a.v_cache);
    }
    return a;
}
template AttentionCall prefill_call<AttnRope::None>(const Stage&, const KernelCall&);
template AttentionCall prefill_call<AttnRope::Rope>(const Stage&, const KernelCall&);
template AttentionCall prefill_call<AttnRope::QkNormRope>(const Stage&, const KernelCall&);

namespace {

// The stage's attention sinks (operand 3, F32 [n_head]) on the device, or null.
const float* sinks_of(const KernelCall& call) { return static_cast<const float*>(stage_data(call).operands[3]); }

// cuda.attention_decode[_rope][_q8]: one token. With Q8 the token's output is also written as
// q8_1 for the output projection (as cuda.add_norm_q8 does for qkv and gate_up): by the decode's
// groups where one split covered every key, else by the combine (whole heads: head_dim_v % 32).
template <bool Q8>
void run_attention_decode(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    AttentionCall a = attention_call(stage, call);
    a.p.head_blocks = cuda_rows::attn_decode_head_blocks(a.p.n_head, a.p.n_head_kv, a.p.head_dim, a.p.head_dim_v);
    const KcapAttentionParams& p = a.p;
    const StageData& data = stage_data(call);
    const Q8Rows q8 = Q8 ? q8_rows_layout(ctx, 1, p.n_head * p.head_dim_v) : Q8Rows{nullptr, nullptr, nullptr};
    const auto* cos_sin = reinterpret_cast<const float2*>(data.rope_table);
    const auto* q_norm = static_cast<const float*>(data.operands[0]);
    const auto* k_norm = static_cast<const float*>(data.operands[1]);
    // The heads' dims and count fix the body and its geometry (per stage, like its splits).
    const int simds = cuda_rows::attn_decode_simds(p.n_head, p.n_head_kv, p.head_dim, p.head_dim_v);
    if (cuda_rows::attn_decode_tiles(p.n_head, p.n_head_kv, p.head_dim, p.head_dim_v)) {
        cuda_rows::with_attn_decode_tiles(p.head_dim, p.kv_f16, p.n_head / p.n_head_kv, [&](auto d, auto f16, auto s) {
            launch(ctx, decode_tiles_kernel<decltype(d)::value, decltype(f16)::value, decltype(s)::value>,
                   dim3(p.n_head_kv, p.n_splits), dim3(32 * simds), 0, p, ctx.step, call.in, call.in2, call.in3,
                   a.k_cache, a.v_cache, ctx.attn_partial_o, ctx.attn_partial_ml, call.out, q8, cos_sin, q_norm,
                   k_norm, sinks_of(call));
        });
    } else {
        cuda_rows::with_attn_decode_body(p.head_dim, p.head_dim_v, [&](auto dg, auto ks) {
            launch(ctx, decode_kernel<decltype(dg)::value, decltype(ks)::value>,
                   dim3(p.n_head_kv * p.head_blocks, p.n_splits), dim3(32 * simds), 0, p, ctx.step, call.in, call.in2,
                   call.in3, a.k_cache, a.v_cache, ctx.attn_partial_o, ctx.attn_partial_ml, call.out, q8, cos_sin,
                   q_norm, k_norm, sinks_of(call));
        });
    }
    if (p.n_splits > 1)
        launch(ctx, combine_kernel, dim3(p.n_head), dim3(cuda_rows::attn_combine_threads(p.head_dim_v)), 0, p, ctx.step,
               static_cast<const float*>(ctx.attn_partial_o), static_cast<const float*>(ctx.attn_partial_ml), call.out,
               q8, sinks_of(call));
}

// cuda.attention_prefill[_rope|_qk_norm_rope][_q8]: a prefill chunk, tiled SIMT.
template <AttnRope ROPE, bool Q8>
void run_attention_prefill(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    const AttentionCall a = prefill_call<ROPE>(stage, call);
    const KcapAttentionParams& p = a.p;
    const int64_t query_rows = int64_t(p.n_tokens) * (p.n_head / p.n_head_kv);
    launch(ctx, prefill_kernel, dim3(ceil_div(query_rows, cuda_rows::attn_prefill_rows(p.head_dim)), p.n_head_kv),
           dim3(32 * cuda_rows::attn_prefill_simds(p.head_dim)), 0, p, ctx.step, call.in,
           static_cast<const kcap_u8*>(a.k_cache), static_cast<const kcap_u8*>(a.v_cache), call.out, sinks_of(call));
    if constexpr (Q8) quantize_into_scratch(ctx, call.n_tokens, p.n_head * p.head_dim_v, call.out);
}

}  // namespace
}  // namespace cuda

template <AttnKind KIND, AttnRope ROPE, bool Q8>
void kcap_cuda_attention(const Stage& stage, const KernelCall& call) {
    if constexpr (KIND == AttnKind::Decode)
        cuda::run_attention_decode<Q8>(stage, call);
    else if constexpr (KIND == AttnKind::Prefill)
        cuda::run_attention_prefill<ROPE, Q8>(stage, call);
    else
        cuda::run_attention_mma<ROPE, Q8>(stage, call);
}

namespace {

// What every latent attention launcher reads of its stage and call.
struct MlaLaunch {
    const cuda::Context& ctx;
    const cuda::StageData& data;
    KcapMlaParams p;
    kcap_u8* cache;
    const float2* cos_sin;
    const kcap_u8* kb;
    const kcap_u8* vb;
    Format kb_format, vb_format;
    const char* row;  // the row's kernel name, for errors
};

MlaLaunch mla_launch(const Stage& stage, const KernelCall& call, const char* row) {
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    const KcapMlaParams p = mla_params(stage, call.n_tokens, ctx.kv_format);
    const auto* kb = static_cast<const kcap_u8*>(data.operands[1]);
    return {ctx,
            data,
            p,
            static_cast<kcap_u8*>(ctx.kv.at(size_t(stage.layer)).k),
            reinterpret_cast<const float2*>(data.rope_table),
            kb,
            p.combined ? kb : static_cast<const kcap_u8*>(data.operands[2]),
            stage.operands[1]->format,
            (p.combined ? stage.operands[1] : stage.operands[2])->format,
            row};
}

// The appended cache rows and the absorbed queries (with TOKENS in token tiles).
template <bool TOKENS>
void launch_append_absorb(const MlaLaunch& m, const KernelCall& call) {
    const KcapMlaParams& p = m.p;
    const unsigned absorb_groups = unsigned(TOKENS ? KCAP_MLA_TOKEN_TILES(p) * p.n_head : p.n_tokens * p.n_head);
    const dim3 grid(absorb_groups + unsigned(p.n_tokens), unsigned(KCAP_MLA_ABSORB_BLOCKS(p)));
    switch (m.kb_format) {
#define KCAP_MLA_ABSORB_CASE(NAME, DECODER)                                                                            \
    case Format::NAME:                                                                                                 \
        cuda::launch(m.ctx, mla_append_absorb_kernel<DECODER, TOKENS>, grid, dim3(KCAP_MLA_THREADS), 0, p, m.ctx.step, \
                     call.in, call.in2, static_cast<const float*>(m.data.operands[0]), m.kb, m.cos_sin, m.cache,       \
                     m.ctx.mla_absorbed);                                                                              \
        break;
        KCAP_WEIGHT_FORMATS(KCAP_MLA_ABSORB_CASE)
#undef KCAP_MLA_ABSORB_CASE
        default:
            throw Error(std::string(m.row) + ": no body for " + format_name(m.kb_format));
    }
}

// W_v_b applied to the weighted latents (with TOKENS in token tiles).
template <bool TOKENS>
void launch_v_up(const MlaLaunch& m, const KernelCall& call) {
    const KcapMlaParams& p = m.p;
    const dim3 grid(unsigned(TOKENS ? KCAP_MLA_TOKEN_TILES(p) * p.n_head : p.n_tokens * p.n_head),
                    unsigned(KCAP_MLA_V_UP_BLOCKS(p)));
    switch (m.vb_format) {
#define KCAP_MLA_V_UP_CASE(NAME, DECODER)                                                                        \
    case Format::NAME:                                                                                           \
        cuda::launch(m.ctx, TOKENS ? mla_v_up_tokens_kernel<DECODER> : mla_v_up_kernel<DECODER>, grid,           \
                     dim3(KCAP_MLA_THREADS), 0, p, static_cast<const float*>(m.ctx.mla_latent), m.vb, call.out); \
        break;
        KCAP_WEIGHT_FORMATS(KCAP_MLA_V_UP_CASE)
#undef KCAP_MLA_V_UP_CASE
        default:
            throw Error(std::string(m.row) + ": no body for " + format_name(m.vb_format));
    }
}

}  // namespace

// cuda.attention_mla[_decode], four launches: the call's cache rows appended and the queries
// absorbed, each (token, group of heads) attending over its span (the decode in the key splits
// fixed at load time from the stage's longest span, a prefill chunk in one), the splits merged,
// then the V up-projection (kernels/attention_mla.h). Positions come from the device (step[0]),
// so the decode graph replays at any position.
template <bool DECODE>
void kcap_cuda_attention_mla(const Stage& stage, const KernelCall& call) {
    const MlaLaunch m = mla_launch(stage, call, DECODE ? "cuda.attention_mla_decode" : "cuda.attention_mla");
    const cuda::Context& ctx = m.ctx;
    const KcapMlaParams& p = m.p;
    const dim3 block(KCAP_MLA_THREADS);
    launch_append_absorb<false>(m, call);
    const int splits = DECODE ? m.data.attn_splits : 1;
    const unsigned groups = unsigned(p.n_tokens * cuda::ceil_div(p.n_head, KCAP_MLA_HEADS_PER_GROUP));
    cuda::launch(ctx, mla_attend_kernel, dim3(groups, unsigned(splits)), block, 0, p, ctx.step,
                 static_cast<const float*>(ctx.mla_absorbed), static_cast<const kcap_u8*>(m.cache), splits,
                 ctx.attn_partial_o, ctx.attn_partial_ml);
    const unsigned slots = unsigned(p.n_tokens * p.n_head);
    cuda::launch(ctx, mla_combine_kernel, dim3(slots, unsigned(KCAP_MLA_COMBINE_BLOCKS(p))), block, 0, p, ctx.step, splits,
                 static_cast<const float*>(ctx.attn_partial_o), static_cast<const float*>(ctx.attn_partial_ml),
                 ctx.mla_latent);
    launch_v_up<false>(m, call);
}
template void kcap_cuda_attention_mla<true>(const Stage&, const KernelCall&);
template void kcap_cuda_attention_mla<false>(const Stage&, const KernelCall&);

// cuda.attention_mla_tiled, three launches: the queries absorbed in token tiles beside the cache
// rows appended, the tiled attend (each staged cache row scored and summed for 32 query rows at
// once, the latents written normalized: no combine), the V up-projection in token tiles.
void kcap_cuda_attention_mla_tiled(const Stage& stage, const KernelCall& call) {
    const MlaLaunch m = mla_launch(stage, call, "cuda.attention_mla_tiled");
    launch_append_absorb<true>(m, call);
    // Above 48 KB a kernel must opt in to its dynamic threadgroup memory: once per process, for
    // the widest row the launch can take (the row's legal dims).
    static const cudaError_t opted_in =
        cudaFuncSetAttribute(mla_attend_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             cuda_rows::mla_tiled_shared_bytes(KCAP_MLA_MAX_WIDTH));
    KCAP_CUDA_CHECK(opted_in);
    cuda::launch(m.ctx, mla_attend_tiled_kernel, dim3(unsigned(KCAP_MLA_ATTEND_TILES(m.p))), dim3(KCAP_MLA_THREADS),
                 size_t(cuda_rows::mla_tiled_shared_bytes(m.p.width)), m.p, m.ctx.step,
                 static_cast<const float*>(m.ctx.mla_absorbed), static_cast<const kcap_u8*>(m.cache), m.ctx.mla_latent);
    launch_v_up<true>(m, call);
}

#define KCAP_INSTANTIATE_ATTENTION(KIND, ROPE)                                                             \
    template void kcap_cuda_attention<AttnKind::KIND, AttnRope::ROPE, false>(const Stage&, const KernelCall&); \
    template void kcap_cuda_attention<AttnKind::KIND, AttnRope::ROPE, true>(const Stage&, const KernelCall&);
KCAP_INSTANTIATE_ATTENTION(Decode, None)
KCAP_INSTANTIATE_ATTENTION(Decode, Rope)
KCAP_INSTANTIATE_ATTENTION(Prefill, None)
KCAP_INSTANTIATE_ATTENTION(Prefill, Rope)
KCAP_INSTANTIATE_ATTENTION(Prefill, QkNormRope)
KCAP_INSTANTIATE_ATTENTION(PrefillMma, None)
KCAP_INSTANTIATE_ATTENTION(PrefillMma, Rope)
KCAP_INSTANTIATE_ATTENTION(PrefillMma, QkNormRope)
#undef KCAP_INSTANTIATE_ATTENTION

}  // namespace kcap
