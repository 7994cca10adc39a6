// What a stage boundary of a decode step costs: a chain of dependent launches in one CUDA graph
// (with and without programmatic dependent launch, as the decode graphs run) against one
// persistent kernel whose stages meet at a grid-wide barrier (an arrival count in global
// memory). Each stage reads its own `bytes` of "weights" (a fresh region of a large buffer, so
// nothing comes from L2; read before the stage's wait, as the decode kernels prefetch their
// weights) and then depends on the stage before it (every group reads the value the previous
// stage's groups added up, then adds its own). Per stage time = (graph or kernel time) / stages.
//
//   nvcc -O3 -arch=sm_90 -o /tmp/stage_sync_probe bench/cuda_stage_sync_probe.cu && /tmp/stage_sync_probe
//
// Prints one line per (weights before / after the wait, bytes a stage, groups): microseconds a
// stage for launches, launches with PDL, and the persistent kernel, and the persistent kernel's
// gain over the PDL launches. "after": each stage reads its weights only after its wait (the
// barrier), as the experts' matvecs must (their rows follow the router's choice).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                                     \
    do {                                                                                             \
        cudaError_t e_ = (x);                                                                        \
        if (e_ != cudaSuccess) {                                                                     \
            std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));        \
            std::exit(1);                                                                            \
        }                                                                                            \
    } while (0)

namespace {

constexpr int kThreads = 256;
constexpr int kStages = 240;  // about a 24-layer decode step's launches

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// The stage's weights: this group's share of `words` 16-byte words, folded into one value (the
// loads streamed past L1/L2 retention, four in flight per thread).
__device__ __forceinline__ unsigned read_weights(const uint4* w, size_t words) {
    unsigned acc = 0;
    const size_t stride = size_t(gridDim.x) * kThreads;
    size_t i = size_t(blockIdx.x) * kThreads + threadIdx.x;
    for (; i + 3 * stride < words; i += 4 * stride) {
        const uint4 a = __ldcs(w + i), b = __ldcs(w + i + stride), c = __ldcs(w + i + 2 * stride),
                    d = __ldcs(w + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < words; i += stride) {
        const uint4 a = __ldcs(w + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    return acc;
}

// The dependent part: the previous stage's total (complete: the caller waited), and this group's
// contribution to this stage's (one atomic per group; the weights' fold keeps the loads live).
__device__ __forceinline__ void depend(unsigned* totals, int stage, unsigned acc) {
    __shared__ unsigned folded;
    if (threadIdx.x == 0) folded = 0;
    __syncthreads();
    atomicXor(&folded, acc);
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned prev = stage > 0 ? load_acquire(totals + stage - 1) : 0u;
        atomicAdd(totals + stage, 1u + ((folded ^ prev) & 0u));
    }
}

// after: the weights read only after the wait (a stage whose weights depend on the one before:
// the experts' on the router's choice).
__global__ void __launch_bounds__(kThreads) stage_kernel(const uint4* w, size_t words, unsigned* totals, int stage,
                                                         int pdl, int after) {
    unsigned acc = after ? 0u : read_weights(w + size_t(stage) * words, words);
    if (pdl) {
        pdl_wait();
        pdl_trigger();
    }
    if (after) acc = read_weights(w + size_t(stage) * words, words);
    depend(totals, stage, acc);
}

// Every group's arrival, then until all `target` arrivals are in.
__device__ __forceinline__ void grid_barrier(unsigned* count, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(count, 1u);
        while (load_acquire(count) < target) {
        }
    }
    __syncthreads();
}

__global__ void __launch_bounds__(kThreads) persistent_kernel(const uint4* w, size_t words, unsigned* totals,
                                                              unsigned* count, int stages, int after) {
    for (int stage = 0; stage < stages; ++stage) {
        unsigned acc = after ? 0u : read_weights(w + size_t(stage) * words, words);  // before the barrier
        if (stage > 0) grid_barrier(count, unsigned(stage) * gridDim.x);
        if (after) acc = read_weights(w + size_t(stage) * words, words);
        depend(totals, stage, acc);
    }
}

float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main() {
    cudaDeviceProp props{};
    CHECK(cudaGetDeviceProperties(&props, 0));
    const int sms = props.multiProcessorCount;
    std::printf("# %s, %d multiprocessors; %d stages a step; us a stage (median of 7 steps)\n", props.name, sms,
                kStages);
    std::printf("# weights read before / after the stage's wait | bytes a stage | groups | launches | launches + PDL |"
                " persistent + grid barrier | PDL / persistent\n");
    const size_t max_bytes = size_t(16) << 20;
    uint4* w = nullptr;
    CHECK(cudaMalloc(&w, max_bytes * kStages));
    CHECK(cudaMemset(w, 1, max_bytes * kStages));
    unsigned* totals = nullptr;
    unsigned* count = nullptr;
    CHECK(cudaMalloc(&totals, kStages * sizeof(unsigned)));
    CHECK(cudaMalloc(&count, sizeof(unsigned)));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, kThreads, 0));
    for (const int after : {0, 1})
    for (const size_t bytes : {size_t(0), size_t(256) << 10, size_t(1) << 20, size_t(4) << 20, size_t(16) << 20}) {
        if (after && bytes == 0) continue;
        const size_t words = bytes / 16;
        for (const int groups_per_sm : {1, 2, 4}) {
            if (groups_per_sm > per_sm) continue;
            const int groups = groups_per_sm * sms;
            float us[3] = {0, 0, 0};
            for (int variant = 0; variant < 2; ++variant) {  // launches, launches with PDL
                cudaGraph_t graph;
                cudaGraphExec_t exec;
                CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
                CHECK(cudaMemsetAsync(totals, 0, kStages * sizeof(unsigned), stream));
                for (int stage = 0; stage < kStages; ++stage) {
                    cudaLaunchConfig_t config = {};
                    config.gridDim = dim3(unsigned(groups));
                    config.blockDim = dim3(kThreads);
                    config.stream = stream;
                    cudaLaunchAttribute attribute[1];
                    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                    attribute[0].val.programmaticStreamSerializationAllowed = 1;
                    config.attrs = attribute;
                    config.numAttrs = variant == 1 ? 1 : 0;
                    CHECK(cudaLaunchKernelEx(&config, stage_kernel, (const uint4*)w, words, totals, stage, variant, after));
                }
                CHECK(cudaStreamEndCapture(stream, &graph));
                CHECK(cudaGraphInstantiate(&exec, graph, 0));
                std::vector<float> times;
                for (int rep = 0; rep < 8; ++rep) {
                    CHECK(cudaEventRecord(start, stream));
                    CHECK(cudaGraphLaunch(exec, stream));
                    CHECK(cudaEventRecord(stop, stream));
                    CHECK(cudaEventSynchronize(stop));
                    float ms = 0;
                    CHECK(cudaEventElapsedTime(&ms, start, stop));
                    if (rep > 0) times.push_back(ms);
                }
                us[variant] = median(times) * 1000.0f / kStages;
                CHECK(cudaGraphExecDestroy(exec));
                CHECK(cudaGraphDestroy(graph));
            }
            std::vector<float> times;
            for (int rep = 0; rep < 8; ++rep) {
                CHECK(cudaMemsetAsync(totals, 0, kStages * sizeof(unsigned), stream));
                CHECK(cudaMemsetAsync(count, 0, sizeof(unsigned), stream));
                CHECK(cudaEventRecord(start, stream));
                persistent_kernel<<<groups, kThreads, 0, stream>>>(w, words, totals, count, kStages, after);
                CHECK(cudaGetLastError());
                CHECK(cudaEventRecord(stop, stream));
                CHECK(cudaEventSynchronize(stop));
                float ms = 0;
                CHECK(cudaEventElapsedTime(&ms, start, stop));
                if (rep > 0) times.push_back(ms);
            }
            us[2] = median(times) * 1000.0f / kStages;
            // Every stage's total is its group count: the dependency chain ran complete.
            std::vector<unsigned> got(kStages);
            CHECK(cudaMemcpy(got.data(), totals, got.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
            for (int s = 0; s < kStages; ++s)
                if (got[s] != unsigned(groups)) {
                    std::fprintf(stderr, "stage %d: total %u, expected %d\n", s, got[s], groups);
                    return 1;
                }
            std::printf("%-6s | %10zu | %5d | %7.2f | %7.2f | %7.2f | %.2fx\n", after ? "after" : "before", bytes, groups,
                        us[0], us[1], us[2], us[1] / us[2]);
        }
    }
    return 0;
}
