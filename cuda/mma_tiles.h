// Pieces shared by the tensor-core matmul kernels (matmul_mma.cu: bf16 tiles on split
// activations; matmul_q8.cu: int8 tiles on q8_1 activations): the tile and warp layout,
// the fragment loads, the raw weight chunks staged by cp.async, the activation loads. Both
// kernels take kMmaRows weight rows per group, K in steps of kStepK, each thread decoding one
// 32-element run of one row per step (see matmul_mma.cu's header); the bf16 kernel takes
// kMmaTokens tokens per group (warps of kWarpTokens x kWarpRows), the int8 one 64 or 128
// (matmul_q8.cu: warps of 32 or 64 tokens x kWarpRows).
#pragma once

#include <cuda_bf16.h>

#include <atomic>
#include <climits>

#include "cuda/cuda_context.h"
#include "cuda/matmul.h"
#include "cuda/mma_ptx.h"
#include "kernels/matmul.h"

#ifndef KCAP_MMA_LDMATRIX
#define KCAP_MMA_LDMATRIX 1
#endif

namespace kcap {
namespace cuda {
namespace mma_tiles {

using namespace cuda_rows;

constexpr int kStepK = 64;                 // K elements staged per step: two 32-element runs per row
constexpr int kSubs16 = kStepK / 16;       // 16-element sub-blocks per step
constexpr int kWarpsRows = 4;              // warp grid: 2 (tokens) x 4 (rows)
constexpr int kWarpTokens = 32, kWarpRows = 32;          // the bf16 kernel's warp tile
constexpr int kMt = kWarpTokens / 16, kNt = kWarpRows / 8;  // mma tiles per warp (kNt: both kernels)
// Words (bf16 pairs) per shared row of the bf16 tiles' weights and activations, padded: 36 = 4
// mod 32, so the 8 rows one ldmatrix phase (or one plain 32-bit fragment load) reads fall in
// distinct banks.
constexpr int kStrideBf16 = kStepK / 2 + 4;
static_assert(kStrideBf16 % 32 == 4 && kStrideBf16 % 4 == 0, "conflict-free fragment loads, 16-byte aligned rows");
static_assert(kMmaThreads == 256 && kMmaTokens == 64 && kMmaRows == 128, "the warp layout assumes these");
static_assert(kMmaThreads == 2 * kMmaRows, "weights: each thread decodes one run of one row per step");
static_assert(kMmaThreads * 16 == kMmaTokens * kStepK && kStepK == 64, "activations: each thread stages 4 float4 (of 4 tokens) per step");

// The fragment loads take shared rows of STRIDE words ([row][k / 2] bf16 pairs, or [row][k / 4]
// int8 quads: the k16 bf16 and k32 int8 fragments hold the same word positions).
// A fragment (16 tokens x 16 k) of m16n8k16 from rows [token][k / 2] starting at `tile`
// (token 0, word kw): a0 (token g, k 2tg..2tg+1), a1 (g + 8, same k), a2 (g, k + 8), a3 (g + 8, k + 8).
template <int STRIDE>
__device__ __forceinline__ void load_a(unsigned (&a)[4], const unsigned* tile, int lane) {
#if KCAP_MMA_LDMATRIX
    // Lane l addresses row l % 16, k 8 * (l / 16) of the tile: matrices 0..3 = a0..a3.
    ldmatrix_x4(a, tile + (lane & 15) * STRIDE + 4 * (lane >> 4));
#else
    const unsigned* p = tile + (lane >> 2) * STRIDE + (lane & 3);
    a[0] = p[0];
    a[1] = p[8 * STRIDE];
    a[2] = p[4];
    a[3] = p[8 * STRIDE + 4];
#endif
}

// B fragments of two neighbouring n8 tiles (rows 0..7 and 8..15 from `tile`, [row][k / 2]):
// b[0], b[1] of the first (row g, k 2tg..2tg+1 and k + 8), b[2], b[3] of the second.
template <int STRIDE>
__device__ __forceinline__ void load_b2(unsigned (&b)[4], const unsigned* tile, int lane) {
#if KCAP_MMA_LDMATRIX
    // Lane l addresses row l % 8 + 8 * (l / 16), k 8 * ((l / 8) % 2): matrices = b[0..3].
    ldmatrix_x4(b, tile + ((lane & 7) + 8 * (lane >> 4)) * STRIDE + 4 * ((lane >> 3) & 1));
#else
    const unsigned* p = tile + (lane >> 2) * STRIDE + (lane & 3);
    b[0] = p[0];
    b[1] = p[4];
    b[2] = p[8 * STRIDE];
    b[3] = p[8 * STRIDE + 4];
#endif
}

// The raw GGUF bytes of one chunk of K for the tile's kMmaRows weight rows, in shared memory
// (dynamic; two buffers). A chunk is one 256-element super-block (the K-quants: one chunk
// serves 4 steps) or kStepK = 64 elements = two 32-element blocks (one step); the last chunk
// of a 32-element format may hold one block (K a multiple of 32 only).
//   Alignment: the decoders read words at the block's real alignment (kernels/quant.h: blocks
// of 18, 22, 34, 110, 210 bytes at even offsets through the a2 paths, which test the address
// bits; MXFP4 byte by byte; Q4_K 16-byte loads), so a row's shared copy has the same address
// mod 4 as in global memory: the copy is the 4-aligned window of words covering the chunk's
// bytes, and the chunk starts `lead` = (global address mod 4) bytes into it. Formats whose
// blocks are a multiple of 16 bytes (BF16, Q4_K, Q5_K) start every chunk 16-aligned (weights
// sit in their own allocation, so a row starts at row * row_bytes): lead 0, the shared rows
// 16-aligned too, and 16-byte copies.
//   Shared row strides: 16-byte rows take stride = 4 mod 8 words, so the 4 rows one quarter
// warp reads with 16-byte loads (lane pairs share a row) fall in distinct bank quads; the
// others an odd stride, so the 16 rows of a warp's 32-bit loads at one offset hit 16 banks.
template <class F>
struct RawChunk {
    static constexpr int k = F::block_elems > kStepK ? F::block_elems : kStepK;  // elements: 256 or 64
    static constexpr int blocks = k / F::block_elems;                           // per row: 1 or 2
    static constexpr int runs = k / 32;
    static constexpr int bytes_per_row = blocks * F::block_bytes;
    static constexpr bool vec16 = F::block_bytes % 16 == 0;
    static constexpr int unit = vec16 ? 16 : 4;  // bytes per cp.async
    // Copies per row: the chunk's bytes, plus (4-byte windows) up to 3 bytes of lead and 3 of tail.
    static constexpr int units = vec16 ? bytes_per_row / 16 : (bytes_per_row + 3 + 3) / 4;
    static constexpr int words = units * unit / 4;
    static constexpr int stride = vec16 ? (words + 3) / 8 * 8 + 4 : words | 1;  // words per shared row
    static constexpr int buffer_words = kMmaRows * stride;
    static constexpr size_t bytes = 2 * size_t(buffer_words) * 4;  // double-buffered
    static_assert(!vec16 || bytes_per_row % 16 == 0, "16-byte copies cover the chunk exactly");
    static_assert(stride >= words && (!vec16 || stride % 8 == 4), "windows fit the padded rows");
};

// Bytes into a row's shared window where chunk `chunk` starts: its global address mod 4 (0 for
// 16-byte formats). `row` is the row's first byte in global memory.
template <class F>
__device__ __forceinline__ unsigned raw_lead(const kcap_u8* row, int chunk) {
    if (RawChunk<F>::vec16) return 0u;
    return kcap_address_bits(row + unsigned(chunk) * unsigned(RawChunk<F>::bytes_per_row)) & 3u;
}

// All threads: issue the cp.async copies of chunk `chunk` of rows row_base .. row_base + 127
// (those < N) into `buf`. Thread i of the flat (row, unit) order copies unit i % units of row
// i / units, so a warp's 32 copies are consecutive words (or 16-byte pieces) of one or two rows.
// A 4-byte window may take up to 3 bytes of the neighbouring rows (never read back; w is 4-aligned,
// so no window starts before it). The word holding the tensor's last byte may stick out past
// its end (the last row of a 4-byte format whose size is not a multiple of 4): that one word
// is read byte by byte instead, so no copy leaves [w, w_end).
template <class F>
__device__ __forceinline__ void stage_chunk(unsigned* buf, const kcap_u8* w, const kcap_u8* w_end,
                                            const KcapMatmulParams& p, int row_base, int chunk, int tid) {
    using R = RawChunk<F>;
    const int blocks = min(R::blocks, int(p.k / F::block_elems) - chunk * R::blocks);  // 1 in a short last chunk
    const int bytes = blocks * F::block_bytes;
    constexpr int kCopies = kMmaRows * R::units;
    const unsigned buf_address = shared_address(buf);
#pragma unroll 4
    for (int i0 = 0; i0 < kCopies; i0 += kMmaThreads) {
        const int i = i0 + tid;
        if (kCopies % kMmaThreads != 0 && i >= kCopies) break;
        const int r = i / R::units, u = i - r * R::units;
        if (row_base + r >= p.n) continue;
        const kcap_u8* row = w + kcap_u64(row_base + r) * p.row_bytes;
        const unsigned dst = buf_address + unsigned(4 * r * R::stride + R::unit * u);
        if (R::vec16) {
            const kcap_u8* src = row + unsigned(chunk) * unsigned(R::bytes_per_row) + 16 * u;
            if (16 * u < bytes) cp_async16(dst, src);
        } else {
            const unsigned lead = raw_lead<F>(row, chunk);
            const kcap_u8* src = row + unsigned(chunk) * unsigned(R::bytes_per_row) - lead + 4 * u;  // 4-aligned
            if (4 * u < int(lead) + bytes) {
                if (src + 4 <= w_end) {
                    cp_async4(dst, src);
                } else {
                    unsigned word = 0u;
#pragma unroll 1
                    for (int j = 0; src + j < w_end; ++j) word |= unsigned(src[j]) << (8 * j);
                    buf[r * R::stride + u] = word;  // a plain store: visible after the barrier
                }
            }
        }
    }
}

// The grouped experts' int8 tiles (matmul_q8.cu) without staged weights also ask L2 for each
// thread's weight run this many steps ahead (prefetch.global.L2), so that more of an expert's
// weights are on their way than the one run per thread each step's decode waits for. Measured
// on the H200 (bench/results/cuda_h200_moe_tiles_staging.txt, pp512 of 12-layer slices): gpt-oss's
// MXFP4 experts 23,895 -> 24,730 tok/s with q8_1; the split-bf16 tiles gained nothing (exact
// 15,589 -> 15,520, bf16 27,239 -> 27,544), so they take none.
constexpr int kMoeQ8PrefetchSteps = 4;

// prefetch.global.L2 of (about) the bytes of run `run` of the weight row starting at wrow: its
// share of its block (a run's codes lie in order in every format; a K-quant's header sits at
// the block's start, which the block's first run's request covers).
template <class F>
__device__ __forceinline__ void prefetch_run(const kcap_u8* wrow, int run) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    kcap_prefetch(wrow + unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes) +
                  unsigned(run % kRunsPerBlock) * unsigned(F::block_bytes / kRunsPerBlock));
}

// The x rows of a thread's 4 tokens xt + 16 i of a tile: the token itself, or (x_rows: the grouped
// experts' sorted rows) the source token x_rows gives it; -1 past M or for a padding row.
__device__ __forceinline__ void x_sources(int (&src)[4], const int* x_rows, const KcapMatmulParams& p, int token_base,
                                          int xt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int token = token_base + xt + 16 * i;
        src[i] = token < p.m ? (x_rows ? x_rows[token] : token) : -1;
    }
}

// Activations of one step: thread (token xt + 16 i, i < 4, reading x row src[i]; float4 column
// xc) of the tile's 64 tokens x 64 values; zeros for a row of -1 or past K (K is a multiple of
// 32, so a float4 is all in or all out).
__device__ __forceinline__ void load_x(float4 (&v)[4], const float* x, const KcapMatmulParams& p, const int (&src)[4],
                                       int xc, int k0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (src[i] >= 0 && k0 + 4 * xc < p.k)
            v[i] = *reinterpret_cast<const float4*>(x + kcap_u64(src[i]) * p.k + k0 + 4 * xc);
    }
}

// The bytes of the block holding run `run` of weight row dr (its first byte in global memory:
// wrow): the shared copy of chunk `chunk` (STAGED), or global memory.
template <class F, bool STAGED>
__device__ __forceinline__ const kcap_u8* run_block(const unsigned* raw, const kcap_u8* wrow, int dr, int run, int chunk) {
    using R = RawChunk<F>;
    constexpr int kRunsPerBlock = F::block_elems / 32;
    if (!STAGED) return wrow + unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes);
    return reinterpret_cast<const kcap_u8*>(raw + (chunk & 1) * R::buffer_words + dr * R::stride) + raw_lead<F>(wrow, chunk) +
           unsigned(run % R::runs / kRunsPerBlock) * unsigned(F::block_bytes);
}

// A thread's run of weights read one step ahead into registers, for the tiles that decode
// straight from global memory (not staged): the aligned words that hold the run's block, loaded
// an iteration before the decode that uses them, so their latency passes under a step of
// products instead of stalling the decode (staging these formats' blocks through shared memory
// was slower: bench/results/cuda_h200_run_ahead.txt). kWords 0: the format reads its block
// in its decode (KcapCodes::codes8). Where given, decode() is codes8 on the words that
// run_ahead_load loads (kOffsetMask: the address bits a block's start may have past 4-alignment).
template <class F>
struct RunAhead {
    static constexpr int kWords = 0;
};
// MXFP4 (17-byte blocks at any alignment): the 5 words that hold [p, p + 17) (the CUDA backend
// pads each weight allocation to 16 bytes, so they lie inside it), the scale byte and the 16
// code bytes rebuilt by funnel shifts, as kcap_load_u8_u32s_a1 does.
template <>
struct RunAhead<KcapMXFP4> {
    static constexpr int kWords = 5;
    static constexpr kcap_u32 kOffsetMask = 3u;  // any alignment
    static __device__ __forceinline__ void decode(const kcap_u32 (&w)[kWords], kcap_u32 off, kcap_u32 (&u)[8],
                                                  float (&scale)[2]) {
        const kcap_u32 e = (w[0] >> (8u * off)) & 0xffu;
        scale[0] = scale[1] = kcap_mxfp4_scale(e);
        const kcap_u32 shift = 8u * (off + 1u);
        KCAP_UNROLL for (int i = 0; i < 4; ++i) kcap_mxfp4_doubled_bytes(kcap_funnel_r(w[i], w[i + 1], shift), u[i], u[4 + i]);
    }
};
// Blocks of an f16 scale and then whole words of codes at even offsets (Q8_0: 34 bytes, Q4_0:
// 18, Q5_0: 22): the words that hold [p, p + block_bytes) (from p - 2 where p % 4 == 2, else up
// to 2 bytes past the block, inside the padded allocation), the scale and the code words
// rebuilt by funnel shifts, then the format's codes of them (KcapCodes<F>::codes8_of_words).
template <class F>
struct RunAheadHalfScaled {
    static constexpr int kCodeWords = (F::block_bytes - 2) / 4;
    static constexpr int kWords = kCodeWords + 1;
    static constexpr kcap_u32 kOffsetMask = 2u;  // even offsets
    static __device__ __forceinline__ void decode(const kcap_u32 (&w)[kWords], kcap_u32 off, kcap_u32 (&u)[8],
                                                  float (&scale)[2]) {
        scale[0] = scale[1] = kcap_half_to_float(kcap_u16((w[0] >> (8u * off)) & 0xffffu));
        const kcap_u32 shift = 8u * (off + 2u);  // 32 where off == 2: the next word itself
        kcap_u32 words[kCodeWords];
        KCAP_UNROLL for (int i = 0; i < kCodeWords; ++i) words[i] = kcap_funnel_r(w[i], w[i + 1], shift);
        KcapCodes<F>::codes8_of_words(words, u);
    }
};
template <>
struct RunAhead<KcapQ8_0> : RunAheadHalfScaled<KcapQ8_0> {};
template <>
struct RunAhead<KcapQ4_0> : RunAheadHalfScaled<KcapQ4_0> {};
template <>
struct RunAhead<KcapQ5_0> : RunAheadHalfScaled<KcapQ5_0> {};
// The RunAhead<F> words of the block at `at` (zeros where !in) from its 4-aligned start; returns
// at's offset into the first word.
template <class F>
__device__ __forceinline__ kcap_u32 run_ahead_load(const kcap_u8* at, bool in, kcap_u32 (&w)[RunAhead<F>::kWords]) {
    const kcap_u32 off = kcap_address_bits(at) & RunAhead<F>::kOffsetMask;
    KCAP_UNROLL for (int i = 0; i < RunAhead<F>::kWords; ++i) w[i] = in ? kcap_load_u32(at - off + 4 * i) : 0u;
    return off;
}

// An MXFP4 run straight to its bf16 pairs (pair j: elements 2j, 2j + 1, the low one in the low
// half), from RunAhead<KcapMXFP4>'s five words at byte offset off: false (nothing written) where
// the block's scale byte e is outside [2, 248]. Each doubled code c (-12..12, the value times 2)
// is looked up as the byte c + 12 (kcap_mxfp4_doubled_bytes<12>), put under the bf16 high byte
// 0x43 (the bf16 128 + c + 12: its 7 mantissa bits hold 0..127), and fma.rn.bf16x2 takes
// (128 + c + 12) s - 140 s, s = 2^(e - 128) the half scale: exactly c s, the value decode32
// gives, in one rounding of an exact, representable result, so the same bits as rounding
// decode32's f32 to bf16. The range keeps every operand and nonzero result normal (|c s| >=
// 2^(e - 128) >= 2^-126, 140 s < 2^128); the callers take another form for the others (the bf16
// tiles the f32 decode, the split-bf16 tiles codes and scales). 2 instructions a pair after the
// lookups, where the f32 decode, its product and the rounding take about 7. Both the bf16 tiles
// (matmul_gemm.cu) and the split-bf16 ones (matmul_mma.cu) multiply these values.
__device__ __forceinline__ bool mxfp4_bf16_pairs(const kcap_u32 (&w)[RunAhead<KcapMXFP4>::kWords], kcap_u32 off,
                                                 unsigned (&pairs)[16]) {
    const kcap_u32 e = (w[0] >> (8u * off)) & 0xffu;
    if (e < 2u || e > 248u) return false;
    const kcap_u32 scale = (e - 1u) << 7, minus = 0x8000u | ((e + 6u) << 7) | 0x0Cu;  // 2^(e-128), -140 x it
    const kcap_u32 scale2 = scale | (scale << 16), minus2 = minus | (minus << 16);
    const kcap_u32 shift = 8u * (off + 1u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        // c + 12 of code bytes 4i..4i+3: elements 4i..4i+3 (lo), 16 + 4i.. (hi).
        kcap_u32 lo, hi;
        kcap_mxfp4_doubled_bytes<12>(kcap_funnel_r(w[i], w[i + 1], shift), lo, hi);
        const kcap_u32 biased[4] = {kcap_byte_perm(lo, 0x43434343u, 0x4140u), kcap_byte_perm(lo, 0x43434343u, 0x4342u),
                                    kcap_byte_perm(hi, 0x43434343u, 0x4140u), kcap_byte_perm(hi, 0x43434343u, 0x4342u)};
        unsigned out[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
            asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(out[j]) : "r"(biased[j]), "r"(scale2), "r"(minus2));
        pairs[2 * i] = out[0], pairs[2 * i + 1] = out[1], pairs[8 + 2 * i] = out[2], pairs[8 + 2 * i + 1] = out[3];
    }
    return true;
}

// A warp's outputs (C fragments: [mt][nt][0], [1] at token g, rows 2tg, 2tg + 1; [2], [3] at
// token g + 8) from its first token and row, plus the bias, where token < m and row < n (and,
// given live_rows, where live_rows[token] >= 0: the grouped tiles' padding rows are left unwritten).
// ADD: added into y (atomically: a split-K launch's two partial sums into the y its launcher
// zeroed, split_k_zero), the bias by the groups given one (the first half's).
template <int MT, bool ADD = false>
__device__ __forceinline__ void store_tile(const float (&acc)[MT][kNt][4], const KcapMatmulParams& p, int token0,
                                           int row0, int lane, const float* bias, float* y,
                                           const int* live_rows = nullptr) {
    const int g = lane >> 2, tg = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int token = token0 + 16 * mt + g + 8 * h;
            if (token >= p.m || (live_rows && live_rows[token] < 0)) continue;
#pragma unroll
            for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
                for (int e = 2 * h; e < 2 * h + 2; ++e) {
                    const int row = row0 + 8 * nt + 2 * tg + (e & 1);
                    if (row >= p.n) continue;
                    const float v = p.has_bias && (!ADD || bias) ? acc[mt][nt][e] + bias[row] : acc[mt][nt][e];
                    if constexpr (ADD) atomicAdd(&y[kcap_u64(token) * p.n + row], v);
                    else y[kcap_u64(token) * p.n + row] = v;
                }
        }
}

// Up to three matrices of one format on the same x (qkv's, gate_up's) in one launch: the grid's
// row tiles run through the matrices in turn, so a small matrix (K, V: 8 row tiles of 128 rows
// against 132 multiprocessors) shares its wave with the others, and a grid's last, partial wave
// comes once per stage instead of once per matrix.
//   Grouped experts (cuda/moe.cu): tile_expert set, each token tile (grid y) is one expert's
// rows of a sorted batch: its weights start expert_bytes * tile_expert[tile] into each member's
// w (a tile of -1 is unused and ends at once), a member's bias (where it has one) is that
// expert's row of n values of a [n_expert][n] bias, and its x rows are x_rows[token] (-1: a
// padding row, zeros). live_rows (the sorted rows' source tokens, -1 for padding) lets a warp skip the
// products of 16-token tiles of padding. The outputs stay in sorted order.
// x split ahead for the grouped experts' split-bf16 tiles (exact plans), rows of k values: hi =
// bf16(x) and lo = bf16(x - hi) (bf16 bits, [row][k]), and sum16, the f32 sum of hi + lo over
// each 16 values ([row][k / 16]) in the order the tiles' own staging adds them (4 values in
// turn, then pairs of 4s, then of 8s): what a tile computed from f32 x, bit for bit, done once
// instead of in every row tile that reads the row. Its size: cuda_rows::split_rows_values.
struct SplitRows {
    kcap_u16* hi;
    kcap_u16* lo;
    float* sum16;
};
inline SplitRows split_rows_layout(kcap_u16* base, int64_t rows, int64_t k) {
    SplitRows s;
    s.hi = base;
    s.lo = base + rows * k;
    s.sum16 = reinterpret_cast<float*>(base + 2 * rows * k);
    return s;
}

// The split of 4 values: hi = bf16(v) and lo = bf16(v - hi) as bf16 pairs (the even value in
// the low half), and the f32 sum of hi + lo of the 4 in turn. Every split-bf16 tile's x goes
// through it, in the tile or ahead (split_store_quad), so both give the same bits.
__device__ __forceinline__ void split_quad(const float (&v)[4], uint2& hi, uint2& lo, float& sum) {
    float h[4], l[4];
    sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        h[j] = __bfloat162float(__float2bfloat16_rn(v[j]));
        l[j] = __bfloat162float(__float2bfloat16_rn(v[j] - h[j]));  // v - hi is exact in f32
        sum += h[j] + l[j];
    }
    const auto pair = [](float a, float b) {
        const __nv_bfloat162 p = __floats2bfloat162_rn(a, b);  // exact: both are bf16 values
        return *reinterpret_cast<const unsigned*>(&p);
    };
    hi = make_uint2(pair(h[0], h[1]), pair(h[2], h[3]));
    lo = make_uint2(pair(l[0], l[1]), pair(l[2], l[3]));
}

// Every lane of a warp: its 4 values v, quad q of the rows' flat order (values 4q .. 4q + 3;
// `in`: whether it has them), split into out. Four lanes in a row hold a 16-value run (lane
// order = quad order, k a multiple of 16), whose sum (pairs of lanes, then pairs of pairs, as
// the tiles add them) the first of them writes.
__device__ __forceinline__ void split_store_quad(const float (&v)[4], kcap_u64 q, bool in, const SplitRows& out) {
    uint2 hi, lo;
    float sum;
    split_quad(v, hi, lo, sum);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (!in) return;
    *reinterpret_cast<uint2*>(out.hi + 4 * q) = hi;
    *reinterpret_cast<uint2*>(out.lo + 4 * q) = lo;
    if ((q & 3) == 0) out.sum16[q / 4] = sum;
}

struct MmaGroup {
    KcapMatmulParams p[3];  // the same k, m and row_bytes (mma_group_add); n and has_bias their own
    const kcap_u8* w[3];
    const float* bias[3];
    float* y[3];
    int tiles_end[3];  // grid x: matrix i's row tiles end here (INT_MAX past the last matrix)
    int count;
    const int* tile_expert;  // grouped experts: the expert of each token tile, -1 unused; else null
    const int* x_rows;       // the x row of each token (-1: zeros); null: the token's own
    const int* live_rows;    // grouped: -1 marks a padding row (its products skipped); null: none
    kcap_u64 expert_bytes;   // bytes of one expert's rows in each member
    SplitRows x_split;       // the split-bf16 grouped tiles: x split ahead (their x is null)
};

inline MmaGroup mma_group(const KcapMatmulParams& p, const kcap_u8* w, const float* bias, float* y) {
    MmaGroup g{};
    g.tiles_end[0] = g.tiles_end[1] = g.tiles_end[2] = INT_MAX;
    g.p[0] = p, g.w[0] = w, g.bias[0] = bias, g.y[0] = y;
    g.tiles_end[0] = int(ceil_div(p.n, kMmaRows));
    g.count = 1;
    return g;
}

// The kernel is one format's: the callers add only matrices of the first one's format (equal k
// and row bytes follow; checked here).
inline void mma_group_add(MmaGroup& g, const KcapMatmulParams& p, const kcap_u8* w, const float* bias, float* y) {
    if (g.count >= 3 || p.k != g.p[0].k || p.m != g.p[0].m || p.row_bytes != g.p[0].row_bytes)
        throw Error("mma_group_add: at most three matrices of one format, k, m and row bytes");
    const int i = g.count++;
    g.p[i] = p, g.w[i] = w, g.bias[i] = bias, g.y[i] = y;
    g.tiles_end[i] = g.tiles_end[i - 1] + int(ceil_div(p.n, kMmaRows));
}

// The grid: every matrix's row tiles along x, token tiles of `tokens` along y.
inline dim3 mma_group_grid(const MmaGroup& g, int tokens = kMmaTokens) {
    return dim3(unsigned(g.tiles_end[g.count - 1]), unsigned(ceil_div(g.p[0].m, tokens)));
}

// In the kernel: which matrix this group's row tile belongs to, and the tile's index in it. The
// members are read with constant indices only, so the parameters stay in the constant bank.
// bx: the group's row tile in the grid (blockIdx.x, or less the tiles of a launch's first
// group: matmul_q8.cu's two-format launch).
__device__ __forceinline__ int mma_group_member(const MmaGroup& g, int bx = int(blockIdx.x)) {
    return bx >= g.tiles_end[1] ? 2 : bx >= g.tiles_end[0] ? 1 : 0;
}
__device__ __forceinline__ int mma_group_tile(const MmaGroup& g, int which, int bx = int(blockIdx.x)) {
    return bx - (which == 0 ? 0 : which == 1 ? g.tiles_end[0] : g.tiles_end[1]);
}
template <class T>
__device__ __forceinline__ T mma_group_pick(const T (&v)[3], int which) {
    return which == 0 ? v[0] : which == 1 ? v[1] : v[2];
}

// Split K (the int8 tiles, matmul_q8.cu): a plain launch whose row tiles would fill less than
// two waves of the device at kSplitKRefTokens tokens, on K of at least kSplitKMinChunks chunks,
// runs each tile as two groups over the two halves of K's chunks (grid z), which add their
// partial sums into the outputs, zeroed first (cudaMemsetAsync). Two addends onto zero give the
// same bits in either order, so the result does not depend on which group adds first; it
// depends on the stage's shape and the device only, never on the call's token count. Qwen3's
// qkv (40 row tiles, 320 groups at 512 tokens: 1.21 waves of 2 x 132) and output projection
// (16 row tiles: 0.48 waves, one group per multiprocessor) were the short grids. Measured on an
// H100 (pp512 q8_1, 12-layer slices, bench/results/cuda_h100_split_k.txt): Qwen3-30B-A3B 46,692
// -> 49,879 tok/s (with the K-quant tiles staged from K 2048: 52,156), Gemma 3 270M 97,407 ->
// 117,964, gpt-oss-20b 26,785 -> 27,209, Llama-3-8B (8 layers) 33,137 -> 33,386.
constexpr int kSplitKRefTokens = 512;
constexpr int kSplitKMinChunks = 8;

inline void split_k_zero_outputs(const Context& ctx, const MmaGroup& g) {
    for (int i = 0; i < g.count; ++i)
        KCAP_CUDA_CHECK(cudaMemsetAsync(g.y[i], 0, size_t(g.p[i].m) * size_t(g.p[i].n) * sizeof(float), ctx.stream));
}

// The split (1 or 2) of a launch of g (with row_tiles row tiles in all, groups_per_sm of its
// groups per multiprocessor, chunks of chunk_k values); where 2, g's outputs are zeroed.
inline int split_k_zero(const Context& ctx, const MmaGroup& g, int row_tiles, int groups_per_sm, int tokens,
                        int chunk_k) {
    const int64_t groups = int64_t(row_tiles) * (kSplitKRefTokens / tokens);
    if (g.tile_expert || groups >= 2LL * groups_per_sm * ctx.sm_count || g.p[0].k / chunk_k < kSplitKMinChunks) return 1;
    split_k_zero_outputs(ctx, g);
    return 2;
}

// qkv's matrices (a batch's QkvParams: three, or a latent attention's pair) grouped by format,
// in order of first appearance: one group for Q, K and V of one format, two or three for a mix.
struct MmaFormatGroups {
    Format format[3];
    MmaGroup group[3];
    int count = 0;
};
inline MmaFormatGroups mma_groups_by_format(const QkvParams& q) {
    MmaFormatGroups out;
    for (int which = 0; which < q.count; ++which) {
        const QkvSegment& s = q.segment[which];
        int i = 0;
        while (i < out.count && out.format[i] != Format(s.format)) ++i;
        if (i == out.count) {
            out.format[out.count++] = Format(s.format);
            out.group[i] = mma_group(s.p, s.w, s.bias, s.y);
        } else {
            mma_group_add(out.group[i], s.p, s.w, s.bias, s.y);
        }
    }
    return out;
}

// The bf16 tiles (matmul_mma.cu) of a group of matrices of one tile format (mma_format, K a
// multiple of 32) on f32 activations x, p.m >= kMmaMinTokens.
void mma_group_bf16(const Context& ctx, Format format, const MmaGroup& g, const float* x);
// x of rows x k values (k a multiple of 32) split into out (SplitRows), for the grouped
// split-bf16 tiles.
void split_bf16(const Context& ctx, const float* x, int64_t rows, int64_t k, const SplitRows& out);
// The grouped experts' tiles of a bf16 plan (matmul_gemm.cu): bf16(W) . x with f32 sums, W of
// one tile format decoded and rounded to bf16 inside the tiles, x in bf16 ([row][k], the sorted
// rows' sources through x_rows).
void mma_group_bf16_rounded(const Context& ctx, Format format, const MmaGroup& g, const kcap_u16* x);
// out = bf16(x) (round to nearest even) of count values, a multiple of 8.
void convert_bf16(const Context& ctx, const float* x, long long count, kcap_u16* out);
// The int8 tiles (matmul_q8.cu, 64 tokens per group) of a group of matrices of one q8_1 format
// on q8_1 activations x (a grouped experts' x: the rows of the source tokens x_rows names).
void mma_group_q8(const Context& ctx, Format format, const MmaGroup& g, const Q8Rows& x);

// Staged weights for long rows only: on the H200 (bench/cuda_sweep.py --pp, pp512, with one
// kernel forced for every matmul) staging all matmuls took the 8B Q4_K_M file (K 4096 and 14336)
// from 4586 to 5293 tok/s, while Gemma 3 270M (K 640 and 2048: a chunk or two per row, small
// grids) went from 78186 to 72110: at short K the copies cannot get ahead of the decode. A fixed
// function of the stage's K and the device (its threadgroup memory), the same for every call.
constexpr int64_t kStagedMinK = 4096;
// The grouped experts' tiles (cuda/moe.cu: an expert's weights per tile of its sorted rows) of
// formats whose chunks span several steps (the K-quants' 256-value super-blocks: the next
// chunk's copies have four steps to land) stage at every K; those of one-step chunks (32-value
// blocks: MXFP4, Q8_0, ...) from kStagedMinK, as the dense tiles. Measured on the H200
// (bench/results/cuda_h200_moe_tiles_staging.txt, pp512 of 12-layer slices, staged at every K
// against from 4096): Qwen3-30B-A3B (Q4_K gate / up at K 2048, Q6_K down at 768) 30,818 ->
// 32,312 tok/s exact, 42,367 -> 47,874 q8_1, 56,250 -> 60,365 bf16; gpt-oss-20b (MXFP4 at 2880)
// 15,589 -> 14,069, 23,895 -> 21,665, 27,239 -> 22,545.
constexpr int64_t kMoeStagedMinK = 0;
// The plain tiles of those formats (256-value chunks) stage from K 2048 (not kStagedMinK): the
// next chunk's copies have four steps to land there too. Measured on an H100 (pp512, 12-layer
// slices, q8_1; bench/results/cuda_h100_split_k.txt): Qwen3-30B-A3B's Q4_K / Q6_K qkv at K 2048
// 46,692 -> 49,155 tok/s, Gemma 3 270M's Q4_K / Q6_K down at K 2048 97,407 -> 102,973; the
// split-bf16 tiles (exact mode) within the spread (34,046 -> 34,257 and 98,547 -> 98,816). Not
// the 32-value formats: gpt-oss-20b's Q8_0 q, k and v staged at K 2880 lost 4%.
constexpr int64_t kStagedMinKLongChunks = 2048;

inline bool use_staged(const Context& ctx, const KcapMatmulParams& p, size_t shared_bytes, int64_t min_k = kStagedMinK) {
    return shared_bytes <= size_t(shared_optin_bytes(ctx.device)) && p.k >= min_k;
}

// The K from which a launch of format F's tiles stages its weights (grouped: the grouped
// experts' tiles). The plain tiles of the formats that read their next run a step ahead
// (RunAhead: MXFP4, Q8_0, Q4_0, Q5_0) do not stage at any K: staging their 18- to 34-byte
// blocks takes 4-byte copies of unaligned words and a decode from shared memory, which cost
// more than the read-ahead's loads wait, on long rows too
// (bench/results/cuda_h100_run_ahead_unstaged.txt). The other 32-value formats stage from
// kStagedMinK.
constexpr int64_t kNeverStaged = INT64_MAX;
template <class F>
constexpr int64_t staged_min_k(bool grouped) {
    if (!grouped && RunAhead<F>::kWords > 0) return kNeverStaged;
    return RawChunk<F>::k > kStepK ? (grouped ? kMoeStagedMinK : kStagedMinKLongChunks) : kStagedMinK;
}
// Runs launch(group, staged) once for all the matrices of g (of format F); staged as use_staged
// decides for a kernel of staged_shared_bytes (the members share k, so one answer serves all).
template <class F, class Launch>
void launch_mma_group(const Context& ctx, const MmaGroup& g, size_t staged_shared_bytes, Launch&& launch) {
    launch(g, use_staged(ctx, g.p[0], staged_shared_bytes, staged_min_k<F>(g.tile_expert != nullptr)));
}

// Dynamic shared memory (the bf16 kernel's raw double buffer, with its static tiles over 48 KB
// for most formats; all of the int8 kernel's, staged or not): allow it once per device and
// kernel, and ask for the largest shared carveout so two groups fit a multiprocessor (the
// carveout is a hint; the default may pick less).
template <auto KERNEL>
void allow_dynamic_shared(const Context& ctx, size_t bytes) {
    static std::atomic<unsigned long long> configured{0};  // bit d: done on device d
    const unsigned long long bit = ctx.device < 64 ? 1ull << ctx.device : 0ull;
    if (bit && (configured.load(std::memory_order_relaxed) & bit)) return;
    KCAP_CUDA_CHECK(cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    KCAP_CUDA_CHECK(cudaFuncSetAttribute(KERNEL, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         int(cudaSharedmemCarveoutMaxShared)));
    configured.fetch_or(bit, std::memory_order_relaxed);
}

}  // namespace mma_tiles
}  // namespace cuda
}  // namespace kcap
