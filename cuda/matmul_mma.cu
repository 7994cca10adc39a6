// CUDA-only matmul rows on the tensor cores (cuda.matmul_mma.<format>), the preferred rows:
// one token runs the exact decode matvec and up to kMmaMinTokens tokens the exact few-token
// walk (both in matmul.cu); a prefill chunk runs tiles of kMmaTokens tokens x kMmaRows weight
// rows on bf16 mma.sync (m16n8k16, f32 accumulation), scale-factored and with split activations:
//
//   weights   every format here is w_k = scale_s * q_k + offset_s over sub-blocks s of 16 or 32
//             elements, q_k a small integer, exact in bf16 (kernels/quant_codes.h, checked
//             against decode32 on the host). Each K step of kStepK = 64, every thread decodes
//             one 32-element run of one weight row: its codes go to shared memory as bf16
//             pairs, its (scale, offset) pairs to per-(sub-block, row) f32 arrays.
//   x         split as x_hi = bf16(x), x_lo = bf16(x - x_hi), both staged as bf16 pairs; for
//             formats with offsets the per-(sub-block, token) sum of x_hi + x_lo (f32) beside them.
//   products  per sub-block, T = sum_k x_lo q + sum_k x_hi q on the tensor cores (products of
//             bf16 values are exact; f32 accumulation), then per output
//             acc += scale * T (+ offset * xsum) in f32 FMAs.
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
// tensor-core path for F32/F16 would split the weights too (2-3x the mma work). Their
// launchers below exist for the declarations in cuda/rows.h and only forward to the exact rows.
//
// Tile: kMmaTokens = 64 tokens x kMmaRows = 128 rows, 8 warps in a 2 (tokens) x 4 (rows) grid,
// each warp 32 tokens x 32 rows = 2 x 4 mma tiles of 16 x 8. Shared rows are kStride = 36
// words (36 = 4 mod 32), so the 8 rows one ldmatrix phase (or one plain 32-bit fragment
// load) reads fall in distinct banks. Grid: x = row tiles, y = token tiles.
// Build with -DKCAP_MMA_LDMATRIX=0 to load the fragments with plain 32-bit shared loads
// instead of ldmatrix (the same layouts spelled out lane by lane; for diagnosis).
#include <cuda_bf16.h>

#include "cuda/matmul.h"
#include "kernels/matmul.h"
#include "kernels/quant_codes.h"

#ifndef KCAP_MMA_LDMATRIX
#define KCAP_MMA_LDMATRIX 1
#endif

namespace kcap {
namespace cuda {
namespace {

using namespace cuda_rows;

constexpr int kStepK = 64;                 // K elements staged per step: two 32-element runs per row
constexpr int kStride = kStepK / 2 + 4;    // words (bf16 pairs) per shared row, padded
constexpr int kSubs16 = kStepK / 16;       // 16-element sub-blocks per step
constexpr int kWarpsRows = 4;              // warp grid: 2 (tokens) x 4 (rows)
constexpr int kWarpTokens = 32, kWarpRows = 32;
constexpr int kMt = kWarpTokens / 16, kNt = kWarpRows / 8;  // mma tiles per warp
static_assert(kMmaThreads == 256 && kMmaTokens == 64 && kMmaRows == 128, "the warp layout below assumes these");
static_assert(kMmaThreads == 2 * kMmaRows, "weights: each thread decodes one run of one row per step");
static_assert(kMmaThreads == 4 * kMmaTokens, "activations: each thread stages 16 values of one token per step");
static_assert(kStride % 32 == 4 && kStride % 4 == 0, "conflict-free fragment loads, 16-byte aligned rows");

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

__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// Registers only (no memory, no side effects): not volatile, so the compiler may schedule it.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const unsigned* p) {
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address)
                 : "memory");
}

// A fragment (16 tokens x 16 k) of m16n8k16 from rows [token][k / 2] starting at `tile`
// (token 0, word kw): a0 (token g, k 2tg..2tg+1), a1 (g + 8, same k), a2 (g, k + 8), a3 (g + 8, k + 8).
__device__ __forceinline__ void load_a(unsigned (&a)[4], const unsigned* tile, int lane) {
#if KCAP_MMA_LDMATRIX
    // Lane l addresses row l % 16, k 8 * (l / 16) of the tile: matrices 0..3 = a0..a3.
    ldmatrix_x4(a, tile + (lane & 15) * kStride + 4 * (lane >> 4));
#else
    const unsigned* p = tile + (lane >> 2) * kStride + (lane & 3);
    a[0] = p[0];
    a[1] = p[8 * kStride];
    a[2] = p[4];
    a[3] = p[8 * kStride + 4];
#endif
}

// B fragments of two neighbouring n8 tiles (rows 0..7 and 8..15 from `tile`, [row][k / 2]):
// b[0], b[1] of the first (row g, k 2tg..2tg+1 and k + 8), b[2], b[3] of the second.
__device__ __forceinline__ void load_b2(unsigned (&b)[4], const unsigned* tile, int lane) {
#if KCAP_MMA_LDMATRIX
    // Lane l addresses row l % 8 + 8 * (l / 16), k 8 * ((l / 8) % 2): matrices = b[0..3].
    ldmatrix_x4(b, tile + ((lane & 7) + 8 * (lane >> 4)) * kStride + 4 * ((lane >> 3) & 1));
#else
    const unsigned* p = tile + (lane >> 2) * kStride + (lane & 3);
    b[0] = p[0];
    b[1] = p[4];
    b[2] = p[8 * kStride];
    b[3] = p[8 * kStride + 4];
#endif
}

template <class F>
__global__ void __launch_bounds__(kMmaThreads, 2)
    mma_kernel(KcapMatmulParams p, const kcap_u8* w, const float* x, const float* bias, float* y) {
    using C = KcapCodes<F>;
    constexpr int kSub = C::sub;                 // elements per sub-block: 16 or 32
    constexpr int kSubs = kStepK / kSub;         // sub-blocks per step
    constexpr int kRunsPerBlock = F::block_elems / 32;
    static_assert(kSub == 16 || kSub == 32, "sub-blocks of 16 or 32 elements");
    __shared__ Shared sh;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tg = lane & 3;
    const int row_base = blockIdx.x * kMmaRows, token_base = blockIdx.y * kMmaTokens;
    const int warp_tokens = kWarpTokens * (warp / kWarpsRows), warp_rows = kWarpRows * (warp % kWarpsRows);
    // Staging roles: weight row dr, run dhalf of each step; token xt, values 16 xq .. 16 xq + 15.
    const int dr = tid >> 1, dhalf = tid & 1;
    const int xt = tid >> 2, xq = tid & 3;
    const bool row_valid = row_base + dr < p.n, token_valid = token_base + xt < p.m;
    const kcap_u8* wrow = w + kcap_u64(row_valid ? row_base + dr : 0) * p.row_bytes;
    const float* xrow = x + kcap_u64(token_valid ? token_base + xt : 0) * p.k + 16 * xq;
    pdl_wait();
    pdl_trigger();
    float acc[kMt][kNt][4] = {};
    const int runs = p.k / 32;
    for (int k0 = 0; k0 < p.k; k0 += kStepK) {
        // Weights: codes as bf16 pairs, (scale, offset) per sub-block; zeros past N or K.
        {
            const int run = k0 / 32 + dhalf;
            float q[32], sc[2] = {0.0f, 0.0f}, off[2] = {0.0f, 0.0f};
            if (row_valid && run < runs) {
                C::codes32(wrow + unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes), run % kRunsPerBlock, q, sc, off);
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
        }
        // Activations: 16 values of one token, split into bf16 hi and lo; zeros past M or K.
        {
            float v[16];
            if (token_valid && k0 + 16 * xq < p.k) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float4 f = *reinterpret_cast<const float4*>(xrow + k0 + 4 * i);
                    v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
                }
            } else {
#pragma unroll
                for (int i = 0; i < 16; ++i) v[i] = 0.0f;
            }
            float hi[16], lo[16], sum = 0.0f;
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                hi[i] = bf16_round(v[i]);
                lo[i] = bf16_round(v[i] - hi[i]);  // v - hi is exact in f32
                if (C::has_offset) sum += hi[i] + lo[i];
            }
            uint4* dhi = reinterpret_cast<uint4*>(sh.xhi + xt * kStride + 8 * xq);
            uint4* dlo = reinterpret_cast<uint4*>(sh.xlo + xt * kStride + 8 * xq);
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                dhi[u] = make_uint4(pack_bf16(hi[8 * u], hi[8 * u + 1]), pack_bf16(hi[8 * u + 2], hi[8 * u + 3]),
                                    pack_bf16(hi[8 * u + 4], hi[8 * u + 5]), pack_bf16(hi[8 * u + 6], hi[8 * u + 7]));
                dlo[u] = make_uint4(pack_bf16(lo[8 * u], lo[8 * u + 1]), pack_bf16(lo[8 * u + 2], lo[8 * u + 3]),
                                    pack_bf16(lo[8 * u + 4], lo[8 * u + 5]), pack_bf16(lo[8 * u + 6], lo[8 * u + 7]));
            }
            if (C::has_offset) {
                if (kSub == 16) {
                    sh.xsum[xq][xt] = sum;
                } else {
                    sum += __shfl_xor_sync(0xffffffffu, sum, 1);  // the token's other 16 of the sub-block
                    if ((xq & 1) == 0) sh.xsum[xq >> 1][xt] = sum;
                }
            }
        }
        __syncthreads();
#pragma unroll 1
        for (int s = 0; s < kSubs; ++s) {
            float t[kMt][kNt][4] = {};
#pragma unroll
            for (int u = 0; u < kSub / 16; ++u) {
                const int kw = (s * kSub + 16 * u) / 2;  // word of the k16 step in a shared row
                unsigned ahi[kMt][4], alo[kMt][4], b[kNt / 2][4];
#pragma unroll
                for (int mt = 0; mt < kMt; ++mt) {
                    load_a(ahi[mt], sh.xhi + (warp_tokens + 16 * mt) * kStride + kw, lane);
                    load_a(alo[mt], sh.xlo + (warp_tokens + 16 * mt) * kStride + kw, lane);
                }
#pragma unroll
                for (int np = 0; np < kNt / 2; ++np) load_b2(b[np], sh.w + (warp_rows + 16 * np) * kStride + kw, lane);
#pragma unroll
                for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
                    for (int nt = 0; nt < kNt; ++nt) {
                        const unsigned b0 = b[nt >> 1][2 * (nt & 1)], b1 = b[nt >> 1][2 * (nt & 1) + 1];
                        mma_bf16(t[mt][nt], alo[mt], b0, b1);  // the small part first
                        mma_bf16(t[mt][nt], ahi[mt], b0, b1);
                    }
            }
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
        __syncthreads();
    }
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int token = token_base + warp_tokens + 16 * mt + g + 8 * (e >> 1);
                const int row = row_base + warp_rows + 8 * nt + 2 * tg + (e & 1);
                if (token < p.m && row < p.n)
                    y[kcap_u64(token) * p.n + row] = p.has_bias ? acc[mt][nt][e] + bias[row] : acc[mt][nt][e];
            }
}

}  // namespace

template <class F>
void run_matmul_mma(const Stage& stage, const KernelCall& call, void (*exact)(const Stage&, const KernelCall&)) {
    // Decode and short batches: the exact kernels (tensor-core tiles would be mostly padding).
    // Unfactorable formats (F32, F16) have no mma row; their launchers only forward.
    if constexpr (!KcapCodes<F>::factorable) {
        return exact(stage, call);
    } else {
        if (call.n_tokens < kMmaMinTokens) return exact(stage, call);
        const Context& ctx = context(call);
        const StageData& data = stage_data(call);
        const KcapMatmulParams p = matmul_params(stage, call);
        launch(ctx, mma_kernel<F>, dim3(ceil_div(p.n, kMmaRows), ceil_div(p.m, kMmaTokens)), dim3(kMmaThreads), 0, p,
               static_cast<const kcap_u8*>(data.operands[0]), call.in, static_cast<const float*>(data.operands[1]),
               call.out);
    }
}

}  // namespace cuda

#define KCAP_DEFINE_MATMUL_MMA(NAME, DECODER)                                       \
    void kcap_cuda_matmul_mma_##NAME(const Stage& stage, const KernelCall& call) { \
        cuda::run_matmul_mma<DECODER>(stage, call, &kcap_cuda_matmul_##NAME);      \
    }
KCAP_WEIGHT_FORMATS(KCAP_DEFINE_MATMUL_MMA)
#undef KCAP_DEFINE_MATMUL_MMA

}  // namespace kcap
