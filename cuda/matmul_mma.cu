// CUDA-only matmul rows on the tensor cores (cuda.matmul_mma.<format>, cuda.gate_up_mma.<format>,
// cuda.qkv_mma), which take kMmaMinTokens tokens and more (fewer run the exact rows of
// matmul.cu): tiles of kMmaTokens tokens x kMmaRows weight rows on bf16 mma.sync (m16n8k16, f32 accumulation), scale-factored and with split activations:
//
//   weights   every format here is w_k = scale_s * q_k + offset_s over sub-blocks s of 16 or 32
//             elements, q_k a small integer, exact in bf16 (kernels/quant_codes.h, checked
//             against decode32 on the host). Each K step of kStepK = 64, every thread decodes
//             one 32-element run of one weight row: its codes go to shared memory as bf16
//             pairs, its (scale, offset) pairs to per-(sub-block, row) f32 arrays. It decodes
//             from a shared copy of the raw GGUF bytes (RawChunk below): all 256 threads copy
//             the tile's 128 rows there with cp.async, one chunk of K at a time (a 256-element
//             super-block for the K-quants, 64 elements = two blocks otherwise), consecutive
//             threads on consecutive words of a row (coalesced; decoding straight from global
//             had every load instruction touch 16 rows), double-buffered: chunk c + 1 is in
//             flight while chunk c is decoded and multiplied. Rows of K >= kStagedMinK only:
//             at short K (Gemma 3's 640 and 2048) decoding straight from global memory was
//             faster on the H200 (kStagedMinK in cuda/mma_tiles.h).
//   x         split as x_hi = bf16(x), x_lo = bf16(x - x_hi), both staged as bf16 pairs; for
//             formats with offsets the per-(sub-block, token) sum of x_hi + x_lo (f32) beside them.
//             Loaded coalesced (16 lanes x float4 per token: 256 contiguous bytes) into
//             registers one step ahead: step k + 1's loads are in flight during step k's mma.
//   products  per sub-block, T = sum_k x_lo q + sum_k x_hi q on the tensor cores (products of
//             bf16 values are exact; f32 accumulation), then per output
//             acc += scale * T (+ offset * xsum) in f32 FMAs. The grouped experts' MXFP4 read
//             ahead (unstaged) is the exception: a value c x 2^(e - 128) with scale byte e in [2, 248] (every
//             block of a real file) is exact in bf16 (mma_tiles.h: mxfp4_bf16_pairs), so its
//             steps stage the values themselves and sum x_lo w + x_hi w into acc over all of
//             K on the tensor cores; a step with any block outside that range is staged again
//             as codes and scales and takes the per-sub-block form.
// So the result is the exact weights (as decode32 gives them) times x_hi + x_lo, summed in f32:
// |x - x_hi - x_lo| <= 2^-16 |x| (8 + 8 significant bits, two round-to-nearest steps), so each
// output errs by at most 2^-16 * sum_k |w_k x_k| plus f32 summation. The parity test states
// 3e-5 relative to ||(|W| |x|)|| (2^-16 = 1.5e-5, plus the exact rows' 1e-5 for f32 sums).
//
// F32 and F16 weights are not scale x bf16-exact codes (their values carry 24 and 11
// significant bits): they have no mma row (cuda/rows.cpp, cuda_rows::mma_format), so the
// planner gives them the exact rows. The TF32 tiles these rows replace (10 mantissa bits of
// both operands) missed the suite's 1e-2 whole-model bound on Gemma 3 270M (0.0131 x std, its
// quantized weights rounded to TF32) and would do no better on float weights; a faithful
// tensor-core path for F32/F16 would split the weights too (2-3x the mma work).
//
// Tile: kMmaTokens = 64 tokens x kMmaRows = 128 rows, 8 warps in a 2 (tokens) x 4 (rows) grid,
// each warp 32 tokens x 32 rows = 2 x 4 mma tiles of 16 x 8. Shared rows are kStride = 36
// words (36 = 4 mod 32), so the 8 rows one ldmatrix phase (or one plain 32-bit fragment
// load) reads fall in distinct banks. Grid: x = row tiles, y = token tiles, z = the halves of K
// of a plain launch of short grid (split_k_zero, cuda/mma_tiles.h: their sums add into the
// zeroed outputs, as the int8 tiles' do). Shared memory:
// the static tiles (Shared, 41 KB) plus the dynamic raw double buffer (RawChunk::bytes, up to
// 55 KB for Q6_K), at most 96 KB per block so two blocks fit a multiprocessor (228 KB).
// Build with -DKCAP_MMA_LDMATRIX=0 to load the fragments with plain 32-bit shared loads
// instead of ldmatrix (the same layouts spelled out lane by lane; for diagnosis).
#include <cuda_bf16.h>

#include <type_traits>

#include "cuda/matmul.h"
#include "cuda/mma_tiles.h"
#include "kernels/quant_codes.h"

namespace kcap {
namespace cuda {
namespace {

using namespace cuda_rows;
using namespace mma_tiles;

constexpr int kStride = kStrideBf16;  // words (bf16 pairs) per shared row
struct alignas(16) Shared {
    unsigned w[kMmaRows * kStride];      // codes, [row][k / 2] as bf16 pairs (low half = even k)
    unsigned xhi[kMmaTokens * kStride];  // x_hi, [token][k / 2]
    unsigned xlo[kMmaTokens * kStride];  // x_lo
    float scale[kSubs16][kMmaRows];      // [sub-block][row]; kStepK / sub of the kSubs16 used
    float offset[kSubs16][kMmaRows];
    float xsum[kSubs16][kMmaTokens];     // [sub-block][token]: sum of x_hi + x_lo
};

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low 16 bits
    return *reinterpret_cast<const unsigned*>(&v);
}

// A thread's activations of one step in registers (load_x's 4 tokens x 4 values): f32 for the
// plain tiles, which split them as they stage them; split ahead (SplitRows) for the grouped
// experts' tiles, with the sub-block sums the thread writes where the format has offsets.
struct StepX {
    float4 v[4];
};
struct StepXSplit {
    uint2 hi[4], lo[4];
    float sum[4];
};

// load_x of split rows: tokens xt + 16 i (x row src[i]), values 4 xc .. 4 xc + 3 of the step at
// k0, zeros for a row of -1 or past K; the sub-block's sum (SUB values: one or two 16-value
// sums, added as the tiles' staging adds them) by the sub-block's first thread (OFFSET).
template <int SUB, bool OFFSET>
__device__ __forceinline__ void load_x_split(StepXSplit& r, const SplitRows& xs, const KcapMatmulParams& p,
                                             const int (&src)[4], int xc, int k0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        r.hi[i] = r.lo[i] = make_uint2(0u, 0u);
        r.sum[i] = 0.0f;
        if (src[i] < 0 || k0 + 4 * xc >= p.k) continue;
        const kcap_u64 at = kcap_u64(src[i]) * p.k + k0 + 4 * xc;
        r.hi[i] = *reinterpret_cast<const uint2*>(xs.hi + at);
        r.lo[i] = *reinterpret_cast<const uint2*>(xs.lo + at);
        if (OFFSET && (xc & (SUB / 4 - 1)) == 0) {
            const float* s = xs.sum16 + at / 16;
            r.sum[i] = SUB == 32 ? s[0] + s[1] : s[0];
        }
    }
}

// A thread's activations of the step into the shared tiles: f32 split into bf16 hi and lo, and
// (OFFSET) each SUB-value sub-block's sum of hi + lo by its first thread, over the SUB / 4
// lanes of the token that hold it.
template <int SUB, bool OFFSET>
__device__ __forceinline__ void stage_x(Shared& sh, const StepX& x, int xt, int xc) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float v[4] = {x.v[i].x, x.v[i].y, x.v[i].z, x.v[i].w};
        uint2 hi, lo;
        float sum;
        split_quad(v, hi, lo, sum);  // (sum unused and dropped without OFFSET)
        const int t = xt + 16 * i;
        *reinterpret_cast<uint2*>(sh.xhi + t * kStride + 2 * xc) = hi;
        *reinterpret_cast<uint2*>(sh.xlo + t * kStride + 2 * xc) = lo;
        if (OFFSET) {
            // The sub-block's SUB / 4 lanes (aligned groups of the 16 lanes of token t).
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            if (SUB == 32) sum += __shfl_xor_sync(0xffffffffu, sum, 4);
            if ((xc & (SUB / 4 - 1)) == 0) sh.xsum[xc / (SUB / 4)][t] = sum;
        }
    }
}
// ... split ahead: copied, the sums already added.
template <int SUB, bool OFFSET>
__device__ __forceinline__ void stage_x(Shared& sh, const StepXSplit& x, int xt, int xc) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int t = xt + 16 * i;
        *reinterpret_cast<uint2*>(sh.xhi + t * kStride + 2 * xc) = x.hi[i];
        *reinterpret_cast<uint2*>(sh.xlo + t * kStride + 2 * xc) = x.lo[i];
        if (OFFSET && (xc & (SUB / 4 - 1)) == 0) sh.xsum[xc / (SUB / 4)][t] = x.sum[i];
    }
}

// STAGED: the weights' raw chunks go through shared memory (stage_chunk); else each thread
// decodes its run straight from global memory (faster at short K: kStagedMinK). GROUPED: the
// grouped experts' tiles (group.tile_expert set) in an instantiation of their own, so that the
// plain tiles carry no per-tile checks of the grouping (without them their spills went: pp512
// exact of 8 layers of Llama-3-8B Q4_K_M on the H200 about 8% faster); the grouped products take
// one 16-token tile at a time, its fragments then its products (a warp skips the tiles of
// padding), which with the first change took pp512 exact of 12-layer slices of Qwen3-30B-A3B,
// gpt-oss-20b and DeepSeek-V2-Lite up 3-5% (bench/results/cuda_h200_grouped_tiles.txt).
template <class F, bool STAGED, bool GROUPED>
__global__ void __launch_bounds__(kMmaThreads, 2)
    mma_kernel(MmaGroup group, const float* x) {
    const int which = mma_group_member(group), tile = mma_group_tile(group, which);
    const KcapMatmulParams p = mma_group_pick(group.p, which);
    const kcap_u8* w = mma_group_pick(group.w, which);  // grouped experts: moved to the tile's expert below
    using C = KcapCodes<F>;
    using R = RawChunk<F>;
    constexpr int kSub = C::sub;                 // elements per sub-block: 16 or 32
    constexpr int kSubs = kStepK / kSub;         // sub-blocks per step
    constexpr int kRunsPerBlock = F::block_elems / 32;
    static_assert(kSub == 16 || kSub == 32, "sub-blocks of 16 or 32 elements");
    __shared__ Shared sh;
    extern __shared__ __align__(16) unsigned raw[];  // RawChunk<F>: two buffers of buffer_words
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tg = lane & 3;
    const int row_base = tile * kMmaRows, token_base = blockIdx.y * kMmaTokens;
    const int warp_tokens = kWarpTokens * (warp / kWarpsRows), warp_rows = kWarpRows * (warp % kWarpsRows);
    // Decoding role: weight row dr, run dhalf of each step. Activation role: float4 column xc
    // (values 4 xc .. 4 xc + 3 of the step) of tokens xt + 16 i, i < 4.
    const int dr = tid >> 1, dhalf = tid & 1;
    const int xt = tid >> 4, xc = tid & 15;
    const bool row_valid = row_base + dr < p.n;
    pdl_wait();
    pdl_trigger();
    kcap_u64 bias_offset = 0;  // grouped experts: the tile's expert's bias row
    if (GROUPED) {
        const int expert = group.tile_expert[blockIdx.y];
        if (expert < 0) return;  // past the batch's tiles
        w += kcap_u64(expert) * group.expert_bytes;
        bias_offset = kcap_u64(expert) * kcap_u64(p.n);
    }
    const kcap_u8* wrow = w + kcap_u64(row_valid ? row_base + dr : 0) * p.row_bytes;
    const kcap_u8* w_end = w + kcap_u64(p.n) * p.row_bytes;
    int xsrc[4];
    x_sources(xsrc, group.x_rows, p, token_base, xt);
    // Grouped experts: a 16-token mma tile whose first row is padding is all padding (an
    // expert's rows are padded at the end of its tiles), so the warp skips its products.
    bool live[kMt];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
        live[mt] = !GROUPED || group.live_rows[token_base + warp_tokens + 16 * mt] >= 0;
    float acc[kMt][kNt][4] = {};
    const int runs = p.k / 32;
    // Split K (grid z of 2, plain tiles only: split_k_zero in mma_tiles.h): this group's chunks
    // [c_begin, chunks) and their values [k_begin, k_end); its partial sums are added into y.
    const int all_chunks = (p.k + R::k - 1) / R::k;
    const int per_split = (all_chunks + int(gridDim.z) - 1) / int(gridDim.z);
    const int c_begin = min(all_chunks, int(blockIdx.z) * per_split), chunks = min(all_chunks, c_begin + per_split);
    const int k_begin = c_begin * R::k, k_end = min(p.k, chunks * R::k);
    if (STAGED) {
        stage_chunk<F>(raw + (c_begin & 1) * R::buffer_words, w, w_end, p, row_base, c_begin, tid);
        cp_async_commit();
    }
    // GROUPED: x split ahead (group.x_split), the sums read where the format has offsets.
    std::conditional_t<GROUPED, StepXSplit, StepX> xv;
    const auto load_step_x = [&](int k0) {
        if constexpr (GROUPED) load_x_split<kSub, C::has_offset>(xv, group.x_split, p, xsrc, xc, k0);
        else load_x(xv.v, x, p, xsrc, xc, k0);
    };
    load_step_x(k_begin);
    // Unstaged MXFP4, Q8_0, Q4_0 and Q5_0 (RunAhead): the words of the thread's run of the next
    // step, loaded with the next step's activations, in flight during this step's products.
    using Ahead = RunAhead<F>;
    constexpr bool kAhead = !STAGED && Ahead::kWords > 0;
    static_assert(!kAhead || kRunsPerBlock == 1, "RunAhead: 32-element blocks");
    kcap_u32 ahead[kAhead ? Ahead::kWords : 1];
    kcap_u32 ahead_off = 0;
    // The grouped experts' MXFP4 read ahead: its values c x 2^(e - 128) are exact in bf16 where
    // the block's scale byte allows (mxfp4_bf16_pairs), so a step's products take the weights
    // themselves and sum into acc over all of K on the tensor cores, with no per-sub-block sums,
    // scale loads and FMAs. (The plain tiles keep codes and scales: with both forms in their
    // loop, the split-K tiles' registers spilled.)
    constexpr bool kFold = GROUPED && kAhead && std::is_same<F, KcapMXFP4>::value;
    const auto load_ahead = [&](int k0) {
        if constexpr (kAhead) {
            const int run = k0 / 32 + dhalf;
            const bool in = row_valid && run < runs;
            ahead_off = run_ahead_load<F>(wrow + unsigned(in ? run : 0) * unsigned(F::block_bytes), in, ahead);
        }
    };
    load_ahead(k_begin);
    for (int k0 = k_begin; k0 < k_end; k0 += kStepK) {
        const int chunk = k0 / R::k;
        const bool chunk_start = k0 % R::k == 0;
        if (STAGED && chunk_start) cp_async_wait<0>();  // this thread's copies of chunk `chunk` have landed
        // Everyone's copies are visible; the previous step's tiles are no longer read.
        __syncthreads();
        // Prefetch the next chunk into the other buffer: its last reader was the decode of the
        // previous chunk's last step, before that step's second barrier.
        if (STAGED && chunk_start && chunk + 1 < chunks) {
            stage_chunk<F>(raw + ((chunk + 1) & 1) * R::buffer_words, w, w_end, p, row_base, chunk + 1, tid);
            cp_async_commit();
        }
        // Weights: codes as bf16 pairs, (scale, offset) per sub-block; zeros past N or K.
        const int run = k0 / 32 + dhalf;
        const bool run_in = row_valid && run < runs;
        const auto write_codes = [&] {
            float q[32], sc[2] = {0.0f, 0.0f}, off[2] = {0.0f, 0.0f};
            if (run_in) {
                if constexpr (kAhead) {
                    kcap_u32 u[8];
                    Ahead::decode(ahead, ahead_off, u, sc);
                    kcap_codes32_from_words<C>(u, q);
                } else {
                    C::codes32(run_block<F, STAGED>(raw, wrow, dr, run, chunk), run % kRunsPerBlock, q, sc, off);
                }
            } else {
#pragma unroll
                for (int i = 0; i < 32; ++i) q[i] = 0.0f;
            }
            uint4* dst = reinterpret_cast<uint4*>(sh.w + dr * kStride + 16 * dhalf);
#pragma unroll
            for (int v = 0; v < 4; ++v)
                dst[v] = make_uint4(pack_bf16(q[8 * v], q[8 * v + 1]), pack_bf16(q[8 * v + 2], q[8 * v + 3]),
                                    pack_bf16(q[8 * v + 4], q[8 * v + 5]), pack_bf16(q[8 * v + 6], q[8 * v + 7]));
            if (kSub == 16) {
                sh.scale[2 * dhalf][dr] = sc[0], sh.scale[2 * dhalf + 1][dr] = sc[1];
                if (C::has_offset) sh.offset[2 * dhalf][dr] = off[0], sh.offset[2 * dhalf + 1][dr] = off[1];
            } else {
                sh.scale[dhalf][dr] = sc[0];
                if (C::has_offset) sh.offset[dhalf][dr] = off[0];
            }
        };
        // kFold: the run's values themselves, where its scale allows (else `unfolded`).
        bool unfolded = false;
        if constexpr (kFold) {
            unsigned pairs[16];
            if (run_in) unfolded = !mxfp4_bf16_pairs(ahead, ahead_off, pairs);
            if (!run_in || unfolded) {
#pragma unroll
                for (int i = 0; i < 16; ++i) pairs[i] = 0u;
            }
            uint4* dst = reinterpret_cast<uint4*>(sh.w + dr * kStride + 16 * dhalf);
#pragma unroll
            for (int v = 0; v < 4; ++v) dst[v] = make_uint4(pairs[4 * v], pairs[4 * v + 1], pairs[4 * v + 2], pairs[4 * v + 3]);
        } else {
            write_codes();
        }
        // Activations (loaded a step ahead): split into bf16 hi and lo (GROUPED: split ahead);
        // zeros past M or K.
        stage_x<kSub, C::has_offset>(sh, xv, xt, xc);
        // Everyone's tiles written. kFold: a step with any run outside the folded range is
        // written again as codes and scales (every thread, after the barrier that finds it).
        bool folded = kFold;
        if constexpr (kFold) {
            folded = !__syncthreads_or(unfolded);
            if (!folded) {
                load_ahead(k0);  // read again: the words need not stay in registers across the barrier
                write_codes();
                __syncthreads();
            }
        } else {
            __syncthreads();
        }
        // The next step's activations (and RunAhead's weights): in flight during this step's products.
        if (k0 + kStepK < k_end) {
            load_step_x(k0 + kStepK);
            load_ahead(k0 + kStepK);
        }
        // The products of one k16 slice (word kw of the shared rows) added into out.
        const auto multiply = [&](float (&out)[kMt][kNt][4], int kw) {
            if constexpr (GROUPED) {
                // One m16 tile of tokens at a time: its fragments, then its products.
                unsigned b[kNt / 2][4];
#pragma unroll
                for (int np = 0; np < kNt / 2; ++np)
                    load_b2<kStride>(b[np], sh.w + (warp_rows + 16 * np) * kStride + kw, lane);
#pragma unroll
                for (int mt = 0; mt < kMt; ++mt) {
                    if (!live[mt]) continue;
                    unsigned ahi[4], alo[4];
                    load_a<kStride>(ahi, sh.xhi + (warp_tokens + 16 * mt) * kStride + kw, lane);
                    load_a<kStride>(alo, sh.xlo + (warp_tokens + 16 * mt) * kStride + kw, lane);
#pragma unroll
                    for (int nt = 0; nt < kNt; ++nt) {
                        const unsigned b0 = b[nt >> 1][2 * (nt & 1)], b1 = b[nt >> 1][2 * (nt & 1) + 1];
                        mma_bf16(out[mt][nt], alo, b0, b1);  // the small part first
                        mma_bf16(out[mt][nt], ahi, b0, b1);
                    }
                }
            } else {
                unsigned ahi[kMt][4], alo[kMt][4], b[kNt / 2][4];
#pragma unroll
                for (int mt = 0; mt < kMt; ++mt) {
                    if (!live[mt]) continue;
                    load_a<kStride>(ahi[mt], sh.xhi + (warp_tokens + 16 * mt) * kStride + kw, lane);
                    load_a<kStride>(alo[mt], sh.xlo + (warp_tokens + 16 * mt) * kStride + kw, lane);
                }
#pragma unroll
                for (int np = 0; np < kNt / 2; ++np)
                    load_b2<kStride>(b[np], sh.w + (warp_rows + 16 * np) * kStride + kw, lane);
#pragma unroll
                for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
                    for (int nt = 0; nt < kNt; ++nt) {
                        if (!live[mt]) continue;
                        const unsigned b0 = b[nt >> 1][2 * (nt & 1)], b1 = b[nt >> 1][2 * (nt & 1) + 1];
                        mma_bf16(out[mt][nt], alo[mt], b0, b1);  // the small part first
                        mma_bf16(out[mt][nt], ahi[mt], b0, b1);
                    }
            }
        };
        if (folded) {
#pragma unroll
            for (int kw = 0; kw < kStepK / 2; kw += 8) multiply(acc, kw);
            continue;
        }
        if constexpr (kFold) {
            // A step of codes and scales (rare: a scale byte outside the folded range): one m16 x n8
            // tile at a time, its fragments loaded again for each, so that its sums take 4
            // registers beside the folded steps' instead of the whole tile's 32.
#pragma unroll 1
            for (int s = 0; s < kSubs; ++s)
#pragma unroll
                for (int mt = 0; mt < kMt; ++mt) {
                    if (!live[mt]) continue;
#pragma unroll
                    for (int nt = 0; nt < kNt; ++nt) {
                        float t[4] = {};
#pragma unroll
                        for (int u = 0; u < kSub / 16; ++u) {
                            const int kw = (s * kSub + 16 * u) / 2;
                            unsigned ahi[4], alo[4], b[4];
                            load_a<kStride>(ahi, sh.xhi + (warp_tokens + 16 * mt) * kStride + kw, lane);
                            load_a<kStride>(alo, sh.xlo + (warp_tokens + 16 * mt) * kStride + kw, lane);
                            load_b2<kStride>(b, sh.w + (warp_rows + 16 * (nt >> 1)) * kStride + kw, lane);
                            mma_bf16(t, alo, b[2 * (nt & 1)], b[2 * (nt & 1) + 1]);
                            mma_bf16(t, ahi, b[2 * (nt & 1)], b[2 * (nt & 1) + 1]);
                        }
                        const int r = warp_rows + 8 * nt + 2 * tg;
                        const float sx = sh.scale[s][r], sy = sh.scale[s][r + 1];
                        float* a = acc[mt][nt];
                        a[0] = fmaf(sx, t[0], a[0]);
                        a[1] = fmaf(sy, t[1], a[1]);
                        a[2] = fmaf(sx, t[2], a[2]);
                        a[3] = fmaf(sy, t[3], a[3]);
                    }
                }
            continue;
        }
#pragma unroll 1
        for (int s = 0; s < kSubs; ++s) {
            float t[kMt][kNt][4] = {};
#pragma unroll
            for (int u = 0; u < kSub / 16; ++u) multiply(t, (s * kSub + 16 * u) / 2);
            // C fragment: t[.][.][0], [1] at (token g, rows 2tg, 2tg + 1); [2], [3] at token g + 8.
#pragma unroll
            for (int nt = 0; nt < kNt; ++nt) {
                const int r = warp_rows + 8 * nt + 2 * tg;
                const float2 sc = make_float2(sh.scale[s][r], sh.scale[s][r + 1]);
                float2 off = make_float2(0.0f, 0.0f);
                if (C::has_offset) off = make_float2(sh.offset[s][r], sh.offset[s][r + 1]);
#pragma unroll
                for (int mt = 0; mt < kMt; ++mt) {
                    float* a = acc[mt][nt];
                    a[0] = fmaf(sc.x, t[mt][nt][0], a[0]);
                    a[1] = fmaf(sc.y, t[mt][nt][1], a[1]);
                    a[2] = fmaf(sc.x, t[mt][nt][2], a[2]);
                    a[3] = fmaf(sc.y, t[mt][nt][3], a[3]);
                    if (C::has_offset) {
                        const float xa = sh.xsum[s][warp_tokens + 16 * mt + g];
                        const float xb = sh.xsum[s][warp_tokens + 16 * mt + g + 8];
                        a[0] = fmaf(off.x, xa, a[0]);
                        a[1] = fmaf(off.y, xa, a[1]);
                        a[2] = fmaf(off.x, xb, a[2]);
                        a[3] = fmaf(off.y, xb, a[3]);
                    }
                }
            }
        }
    }
    const float* bias = mma_group_pick(group.bias, which);
    if (!GROUPED && gridDim.z > 1) {
        store_tile<kMt, true>(acc, p, token_base + warp_tokens, row_base + warp_rows, lane,
                              blockIdx.z == 0 ? bias : nullptr, mma_group_pick(group.y, which));
        return;
    }
    store_tile(acc, p, token_base + warp_tokens, row_base + warp_rows, lane, bias ? bias + bias_offset : nullptr,
               mma_group_pick(group.y, which));
}

}  // namespace

template <class F, bool STAGED, bool GROUPED>
void launch_mma_tiles(const Context& ctx, const MmaGroup& g, const float* x) {
    constexpr size_t raw_bytes = STAGED ? RawChunk<F>::bytes : 0;
    if (STAGED) allow_dynamic_shared<mma_kernel<F, STAGED, GROUPED>>(ctx, raw_bytes);
    dim3 grid = mma_group_grid(g);
    if (!GROUPED) grid.z = unsigned(split_k_zero(ctx, g, int(grid.x), 2, kMmaTokens, RawChunk<F>::k));
    launch(ctx, mma_kernel<F, STAGED, GROUPED>, grid, dim3(kMmaThreads), raw_bytes, g, x);
}

template <class F, bool STAGED>
void launch_mma(const Context& ctx, const MmaGroup& g, const float* x) {
    g.tile_expert ? launch_mma_tiles<F, STAGED, true>(ctx, g, x) : launch_mma_tiles<F, STAGED, false>(ctx, g, x);
}

// The tiles of the matrices of `g` (mma_tiles.h: launch_mma_group).
template <class F>
void mma_group_tiles(const Context& ctx, const MmaGroup& g, const float* x) {
    launch_mma_group<F>(ctx, g, sizeof(Shared) + RawChunk<F>::bytes, [&](const MmaGroup& group, bool staged) {
        staged ? launch_mma<F, true>(ctx, group, x) : launch_mma<F, false>(ctx, group, x);
    });
}

namespace {
// split_bf16's kernel: a quad of values per thread (split_store_quad).
__global__ void __launch_bounds__(kElementwiseThreads) split_bf16_kernel(const float* x, kcap_u64 quads, SplitRows out) {
    pdl_wait();
    pdl_trigger();
    const kcap_u64 q = kcap_u64(blockIdx.x) * blockDim.x + threadIdx.x;
    const bool in = q < quads;
    const float4 v4 = in ? *reinterpret_cast<const float4*>(x + 4 * q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float v[4] = {v4.x, v4.y, v4.z, v4.w};
    split_store_quad(v, q, in, out);  // every lane: the 16-value sums take 4 lanes
}
}  // namespace

void mma_tiles::split_bf16(const Context& ctx, const float* x, int64_t rows, int64_t k, const SplitRows& out) {
    if (k % 32 != 0) throw Error("split_bf16: rows of a multiple of 32 values");
    const kcap_u64 quads = kcap_u64(rows * k / 4);
    launch(ctx, split_bf16_kernel, dim3(unsigned(ceil_div(int64_t(quads), kElementwiseThreads))), dim3(kElementwiseThreads),
           0, x, quads, out);
}

void mma_tiles::mma_group_bf16(const Context& ctx, Format format, const MmaGroup& g, const float* x) {
    if (!cuda_rows::mma_format(format) || g.p[0].k % 32 != 0 || g.p[0].m < kMmaMinTokens)
        throw Error(std::string("mma_group_bf16: no tiles for ") + format_name(format) + " at this k and m");
    switch (format) {
#define KCAP_MMA_GROUP_CASE(NAME, DECODER)                                         \
    case Format::NAME:                                                             \
        if constexpr (KcapCodes<DECODER>::factorable) return mma_group_tiles<DECODER>(ctx, g, x); \
        break;
        KCAP_WEIGHT_FORMATS(KCAP_MMA_GROUP_CASE)
#undef KCAP_MMA_GROUP_CASE
        default: break;
    }
    throw Error(std::string("mma_group_bf16: no tiles for ") + format_name(format));
}

}  // namespace cuda

template <Format FORMAT>
void kcap_cuda_matmul_mma(const Stage& stage, const KernelCall& call) {
    const cuda::StageData& data = cuda::stage_data(call);
    cuda::mma_tiles::mma_group_bf16(cuda::context(call), FORMAT,
                                    cuda::mma_tiles::mma_group(cuda::matmul_params(stage, call),
                                                               static_cast<const kcap_u8*>(data.operands[0]),
                                                               static_cast<const float*>(data.operands[1]), call.out),
                                    call.in);
}

// gate_up: both matrices' tiles in one launch into the plan's gate / up scratch, then the
// gated activation.
template <Format FORMAT>
void kcap_cuda_gate_up_mma(const Stage& stage, const KernelCall& call) {
    const cuda::StageData& data = cuda::stage_data(call);
    const KcapMatmulParams p = cuda::matmul_params(stage, call);  // operand 1 is the up matrix, not a bias
    cuda::mma_tiles::MmaGroup g =
        cuda::mma_tiles::mma_group(p, static_cast<const kcap_u8*>(data.operands[0]), nullptr, call.inout2);
    cuda::mma_tiles::mma_group_add(g, p, static_cast<const kcap_u8*>(data.operands[1]), nullptr, call.inout3);
    cuda::mma_tiles::mma_group_bf16(cuda::context(call), FORMAT, g, call.in);
    cuda::gate_up_activation(stage, call);
}

#define KCAP_INSTANTIATE_MMA(NAME, DECODER)                                                  \
    template void kcap_cuda_matmul_mma<Format::NAME>(const Stage&, const KernelCall&);      \
    template void kcap_cuda_gate_up_mma<Format::NAME>(const Stage&, const KernelCall&);
KCAP_WEIGHT_FORMATS(KCAP_INSTANTIATE_MMA)
#undef KCAP_INSTANTIATE_MMA

// qkv: the tiles of the matrices of one format in one launch, per format (every weight has a tile
// format).
void kcap_cuda_qkv_mma(const Stage& stage, const KernelCall& call) {
    int groups = 0;
    const cuda::mma_tiles::MmaFormatGroups by_format = cuda::mma_tiles::mma_groups_by_format(
        cuda::qkv_segments(stage, call, cuda_rows::kMatvecChunkRuns, &groups));
    for (int i = 0; i < by_format.count; ++i)
        cuda::mma_tiles::mma_group_bf16(cuda::context(call), by_format.format[i], by_format.group[i], call.in);
}

}  // namespace kcap
