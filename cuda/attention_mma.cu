// CUDA-only attention row on the tensor cores (cuda.attention_mma: f16 KV cache, head_dim ==
// head_dim_v in {64, 128, 256}, declared in its row): a prefill chunk's attention as flash
// attention on f16 mma.sync (m16n8k16, f32 accumulation). One token (decode), and devices with
// too little threadgroup memory per group for the tiles (133 KB at head_dim 256: sm_86/sm_89
// parts have 99 KB), run cuda.attention's kernels unchanged (cuda/attention.cu).
//
// Numerics: every tensor-core product is exact, so the result is the tiled SIMT body's up to
// the order and the rounding of the f32 sums:
//   K, V    the cache's f16 values, used as they are (why the row takes f16 caches only).
//   Q       per query row, q' = q * 2^e with e chosen so max |q'| < 2^15 (a power of two: exact,
//           and no f16 overflow), split q' = hi + lo with hi = f16(q'), lo = f16(q' - hi); the
//           scores are (hi.k + lo.k) * 2^-e in f32. |q' - hi - lo| <= 2^-22 |q'| (11 + 11 bits)
//           plus f16 underflow (< 2^-25 absolute at max |q'| ~ 2^15: 2^-40 relative).
//   P       the softmax weights exp(s - m) in [0, 1], split the same way (hi + lo, 2^-22
//           relative, plus at most 2^-25 absolute for weights below f16's normal range).
//   exp, softcap, the online max/sum and the final 1/l are f32, as in kernels/attention.h; an
//           attention sink (gpt-oss) adds exp(sink - m) to l before it.
// The sums: the tensor cores add each mma's products into the f32 accumulators with
// truncation rather than round-to-nearest, one ulp (2^-23) at most per accumulation and all
// in the same direction, so an output over n keys (2 accumulations per 16 keys: hi and lo
// weights) may drift by up to n / 8 ulps where the SIMT body's round-to-nearest sums drift as
// a random walk. test_cuda_rows states the bound (1e-5 + (2 n / 16 + head_dim / 8) 2^-23
// relative); measured on the H200: within 1e-5 up to ~1100 keys, 1.04e-5 at 16500.
//
// Geometry (cuda_rows::kAttnMma*): a group of 4 simd groups owns 64 consecutive query rows of
// one KV head (rows token-major: row = token * group + query head of the KV head, so the query
// heads that share K/V and neighbouring tokens share each staged tile), 16 rows per simd group.
// Grid x = row tiles (the last tokens, which see the most keys, first), y = KV heads. Keys go
// in tiles of attn_mma_keys(head_dim) (32 at head_dim 256, else 64), K and V staged into
// threadgroup memory by cp.async, the next tile in flight while this one is used. Per tile a
// simd group computes its 16 x keys scores S = Q K^T (ldmatrix of Q hi/lo and K, 2 mma per
// product), folds them into its rows' online softmax in registers, and adds P V (P's C
// fragments re-packed as A fragments, V through ldmatrix.trans). A simd group skips a tile
// none of its rows can see (causal, sliding window); masked keys get weight 0, and keys past
// the chunk's last token are zero-filled, so no NaN from unwritten cache rows reaches a sum.
#include <cuda_fp16.h>

#include "cuda/attention.h"
#include "cuda/mma_ptx.h"
#include "kernels/attention.h"

namespace kcap {
namespace {

using namespace cuda_rows;
using namespace cuda;

__device__ __forceinline__ unsigned pack_half2(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);  // .x (lo) in the low 16 bits
    return *reinterpret_cast<const unsigned*>(&v);
}

// v = hi + lo (+ error), both f16, packed as two (element 0, element 1) pairs.
__device__ __forceinline__ void split_half2(float v0, float v1, unsigned& hi, unsigned& lo) {
    const __half h0 = __float2half_rn(v0), h1 = __float2half_rn(v1);
    const __half2 h = __halves2half2(h0, h1);
    hi = *reinterpret_cast<const unsigned*>(&h);
    lo = pack_half2(v0 - __half2float(h0), v1 - __half2float(h1));  // the differences are exact in f32
}

template <int D>
__global__ void __launch_bounds__(kAttnMmaWarps * 32)
    prefill_mma_kernel(KcapAttentionParams p, const kcap_i32* step, const float* q, const __half* k_cache,
                       const __half* v_cache, float* out, const float* sinks) {
    constexpr int kKeys = D >= 256 ? 32 : 64;  // cuda_rows::attn_mma_keys (checked in the launcher)
    constexpr int kStride = D + 8;  // halves per shared row
    constexpr int kQHalves = kAttnMmaRows * kStride, kTileHalves = kKeys * kStride;
    const float kNegInf = KCAP_NEG_INFINITY;
    extern __shared__ __align__(16) unsigned char shared_bytes[];
    __half* q_hi = reinterpret_cast<__half*>(shared_bytes);  // [rows][stride]
    __half* q_lo = q_hi + kQHalves;
    __half* k_tiles = q_lo + kQHalves;           // [2][keys][stride]
    __half* v_tiles = k_tiles + 2 * kTileHalves;  // [2][keys][stride]
    float* row_unscale = reinterpret_cast<float*>(v_tiles + 2 * kTileHalves);  // [rows]: 2^-e

    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
    const int g = lane >> 2, tq = lane & 3;
    const int group = p.n_head / p.n_head_kv;
    const int total_rows = p.n_tokens * group;
    const int kv_head = int(blockIdx.y);
    const int row0 = int(gridDim.x - 1 - blockIdx.x) * kAttnMmaRows;  // the longest rows start first
    const int last_row = min(row0 + kAttnMmaRows, total_rows) - 1;
    cuda::pdl_wait();
    cuda::pdl_trigger();
    const int pos0 = step[0];
    const int pos_hi = pos0 + last_row / group;  // the last key any row of the group sees
    const int first_key = p.window > 0 ? max(pos0 + row0 / group - p.window + 1, 0) : 0;
    const int n_tiles = pos_hi >= first_key ? (pos_hi - first_key) / kKeys + 1 : 0;

    // K and V of keys kb .. kb + kKeys - 1 into buffer b (zeros past pos_hi).
    auto load_tile = [&](int b, int kb) {
        constexpr int kChunks = kKeys * (D / 8);  // 16-byte pieces per matrix
        for (int c = int(threadIdx.x); c < kChunks; c += kAttnMmaWarps * 32) {
            const int key = c / (D / 8), piece = 8 * (c % (D / 8));
            const bool valid = kb + key <= pos_hi;
            const kcap_u64 row = kcap_u64(valid ? kb + key : 0);
            cp_async16_or_zero(k_tiles + b * kTileHalves + key * kStride + piece,
                       k_cache + row * kcap_u64(p.k_width) + kcap_u64(kv_head * D + piece), valid);
            cp_async16_or_zero(v_tiles + b * kTileHalves + key * kStride + piece,
                       v_cache + row * kcap_u64(p.v_width) + kcap_u64(kv_head * D + piece), valid);
        }
        cp_async_commit();
    };
    if (n_tiles > 0) load_tile(0, first_key);

    // This simd group's 16 queries, scaled by a power of two and split into f16 hi + lo
    // (zeros for rows past the call's last token). Only this simd group reads them.
    const int wrow0 = 16 * warp;
    for (int i = 0; i < 16; ++i) {
        const int gr = row0 + wrow0 + i;
        float v[D / 32];
        float peak = 0.0f;
        if (gr < total_rows) {
            const kcap_u64 head = kcap_u64(gr / group) * kcap_u64(p.n_head) + kcap_u64(kv_head * group + gr % group);
#pragma unroll
            for (int j = 0; j < D / 32; ++j) {
                v[j] = q[head * kcap_u64(D) + kcap_u64(lane + 32 * j)];
                peak = fmaxf(peak, fabsf(v[j]));
            }
        } else {
#pragma unroll
            for (int j = 0; j < D / 32; ++j) v[j] = 0.0f;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) peak = fmaxf(peak, __shfl_xor_sync(0xffffffffu, peak, o));
        int e = 0;
        if (peak > 0.0f) frexpf(peak, &e);  // peak < 2^e
        const int shift = min(15 - e, 126);  // max |q'| < 2^15 (f16 max 65504); 2^126 stays finite
        const float scale = ldexpf(1.0f, shift);
#pragma unroll
        for (int j = 0; j < D / 32; ++j) {
            const float s = v[j] * scale;
            const __half hi = __float2half_rn(s);
            q_hi[(wrow0 + i) * kStride + lane + 32 * j] = hi;
            q_lo[(wrow0 + i) * kStride + lane + 32 * j] = __float2half_rn(s - __half2float(hi));
        }
        if (lane == 0) row_unscale[wrow0 + i] = ldexpf(1.0f, -shift);
    }
    __syncwarp();

    // Rows g and g + 8 of this simd group: position (-1: past the last token, sees no key) and
    // first visible key.
    const int ra = row0 + wrow0 + g, rb = ra + 8;
    const int pos_a = ra < total_rows ? pos0 + ra / group : -1;
    const int pos_b = rb < total_rows ? pos0 + rb / group : -1;
    const int first_a = p.window > 0 ? pos_a - p.window + 1 : 0;
    const int first_b = p.window > 0 ? pos_b - p.window + 1 : 0;
    const float unscale_a = row_unscale[wrow0 + g] * p.scale, unscale_b = row_unscale[wrow0 + g + 8] * p.scale;
    // The keys any of the simd group's rows sees, to skip tiles.
    const int w_first_row = row0 + wrow0, w_last_row = min(row0 + wrow0 + 15, total_rows - 1);
    const bool w_rows = w_first_row < total_rows;
    const int w_pos_hi = pos0 + w_last_row / group;
    const int w_first_key = p.window > 0 ? pos0 + w_first_row / group - p.window + 1 : 0;

    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m_a = kNegInf, m_b = kNegInf, l_a = 0.0f, l_b = 0.0f;  // l: this thread's share of the sum

    for (int t = 0; t < n_tiles; ++t) {
        const int kb = first_key + t * kKeys;
        const int b = t & 1;
        if (t + 1 < n_tiles) {
            load_tile(b ^ 1, kb + kKeys);  // the buffer every simd group finished with last iteration
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // tile t is in threadgroup memory for everyone
        if (w_rows && kb <= w_pos_hi && kb + kKeys - 1 >= w_first_key) {
            const __half* kt = k_tiles + b * kTileHalves;
            const __half* vt = v_tiles + b * kTileHalves;
            // Scores: 16 rows x kKeys keys.
            float s[kKeys / 8][4];
#pragma unroll
            for (int nt = 0; nt < kKeys / 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < D / 16; ++kc) {
                unsigned a_hi[4], a_lo[4];
                const int q_off = (wrow0 + (lane & 15)) * kStride + 16 * kc + 8 * (lane >> 4);
                ldmatrix_x4(a_hi, q_hi + q_off);
                ldmatrix_x4(a_lo, q_lo + q_off);
#pragma unroll
                for (int np = 0; np < kKeys / 16; ++np) {
                    unsigned k4[4];  // B fragments of keys 16 np .. +7 (k4[0..1]) and +8 .. +15 (k4[2..3])
                    ldmatrix_x4(k4, kt + (16 * np + (lane & 7) + 8 * (lane >> 4)) * kStride + 16 * kc + 8 * ((lane >> 3) & 1));
                    mma_f16(s[2 * np], a_lo, k4[0], k4[1]);  // the small part first
                    mma_f16(s[2 * np], a_hi, k4[0], k4[1]);
                    mma_f16(s[2 * np + 1], a_lo, k4[2], k4[3]);
                    mma_f16(s[2 * np + 1], a_hi, k4[2], k4[3]);
                }
            }
            // C fragment: s[nt][0..1] row g, keys kb + 8 nt + 2 tq + (0, 1); s[nt][2..3] row g + 8.
            float max_a = kNegInf, max_b = kNegInf;
#pragma unroll
            for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const bool row_a = e < 2;
                    const int key = kb + 8 * nt + 2 * tq + (e & 1);
                    float x = s[nt][e] * (row_a ? unscale_a : unscale_b);
                    if (p.softcap > 0.0f) x = p.softcap * kcap_tanh(x / p.softcap);
                    const bool seen = row_a ? key <= pos_a && key >= first_a : key <= pos_b && key >= first_b;
                    x = seen ? x : kNegInf;
                    s[nt][e] = x;
                    if (row_a)
                        max_a = fmaxf(max_a, x);
                    else
                        max_b = fmaxf(max_b, x);
                }
#pragma unroll
            for (int o_ = 1; o_ <= 2; o_ <<= 1) {  // the 4 threads of a row
                max_a = fmaxf(max_a, __shfl_xor_sync(0xffffffffu, max_a, o_));
                max_b = fmaxf(max_b, __shfl_xor_sync(0xffffffffu, max_b, o_));
            }
            const float new_a = fmaxf(m_a, max_a), new_b = fmaxf(m_b, max_b);
            // 0 while m is still -inf; 1 while no key was seen at all (no -inf - -inf)
            const float corr_a = new_a == kNegInf ? 1.0f : kcap_exp(m_a - new_a);
            const float corr_b = new_b == kNegInf ? 1.0f : kcap_exp(m_b - new_b);
            m_a = new_a, m_b = new_b;
            float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
            for (int nt = 0; nt < kKeys / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const bool row_a = e < 2;
                    const float x = s[nt][e];
                    const float w = x == kNegInf ? 0.0f : kcap_exp(x - (row_a ? new_a : new_b));
                    s[nt][e] = w;
                    if (row_a)
                        sum_a += w;
                    else
                        sum_b += w;
                }
            l_a = l_a * corr_a + sum_a;
            l_b = l_b * corr_b + sum_b;
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                o[nt][0] *= corr_a, o[nt][1] *= corr_a;
                o[nt][2] *= corr_b, o[nt][3] *= corr_b;
            }
            // O += P V, 16 keys at a time: P's A fragment from the C fragments of key tiles 2kc, 2kc+1.
#pragma unroll
            for (int kc = 0; kc < kKeys / 16; ++kc) {
                unsigned p_hi[4], p_lo[4];
                split_half2(s[2 * kc][0], s[2 * kc][1], p_hi[0], p_lo[0]);          // row g, keys 2tq..
                split_half2(s[2 * kc][2], s[2 * kc][3], p_hi[1], p_lo[1]);          // row g + 8
                split_half2(s[2 * kc + 1][0], s[2 * kc + 1][1], p_hi[2], p_lo[2]);  // row g, keys 8 + 2tq..
                split_half2(s[2 * kc + 1][2], s[2 * kc + 1][3], p_hi[3], p_lo[3]);  // row g + 8
#pragma unroll
                for (int dp = 0; dp < D / 16; ++dp) {
                    unsigned v4[4];  // B fragments of dims 16 dp .. +7 (v4[0..1]) and +8 .. +15 (v4[2..3])
                    ldmatrix_x4_trans(v4, vt + (16 * kc + (lane & 7) + 8 * ((lane >> 3) & 1)) * kStride + 16 * dp +
                                              8 * (lane >> 4));
                    mma_f16(o[2 * dp], p_lo, v4[0], v4[1]);
                    mma_f16(o[2 * dp], p_hi, v4[0], v4[1]);
                    mma_f16(o[2 * dp + 1], p_lo, v4[2], v4[3]);
                    mma_f16(o[2 * dp + 1], p_hi, v4[2], v4[3]);
                }
            }
        }
        __syncthreads();  // every simd group is done with buffer b before it is refilled
    }

#pragma unroll
    for (int o_ = 1; o_ <= 2; o_ <<= 1) {
        l_a += __shfl_xor_sync(0xffffffffu, l_a, o_);
        l_b += __shfl_xor_sync(0xffffffffu, l_b, o_);
    }
    // C fragment: o[nt][0..1] row g, dims 8 nt + 2 tq + (0, 1); o[nt][2..3] row g + 8.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int gr = half == 0 ? ra : rb;
        if (gr >= total_rows) continue;
        const int query_head = kv_head * group + gr % group;
        const kcap_u64 head = kcap_u64(gr / group) * kcap_u64(p.n_head) + kcap_u64(query_head);
        // The softmax denominator, with the head's attention sink where the stage has them.
        const float inv = 1.0f / kcap_attn_denominator(sinks, query_head, half == 0 ? m_a : m_b, half == 0 ? l_a : l_b);
        float* dst = out + head * kcap_u64(D) + kcap_u64(2 * tq);
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt)
            *reinterpret_cast<float2*>(dst + 8 * nt) = make_float2(o[nt][2 * half] * inv, o[nt][2 * half + 1] * inv);
    }
}

template <int D>
void launch_prefill_mma(const cuda::Context& ctx, const cuda::AttentionCall& a, const KernelCall& call) {
    static_assert(attn_mma_keys(D) == (D >= 256 ? 32 : 64), "the kernel's key tile is cuda_rows'");
    const KcapAttentionParams& p = a.p;
    const int bytes = attn_mma_shared_bytes(D);
    // Above 48 KB a kernel must opt in to its dynamic threadgroup memory, once per process.
    static const cudaError_t opted_in =
        cudaFuncSetAttribute(prefill_mma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    KCAP_CUDA_CHECK(opted_in);
    const int64_t query_rows = int64_t(p.n_tokens) * (p.n_head / p.n_head_kv);
    cuda::launch(ctx, prefill_mma_kernel<D>, dim3(cuda::ceil_div(query_rows, kAttnMmaRows), p.n_head_kv),
                 dim3(kAttnMmaWarps * 32), size_t(bytes), p, ctx.step, call.in,
                 reinterpret_cast<const __half*>(a.k_cache), reinterpret_cast<const __half*>(a.v_cache), call.out,
                 static_cast<const float*>(cuda::stage_data(call).operands[3]));  // the sinks (F32 [n_head]), or null
}

}  // namespace

namespace cuda {

// cuda.attention_mma[_rope|_qk_norm_rope][_q8]: a prefill chunk on the tensor cores (the row's
// legal dims: f16 cache, head dims with a body, the device's threadgroup memory).
template <AttnRope ROPE, bool Q8>
void run_attention_mma(const Stage& stage, const KernelCall& call) {
    const Context& ctx = context(call);
    const AttentionCall a = prefill_call<ROPE>(stage, call);
    switch (stage.params.head_dim) {
        case 64: launch_prefill_mma<64>(ctx, a, call); break;
        case 128: launch_prefill_mma<128>(ctx, a, call); break;
        case 256: launch_prefill_mma<256>(ctx, a, call); break;
        default: throw Error("cuda.attention_mma: no tensor-core body for head_dim " + std::to_string(stage.params.head_dim));
    }
    if constexpr (Q8) quantize_into_scratch(ctx, call.n_tokens, a.p.n_head * a.p.head_dim_v, call.out);
}

#define KCAP_INSTANTIATE_ATTENTION_MMA(ROPE)                                               \
    template void run_attention_mma<AttnRope::ROPE, false>(const Stage&, const KernelCall&); \
    template void run_attention_mma<AttnRope::ROPE, true>(const Stage&, const KernelCall&);
KCAP_INSTANTIATE_ATTENTION_MMA(None)
KCAP_INSTANTIATE_ATTENTION_MMA(Rope)
KCAP_INSTANTIATE_ATTENTION_MMA(QkNormRope)
#undef KCAP_INSTANTIATE_ATTENTION_MMA

}  // namespace cuda
}  // namespace kcap
