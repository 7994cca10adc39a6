// Matmuls of a batch on bf16 activations (rows cuda.matmul_bf16.*, cuda.gate_up_bf16.*,
// cuda.qkv_bf16; opt-in: EngineOptions::activations = "bf16"), CUDA only:
//   1. the weight matrix (or a chunk of its rows) is dequantized from its GGUF blocks into a
//      bf16 scratch: each 32-value run by the format's decoder (kernels/quant.h, the exact values
//      the other rows multiply), then rounded to nearest even;
//   2. the input x (m tokens of k f32 values) is rounded to bf16 the same way, once per stage;
//   3. cuBLAS multiplies them on the tensor cores (cublasGemmEx: bf16 x bf16, f32 compute and
//      output), y = bf16(W) . bf16(x) with f32 sums, written straight into the stage's output.
// The dequantize is compiled without contracting a multiply and an add into an FMA (CMakeLists:
// -fmad=false for this file), so its f32 values are kernels/quant.h's products in formats.h's
// order, rounded as the CPU's dequantize_row rounds them, before the bf16 rounding: bf16(W) here is
// bf16 of gguf's dequantized values bit for bit (test_cuda_rows compares with exactly that).
// The weights stay on the device as their raw blocks (the scratch is one matrix at a time), so
// a prefill pays one dequantize per matrix per chunk of tokens: at 512 tokens of the 8B model's
// gate and up (2 x 14336 x 4096) about 0.3 GB written, against 120 GFLOP of products. The
// int8 tiles (cuda/matmul_q8.cu) decode every weight again for every 64 or 128 tokens inside
// their loops and are bound by those instructions; a GEMM library is not.
//
// Fewer than Context::gemm_min_tokens tokens run the format's exact kernels instead (decode
// and short batches are bound by reading the weights, where the raw blocks are fastest).
//
// cuBLAS is loaded at run time (dlopen), not linked: the package builds and imports without it
// (CI compiles this file on machines with nvcc but no cuBLAS), and only a plan with bf16 rows
// needs it; such a backend refuses to start without it, naming the library it looked for.
#include <cuda_bf16.h>
#include <dlfcn.h>
#include <library_types.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/cuda_context.h"
#include "cuda/matmul.h"
#include "cuda/mma_tiles.h"
#include "kernels/quant.h"
#include "kernels/quant_codes.h"

namespace kcap {
namespace cuda {
namespace {

// --- cuBLAS, loaded at run time ------------------------------------------------------------------
// The few entry points used here, declared as cublas_api.h declares them (C ABI, stable since
// cuBLAS 11: enums are ints, the handle an opaque pointer); the constants are cublas_api.h's.
using CublasHandle = void*;
constexpr int kCublasSuccess = 0;
constexpr int kCublasOpN = 0, kCublasOpT = 1;  // cublasOperation_t
constexpr int kCublasCompute32F = 68;          // cublasComputeType_t CUBLAS_COMPUTE_32F
constexpr int kCublasGemmDefault = -1;         // cublasGemmAlgo_t CUBLAS_GEMM_DEFAULT
// NVIDIA's recommended cuBLAS workspace on Hopper; given up front so no GEMM allocates.
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

struct CublasApi {
    std::string library;  // the file loaded
    int (*create)(CublasHandle*) = nullptr;
    int (*destroy)(CublasHandle) = nullptr;
    int (*set_stream)(CublasHandle, cudaStream_t) = nullptr;
    int (*set_workspace)(CublasHandle, void*, size_t) = nullptr;
    int (*gemm_ex)(CublasHandle, int transa, int transb, int m, int n, int k, const void* alpha, const void* a,
                   cudaDataType a_type, int lda, const void* b, cudaDataType b_type, int ldb, const void* beta, void* c,
                   cudaDataType c_type, int ldc, int compute_type, int algo) = nullptr;
    const char* (*status_string)(int) = nullptr;
};

// The library, loaded once per process: `path` where the engine was given one
// (EngineOptions::cublas_library: kcap.load finds pip's copy), else KCAP_CUBLAS_LIBRARY if set,
// else the sonames of cuBLAS 13 and 12 (the dynamic loader's search path) and the CUDA toolkit's
// lib64. A failed attempt is not remembered: a later engine may name another library.
const CublasApi& cublas(const std::string& path) {
    static std::mutex mutex;
    static CublasApi api;
    std::lock_guard<std::mutex> lock(mutex);
    if (api.gemm_ex) return api;
    std::vector<std::string> names;
    const char* chosen = std::getenv("KCAP_CUBLAS_LIBRARY");
    if (!path.empty()) {
        names = {path};
    } else if (chosen && *chosen) {
        names = {chosen};
    } else {
        names = {"libcublas.so.13", "libcublas.so.12", "libcublas.so", "/usr/local/cuda/lib64/libcublas.so.13",
                 "/usr/local/cuda/lib64/libcublas.so.12", "/usr/local/cuda/lib64/libcublas.so"};
    }
    std::string tried;
    for (const std::string& name : names) {
        void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!library) {
            const char* why = dlerror();
            tried += "\n  " + name + ": " + (why ? why : "not found");
            continue;
        }
        CublasApi found;
        found.library = name;
        std::string missing;
        const auto bind = [&](auto& fn, const char* symbol) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(library, symbol));
            if (!fn) missing += std::string(missing.empty() ? "" : ", ") + symbol;
        };
        bind(found.create, "cublasCreate_v2");
        bind(found.destroy, "cublasDestroy_v2");
        bind(found.set_stream, "cublasSetStream_v2");
        bind(found.set_workspace, "cublasSetWorkspace_v2");
        bind(found.gemm_ex, "cublasGemmEx");
        bind(found.status_string, "cublasGetStatusString");
        if (!missing.empty()) {
            tried += "\n  " + name + ": loaded, but lacks " + missing + " (cuBLAS 11.4 or newer is needed)";
            dlclose(library);
            continue;
        }
        api = found;
        return api;
    }
    throw Error("activations='bf16': the bf16 matmul rows multiply through cuBLAS, which could not be loaded:" + tried +
                "\nInstall cuBLAS (the CUDA toolkit, or pip's nvidia-cublas) and set KCAP_CUBLAS_LIBRARY to its "
                "libcublas.so, or use activations='f32' or 'q8_1'");
}

void check_cublas(const CublasApi& api, int status, const char* what) {
    if (status != kCublasSuccess)
        throw Error(std::string("cuBLAS error in ") + what + ": " + api.status_string(status) + " (" +
                    std::to_string(status) + ")");
}

// --- kernels -------------------------------------------------------------------------------------

// Rounds 32 decoded values to bf16 (nearest even) and stores them as 64 contiguous bytes.
__device__ __forceinline__ void store_bf16_run(const float* v, __nv_bfloat16* out) {
    uint4 words[4];
    auto* pairs = reinterpret_cast<__nv_bfloat162*>(words);
#pragma unroll
    for (int i = 0; i < 16; ++i) pairs[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    auto* dst = reinterpret_cast<uint4*>(out);
#pragma unroll
    for (int i = 0; i < 4; ++i) dst[i] = words[i];
}

// out[r][0..k) = bf16(W[r]) for `rows` weight rows of k values (row_bytes each): one thread per
// 32-value run, consecutive threads on consecutive runs of a row (a warp writes 2 KB in a row).
template <class F>
__global__ void __launch_bounds__(cuda_rows::kGemmThreads)
    dequantize_bf16_kernel(const kcap_u8* w, unsigned row_bytes, int runs_per_row, long long runs, __nv_bfloat16* out) {
    // The scratch may still be read by the GEMM before this launch: wait for it (and anything
    // earlier) to finish before writing.
    pdl_wait();
    const long long run = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (run >= runs) return;
    constexpr int kRunsPerBlock = F::block_elems / 32;
    const long long row = run / runs_per_row;
    const int in_row = int(run - row * runs_per_row);
    float v[32];
    F::decode32(w + (unsigned long long)row * row_bytes + (unsigned long long)(in_row / kRunsPerBlock) * F::block_bytes,
                in_row % kRunsPerBlock, v);
    store_bf16_run(v, out + run * 32);
}

// out = bf16(x), 8 values per thread (count a multiple of 8: k is a multiple of 32).
__global__ void __launch_bounds__(cuda_rows::kGemmThreads)
    convert_bf16_kernel(const float* x, long long count, __nv_bfloat16* out) {
    pdl_wait();
    const long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= count) return;
    const float4 a = *reinterpret_cast<const float4*>(x + i);
    const float4 b = *reinterpret_cast<const float4*>(x + i + 4);
    uint4 word;
    auto* pairs = reinterpret_cast<__nv_bfloat162*>(&word);
    pairs[0] = __floats2bfloat162_rn(a.x, a.y);
    pairs[1] = __floats2bfloat162_rn(a.z, a.w);
    pairs[2] = __floats2bfloat162_rn(b.x, b.y);
    pairs[3] = __floats2bfloat162_rn(b.z, b.w);
    *reinterpret_cast<uint4*>(out + i) = word;
}

// y[t][j] += bias[j] for m tokens of n outputs.
__global__ void __launch_bounds__(cuda_rows::kGemmThreads) add_bias_kernel(float* y, const float* bias, int n, long long count) {
    pdl_wait();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) y[i] += bias[i % n];
}

// ---- grouped experts' tiles on bf16(W) . bf16(x) ------------------------------------------------
using namespace cuda_rows;
using namespace mma_tiles;

// The grouped experts (cuda/moe.cu) of a bf16 plan: an expert's weights cannot be dequantized
// ahead of the products (which experts a chunk's tokens pick is known only on the device, and
// all of them in bf16 would be 1.6 GB a layer of gpt-oss-20b per chunk), so these tiles decode
// them inside their loop, as the split-bf16 tiles do (cuda/matmul_mma.cu: the same tile of 64
// sorted rows x kMmaRows weight rows, warp grid, fragment loads and raw chunk staging,
// cuda/mma_tiles.h). What they multiply is what the bf16 GEMM rows multiply: each weight run
// decoded to f32 by the format's decoder (this file is compiled without FMA contraction, so the
// values are the dequantize's bit for bit) and rounded to bf16 (nearest even), each activation
// rounded to bf16 as it is staged; one bf16 mma per product and f32 sums over the whole of K,
// with no per-sub-block scale or offset after the products and no second (low) activation part.
struct alignas(16) SharedBf16Tile {
    unsigned w[kMmaRows * kStrideBf16];    // bf16(W), [row][k / 2] as bf16 pairs (low half = even k)
    unsigned x[kMmaTokens * kStrideBf16];  // bf16(x), [token][k / 2]
};

__device__ __forceinline__ unsigned bf16_pair(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low 16 bits
    return *reinterpret_cast<const unsigned*>(&v);
}

// load_x of bf16 rows: thread (token xt + 16 i, reading x row src[i]) takes values 4 xc .. 4 xc
// + 3 of the step as one 8-byte word (zeros for a row of -1 or past K).
__device__ __forceinline__ void load_x_bf16(uint2 (&v)[4], const kcap_u16* x, const KcapMatmulParams& p,
                                            const int (&src)[4], int xc, int k0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[i] = make_uint2(0u, 0u);
        if (src[i] >= 0 && k0 + 4 * xc < p.k)
            v[i] = *reinterpret_cast<const uint2*>(x + kcap_u64(src[i]) * p.k + k0 + 4 * xc);
    }
}

// STAGED: the raw chunks through shared memory (the K-quants at every K, staged_min_k); else
// each thread reads its run from global memory, a step ahead where the format has RunAhead
// (MXFP4, Q8_0, Q4_0, Q5_0: their values are code x scale, one product, as decode32 forms them).
// STAGED tiles take two step tiles: step s is written into tile s & 1 while the products of step
// s - 1 may still read the other, so a step takes one barrier (as the int8 tiles'). Unstaged ones
// take one tile and a second barrier before writing it, in 27 KB that need no opt-in: with two
// tiles (55 KB, opted in with the largest shared carveout, allow_dynamic_shared) gpt-oss-20b's
// MXFP4 experts took 7-17% longer a launch, where the staged Q4_K / Q6_K experts of Qwen3-30B-A3B
// gained 4% (H100, bench/results/cuda_h100_moe_bf16_tiles.txt). Dynamic shared memory: the
// step tiles, then (STAGED) the raw chunks' two buffers.
//   x arrives in bf16 (convert_bf16 of the tokens' rows for gate and up; the gated activation
// writes the down's input in bf16): a thread stages its tokens' 4 values a step as one 8-byte
// load and store, where rounding f32 x in the tile took 16-byte loads, conversions and twice
// the traffic, in every one of the row tiles that read the same x.
template <class F, bool STAGED>
__global__ void __launch_bounds__(kMmaThreads, 2) mma_bf16_rounded_kernel(MmaGroup group, const kcap_u16* x) {
    const int which = mma_group_member(group), tile = mma_group_tile(group, which);
    const KcapMatmulParams p = mma_group_pick(group.p, which);
    const kcap_u8* w = mma_group_pick(group.w, which);
    using C = KcapCodes<F>;
    using R = RawChunk<F>;
    constexpr int kRunsPerBlock = F::block_elems / 32;
    constexpr int kStepsPerChunk = R::k / kStepK;  // 4 (256-value chunks) or 1
    constexpr int kTiles = STAGED ? 2 : 1;
    extern __shared__ __align__(16) unsigned char bf16_shared[];
    SharedBf16Tile* sh = reinterpret_cast<SharedBf16Tile*>(bf16_shared);
    unsigned* raw = reinterpret_cast<unsigned*>(bf16_shared + kTiles * sizeof(SharedBf16Tile));
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int row_base = tile * kMmaRows, token_base = blockIdx.y * kMmaTokens;
    const int warp_tokens = kWarpTokens * (warp / kWarpsRows), warp_rows = kWarpRows * (warp % kWarpsRows);
    // Decoding role: weight row dr, run dhalf of each step. Activation role: float4 column xc
    // (values 4 xc .. 4 xc + 3 of the step) of tokens xt + 16 i, i < 4.
    const int dr = tid >> 1, dhalf = tid & 1;
    const int xt = tid >> 4, xc = tid & 15;
    const bool row_valid = row_base + dr < p.n;
    pdl_wait();
    pdl_trigger();
    const int expert = group.tile_expert[blockIdx.y];
    if (expert < 0) return;  // past the batch's tiles
    w += kcap_u64(expert) * group.expert_bytes;
    const kcap_u64 bias_offset = kcap_u64(expert) * kcap_u64(p.n);
    const kcap_u8* wrow = w + kcap_u64(row_valid ? row_base + dr : 0) * p.row_bytes;
    const kcap_u8* w_end = w + kcap_u64(p.n) * p.row_bytes;
    int xsrc[4];
    x_sources(xsrc, group.x_rows, p, token_base, xt);
    // A 16-token mma tile whose first row is padding is all padding (an expert's rows are padded
    // at the end of its tiles): the warp skips its products.
    bool live[kMt];
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt) live[mt] = group.live_rows[token_base + warp_tokens + 16 * mt] >= 0;
    float acc[kMt][kNt][4] = {};
    const int runs = p.k / 32;
    const int steps = (p.k + kStepK - 1) / kStepK;
    const int chunks = (p.k + R::k - 1) / R::k;
    // Raw chunk c into buffer c & 1 (STAGED; nothing past the last chunk), one commit group.
    const auto stage = [&](int c) {
        if (!STAGED || c >= chunks) return;
        stage_chunk<F>(raw + (c & 1) * R::buffer_words, w, w_end, p, row_base, c, tid);
        cp_async_commit();
    };
    uint2 xv[4];
    using Ahead = RunAhead<F>;
    constexpr bool kAhead = !STAGED && Ahead::kWords > 0;
    static_assert(!kAhead || kRunsPerBlock == 1, "RunAhead: 32-element blocks");
    kcap_u32 ahead[kAhead ? Ahead::kWords : 1];
    kcap_u32 ahead_off = 0;
    // Step s's activations and (RunAhead) weight words into registers.
    const auto load = [&](int s) {
        load_x_bf16(xv, x, p, xsrc, xc, s * kStepK);
        if constexpr (kAhead) {
            const int run = 2 * s + dhalf;
            const bool in = row_valid && run < runs;
            ahead_off = run_ahead_load<F>(wrow + unsigned(in ? run : 0) * unsigned(F::block_bytes), in, ahead);
        }
    };
    // The first two chunks in flight, the first landed and visible.
    stage(0);
    stage(1);
    if (STAGED) {
        if (chunks > 1) cp_async_wait<1>();
        else cp_async_wait<0>();
    }
    load(0);
    __syncthreads();
    for (int s = 0; s < steps; ++s) {
        SharedBf16Tile& b = sh[s % kTiles];
        if (kTiles == 1 && s > 0) __syncthreads();  // the one tile's products of step s - 1 done
        // Weights: bf16 of the run's decoded values; zeros past N or K.
        {
            const int run = 2 * s + dhalf;
            const bool in = row_valid && run < runs;
            unsigned pairs[16];
            bool paired = false;  // MXFP4 read ahead: its pairs straight from the codes where the scale allows
            if constexpr (kAhead && std::is_same<F, KcapMXFP4>::value) paired = in && mxfp4_bf16_pairs(ahead, ahead_off, pairs);
            if (!paired) {
                float v[32];
                if (in) {
                    if constexpr (kAhead) {
                        kcap_u32 u[8];
                        float sc[2];
                        Ahead::decode(ahead, ahead_off, u, sc);
                        kcap_codes32_from_words<C>(u, v);
#pragma unroll
                        for (int i = 0; i < 32; ++i) v[i] = v[i] * sc[0];
                    } else {
                        F::decode32(run_block<F, STAGED>(raw, wrow, dr, run, s / kStepsPerChunk), run % kRunsPerBlock, v);
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < 32; ++i) v[i] = 0.0f;
                }
#pragma unroll
                for (int i = 0; i < 16; ++i) pairs[i] = bf16_pair(v[2 * i], v[2 * i + 1]);
            }
            uint4* dst = reinterpret_cast<uint4*>(b.w + dr * kStrideBf16 + 16 * dhalf);
#pragma unroll
            for (int q = 0; q < 4; ++q) dst[q] = make_uint4(pairs[4 * q], pairs[4 * q + 1], pairs[4 * q + 2], pairs[4 * q + 3]);
        }
        // Activations (bf16 already); zeros past M or K.
#pragma unroll
        for (int i = 0; i < 4; ++i) *reinterpret_cast<uint2*>(b.x + (xt + 16 * i) * kStrideBf16 + 2 * xc) = xv[i];
        // The next step's loads, in flight during this step's products.
        const bool next_chunk = (s + 1) % kStepsPerChunk == 0;  // step s + 1 decodes a new chunk
        if (s + 1 < steps) load(s + 1);
        if (STAGED && next_chunk) cp_async_wait<0>();  // this thread's copies of that chunk
        // Step s's tile written by every thread (and the next chunk's copies visible); every
        // decode of this step's chunk done.
        __syncthreads();
        // Step s + 1 starts chunk c + 1: chunk c + 2 into chunk c's buffer.
        if (next_chunk) stage((s + 1) / kStepsPerChunk + 1);
#pragma unroll
        for (int kw = 0; kw < kStepK / 2; kw += 8) {  // the step's k16 slices (8 words each)
            unsigned bw[kNt / 2][4];
#pragma unroll
            for (int np = 0; np < kNt / 2; ++np)
                load_b2<kStrideBf16>(bw[np], b.w + (warp_rows + 16 * np) * kStrideBf16 + kw, lane);
#pragma unroll
            for (int mt = 0; mt < kMt; ++mt) {
                if (!live[mt]) continue;  // uniform per warp
                unsigned a[4];
                load_a<kStrideBf16>(a, b.x + (warp_tokens + 16 * mt) * kStrideBf16 + kw, lane);
#pragma unroll
                for (int nt = 0; nt < kNt; ++nt)
                    mma_bf16(acc[mt][nt], a, bw[nt >> 1][2 * (nt & 1)], bw[nt >> 1][2 * (nt & 1) + 1]);
            }
        }
    }
    const float* bias = mma_group_pick(group.bias, which);
    store_tile(acc, p, token_base + warp_tokens, row_base + warp_rows, lane, bias ? bias + bias_offset : nullptr,
               mma_group_pick(group.y, which));
}

// Shared memory of a launch: the step tiles and (STAGED) the raw chunks.
template <class F, bool STAGED>
constexpr size_t bf16_rounded_shared_bytes() {
    return STAGED ? 2 * sizeof(SharedBf16Tile) + RawChunk<F>::bytes : sizeof(SharedBf16Tile);
}
static_assert(sizeof(SharedBf16Tile) <= 48 * 1024, "one step tile needs no opt-in");

template <class F, bool STAGED>
void launch_bf16_rounded_tiles(const Context& ctx, const MmaGroup& g, const kcap_u16* x) {
    constexpr size_t bytes = bf16_rounded_shared_bytes<F, STAGED>();
    if (STAGED) allow_dynamic_shared<mma_bf16_rounded_kernel<F, STAGED>>(ctx, bytes);
    launch(ctx, mma_bf16_rounded_kernel<F, STAGED>, mma_group_grid(g), dim3(kMmaThreads), bytes, g, x);
}

}  // namespace

struct Gemm {
    const CublasApi* api = nullptr;
    CublasHandle handle = nullptr;
    void* workspace = nullptr;
    __nv_bfloat16* weights = nullptr;  // weight_values
    __nv_bfloat16* input = nullptr;    // input_values
    size_t weight_values = 0, input_values = 0;
};

Gemm* gemm_create(cudaStream_t stream, size_t weight_values, size_t input_values, const std::string& library) {
    auto* g = new Gemm;
    try {
        g->api = &cublas(library);
        g->weight_values = weight_values;
        g->input_values = input_values;
        KCAP_CUDA_CHECK(cudaMalloc(&g->workspace, kCublasWorkspaceBytes));
        KCAP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&g->weights), std::max<size_t>(weight_values, 32) * 2));
        KCAP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&g->input), std::max<size_t>(input_values, 32) * 2));
        check_cublas(*g->api, g->api->create(&g->handle), "cublasCreate");
        check_cublas(*g->api, g->api->set_stream(g->handle, stream), "cublasSetStream");
        check_cublas(*g->api, g->api->set_workspace(g->handle, g->workspace, kCublasWorkspaceBytes), "cublasSetWorkspace");
    } catch (...) {
        gemm_destroy(g);
        throw;
    }
    return g;
}

size_t gemm_device_bytes(const Gemm* g) {
    if (!g) return 0;
    return kCublasWorkspaceBytes + (std::max<size_t>(g->weight_values, 32) + std::max<size_t>(g->input_values, 32)) * 2;
}

void gemm_destroy(Gemm* g) {
    if (!g) return;
    if (g->handle) g->api->destroy(g->handle);
    cudaFree(g->workspace);
    cudaFree(g->weights);
    cudaFree(g->input);
    delete g;
}

namespace {

Gemm& gemm_of(const Context& ctx) {
    if (!ctx.gemm) throw Error("a bf16 matmul row ran on a backend without its GEMM (no bf16 row was planned)");
    return *ctx.gemm;
}

// bf16(x) of m tokens of k values in the GEMM's input scratch.
const __nv_bfloat16* convert_input(const Context& ctx, const float* x, int m, int k) {
    Gemm& g = gemm_of(ctx);
    const long long count = (long long)m * k;
    if (size_t(count) > g.input_values)
        throw Error("bf16 input of " + std::to_string(m) + " x " + std::to_string(k) + " exceeds the GEMM's scratch (" +
                    std::to_string(g.input_values) + " values)");
    mma_tiles::convert_bf16(ctx, x, count, reinterpret_cast<kcap_u16*>(g.input));
    return g.input;
}

template <class F>
void launch_dequantize(const Context& ctx, const kcap_u8* w, unsigned row_bytes, int k, int rows, __nv_bfloat16* out) {
    const long long runs = (long long)rows * (k / 32);
    launch(ctx, dequantize_bf16_kernel<F>, dim3(ceil_div(runs, cuda_rows::kGemmThreads)), dim3(cuda_rows::kGemmThreads),
           0, w, row_bytes, k / 32, runs, out);
}

void dequantize(const Context& ctx, Format format, const kcap_u8* w, unsigned row_bytes, int k, int rows,
                __nv_bfloat16* out) {
    switch (format) {
#define KCAP_DEQUANTIZE_CASE(NAME, DECODER) \
    case Format::NAME: return launch_dequantize<DECODER>(ctx, w, row_bytes, k, rows, out);
        KCAP_WEIGHT_FORMATS(KCAP_DEQUANTIZE_CASE)
#undef KCAP_DEQUANTIZE_CASE
        default: throw Error(std::string("bf16 matmul: no decoder for ") + format_name(format));
    }
}

// y (m x n, row-major f32) = bf16(W) . x for x already in bf16 (convert_input), W of `format`:
// the matrix in chunks of rows that fit the weight scratch, each dequantized, then one GEMM
// into its columns of y; then the bias, if any.
void gemm_matmul(const Context& ctx, Format format, const KcapMatmulParams& p, const kcap_u8* w,
                 const __nv_bfloat16* x, const float* bias, float* y) {
    Gemm& g = gemm_of(ctx);
    // The whole matrix where it fits, else chunks of a multiple of 8 rows (every chunk's output
    // columns stay 32-byte aligned).
    long long fit = (long long)(g.weight_values / size_t(p.k));
    if (fit < p.n) fit = fit / 8 * 8;
    if (fit < 1)
        throw Error("bf16 matmul: K=" + std::to_string(p.k) + " exceeds the GEMM's weight scratch (" +
                    std::to_string(g.weight_values) + " values)");
    const long long chunk = std::min<long long>(p.n, fit);
    const float alpha = 1.0f, beta = 0.0f;
    for (long long row0 = 0; row0 < p.n; row0 += chunk) {
        const int rows = int(std::min<long long>(chunk, p.n - row0));
        dequantize(ctx, format, w + (unsigned long long)row0 * p.row_bytes, p.row_bytes, p.k, rows, g.weights);
        // Column-major, as cuBLAS sees it: C (rows x m, ldc n) = A^T (A: k x rows, the row-major
        // weights) . B (k x m, the row-major tokens); C is y's row-major m x n.
        check_cublas(*g.api, g.api->gemm_ex(g.handle, kCublasOpT, kCublasOpN, rows, p.m, p.k, &alpha, g.weights, CUDA_R_16BF,
                                    p.k, x, CUDA_R_16BF, p.k, &beta, y + row0, CUDA_R_32F, p.n, kCublasCompute32F,
                                    kCublasGemmDefault),
                     "cublasGemmEx");
    }
    if (bias) {
        const long long count = (long long)p.m * p.n;
        launch(ctx, add_bias_kernel, dim3(ceil_div(count, cuda_rows::kGemmThreads)), dim3(cuda_rows::kGemmThreads), 0, y,
               bias, p.n, count);
    }
}

}  // namespace

void mma_tiles::convert_bf16(const Context& ctx, const float* x, long long count, kcap_u16* out) {
    if (count % 8 != 0) throw Error("convert_bf16: a count of whole runs of 8 values");
    launch(ctx, convert_bf16_kernel, dim3(ceil_div(count / 8, cuda_rows::kGemmThreads)), dim3(cuda_rows::kGemmThreads),
           0, x, count, reinterpret_cast<__nv_bfloat16*>(out));
}

void mma_tiles::mma_group_bf16_rounded(const Context& ctx, Format format, const MmaGroup& g, const kcap_u16* x) {
    if (!g.tile_expert || !cuda_rows::mma_format(format) || g.p[0].k % 32 != 0 || g.p[0].m < kMmaMinTokens)
        throw Error(std::string("mma_group_bf16_rounded: no grouped tiles for ") + format_name(format) +
                    " at this k and m");
    switch (format) {
#define KCAP_BF16_TILES_CASE(NAME, DECODER)                                                                     \
    case Format::NAME:                                                                                        \
        if constexpr (KcapCodes<DECODER>::factorable)                                                         \
            return launch_mma_group<DECODER>(ctx, g, bf16_rounded_shared_bytes<DECODER, true>(),          \
                                             [&](const MmaGroup& group, bool staged) {                        \
                                                 staged ? launch_bf16_rounded_tiles<DECODER, true>(ctx, group, x) \
                                                        : launch_bf16_rounded_tiles<DECODER, false>(ctx, group, x); \
                                             });                                                              \
        break;
        KCAP_WEIGHT_FORMATS(KCAP_BF16_TILES_CASE)
#undef KCAP_BF16_TILES_CASE
        default: break;
    }
    throw Error(std::string("mma_group_bf16_rounded: no grouped tiles for ") + format_name(format));
}
}  // namespace cuda

// cuda.matmul_bf16.<format> (kGemmMinTokens tokens and more): x converted to bf16, the weights
// dequantized to bf16 (in chunks of rows where the scratch is smaller), cuBLAS's GEMM, the bias.
template <Format FORMAT>
void kcap_cuda_matmul_bf16(const Stage& stage, const KernelCall& call) {
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    const KcapMatmulParams p = cuda::matmul_params(stage, call);
    cuda::gemm_matmul(ctx, FORMAT, p, static_cast<const kcap_u8*>(data.operands[0]),
                      cuda::convert_input(ctx, call.in, p.m, p.k), static_cast<const float*>(data.operands[1]),
                      call.out);
}

// cuda.gate_up_bf16.<format>: x converted once, each matrix's GEMM into the plan's gate / up
// scratch, then the activation.
template <Format FORMAT>
void kcap_cuda_gate_up_bf16(const Stage& stage, const KernelCall& call) {
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    const KcapMatmulParams p = cuda::matmul_params(stage, call);  // operand 1 is the up matrix, not a bias
    const __nv_bfloat16* x = cuda::convert_input(ctx, call.in, p.m, p.k);
    cuda::gemm_matmul(ctx, FORMAT, p, static_cast<const kcap_u8*>(data.operands[0]), x, nullptr, call.inout2);
    cuda::gemm_matmul(ctx, FORMAT, p, static_cast<const kcap_u8*>(data.operands[1]), x, nullptr, call.inout3);
    cuda::gate_up_activation(stage, call);
}

#define KCAP_INSTANTIATE_BF16(NAME, DECODER)                                                 \
    template void kcap_cuda_matmul_bf16<Format::NAME>(const Stage&, const KernelCall&);     \
    template void kcap_cuda_gate_up_bf16<Format::NAME>(const Stage&, const KernelCall&);
KCAP_WEIGHT_FORMATS(KCAP_INSTANTIATE_BF16)
#undef KCAP_INSTANTIATE_BF16

// cuda.qkv_bf16: x converted once and each matrix (its own format) through the GEMM into its
// output.
void kcap_cuda_qkv_bf16(const Stage& stage, const KernelCall& call) {
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    const __nv_bfloat16* x = cuda::convert_input(ctx, call.in, call.n_tokens, int(stage.k));
    float* outputs[3] = {call.out, call.inout2, call.inout3};
    Stage matmul = stage;
    matmul.op = Op::MatMul;
    matmul.features = 0;
    for (int which = 0; which < qkv_matrices(stage); ++which) {  // three, or a latent attention's pair
        const TensorRef* w = stage.operands[size_t(which)];
        const TensorRef* bias = qkv_bias(stage, which);
        matmul.operands = {w, bias};
        matmul.n = w->n_rows();
        cuda::gemm_matmul(ctx, w->format, cuda::matmul_params(matmul, call), static_cast<const kcap_u8*>(data.operands[which]),
                          x, bias ? static_cast<const float*>(data.operands[3 + which]) : nullptr, outputs[which]);
    }
}

}  // namespace kcap
