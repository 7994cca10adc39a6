// CUDA entry points of the mixture-of-experts rows (kernels/moe.h, kernels/matvec.h, the tiles of
// cuda/matmul_mma.cu):
//   cuda.moe_route           the router's logits (times a logit scale) over groups of experts and
//                            tokens, then one simd group per token: the top n_used, their weights
//                            (times a per-expert scale where the stage has one), into the Routing
//                            buffer on the device (no host round trip: the decode step stays one
//                            captured graph).
//   cuda.moe_route_tiled     the same from kMoeRouteTiledMinTokens tokens, the logits as a tiled
//                            matmul over slices of K (kcap_moe_logits_tiled), the slices' sums
//                            added by the top-k.
//   cuda.moe_route_cluster   (sm_90) below kMoeRouteTiledMinTokens tokens, the logits and the top-k
//                            in one launch: each group of tokens a thread-block cluster whose
//                            groups write their experts' logits into group 0's threadgroup
//                            memory, which then chooses by rank (kcap_moe_route_ranked).
//   <router row>_add_norm    a router stage with the add_norm before it (kAddNormInput): the
//                            add_norm's kernel, then the row's launches.
//   cuda.moe_route_cluster_norm  (sm_90, one token) the same in one launch: every group of the
//                            cluster adds and norms the row itself (route_cluster_norm_kernel).
//   cuda.moe_experts.<fmt>   the chosen experts' gated FFNs, slot by slot: the staged gate_up
//                            matvec of each (token, chosen expert) slot (grid y = slots, the
//                            expert's rows found from the Routing buffer in the kernel), the down
//                            matvec of each slot (the down matrix's own format), then the weighted
//                            sum per token. A call reads only the chosen experts' weights; each
//                            slot reads its expert's rows once (the few-token calls).
//   cuda.moe_experts_mma.<fmt>  grouped by expert (the batches): one group sorts the slots by
//                            expert, each expert's slots padded to whole tiles of kMmaTokens rows;
//                            the split-bf16 tensor-core tiles of matmul_mma.cu then take gate and
//                            up of every tile of one expert's rows (its weights read once per
//                            tile of rows, not once per slot), the gated activation, the down
//                            tiles in the down matrix's format, and the weighted sum reads each
//                            slot's row back. The experts' biases (gpt-oss) are added by each
//                            tile (its expert's row), its clamped SwiGLU by the activation.
//   cuda.moe_experts_q8.<fmt>  the slot matvecs with q8_1 activations (kernels/moe_q8.h: the dp4a
//                            walk of matvec_q8.h, each group rounding its slot's x, then its
//                            activations, as it stages them), for plans with activations="q8_1"
//                            whose experts' matrices all have integer products; the same sum. A
//                            down matrix of short rows (cuda_rows::moe_q8_short_down) takes
//                            kMoeQ8ShortDownRows rows per team.
//   cuda.moe_experts_q8_mma.<fmt>  grouped by expert as moe_experts_mma, on the int8 tiles of
//                            matmul_q8.cu: x rounded to q8_1 once per token, each sorted row's
//                            activations rounded to q8_1 as the gated activation writes them
//                            (q8_1 plans from kMoeGroupedMinTokens where gate, up and down all
//                            have int8 tiles).
//   All experts' rows add an ungated shared expert's output (input3) in their weighted sum where
//   the plan asks (kSharedExpertSum).
//   cuda.moe_shared_gate     out = in + sigmoid(w . x) * shared, one group per token.
#include <algorithm>
#include <type_traits>

#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include "cuda/matmul.h"
#include "cuda/mma_tiles.h"
#include "dispatch/planner.h"
#include "kernels/activation.h"
#include "kernels/group.h"
#include "kernels/moe.h"
#include "kernels/moe_q8.h"

namespace kcap {
namespace cuda {
namespace {

using namespace cuda_rows;

template <class F>
__global__ void __launch_bounds__(kMoeLogitThreads)
    logits_kernel(KcapMoeParams p, const kcap_u8* w, const float* x, float* logits, const float* bias) {
    __shared__ float xs[KCAP_MOE_LOGIT_SHARED_FLOATS];
    if (blockIdx.y == 0) kcap_moe_logits_prefetch(kcap_cuda_thread(), p, w);  // before the wait: weights never change
    pdl_wait();
    pdl_trigger();
    kcap_moe_logits<F>(kcap_cuda_thread(), p, w, x, logits, xs, bias);
}

template <class F>
__global__ void __launch_bounds__(KCAP_MOE_TILE_THREADS)
    logits_tiled_kernel(KcapMoeParams p, const kcap_u8* w, const float* x, float* partials) {
    __shared__ float shared[KCAP_MOE_TILE_SHARED_FLOATS];
    pdl_wait();
    pdl_trigger();
    kcap_moe_logits_tiled<F>(kcap_cuda_thread(), p, w, x, partials, shared);
}

__global__ void __launch_bounds__(kMoeRouteThreads)
    route_kernel(KcapMoeParams p, const float* token_logits, const float* expert_scale, float* routing,
                 const float* choice_bias, const float* logit_bias) {
    __shared__ float logits[KCAP_MOE_MAX_EXPERTS];
    pdl_wait();
    pdl_trigger();
    kcap_moe_route(kcap_cuda_thread(), p, token_logits, expert_scale, routing, logits, choice_bias, logit_bias);
}

// The address of this group's threadgroup array p in the cluster's group 0 (distributed shared
// memory, sm_90; the code for older devices is never launched: its row needs sm_90).
__device__ __forceinline__ float* cluster_group0(float* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return cooperative_groups::this_cluster().map_shared_rank(p, 0);
#else
    return p;
#endif
}

// cuda.moe_route_cluster: logits_kernel's body and the top-k in one launch. Grid: x = the
// cluster's groups (moe_route_cluster_groups), y = groups of KCAP_MOE_LOGIT_TOKENS tokens, one
// cluster each; 32 * moe_route_cluster_simds threads. The groups write their experts' logits of
// the cluster's tokens into group 0's threadgroup memory (distributed shared memory: no round
// trip through global memory) and meet at the cluster's barrier; group 0 then takes the tokens'
// top-k by rank (kcap_moe_route_ranked).
template <class F>
__global__ void __launch_bounds__(kMoeRouteClusterMaxSimds * 32, 1)
    route_cluster_kernel(KcapMoeParams p, const kcap_u8* w, const float* x, const float* bias,
                         const float* expert_scale, float* routing, const float* choice_bias) {
    static_assert(KCAP_MOE_RANKED_FLOATS(kMoeRouteClusterMaxExperts) <= KCAP_MOE_LOGIT_SHARED_FLOATS,
                  "the top-k's scores and choices fit where x was staged");
    __shared__ float xs[KCAP_MOE_LOGIT_SHARED_FLOATS];  // x staged; in group 0 then the top-k's work
    __shared__ float logits[KCAP_MOE_LOGIT_TOKENS * kMoeRouteClusterMaxExperts];  // group 0's: [tokens][n_expert]
    const KcapThread t = kcap_cuda_thread();
    if (blockIdx.y == 0) kcap_moe_logits_prefetch(t, p, w);  // before the wait: weights never change
    pdl_wait();
    pdl_trigger();
    const int token0 = int(blockIdx.y) * KCAP_MOE_LOGIT_TOKENS;
    kcap_moe_logits<F>(t, p, w, x, cluster_group0(logits), xs, bias, token0);
    cluster_sync();  // every expert's logit of the cluster's tokens is in group 0's memory
    if (blockIdx.x != 0) return;
    const int tokens = p.n_tokens - token0 < KCAP_MOE_LOGIT_TOKENS ? p.n_tokens - token0 : KCAP_MOE_LOGIT_TOKENS;
    kcap_moe_route_ranked(t, p, tokens, logits, xs, expert_scale, routing + kcap_u64(token0) * kcap_u64(2 * p.n_used),
                          choice_bias);
}

// cuda.moe_route_cluster_norm (one token): route_cluster_kernel with the add_norm before it
// (residual += branch; x = rms_norm(residual) * weight) done by every group of the cluster into
// its own threadgroup memory, in the layout kcap_moe_logits stages x in (run r at r *
// KCAP_MATVEC_RUN_STRIDE), instead of a launch of its own and a reload of x. All groups compute
// the same row in the same order. A group has at least kMoeRouteNormMinSimds simd groups for
// the norm (its loads kRouteNormBatch float4s per thread at a time); its first `simds` (as
// route_cluster_kernel's) take the experts' logits. After the cluster's barrier (every group has
// read the residual by then) the last group writes the residual and the normed row back for
// the layer's later stages while group 0 takes the top-k (a cluster of one group does both, the
// writes first: the top-k reuses its staged row's memory).
constexpr int kRouteNormBatch = 4;

// The one-token logits of an F32 router (the common case: llama.cpp keeps ffn_gate_inp in F32)
// from x staged as kcap_moe_logits stages it (run r at r * KCAP_MATVEC_RUN_STRIDE). Every simd
// group of the group takes part: expert g * simds + s of group g is taken by `sub` = (the
// group's simd groups) / simds consecutive simd groups (gpt-oss: 2 experts a group, 4 simd groups
// each), whose lanes read consecutive float4s of the row (lane l of part c: float4 c * 32 + l,
// then every 32 * sub), so every load of a simd group is 512 contiguous bytes. The first
// kRouterPreload float4s of each lane are loaded before the launch's wait (the weights never
// change) and held in registers: a Qwen3-30B-A3B row (2,048 values, one simd group an expert) and
// a gpt-oss one (2,880, four) are then read whole ahead, and after the norm the logits are
// products of registers and the staged row. kcap_moe_logits gave each lane a run of 32 values
// (one 128-byte line a lane, 32 lines a load) after the wait: 3.1 us of a Qwen3-30B-A3B decode
// router's 9.5 (bench/results/cuda_h100_router_attention_probe.txt). With groups of 16 simd
// groups and the rank of kcap_moe_rank_choice, 12-layer q8_1 decode on an H100 went from 1,298
// to 1,334 tokens/s (Qwen3-30B-A3B) and 898 to 914 (gpt-oss-20b), means of two rounds; without
// the read-ahead 1,327 and 900 (bench/results/cuda_h100_router_preload_ab.txt, docs/benchmarks.md).
constexpr int kRouterPreload = 8;  // float4s a lane loads before the wait

struct RouterF32Lane {
    const float* row;  // the expert's row; null: the simd group takes no expert
    int expert;
    int first;   // the lane's first float4 of the row
    int stride;  // float4s between the lane's
    int sub;     // simd groups per expert
    float4 pre[kRouterPreload];
};

__device__ __forceinline__ RouterF32Lane route_f32_preload(const KcapThread t, const KcapMoeParams p, int simds,
                                                           const kcap_u8* w) {
    RouterF32Lane r;
    r.sub = int(t.simds) / simds > 1 ? int(t.simds) / simds : 1;
    const int local = int(t.simd) / r.sub;
    r.expert = int(t.group_x) * simds + local;
    r.row = local < simds && r.expert < p.n_expert
                ? reinterpret_cast<const float*>(w + kcap_u64(r.expert) * p.router_row_bytes)
                : nullptr;
    r.first = (int(t.simd) % r.sub) * 32 + int(t.lane);
    r.stride = 32 * r.sub;
    const int n4 = p.k / 4;
#pragma unroll
    for (int j = 0; j < kRouterPreload; ++j) {
        const int i = r.first + j * r.stride;
        r.pre[j] = r.row && i < n4 ? kcap_load_f32x4(r.row + 4 * i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    return r;
}

// After the normed row is staged (a barrier after it): the logits of the lane's expert into group
// 0's logits. Every thread of the group calls it (a barrier inside when sub > 1).
__device__ __forceinline__ void route_logits_f32(const KcapThread t, const KcapMoeParams p, const RouterF32Lane& r,
                                                 float* logits, const float* xs, float* scratch,
                                                 const float* bias) {
    const int n4 = p.k / 4;
    const auto staged4 = [&](int i) {
        return *reinterpret_cast<const float4*>(xs + (i / 8) * KCAP_MATVEC_RUN_STRIDE + 4 * (i % 8));
    };
    float acc = 0.0f;
    if (r.row) {
        int i = r.first;
#pragma unroll
        for (int j = 0; j < kRouterPreload; ++j, i += r.stride) {
            if (i < n4) {
                const float4 a = r.pre[j], x = staged4(i);
                acc += a.x * x.x + a.y * x.y + a.z * x.z + a.w * x.w;
            }
        }
#pragma unroll 8
        for (; i < n4; i += r.stride) {
            const float4 a = kcap_load_f32x4(r.row + 4 * i), x = staged4(i);
            acc += a.x * x.x + a.y * x.y + a.z * x.z + a.w * x.w;
        }
    }
    float sum = kcap_simd_sum(acc);
    if (r.sub > 1) {  // uniform over the group
        if (t.lane == 0) scratch[t.simd] = sum;
        __syncthreads();
        if (int(t.simd) % r.sub == 0)
            for (int c = 1; c < r.sub; ++c) sum += scratch[int(t.simd) + c];
    }
    if (r.row && int(t.simd) % r.sub == 0 && t.lane == 0)
        logits[r.expert] = (bias ? sum + bias[r.expert] : sum) * p.logit_scale;
}

template <class F>
__global__ void __launch_bounds__(kMoeRouteClusterMaxSimds * 32, 1)
    route_cluster_norm_kernel(KcapMoeParams p, int simds, const kcap_u8* w, float* residual, const float* branch,
                              const float* norm_weight, float eps, float* normed, const float* bias,
                              const float* expert_scale, float* routing, const float* choice_bias) {
    static_assert(kMoeRouteNormMaxK == KCAP_MOE_LOGIT_TOKENS * KCAP_MOE_LOGIT_CHUNK_RUNS * 32,
                  "the whole row fits where kcap_moe_logits stages x");
    __shared__ __align__(16) float xs[KCAP_MOE_LOGIT_SHARED_FLOATS];
    __shared__ float logits[KCAP_MOE_LOGIT_TOKENS * kMoeRouteClusterMaxExperts];  // group 0's: [n_expert]
    __shared__ float scratch[32];
    const KcapThread t = kcap_cuda_thread();
    KcapThread experts = t;  // the simd groups that take the logits, as route_cluster_kernel's
    experts.simds = unsigned(simds);
    experts.threads = 32u * unsigned(simds);
    constexpr bool kF32 = std::is_same_v<F, KcapF32>;
    RouterF32Lane f32_lane{};
    if (kF32) f32_lane = route_f32_preload(t, p, simds, w);  // before the wait: weights never change
    else if (t.simd < experts.simds) kcap_moe_logits_prefetch(experts, p, w);
    const int n4 = p.k / 4, stride = int(t.threads);
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // The norm's weights of the thread's first batch of float4s (a row of up to kRouteNormBatch *
    // threads float4s is one batch), read before the wait as well: the norm's second pass then
    // waits on no load of its own.
    float4 g_first[kRouteNormBatch];
#pragma unroll
    for (int u = 0; u < kRouteNormBatch; ++u) {
        const int i = int(t.index) + u * stride;
        g_first[u] = i < n4 ? kcap_load_f32x4(norm_weight + 4 * i) : zero;
    }
    pdl_wait();
    pdl_trigger();
    const auto staged = [&](int i) { return xs + (i / 8) * KCAP_MATVEC_RUN_STRIDE + 4 * (i % 8); };
    // fn(i, residual + branch) for every float4 i of the row, the residual's and the branch's
    // float4s base + u * stride (u < kRouteNormBatch) loaded together: for the norm, and again
    // for the write-back.
    const auto each_sum = [&](auto&& fn) {
        for (int base = int(t.index); base < n4; base += kRouteNormBatch * stride) {
            float4 r[kRouteNormBatch], b[kRouteNormBatch];
#pragma unroll
            for (int u = 0; u < kRouteNormBatch; ++u) {
                const int i = base + u * stride;
                r[u] = i < n4 ? kcap_load_f32x4(residual + 4 * i) : zero;
                b[u] = i < n4 ? kcap_load_f32x4(branch + 4 * i) : zero;
            }
#pragma unroll
            for (int u = 0; u < kRouteNormBatch; ++u) {
                const int i = base + u * stride;
                if (i < n4) fn(i, make_float4(r[u].x + b[u].x, r[u].y + b[u].y, r[u].z + b[u].z, r[u].w + b[u].w));
            }
        }
    };
    float sq = 0.0f;
    each_sum([&](int i, float4 v) {
        float* to = staged(i);
        to[0] = v.x, to[1] = v.y, to[2] = v.z, to[3] = v.w;
        sq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    });
    const float inv = kcap_rsqrt(kcap_group_sum(t, sq, scratch) / float(p.k) + eps);
    for (int base = int(t.index); base < n4; base += kRouteNormBatch * stride) {
        float4 g[kRouteNormBatch];
#pragma unroll
        for (int u = 0; u < kRouteNormBatch; ++u) {
            const int i = base + u * stride;
            g[u] = base == int(t.index) ? g_first[u] : i < n4 ? kcap_load_f32x4(norm_weight + 4 * i) : zero;
        }
#pragma unroll
        for (int u = 0; u < kRouteNormBatch; ++u) {
            const int i = base + u * stride;
            if (i >= n4) continue;
            float* at = staged(i);
            at[0] = at[0] * inv * g[u].x, at[1] = at[1] * inv * g[u].y, at[2] = at[2] * inv * g[u].z,
            at[3] = at[3] * inv * g[u].w;
        }
    }
    __syncthreads();  // the normed row in xs for every simd group
    if (kF32)
        route_logits_f32(t, p, f32_lane, cluster_group0(logits), xs, scratch, bias);
    else if (t.simd < experts.simds)
        kcap_moe_logits<F>(experts, p, w, nullptr, cluster_group0(logits), xs, bias, 0, true);
    cluster_sync();  // every expert's logit is in group 0's memory; every group has read the residual
    if (blockIdx.x == gridDim.x - 1) {
        each_sum([&](int i, float4 v) {
            kcap_store_f32x4(residual + 4 * i, v);
            const float* from = staged(i);
            kcap_store_f32x4(normed + 4 * i, make_float4(from[0], from[1], from[2], from[3]));
        });
        __syncthreads();  // a cluster of one group: xs read before the top-k reuses it
    }
    if (blockIdx.x != 0) return;
    kcap_moe_route_ranked(t, p, 1, logits, xs, expert_scale, routing, choice_bias);
}

// The (token, chosen expert) slot blockIdx.y's gate and up matvec: act into act[slot].
template <class F, int ROWS, bool TEAMS>
__global__ void __launch_bounds__(kMatvecSimds * 32)
    experts_gate_up_kernel(KcapMoeParams moe, KcapMatmulParams p, KcapMatvecTeams teams, int chunk_runs,
                           const kcap_u8* gate, const kcap_u8* up, const float* routing, const float* x, int activation,
                           float* act, const float* gate_bias, const float* up_bias) {
    extern __shared__ float shared[];
    pdl_wait();
    pdl_trigger();
    kcap_moe_gate_up<F, ROWS, TEAMS>(kcap_cuda_thread(), moe, p, teams, chunk_runs, gate, up, routing, x, activation,
                                     act, shared, gate_bias, up_bias);
}

// The slot's down matvec into down[slot].
template <class F, int ROWS, bool TEAMS>
__global__ void __launch_bounds__(kMatvecSimds * 32)
    experts_down_kernel(KcapMoeParams moe, KcapMatmulParams p, KcapMatvecTeams teams, int chunk_runs,
                        const kcap_u8* down, const float* routing, const float* act, float* out,
                        const float* down_bias) {
    extern __shared__ float shared[];
    pdl_wait();
    pdl_trigger();
    kcap_moe_down<F, ROWS, TEAMS>(kcap_cuda_thread(), moe, p, teams, chunk_runs, down, routing, act, out, shared,
                                  down_bias);
}

// kcap_moe_gate_up_q8 / kcap_moe_down_q8 of slot blockIdx.y.
//
// Slot starts (cuda.moe_experts_q8_slot_starts: slot_done non-null): each gate/up group, once its
// activation rows are written, counts itself done in slot_done[slot] (the rows, a barrier, then
// one thread's device-scope fence and atomic add: a release, as cooperative groups' grid barrier);
// each down group waits, instead of for the whole gate/up launch, until its slot's count reaches
// the gate/up groups of a slot (a spin on the count, then a fence: the acquire). The down launch
// starts only once every gate/up group has started (programmatic dependent launch: each gate/up
// group triggers right after its own wait), so every group a down group waits for is resident or
// done and the spin ends; without programmatic launch the counts are complete before any down
// group runs. The combine's launch, after the down launch, sets the counts back to 0.
template <class F, int ROWS, bool TEAMS>
__global__ void __launch_bounds__(kMatvecQ8Simds * 32)
    experts_gate_up_q8_kernel(KcapMoeParams moe, KcapMatmulParams p, KcapMatvecTeams teams, int chunk_runs,
                              const kcap_u8* gate, const kcap_u8* up, const float* routing, const float* x,
                              int activation, float* act, const float* gate_bias, const float* up_bias,
                              int* slot_done) {
    extern __shared__ kcap_i32 q8_shared[];
    pdl_wait();
    pdl_trigger();
    kcap_moe_gate_up_q8<F, ROWS, TEAMS>(kcap_cuda_thread(), moe, p, teams, chunk_runs, gate, up, routing, x, activation,
                                        act, q8_shared, gate_bias, up_bias);
    if (slot_done) {
        __syncthreads();  // every thread's activation rows are written
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(slot_done + blockIdx.y, 1);
        }
    }
}

// The wait of a slot-starts down group: until slot_done[blockIdx.y] reaches `groups`.
__device__ __forceinline__ void wait_slot_done(const int* slot_done, int groups) {
    if (threadIdx.x == 0) {
        while (*reinterpret_cast<const volatile int*>(slot_done + blockIdx.y) < groups) __nanosleep(32);
        __threadfence();
    }
    __syncthreads();
}

// The groups per multiprocessor its registers must allow: MIN_GROUPS (the short rows' teams:
// kMoeQ8ShortDownGroups; 0, no minimum, compiles as no second bound).
template <class F, int ROWS, bool TEAMS, int MIN_GROUPS>
__global__ void __launch_bounds__(kMatvecQ8Simds * 32, MIN_GROUPS)
    experts_down_q8_kernel(KcapMoeParams moe, KcapMatmulParams p, KcapMatvecTeams teams, int chunk_runs,
                           const kcap_u8* down, const float* routing, const float* act, float* out,
                           const float* down_bias, const int* slot_done, int slot_groups) {
    extern __shared__ kcap_i32 q8_shared[];
    if (slot_done) {  // slot starts: this slot's gate/up groups, not the whole launch
        pdl_trigger();
        wait_slot_done(slot_done, slot_groups);
    } else {
        pdl_wait();
        pdl_trigger();
    }
    kcap_moe_down_q8<F, ROWS, TEAMS>(kcap_cuda_thread(), moe, p, teams, chunk_runs, down, routing, act, out, q8_shared,
                                     down_bias);
}

__global__ void __launch_bounds__(kElementwiseThreads)
    combine_kernel(KcapMoeParams p, const float* routing, const float* down, const int* slot_rows, float* out,
                   const float* shared, int* slot_done) {
    pdl_wait();
    pdl_trigger();
    // Slot starts: the counts back to 0 for the next stage (the down launch, the last to read
    // them, is done).
    if (slot_done && blockIdx.x == 0)
        for (int i = int(threadIdx.x); i < p.n_tokens * p.n_used; i += int(blockDim.x)) slot_done[i] = 0;
    kcap_moe_combine(kcap_cuda_thread(), p, routing, down, slot_rows, out, shared);
}

// The grouped experts' order (one group of kMoeSortThreads): each expert's slots get consecutive
// rows from its first tile on (an expert's slots padded to whole tiles of kMmaTokens rows, the
// experts in index order), `tiles` tiles in all (moe_grouped_tiles). Writes the source token of
// every row (-1 for padding and unused rows), the row of every slot and the expert of every
// tile (-1 past the last used one). Which of an expert's rows a slot takes depends on the order
// of the atomics, but each row's products depend only on its own token, so results do not.
__global__ void __launch_bounds__(kMoeSortThreads)
    sort_kernel(KcapMoeParams p, const float* routing, int tiles, int* rows, int* slot_rows, int* tile_expert) {
    __shared__ int count[KCAP_MOE_MAX_EXPERTS];
    __shared__ int first_row[KCAP_MOE_MAX_EXPERTS];
    pdl_wait();
    pdl_trigger();
    const int tid = int(threadIdx.x), threads = int(blockDim.x), slots = p.n_tokens * p.n_used;
    const auto expert_of = [&](int slot) {
        const int e = int(routing[kcap_u64(slot / p.n_used) * kcap_u64(2 * p.n_used) + kcap_u64(slot % p.n_used)]);
        return e >= 0 && e < p.n_expert ? e : 0;  // the router keeps ids in range; stay in bounds regardless
    };
    for (int e = tid; e < p.n_expert; e += threads) count[e] = 0;
    for (int r = tid; r < tiles * kMmaTokens; r += threads) rows[r] = -1;
    for (int t = tid; t < tiles; t += threads) tile_expert[t] = -1;
    __syncthreads();
    for (int s = tid; s < slots; s += threads) atomicAdd(&count[expert_of(s)], 1);
    __syncthreads();
    if (tid == 0) {
        int tile = 0;
        for (int e = 0; e < p.n_expert; ++e) {
            first_row[e] = tile * kMmaTokens;
            const int used = (count[e] + kMmaTokens - 1) / kMmaTokens;
            for (int j = 0; j < used; ++j) tile_expert[tile + j] = e;
            tile += used;
            count[e] = 0;
        }
    }
    __syncthreads();
    for (int s = tid; s < slots; s += threads) {
        const int e = expert_of(s);
        const int row = first_row[e] + atomicAdd(&count[e], 1);
        slot_rows[s] = row;
        rows[row] = s / p.n_used;
    }
}

// The bf16 tiles' gated activation (their down input): act(gate) * up of the grouped rows (the
// gate and up tiles' f32 sums) rounded to bf16 (nearest even, as the tiles rounded f32
// activations), 8 values a thread (ff a multiple of 32) into out ([rows][ff]). The grid covers
// every tile the host sized for (moe_grouped_tiles); a tile of -1 is one no gate or up tile
// wrote and no down tile reads, so its rows are skipped rather than read uninitialized
// (compute-sanitizer's initcheck found that read).
__global__ void __launch_bounds__(kElementwiseThreads)
    grouped_activation_bf16_kernel(long long count, int ff, int activation, const int* tile_expert, const float* gate,
                                   const float* up, float alpha, float limit, kcap_u16* out) {
    pdl_wait();
    pdl_trigger();
    const kcap_u64 i = 8 * (kcap_u64(blockIdx.x) * blockDim.x + threadIdx.x);
    if (i >= kcap_u64(count) || tile_expert[i / (kcap_u64(ff) * kMmaTokens)] < 0) return;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; j += 4) {
        const float4 g = *reinterpret_cast<const float4*>(gate + i + j);
        const float4 u = *reinterpret_cast<const float4*>(up + i + j);
        v[j] = kcap_gated(activation, g.x, u.x, alpha, limit), v[j + 1] = kcap_gated(activation, g.y, u.y, alpha, limit);
        v[j + 2] = kcap_gated(activation, g.z, u.z, alpha, limit), v[j + 3] = kcap_gated(activation, g.w, u.w, alpha, limit);
    }
    unsigned pairs[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);  // .x (even) in the low half
        pairs[j] = *reinterpret_cast<const unsigned*>(&b);
    }
    *reinterpret_cast<uint4*>(out + i) = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
}

// The split-bf16 tiles' gated activation (their down input): act(gate) * up of the grouped rows
// split into out (SplitRows [rows][ff]), a quad of values per thread; rows of unused tiles are
// skipped, as above.
__global__ void __launch_bounds__(kElementwiseThreads)
    grouped_activation_split_kernel(kcap_u64 quads, int ff, int activation, const int* tile_expert, const float* gate,
                                    const float* up, float alpha, float limit, mma_tiles::SplitRows out) {
    pdl_wait();
    pdl_trigger();
    const kcap_u64 q = kcap_u64(blockIdx.x) * blockDim.x + threadIdx.x;
    const bool in = q < quads && tile_expert[4 * q / (kcap_u64(ff) * kMmaTokens)] >= 0;  // a 16-value run's lanes agree
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (in) {
        const float4 g = *reinterpret_cast<const float4*>(gate + 4 * q);
        const float4 u = *reinterpret_cast<const float4*>(up + 4 * q);
        v[0] = kcap_gated(activation, g.x, u.x, alpha, limit), v[1] = kcap_gated(activation, g.y, u.y, alpha, limit);
        v[2] = kcap_gated(activation, g.z, u.z, alpha, limit), v[3] = kcap_gated(activation, g.w, u.w, alpha, limit);
    }
    mma_tiles::split_store_quad(v, q, in, out);  // every lane
}

// The int8 tiles' gated activation: act(gate) * up of the grouped rows rounded to q8_1
// (kcap_q8_quantize_quad: a float4 per thread, 8 lanes a run; ff a multiple of 32) into `out`,
// the int8 down tiles' input. Rows of unused tiles (-1) are skipped; the padding rows of used
// tiles (source token -1), which the int8 gate and up tiles leave unwritten, get zeros.
__global__ void __launch_bounds__(kQ8QuantizeThreads)
    grouped_activation_q8_kernel(int rows, int ff, int activation, const int* tile_expert, const int* row_tokens,
                                 const float* gate, const float* up, float alpha, float limit, Q8Rows out) {
    pdl_wait();
    pdl_trigger();
    const int quads = ff / 4;
    const int i = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
    const bool in = i < rows * quads && tile_expert[i / quads / kMmaTokens] >= 0;  // a run's 8 lanes agree
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (in && row_tokens[i / quads] >= 0) {
        const float4 g = *reinterpret_cast<const float4*>(gate + 4 * kcap_u64(i));
        const float4 u = *reinterpret_cast<const float4*>(up + 4 * kcap_u64(i));
        v = make_float4(kcap_gated(activation, g.x, u.x, alpha, limit), kcap_gated(activation, g.y, u.y, alpha, limit),
                        kcap_gated(activation, g.z, u.z, alpha, limit), kcap_gated(activation, g.w, u.w, alpha, limit));
    }
    const KcapQ8Quad q = kcap_q8_quantize_quad(v);  // every lane takes part
    if (in) kcap_q8_store_quad(q, i, out.codes, out.d, out.half_sums);
}

__global__ void __launch_bounds__(kElementwiseThreads)
    shared_gate_kernel(int width, const float* w, const float* x, const float* in, const float* shared, float* out) {
    __shared__ float partial[kElementwiseThreads / 32];
    pdl_wait();
    pdl_trigger();
    kcap_moe_shared_gate(kcap_cuda_thread(), width, w, x, in, shared, out, partial);
}

// The down matvec of every slot (Q8: on q8_1 of the activations, dp4a).
// slot_done: the slot starts' counts (Q8 only; null: the down launch waits for the gate/up launch),
// each reaching slot_groups.
template <bool Q8, class F, int ROWS, int MIN_GROUPS = 0>
void launch_experts_down_rows(const Context& ctx, KcapMatmulParams p, const KcapMoeParams& moe, const kcap_u8* down,
                              const float* routing, unsigned slots, const float* down_bias, const int* slot_done,
                              int slot_groups) {
    constexpr int kMinLanes = Q8 ? kMoeQ8MatvecMinLanes : kMoeMatvecMinLanes;
    constexpr int kSimds = Q8 ? kMatvecQ8Simds : kMatvecSimds;
    const KcapMatvecTeams teams = matvec_teams(ctx, p, ROWS, Q8 ? q8_units_per_row<F>(p.k) : p.k / 32, kMinLanes,
                                               (long long)p.n * slots, kSimds);  // one grid holds every slot
    const int chunk_runs = std::min(p.k / 32, Q8 ? kMatvecQ8ChunkRuns : kMatvecChunkRuns);
    const dim3 grid(matvec_groups(p, teams, ROWS, kSimds), slots);
    const size_t shared = size_t(Q8 ? matvec_q8_shared_words(p.k, ROWS) : matvec_shared_floats(p.k, ROWS)) * 4;
    with_matvec_body<kMinLanes>(teams.lanes, [&](auto teams_body) {
        constexpr bool TEAMS = decltype(teams_body)::value;
        const auto run = [&](auto kernel) {
            launch(ctx, kernel, grid, dim3(kSimds * 32), shared, moe, p, teams, chunk_runs, down, routing,
                   static_cast<const float*>(ctx.moe_act), ctx.moe_down, down_bias);
        };
        if constexpr (Q8)
            launch(ctx, experts_down_q8_kernel<F, ROWS, TEAMS, MIN_GROUPS>, grid, dim3(kSimds * 32), shared, moe, p,
                   teams, chunk_runs, down, routing, static_cast<const float*>(ctx.moe_act), ctx.moe_down, down_bias,
                   slot_done, slot_groups);
        else
            run(experts_down_kernel<F, ROWS, TEAMS>);
    });
}

// Its rows per team by the stage's shape: with Q8, kMoeQ8ShortDownRows for short rows.
template <bool Q8, class F>
void launch_experts_down_of(const Context& ctx, const KcapMatmulParams& p, const KcapMoeParams& moe, const kcap_u8* down,
                            const float* routing, unsigned slots, const float* down_bias, const int* slot_done,
                            int slot_groups) {
    if constexpr (Q8) {
        constexpr int kShortRows = std::is_same<F, KcapQ6_K>::value ? kMoeQ8ShortDownRowsQ6_K : kMoeQ8ShortDownRows;
        if (moe_q8_short_down(q8_units_per_row<F>(p.k)))
            return launch_experts_down_rows<true, F, kShortRows, kMoeQ8ShortDownGroups>(
                ctx, p, moe, down, routing, slots, down_bias, slot_done, slot_groups);
        return launch_experts_down_rows<true, F, kMoeQ8DownRows>(ctx, p, moe, down, routing, slots, down_bias,
                                                                  slot_done, slot_groups);
    } else {
        return launch_experts_down_rows<false, F, kMatvecRows>(ctx, p, moe, down, routing, slots, down_bias, nullptr,
                                                                0);
    }
}

// The down matvec of every slot in the down matrix's format (fixed per stage; Q8: one with
// integer products).
template <bool Q8>
void launch_experts_down(const Context& ctx, const Stage& stage, const KcapMoeParams& moe, const kcap_u8* down,
                         const float* routing, unsigned slots, const float* down_bias,
                         const int* slot_done = nullptr, int slot_groups = 0) {
    KcapMatmulParams p{};
    p.k = moe.ff;
    p.n = moe.n;
    p.m = 1;
    p.has_bias = down_bias != nullptr;
    const Format format = stage.operands[2]->format;
    p.row_bytes = unsigned(row_bytes(format, moe.ff));
#define KCAP_MOE_DOWN_CASE(NAME, DECODER) \
    case Format::NAME:                    \
        return launch_experts_down_of<Q8, DECODER>(ctx, p, moe, down, routing, slots, down_bias, slot_done, slot_groups);
    if constexpr (Q8) {
        switch (format) {
            KCAP_Q8_WEIGHT_FORMATS(KCAP_MOE_DOWN_CASE)
            default: break;
        }
    } else {
        switch (format) {
            KCAP_WEIGHT_FORMATS(KCAP_MOE_DOWN_CASE)
            default: break;
        }
    }
#undef KCAP_MOE_DOWN_CASE
    throw Error(std::string(Q8 ? "cuda.moe_experts_q8: no q8_1 body for " : "cuda.moe_experts: no body for ") +
                format_name(format));
}

// The experts' gate (and up) matmul: K = the model's width, N = the FFN width, rows of FORMAT;
// one row of x (the slot matvecs; the grouped tiles set their rows).
KcapMatmulParams experts_gate_up_params(const KcapMoeParams& moe, Format format) {
    KcapMatmulParams p{};
    p.k = moe.k;
    p.n = moe.ff;
    p.m = 1;
    p.row_bytes = unsigned(row_bytes(format, moe.k));
    return p;
}

// The weighted sum of each token's slots from ctx.moe_down (slot_rows: the row of each slot
// there, the grouped rows' order; null: the slots in order), plus the shared expert's output
// (input3) where the stage adds it; slot_done: the slot starts' counts, set back to 0.
void launch_experts_combine(const Context& ctx, const Stage& stage, const KernelCall& call, const KcapMoeParams& moe,
                            const int* slot_rows, int* slot_done = nullptr) {
    const int64_t outputs = int64_t(moe.n_tokens) * moe.n;
    launch(ctx, combine_kernel, dim3(ceil_div(outputs, kElementwiseThreads)), dim3(kElementwiseThreads), 0, moe,
           call.in2, static_cast<const float*>(ctx.moe_down), slot_rows, call.out,
           (stage.features & kSharedExpertSum) ? call.in3 : nullptr, slot_done);
}

template <class F, int ROWS>
void launch_experts_gate_up(const Context& ctx, const Stage& stage, const KernelCall& call, const StageData& data,
                            const KcapMoeParams& moe, KcapMatmulParams p, unsigned slots) {
    const KcapMatvecTeams teams = matvec_teams(ctx, p, ROWS, p.k / 32, kMoeMatvecMinLanes, (long long)p.n * slots);
    const int chunk_runs = std::min(p.k / 32, kMatvecChunkRuns);
    with_matvec_body<kMoeMatvecMinLanes>(teams.lanes, [&](auto teams_body) {
        launch(ctx, experts_gate_up_kernel<F, ROWS, decltype(teams_body)::value>,
               dim3(matvec_groups(p, teams, ROWS), slots), dim3(kMatvecSimds * 32),
               size_t(matvec_shared_floats(p.k, ROWS)) * 4, moe, p, teams, chunk_runs,
               static_cast<const kcap_u8*>(data.operands[0]), static_cast<const kcap_u8*>(data.operands[1]), call.in2,
               call.in, int(stage.params.activation), ctx.moe_act, static_cast<const float*>(data.operands[3]),
               static_cast<const float*>(data.operands[4]));
    });
}

}  // namespace
}  // namespace cuda

namespace {

// A router stage's operands (cuda/rows.cpp): its weight, the per-expert scale vector (F32, where
// the stage has one), its bias and the choice bias (F32, or null).
struct RouterOperands {
    const kcap_u8* w;
    const float* expert_scale;
    const float* bias;
    const float* choice_bias;
};
RouterOperands router_operands(const cuda::StageData& data, const KcapMoeParams& p) {
    return {static_cast<const kcap_u8*>(data.operands[0]),
            p.expert_scaled ? static_cast<const float*>(data.operands[1]) : nullptr,
            static_cast<const float*>(data.operands[2]), static_cast<const float*>(data.operands[3])};
}

// The router's logits into ctx.moe_logits (TILED: kcap_moe_logits_tiled's partial sums over
// slices of K, which the top-k adds with the bias and logit scale), then its top-k.
template <bool TILED>
void moe_route(const Stage& stage, const KernelCall& call) {
    using namespace cuda_rows;
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    KcapMoeParams p = moe_params(stage, call.n_tokens);
    p.logit_splits = TILED ? kcap_moe_tile_splits(p.k) : 0;
    const auto [w, expert_scale, bias, choice_bias] = router_operands(data, p);
    const dim3 grid = TILED ? dim3(unsigned(cuda::ceil_div(p.n_expert, KCAP_MOE_TILE) * p.logit_splits),
                                   cuda::ceil_div(p.n_tokens, KCAP_MOE_TILE))
                            : dim3(cuda::ceil_div(p.n_expert, kMoeLogitThreads / 32 * KCAP_MOE_LOGIT_EXPERTS),
                                   cuda::ceil_div(p.n_tokens, KCAP_MOE_LOGIT_TOKENS));
    switch (stage.operands[0]->format) {
#define KCAP_MOE_LOGITS_CASE(NAME, DECODER)                                                                       \
    case Format::NAME:                                                                                            \
        if (TILED)                                                                                                \
            cuda::launch(ctx, cuda::logits_tiled_kernel<DECODER>, grid, dim3(KCAP_MOE_TILE_THREADS), 0, p, w,     \
                         call.in, ctx.moe_logits);                                                                \
        else                                                                                                      \
            cuda::launch(ctx, cuda::logits_kernel<DECODER>, grid, dim3(kMoeLogitThreads), 0, p, w, call.in,       \
                         ctx.moe_logits, bias);                                                                   \
        break;
        KCAP_WEIGHT_FORMATS(KCAP_MOE_LOGITS_CASE)
#undef KCAP_MOE_LOGITS_CASE
        default: throw Error(std::string("cuda.moe_route: no body for ") + format_name(stage.operands[0]->format));
    }
    cuda::launch(ctx, cuda::route_kernel, dim3(unsigned(p.n_tokens)), dim3(kMoeRouteThreads), 0, p,
                 static_cast<const float*>(ctx.moe_logits), expert_scale, call.out,
                 choice_bias, TILED ? bias : nullptr);  // the tiled logits' bias, added to their sum
}

// cuda.moe_route_cluster: the logits and the top-k in one launch of clusters (route_cluster_kernel).
template <class F>
void moe_route_cluster(const cuda::Context& ctx, const KcapMoeParams& p, const kcap_u8* w, const float* x,
                       const float* bias, const float* expert_scale, float* routing, const float* choice_bias) {
    using namespace cuda_rows;
    // Clusters of more than 8 groups are sm_90's non-portable size: each kernel opts in once.
    static const cudaError_t allowed =
        cudaFuncSetAttribute(cuda::route_cluster_kernel<F>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    KCAP_CUDA_CHECK(allowed);
    const unsigned groups = unsigned(moe_route_cluster_groups(p.n_expert));
    cuda::launch_clusters(ctx, groups, cuda::route_cluster_kernel<F>,
                          dim3(groups, cuda::ceil_div(p.n_tokens, KCAP_MOE_LOGIT_TOKENS)),
                          dim3(unsigned(32 * moe_route_cluster_simds(p.n_expert))), 0, p, w, x, bias, expert_scale,
                          routing, choice_bias);
}

}  // namespace

void kcap_cuda_moe_route(const Stage& stage, const KernelCall& call) { moe_route<false>(stage, call); }
void kcap_cuda_moe_route_tiled(const Stage& stage, const KernelCall& call) { moe_route<true>(stage, call); }

void kcap_cuda_moe_route_cluster(const Stage& stage, const KernelCall& call) {
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    const KcapMoeParams p = moe_params(stage, call.n_tokens);
    const auto [w, expert_scale, bias, choice_bias] = router_operands(data, p);
    switch (stage.operands[0]->format) {
#define KCAP_MOE_ROUTE_CLUSTER_CASE(NAME, DECODER)                                                  \
    case Format::NAME:                                                                             \
        moe_route_cluster<DECODER>(ctx, p, w, call.in, bias, expert_scale, call.out, choice_bias); \
        break;
        KCAP_WEIGHT_FORMATS(KCAP_MOE_ROUTE_CLUSTER_CASE)
#undef KCAP_MOE_ROUTE_CLUSTER_CASE
        default:
            throw Error(std::string("cuda.moe_route_cluster: no body for ") + format_name(stage.operands[0]->format));
    }
}

namespace {

// A router stage with the add_norm before it (kAddNormInput): that add_norm's kernel (residual
// call.inout2 += branch call.in2; normed call.inout3 = rms_norm(residual) * operand 4), then
// `route` on the normed rows.
void route_after_add_norm(const Stage& stage, const KernelCall& call, void (*route)(const Stage&, const KernelCall&)) {
    const cuda::StageData& data = cuda::stage_data(call);
    Stage add;
    add.op = Op::AddNorm;
    add.layer = stage.layer;
    add.name = stage.name;
    add.operands = {nullptr, nullptr, stage.operands[4], nullptr};
    add.k = add.n = stage.k;
    add.params.eps = stage.params.eps;
    add.features = kRmsNorm;
    cuda::StageData add_data = data;
    add_data.operands[0] = add_data.operands[1] = add_data.operands[3] = nullptr;
    add_data.operands[2] = data.operands[4];
    KernelCall add_call = call;
    add_call.stage_state = &add_data;
    add_call.out = call.inout3;
    kcap_cuda_add_norm<false>(add, add_call);
    KernelCall route_call = call;
    route_call.in = call.inout3;
    route(stage, route_call);
}

}  // namespace

void kcap_cuda_moe_route_add_norm(const Stage& stage, const KernelCall& call) {
    route_after_add_norm(stage, call, kcap_cuda_moe_route);
}
void kcap_cuda_moe_route_tiled_add_norm(const Stage& stage, const KernelCall& call) {
    route_after_add_norm(stage, call, kcap_cuda_moe_route_tiled);
}
void kcap_cuda_moe_route_cluster_add_norm(const Stage& stage, const KernelCall& call) {
    route_after_add_norm(stage, call, kcap_cuda_moe_route_cluster);
}

void kcap_cuda_moe_route_cluster_norm(const Stage& stage, const KernelCall& call) {
    using namespace cuda_rows;
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    const KcapMoeParams p = moe_params(stage, call.n_tokens);
    const auto [w, expert_scale, bias, choice_bias] = router_operands(data, p);
    const auto* norm_weight = static_cast<const float*>(data.operands[4]);
    const unsigned groups = unsigned(moe_route_cluster_groups(p.n_expert));
    const int simds = moe_route_cluster_simds(p.n_expert);
    const dim3 grid(groups, 1), block(unsigned(32 * std::max(simds, kMoeRouteNormMinSimds)));
    switch (stage.operands[0]->format) {
#define KCAP_MOE_ROUTE_NORM_CASE(NAME, DECODER)                                                                      \
    case Format::NAME: {                                                                                             \
        static const cudaError_t allowed = cudaFuncSetAttribute(cuda::route_cluster_norm_kernel<DECODER>,            \
                                                                cudaFuncAttributeNonPortableClusterSizeAllowed, 1); \
        KCAP_CUDA_CHECK(allowed);                                                                                    \
        cuda::launch_clusters(ctx, groups, cuda::route_cluster_norm_kernel<DECODER>, grid, block, 0, p, simds, w,   \
                              call.inout2, static_cast<const float*>(call.in2), norm_weight, stage.params.eps,       \
                              call.inout3, bias, expert_scale, call.out, choice_bias);                               \
        break;                                                                                                       \
    }
        KCAP_WEIGHT_FORMATS(KCAP_MOE_ROUTE_NORM_CASE)
#undef KCAP_MOE_ROUTE_NORM_CASE
        default:
            throw Error(std::string("cuda.moe_route_cluster_norm: no body for ") + format_name(stage.operands[0]->format));
    }
}

template <Format FORMAT>
void kcap_cuda_moe_experts(const Stage& stage, const KernelCall& call) {
    using namespace cuda_rows;
    using F = cuda::Decoder<FORMAT>;
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    const KcapMoeParams moe = moe_params(stage, call.n_tokens);
    const unsigned slots = unsigned(moe.n_tokens * moe.n_used);
    const KcapMatmulParams p = cuda::experts_gate_up_params(moe, FORMAT);
    // The gate and up matvecs, then the down (the experts' biases, F32, operands 3-5 (gpt-oss),
    // or null).
    cuda::launch_experts_gate_up<F, kMatvecRows>(ctx, stage, call, data, moe, p, slots);
    cuda::launch_experts_down<false>(ctx, stage, moe, static_cast<const kcap_u8*>(data.operands[2]), call.in2, slots,
                              static_cast<const float*>(data.operands[5]));
    cuda::launch_experts_combine(ctx, stage, call, moe, nullptr);
}

// The slot matvecs with q8_1 activations (gate and up in FORMAT, down in its own format), then
// the weighted sum as kcap_cuda_moe_experts; SLOT_STARTS: each slot's down groups start when that
// slot's gate/up groups are done (experts_gate_up_q8_kernel).
namespace {

template <Format FORMAT, bool SLOT_STARTS>
void moe_experts_q8(const Stage& stage, const KernelCall& call) {
    using namespace cuda_rows;
    using F = cuda::Decoder<FORMAT>;
    const cuda::Context& ctx = cuda::context(call);
    const cuda::StageData& data = cuda::stage_data(call);
    const KcapMoeParams moe = moe_params(stage, call.n_tokens);
    const unsigned slots = unsigned(moe.n_tokens * moe.n_used);
    const KcapMatmulParams p = cuda::experts_gate_up_params(moe, FORMAT);
    constexpr int ROWS = kMoeQ8GateUpRows;
    const KcapMatvecTeams teams = cuda::matvec_teams(ctx, p, ROWS, cuda::q8_units_per_row<F>(p.k), kMoeQ8MatvecMinLanes,
                                                     (long long)p.n * slots, kMatvecQ8Simds);
    const int chunk_runs = std::min(p.k / 32, kMatvecQ8ChunkRuns);
    const unsigned groups = cuda::matvec_groups(p, teams, ROWS, kMatvecQ8Simds);  // per slot
    int* slot_done = nullptr;
    if (SLOT_STARTS) {
        if (!ctx.moe_slot_done || size_t(slots) > ctx.moe_slot_done_capacity)
            throw Error("cuda.moe_experts_q8_slot_starts: " + std::to_string(slots) + " slots exceed the " +
                        std::to_string(ctx.moe_slot_done_capacity) + " counts planned");
        slot_done = ctx.moe_slot_done;
    }
    with_matvec_body<kMoeQ8MatvecMinLanes>(teams.lanes, [&](auto teams_body) {
        cuda::launch(ctx, cuda::experts_gate_up_q8_kernel<F, ROWS, decltype(teams_body)::value>, dim3(groups, slots),
                     dim3(kMatvecQ8Simds * 32), size_t(matvec_q8_shared_words(p.k, ROWS)) * 4, moe, p, teams,
                     chunk_runs, static_cast<const kcap_u8*>(data.operands[0]),
                     static_cast<const kcap_u8*>(data.operands[1]), call.in2, call.in, int(stage.params.activation),
                     ctx.moe_act, static_cast<const float*>(data.operands[3]),
                     static_cast<const float*>(data.operands[4]), slot_done);
    });
    cuda::launch_experts_down<true>(ctx, stage, moe, static_cast<const kcap_u8*>(data.operands[2]), call.in2, slots,
                                 static_cast<const float*>(data.operands[5]), slot_done, int(groups));
    cuda::launch_experts_combine(ctx, stage, call, moe, nullptr, slot_done);
}

}  // namespace

template <Format FORMAT>
void kcap_cuda_moe_experts_q8(const Stage& stage, const KernelCall& call) {
    moe_experts_q8<FORMAT, false>(stage, call);
}

template <Format FORMAT>
void kcap_cuda_moe_experts_q8_slot_starts(const Stage& stage, const KernelCall& call) {
    moe_experts_q8<FORMAT, true>(stage, call);
}

namespace cuda {
namespace {

// Grouped by expert: the sort, gate and up tiles of the sorted rows (x read through each row's
// source token), the gated activation, the down tiles (the down matrix's format) and the
// weighted sum of each token's slot rows, on one of three kinds of tiles: split-bf16 (exact
// plans), int8 on q8_1 activations (x rounded once per token, the activations per sorted row as
// the activation writes them), or bf16(W) . bf16(x) (bf16 plans: x rounded to bf16 once, the
// activation writes its values rounded to bf16). The split-bf16 tiles too read x and the
// activations split ahead (SplitRows), once, instead of splitting them in every row tile.
enum class GroupedTiles { SplitBf16, Q8, Bf16Rounded };

template <GroupedTiles TILES>
void moe_experts_grouped(Format format, const Stage& stage, const KernelCall& call) {
    constexpr bool Q8 = TILES == GroupedTiles::Q8;
    using namespace cuda_rows;
    namespace tiles = mma_tiles;
    const Context& ctx = context(call);
    const StageData& data = stage_data(call);
    const KcapMoeParams moe = moe_params(stage, call.n_tokens);
    const int64_t slots = int64_t(moe.n_tokens) * moe.n_used;
    const int n_tiles = int(moe_grouped_tiles(slots, moe.n_expert, kMmaTokens));
    const int rows = n_tiles * kMmaTokens;
    launch(ctx, sort_kernel, dim3(1), dim3(kMoeSortThreads), 0, moe, call.in2, n_tiles, ctx.moe_rows, ctx.moe_slot_rows,
           ctx.moe_tile_expert);
    // Gate and up: rows x ff each, from the expert's gate (and up) rows.
    KcapMatmulParams p = experts_gate_up_params(moe, format);
    p.m = rows;
    const kcap_u64 expert_rows = kcap_u64(moe.gate_up_merged ? 2 * moe.ff : moe.ff);
    const auto* gate = static_cast<const kcap_u8*>(data.operands[0]);
    const auto* up = static_cast<const kcap_u8*>(data.operands[1]) +
                     (moe.gate_up_merged ? kcap_u64(moe.ff) * p.row_bytes : kcap_u64(0));
    // The experts' biases (F32 [n_expert][rows], gpt-oss: operands 3-5), or null: each tile adds
    // its expert's row.
    const auto* gate_bias = static_cast<const float*>(data.operands[3]);
    const auto* up_bias = static_cast<const float*>(data.operands[4]);
    const auto* down_bias = static_cast<const float*>(data.operands[5]);
    KcapMatmulParams pu = p;
    p.has_bias = gate_bias != nullptr;
    pu.has_bias = up_bias != nullptr;
    tiles::MmaGroup g = tiles::mma_group(p, gate, gate_bias, ctx.moe_act);
    tiles::mma_group_add(g, pu, up, up_bias, ctx.moe_up);
    g.tile_expert = ctx.moe_tile_expert;
    g.x_rows = ctx.moe_rows;
    g.live_rows = ctx.moe_rows;
    g.expert_bytes = expert_rows * p.row_bytes;
    // The bf16 and split-bf16 tiles' inputs (moe_bf16): the tokens' x, then the sorted rows'
    // activations, in bf16 (bf16 tiles) or split (split-bf16 tiles: SplitRows).
    const bool bf16_tiles = TILES == GroupedTiles::Bf16Rounded;
    kcap_u16* x16 = ctx.moe_bf16;
    const int64_t x_values = bf16_tiles ? int64_t(moe.n_tokens) * moe.k : split_rows_values(moe.n_tokens, moe.k);
    const int64_t act_values = bf16_tiles ? int64_t(rows) * moe.ff : split_rows_values(rows, moe.ff);
    kcap_u16* act16 = x16 + x_values;
    if (!Q8 && (!x16 || size_t(x_values + act_values) > ctx.moe_bf16_capacity))
        throw Error(std::string(bf16_tiles ? "cuda.moe_experts_bf16_mma" : "cuda.moe_experts_mma") +
                    ": the experts' input scratch is missing or too small for " + std::to_string(moe.n_tokens) + " tokens");
    const tiles::SplitRows x_split = tiles::split_rows_layout(x16, moe.n_tokens, moe.k);
    const tiles::SplitRows act_split = tiles::split_rows_layout(act16, rows, moe.ff);
    if constexpr (Q8) {
        quantize_into_scratch(ctx, moe.n_tokens, moe.k, call.in);
        tiles::mma_group_q8(ctx, format, g, q8_rows_layout(ctx, moe.n_tokens, moe.k));
    } else if constexpr (TILES == GroupedTiles::Bf16Rounded) {
        tiles::convert_bf16(ctx, call.in, (long long)moe.n_tokens * moe.k, x16);
        tiles::mma_group_bf16_rounded(ctx, format, g, x16);
    } else {
        tiles::split_bf16(ctx, call.in, moe.n_tokens, moe.k, x_split);
        g.x_split = x_split;
        tiles::mma_group_bf16(ctx, format, g, nullptr);
    }
    const int activation = int(stage.params.activation);
    Q8Rows act_q8{};
    if constexpr (Q8) {
        act_q8 = q8_rows_in(ctx.moe_q8, ctx.moe_q8_capacity, rows, moe.ff);
        launch(ctx, grouped_activation_q8_kernel, dim3(ceil_div(int64_t(rows) * (moe.ff / 4), kQ8QuantizeThreads)),
               dim3(kQ8QuantizeThreads), 0, rows, int(moe.ff), activation, static_cast<const int*>(ctx.moe_tile_expert),
               static_cast<const int*>(ctx.moe_rows), static_cast<const float*>(ctx.moe_act),
               static_cast<const float*>(ctx.moe_up), stage.params.swiglu_alpha, stage.params.swiglu_limit, act_q8);
    } else if constexpr (TILES == GroupedTiles::Bf16Rounded) {
        const long long count = (long long)rows * moe.ff;
        launch(ctx, grouped_activation_bf16_kernel, dim3(ceil_div(count / 8, kElementwiseThreads)),
               dim3(kElementwiseThreads), 0, count, int(moe.ff), activation,
               static_cast<const int*>(ctx.moe_tile_expert), static_cast<const float*>(ctx.moe_act),
               static_cast<const float*>(ctx.moe_up), stage.params.swiglu_alpha, stage.params.swiglu_limit, act16);
    } else {
        const kcap_u64 quads = kcap_u64(rows) * kcap_u64(moe.ff / 4);
        launch(ctx, grouped_activation_split_kernel, dim3(unsigned(ceil_div(int64_t(quads), kElementwiseThreads))),
               dim3(kElementwiseThreads), 0, quads, int(moe.ff), activation, static_cast<const int*>(ctx.moe_tile_expert),
               static_cast<const float*>(ctx.moe_act), static_cast<const float*>(ctx.moe_up), stage.params.swiglu_alpha,
               stage.params.swiglu_limit, act_split);
    }
    // Down: rows x n from the expert's down rows, on the activations in sorted order.
    const Format down_format = stage.operands[2]->format;
    KcapMatmulParams d{};
    d.k = moe.ff;
    d.n = moe.n;
    d.m = rows;
    d.row_bytes = unsigned(row_bytes(down_format, moe.ff));
    d.has_bias = down_bias != nullptr;
    tiles::MmaGroup dg = tiles::mma_group(d, static_cast<const kcap_u8*>(data.operands[2]), down_bias, ctx.moe_down);
    dg.tile_expert = ctx.moe_tile_expert;
    dg.live_rows = ctx.moe_rows;
    dg.expert_bytes = kcap_u64(moe.n) * d.row_bytes;
    if constexpr (Q8) tiles::mma_group_q8(ctx, down_format, dg, act_q8);
    else if constexpr (TILES == GroupedTiles::Bf16Rounded) tiles::mma_group_bf16_rounded(ctx, down_format, dg, act16);
    else {
        dg.x_split = act_split;
        tiles::mma_group_bf16(ctx, down_format, dg, nullptr);
    }
    launch_experts_combine(ctx, stage, call, moe, static_cast<const int*>(ctx.moe_slot_rows));
}

}  // namespace
}  // namespace cuda

template <Format FORMAT>
void kcap_cuda_moe_experts_mma(const Stage& stage, const KernelCall& call) {
    cuda::moe_experts_grouped<cuda::GroupedTiles::SplitBf16>(FORMAT, stage, call);
}

// The grouped experts of a bf16 plan, on bf16(W) . bf16(x).
template <Format FORMAT>
void kcap_cuda_moe_experts_bf16_mma(const Stage& stage, const KernelCall& call) {
    cuda::moe_experts_grouped<cuda::GroupedTiles::Bf16Rounded>(FORMAT, stage, call);
}

// The grouped experts on the int8 tiles (q8_1 plans whose experts' matrices all have them).
template <Format FORMAT>
void kcap_cuda_moe_experts_q8_mma(const Stage& stage, const KernelCall& call) {
    cuda::moe_experts_grouped<cuda::GroupedTiles::Q8>(FORMAT, stage, call);
}

#define KCAP_INSTANTIATE_MOE(NAME, DECODER)                                                      \
    template void kcap_cuda_moe_experts<Format::NAME>(const Stage&, const KernelCall&);         \
    template void kcap_cuda_moe_experts_mma<Format::NAME>(const Stage&, const KernelCall&);      \
    template void kcap_cuda_moe_experts_bf16_mma<Format::NAME>(const Stage&, const KernelCall&);
KCAP_WEIGHT_FORMATS(KCAP_INSTANTIATE_MOE)
#undef KCAP_INSTANTIATE_MOE
#define KCAP_INSTANTIATE_MOE_Q8(NAME, DECODER)                                                     \
    template void kcap_cuda_moe_experts_q8<Format::NAME>(const Stage&, const KernelCall&);        \
    template void kcap_cuda_moe_experts_q8_slot_starts<Format::NAME>(const Stage&, const KernelCall&); \
    template void kcap_cuda_moe_experts_q8_mma<Format::NAME>(const Stage&, const KernelCall&);
KCAP_Q8_WEIGHT_FORMATS(KCAP_INSTANTIATE_MOE_Q8)
#undef KCAP_INSTANTIATE_MOE_Q8

void kcap_cuda_moe_shared_gate(const Stage& stage, const KernelCall& call) {
    const cuda::StageData& data = cuda::stage_data(call);
    cuda::launch(cuda::context(call), cuda::shared_gate_kernel, dim3(unsigned(call.n_tokens)),
                 dim3(cuda_rows::kElementwiseThreads), 0, int(stage.n), static_cast<const float*>(data.operands[0]),
                 call.in3, call.in, call.in2, call.out);
}

}  // namespace kcap
