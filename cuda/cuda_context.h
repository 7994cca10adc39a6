// What CUDA launchers share: the device context of one engine (stream, KV cache, decode-step
// state in device memory, scratch) and what the backend bound to each stage at load time.
// Included only by CUDA translation units (cuda/*.cu) and the CUDA tests.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda/rows.h"
#include "dispatch/kernel_params.h"
#include "dispatch/stage.h"
#include "kcap/errors.h"

namespace kcap {
namespace cuda {

// Throws kcap::Error naming the call and CUDA's message.
void check(cudaError_t status, const char* what);
#define KCAP_CUDA_CHECK(expr) ::kcap::cuda::check((expr), #expr)

// The most threadgroup memory one group of a kernel may opt in to on `device` (bytes): 227 KB
// on the H200, 99 KB on sm_86/sm_89 parts. Rows whose fast kernels need more run their other
// kernel there (cuda.attention_mma, the staged matmul_mma).
int shared_optin_bytes(int device);

// The bf16 rows' GEMM (cuda/matmul_gemm.cu): cuBLAS, loaded at run time, with its handle on one
// stream, its workspace, and the bf16 scratch for a weight matrix (or a chunk of its rows) and a
// batch of inputs.
struct Gemm;
// weight_values: the scratch for one matrix (or chunk); input_values: for the widest input of a
// batch. Throws Error naming what failed (cuBLAS not found: which names were tried, and
// KCAP_CUBLAS_LIBRARY to point at it).
Gemm* gemm_create(cudaStream_t stream, size_t weight_values, size_t input_values);
void gemm_destroy(Gemm* gemm);

// One layer's KV cache in device memory: [n_ctx][k_width] and [n_ctx][v_width] elements.
struct KvCache {
    void* k = nullptr;
    void* v = nullptr;
};

struct Context {
    cudaStream_t stream = nullptr;
    int device = 0;
    int sm_count = 0;
    bool pdl = false;  // launch with programmatic dependent launch (sm_90+)
    int matvec_rows = cuda_rows::kMatvecRows;  // decode matvec rows per team (KCAP_MATVEC_ROWS: 1, 2, 8)
    int matvec_wide_rows = cuda_rows::kMatvecWideRows;  // ... of a wide matrix (KCAP_MATVEC_WIDE_ROWS: 1, 2)
    int matvec_warps = cuda_rows::kMatvecTargetWarps;  // KCAP_MATVEC_WARPS: the split's simd groups per multiprocessor
    // Decode attention (KCAP_ATTN_DECODE_SIMDS, KCAP_ATTN_MIN_CHUNK, KCAP_ATTN_SPLITS_PER_SM):
    // simd groups per group, fewest keys per split, most groups per multiprocessor.
    int attn_decode_simds = 0;  // 0: cuda_rows::attn_decode_simds(n_head_kv)
    int attn_min_chunk = cuda_rows::kAttnMinChunk;
    int attn_splits_per_sm = cuda_rows::kAttnSplitsPerSm;
    // A stage that owns its rope (planner: rope + attention fused) rotates in its decode kernel;
    // false (KCAP_ATTN_OWN_ROPE=0, a measurement switch): a rope launch before the decode.
    bool attn_own_rope = true;
    // The q8_1 matvec's x: quantized by its own launch for k >= q8_prequantize (unless the stage
    // before did it), else by its groups; 0: always by its groups, and no add_norm epilogue
    // (KCAP_Q8_PREQUANT, a measurement switch; cuda_rows::kQ8QuantizeMinK).
    int q8_prequantize = cuda_rows::kQ8QuantizeMinK;
    bool add_norm_vec = true;  // KCAP_ADD_NORM_VEC=0 (a measurement switch): add_norm walks the row, not registers
    int mma_staged = -1;  // KCAP_MMA_STAGED: prefill matmul weights staged in shared memory (1), not (0), by K (-1)
    bool mma_group = true;  // KCAP_MMA_GROUP=0 (a measurement switch): a batch's qkv / gate_up tiles one launch per matrix
    int mma_q8_tokens = 0;  // KCAP_MMA_Q8_TOKENS=64|128: the int8 tiles' tokens per group for every batch (0: by the grid)
    // The bf16 rows (activations="bf16"): their GEMM, null where none is planned, and the batch
    // size from which they use it (KCAP_GEMM_MIN_TOKENS, a measurement switch).
    Gemm* gemm = nullptr;
    int gemm_min_tokens = cuda_rows::kGemmMinTokens;
    // Decode-step state in device memory, so one captured graph serves every step:
    // step[0] = position of token 0 of the call, step[1] = tokens generated (history index).
    int32_t* step = nullptr;
    int32_t* tokens = nullptr;   // [max_batch] token ids of the call
    int32_t* history = nullptr;  // [n_ctx] greedy tokens of decode_greedy
    int32_t* argmax_result = nullptr;
    float* argmax_partial_value = nullptr;
    int32_t* argmax_partial_index = nullptr;
    int argmax_partials = 0;
    // Sampling (cuda.sample): settings written before each sampling call, first-pass candidates.
    KcapSampleSettings* sample_settings = nullptr;
    float* sample_partial_value = nullptr;
    int32_t* sample_partial_index = nullptr;
    Format kv_format = Format::F32;
    int64_t n_ctx = 0;
    std::vector<KvCache> kv;     // one per layer (null for a shared-KV layer: it reads its source's)
    float* attn_partial_o = nullptr;   // split-K decode partials
    float* attn_partial_ml = nullptr;
    // q8_1 activations of a matmul's input (cuda/matmul_q8.cu): codes, run scales and half sums
    // of up to q8_rows_capacity bytes (cuda_rows::q8_rows_bytes); null where no q8_1 row is planned.
    void* q8_rows = nullptr;
    size_t q8_rows_capacity = 0;
    // What q8_rows holds for the stage now running: q8_1 of the f32 buffer q8_rows_of.x (m x k),
    // written by the stage before it (cuda.add_norm, and cuda.attention for a decode token, quantize
    // their output there when the plan has q8_1 rows), so a q8_1 matmul of that x skips its
    // quantize launch. A stage that writes q8_rows sets q8_rows_next; run_stages moves it to
    // q8_rows_of before each stage (so it holds for exactly the next stage that runs) and clears it.
    struct Q8Source {
        const float* x = nullptr;
        int m = 0, k = 0;
    };
    Q8Source q8_rows_of, q8_rows_next;
};

// m x k q8_1 values in a context's q8_rows (the form of kcap_q8_quantize_rows).
struct Q8Rows {
    uint32_t* codes;     // [m][k / 4] words of 4 signed bytes
    float* d;            // [m][k / 32]
    int32_t* half_sums;  // [m][k / 16]
};
inline Q8Rows q8_rows_layout(const Context& ctx, int m, int k) {
    const size_t bytes = size_t(cuda_rows::q8_rows_bytes(m, k));
    if (!ctx.q8_rows || bytes > ctx.q8_rows_capacity)
        throw Error("q8_1 activations of " + std::to_string(m) + " x " + std::to_string(k) +
                    " exceed the backend's scratch (" + std::to_string(ctx.q8_rows_capacity) + " bytes)");
    auto* codes = static_cast<uint32_t*>(ctx.q8_rows);
    auto* d = reinterpret_cast<float*>(static_cast<uint8_t*>(ctx.q8_rows) + size_t(m) * size_t(k));
    auto* half_sums = reinterpret_cast<int32_t*>(d + size_t(m) * size_t(k / 32));
    return {codes, d, half_sums};
}

// For a stage whose output (m x k, at out) is the next stage's q8_1 matmul input: where the plan
// has q8_1 rows (and KCAP_Q8_PREQUANT is not 0), the rows to quantize it into, announced in
// Context::q8_rows_next; else empty (codes null: write none). k must be a multiple of 32.
inline Q8Rows q8_output_rows(Context& ctx, const float* out, int m, int k) {
    if (!ctx.q8_rows || ctx.q8_prequantize == 0 || k % 32 != 0 ||
        size_t(cuda_rows::q8_rows_bytes(m, k)) > ctx.q8_rows_capacity)
        return {nullptr, nullptr, nullptr};
    ctx.q8_rows_next = {out, m, k};
    return q8_rows_layout(ctx, m, k);
}

// Bound to one stage when the backend is built.
struct StageData {
    const void* operands[4] = {nullptr, nullptr, nullptr, nullptr};  // device copies of the stage's operands
    const float* rope_table = nullptr;             // rope: [n_ctx][rope_dim / 2] (cos, sin)
    int attn_splits = 1;                           // attention: decode key-range splits
};

inline Context& context(const KernelCall& call) { return *static_cast<Context*>(call.backend_state); }
inline const StageData& stage_data(const KernelCall& call) { return *static_cast<const StageData*>(call.stage_state); }

inline unsigned ceil_div(int64_t a, int64_t b) { return unsigned((a + b - 1) / b); }

// Launches kernel on the context's stream, with programmatic dependent launch when enabled
// (each kernel then waits for its predecessor with kcap_pdl_wait before touching memory).
template <typename... Params, typename... Args>
void launch(const Context& ctx, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
            Args&&... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = ctx.stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = ctx.pdl ? 1 : 0;
    KCAP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// Kernel side of programmatic dependent launch: wait until the previous kernel finished and
// its writes are visible (a no-op without PDL); let the next kernel start launching.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace cuda
}  // namespace kcap
