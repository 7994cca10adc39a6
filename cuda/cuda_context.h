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
// batch; library: the libcublas to load (EngineOptions::cublas_library; empty: KCAP_CUBLAS_LIBRARY
// or the sonames). Throws Error naming what failed (cuBLAS not found: which names were tried,
// and KCAP_CUBLAS_LIBRARY to point at it).
Gemm* gemm_create(cudaStream_t stream, size_t weight_values, size_t input_values, const std::string& library);
void gemm_destroy(Gemm* gemm);
// Device bytes a Gemm allocated (workspace and both scratches); 0 for null.
size_t gemm_device_bytes(const Gemm* gemm);

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
    // The bf16 rows' GEMM, null where none is planned.
    Gemm* gemm = nullptr;
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
    // of up to q8_rows_capacity bytes (cuda_rows::q8_rows_bytes); null where no q8_1 row is
    // planned. A q8_1 row with its own quantize launch writes it and reads it back; a stage the
    // planner linked to the q8_1 matmuls after it (kQ8Output: cuda.add_norm_q8, the attention
    // rows' _q8 forms) writes it and they read it (kQ8Input).
    void* q8_rows = nullptr;
    size_t q8_rows_capacity = 0;
    // Mixture of experts (cuda/moe.cu), sized for max_batch tokens of the widest stage
    // (dispatch/planner.h: moe_scratch): the router's logits; the experts' rows (the slots, or the
    // grouped tiles' sorted rows): FFN activations, up outputs (grouped), down outputs; grouped:
    // the source token of each sorted row, the sorted row of each slot, the expert of each tile.
    float* moe_logits = nullptr;
    float* moe_act = nullptr;
    float* moe_up = nullptr;
    float* moe_down = nullptr;
    int* moe_rows = nullptr;
    int* moe_slot_rows = nullptr;
    int* moe_tile_expert = nullptr;
    // The slot starts' counts (cuda.moe_experts_q8_slot_starts: gate/up groups done per slot),
    // moe_slot_done_capacity of them, 0 between stages (each stage's combine sets them back); null
    // where no such row is planned.
    int* moe_slot_done = nullptr;
    size_t moe_slot_done_capacity = 0;
    // The grouped q8_1 experts' activations rounded to q8_1 (cuda.moe_experts_q8_mma: the sorted
    // rows' act(gate) * up, the down tiles' input), in the form of q8_rows; null where no q8_1
    // experts row is planned.
    void* moe_q8 = nullptr;
    size_t moe_q8_capacity = 0;
    // The grouped experts' inputs of the bf16 and split-bf16 tiles (cuda.moe_experts_bf16_mma: the
    // tokens' x [tokens][k], then the sorted rows' activations [rows][ff], in bf16;
    // cuda.moe_experts_mma: the same split, mma_tiles::SplitRows), moe_bf16_capacity values; null
    // where no such row is planned.
    unsigned short* moe_bf16 = nullptr;  // bf16 bits
    size_t moe_bf16_capacity = 0;
    // Multi-head latent attention (cuda.attention_mla), for max_batch tokens of the widest stage:
    // the absorbed queries [tokens][heads][kv_lora_rank + rope_dim], the weighted latents
    // [tokens][heads][kv_lora_rank].
    float* mla_absorbed = nullptr;
    float* mla_latent = nullptr;
};

// m x k q8_1 values in a context's q8_rows (the form of kcap_q8_quantize_rows).
struct Q8Rows {
    uint32_t* codes;     // [m][k / 4] words of 4 signed bytes
    float* d;            // [m][k / 32]
    int32_t* half_sums;  // [m][k / 16]
};
// m x k q8_1 values at `base`, a scratch of `capacity` bytes.
inline Q8Rows q8_rows_in(void* base, size_t capacity, int m, int k) {
    const size_t bytes = size_t(cuda_rows::q8_rows_bytes(m, k));
    if (!base || bytes > capacity)
        throw Error("q8_1 activations of " + std::to_string(m) + " x " + std::to_string(k) +
                    " exceed the backend's scratch (" + std::to_string(capacity) + " bytes)");
    auto* codes = static_cast<uint32_t*>(base);
    auto* d = reinterpret_cast<float*>(static_cast<uint8_t*>(base) + size_t(m) * size_t(k));
    auto* half_sums = reinterpret_cast<int32_t*>(d + size_t(m) * size_t(k / 32));
    return {codes, d, half_sums};
}
inline Q8Rows q8_rows_layout(const Context& ctx, int m, int k) { return q8_rows_in(ctx.q8_rows, ctx.q8_rows_capacity, m, k); }

// The q8_1 scratch of a call's input: the rows of all `rows` tokens of the buffer the stage
// before wrote (KernelCall::buffer_rows), from row `first` on (a stage that runs on the last
// position only reads the last row).
inline Q8Rows q8_rows_at(const Context& ctx, int rows, int k, int first) {
    const Q8Rows all = q8_rows_layout(ctx, rows, k);
    const size_t r = size_t(first);
    return {all.codes + r * size_t(k / 4), all.d + r * size_t(k / 32), all.half_sums + r * size_t(k / 16)};
}

// Bound to one stage when the backend is built.
struct StageData {
    const void* operands[6] = {};  // device copies of the stage's operands (null where absent)
    const float* rope_table = nullptr;             // rope: [n_ctx][rope_dim / 2] (cos, sin)
    int attn_splits = 1;                           // attention: decode key-range splits
};

inline Context& context(const KernelCall& call) { return *static_cast<Context*>(call.backend_state); }
inline const StageData& stage_data(const KernelCall& call) { return *static_cast<const StageData*>(call.stage_state); }

inline unsigned ceil_div(int64_t a, int64_t b) { return unsigned((a + b - 1) / b); }

// Launches kernel on the context's stream, with programmatic dependent launch when enabled
// (each kernel then waits for its predecessor with kcap_pdl_wait before touching memory), in
// thread-block clusters of cluster_x groups along x where cluster_x > 0 (sm_90: the rows that
// launch clusters say so in their legal dims).
template <typename... Params, typename... Args>
void launch_clusters(const Context& ctx, unsigned cluster_x, void (*kernel)(Params...), dim3 grid, dim3 block,
                     size_t shared_bytes, Args&&... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = ctx.stream;
    cudaLaunchAttribute attribute[2];
    unsigned n = 0;
    if (ctx.pdl) {
        attribute[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_x > 0) {
        attribute[n].id = cudaLaunchAttributeClusterDimension;
        attribute[n++].val.clusterDim = {cluster_x, 1, 1};
    }
    config.attrs = attribute;
    config.numAttrs = n;
    KCAP_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}
template <typename... Params, typename... Args>
void launch(const Context& ctx, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
            Args&&... args) {
    launch_clusters(ctx, 0, kernel, grid, block, shared_bytes, std::forward<Args>(args)...);
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
// Every thread of the cluster waits for all of them: what each wrote before (global and shared
// memory) is visible to the others after (release / acquire at cluster scope). sm_90 only: the
// rows whose kernels call it need it (LegalDims::min_sm_version).
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#elif defined(__CUDA_ARCH__)
    __trap();
#endif
}

}  // namespace cuda
}  // namespace kcap
