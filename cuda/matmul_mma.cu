// CUDA-only matmul rows on the tensor cores (cuda.matmul_mma.<format>), the preferred rows:
// one token runs the exact decode matvec and up to kMmaMinTokens tokens the exact few-token
// walk (both in matmul.cu); a prefill chunk runs tiles of kMmaTokens tokens x kMmaRows weight
// rows on TF32 mma.sync. Each 64-element K step, every thread decodes one 32-element run of
// one weight row (kernels/quant.h) into shared memory and the tile's activations are staged
// beside it, both rounded to TF32; products accumulate in f32. TF32 keeps 10 mantissa bits of
// each operand, so these rows are not exact: their parity test states a 3e-3 tolerance.
#include "cuda/matmul.h"
#include "kernels/matmul.h"

namespace kcap {
namespace cuda {
namespace {

using namespace cuda_rows;

constexpr int kStepK = 64;             // K elements per shared-memory stage (two runs)
constexpr int kPad = 4;                // row padding (floats): fragment loads hit 32 distinct banks
constexpr int kStride = kStepK + kPad;
static_assert(kMmaThreads == 128 && kMmaTokens == 64 && kMmaRows == 64, "the warp layout below assumes these");

__device__ __forceinline__ unsigned to_tf32(float x) {
    unsigned bits;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(x));
    return bits;
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Grid: x = ceil(n / kMmaRows), y = ceil(m / kMmaTokens). Warp w computes tokens
// 32 * (w / 2) .. +32 and rows 32 * (w % 2) .. +32 of the tile: 2 x 4 mma tiles of 16 x 8.
template <class F>
__global__ void __launch_bounds__(kMmaThreads)
    mma_kernel(KcapMatmulParams p, const kcap_u8* w, const float* x, const float* bias, float* y) {
    constexpr int kRunsPerBlock = F::block_elems / 32;
    __shared__ unsigned xs[kMmaTokens * kStride];  // [token][k] as TF32 bits
    __shared__ unsigned ws[kMmaRows * kStride];    // [row][k]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tg = lane & 3;
    const int row_base = blockIdx.x * kMmaRows, token_base = blockIdx.y * kMmaTokens;
    const int warp_tokens = 32 * (warp >> 1), warp_rows = 32 * (warp & 1);
    pdl_wait();
    pdl_trigger();
    float acc[2][4][4] = {};
    const int runs = p.k / 32;
    for (int k0 = 0; k0 < p.k; k0 += kStepK) {
        // Weights: thread tid decodes run (k0 / 32 + tid % 2) of row tid / 2.
        {
            const int r = tid >> 1, half = tid & 1;
            const int run = k0 / 32 + half;
            const int row = row_base + r;
            float v[32];
            if (row < p.n && run < runs) {
                F::decode32(w + kcap_u64(row) * p.row_bytes + unsigned(run / kRunsPerBlock) * unsigned(F::block_bytes),
                            run % kRunsPerBlock, v);
            } else {
#pragma unroll
                for (int i = 0; i < 32; ++i) v[i] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 32; ++i) ws[r * kStride + 32 * half + i] = to_tf32(v[i]);
        }
        // Activations: 64 tokens x 64 floats, 32 per thread as float4s along K.
        {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int index = tid + kMmaThreads * i;  // 0 .. 1023 float4s
                const int token = index >> 4, col = (index & 15) * 4;
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (token_base + token < p.m && k0 + col < p.k)
                    v = *reinterpret_cast<const float4*>(x + kcap_u64(token_base + token) * p.k + k0 + col);
                unsigned* dst = xs + token * kStride + col;
                dst[0] = to_tf32(v.x), dst[1] = to_tf32(v.y), dst[2] = to_tf32(v.z), dst[3] = to_tf32(v.w);
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kStepK; kk += 8) {
            unsigned a[2][4], b[4][2];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                const unsigned* base = xs + (warp_tokens + 16 * mt + g) * kStride + kk + tg;
                a[mt][0] = base[0];
                a[mt][1] = base[8 * kStride];
                a[mt][2] = base[4];
                a[mt][3] = base[8 * kStride + 4];
            }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const unsigned* base = ws + (warp_rows + 8 * nt + g) * kStride + kk + tg;
                b[nt][0] = base[0];
                b[nt][1] = base[4];
            }
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) mma_tf32(acc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[nt][0], b[nt][1]);
        }
        __syncthreads();
    }
    // C fragment: c0,c1 at (token g, rows 2tg, 2tg+1); c2,c3 at token g + 8.
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
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
    if (call.n_tokens < kMmaMinTokens) return exact(stage, call);
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    const KcapMatmulParams p = matmul_params(stage, call);
    launch(ctx, mma_kernel<F>, dim3(ceil_div(p.n, kMmaRows), ceil_div(p.m, kMmaTokens)), dim3(kMmaThreads), 0, p,
           static_cast<const kcap_u8*>(data.operands[0]), call.in, static_cast<const float*>(data.operands[1]),
           call.out);
}

}  // namespace cuda

#define KCAP_DEFINE_MATMUL_MMA(NAME, DECODER)                                       \
    void kcap_cuda_matmul_mma_##NAME(const Stage& stage, const KernelCall& call) { \
        cuda::run_matmul_mma<DECODER>(stage, call, &kcap_cuda_matmul_##NAME);      \
    }
KCAP_WEIGHT_FORMATS(KCAP_DEFINE_MATMUL_MMA)
#undef KCAP_DEFINE_MATMUL_MMA

}  // namespace kcap
