// Times the prefill attention body alone on the GPU at the two shapes that motivated the tiled
// body (512-token prompt, f16 cache): Llama-3-8B (32/8 heads, head_dim 128) and Gemma 3 270M
// (4/1 heads, head_dim 256, window 512), against the per-token body it replaced (kept here,
// verbatim, as the baseline), and checks the two agree.
//   nvcc -O3 -std=c++17 -arch=sm_90 -I cpp/include -I cpp -I . bench/cuda_attention_prefill.cu -o /tmp/pf && /tmp/pf
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/rows.h"
#include "kernels/attention.h"

// The replaced body (one group per token and KV head, one simd group per query head).
KCAP_FN void old_prefill(const KcapThread t, const KcapAttentionParams p, const kcap_i32* step, const float* q,
                         const kcap_u8* k_cache, const kcap_u8* v_cache, float* out, float* q_shared) {
    const int token = int(t.group_x);
    const int kv_head = int(t.group_y);
    const int pos = step[0] + token;
    const int first = p.window > 0 && pos - p.window + 1 > 0 ? pos - p.window + 1 : 0;
    const int group = p.n_head / p.n_head_kv;
    float* qs = q_shared + t.simd * p.head_dim;
    for (int g0 = 0; g0 < group; g0 += int(t.simds)) {
        const int g = g0 + int(t.simd);
        if (g >= group) break;
        const kcap_u64 head = kcap_u64(token) * p.n_head + kv_head * group + g;
        for (int d = int(t.lane); d < p.head_dim; d += KCAP_SIMD_WIDTH) qs[d] = q[head * p.head_dim + d];
        kcap_simd_barrier();
        float m = KCAP_NEG_INFINITY, l = 0.0f, o[KCAP_ATTN_VALUES_PER_LANE];
        KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_VALUES_PER_LANE; ++i) o[i] = 0.0f;
        kcap_attend_range(t, p, kv_head, first, pos + 1, -1, qs, k_cache, v_cache, q, q, &m, &l, o);
        const float inv = 1.0f / l;
        KCAP_UNROLL for (int i = 0; i < KCAP_ATTN_VALUES_PER_LANE; ++i) {
            const int d = int(t.lane) + KCAP_SIMD_WIDTH * i;
            if (d < p.head_dim_v) out[head * p.head_dim_v + d] = o[i] * inv;
        }
        kcap_simd_barrier();
    }
}

__global__ void __launch_bounds__(256) old_kernel(KcapAttentionParams p, const kcap_i32* step, const float* q,
                                                  const kcap_u8* k, const kcap_u8* v, float* out) {
    __shared__ float q_shared[8 * KCAP_ATTN_MAX_HEAD_DIM];
    old_prefill(kcap_cuda_thread(), p, step, q, k, v, out, q_shared);
}

__global__ void __launch_bounds__(KCAP_ATTN_PREFILL_MAX_SIMDS * 32)
    new_kernel(KcapAttentionParams p, const kcap_i32* step, const float* q, const kcap_u8* k, const kcap_u8* v, float* out) {
    __shared__ __align__(16) float shared[KCAP_ATTN_PREFILL_SHARED_FLOATS];
    kcap_attention_prefill(kcap_cuda_thread(), p, step, q, k, v, out, shared);
}

int main() {
    using namespace kcap::cuda_rows;
    struct Shape {
        const char* name;
        int n_head, n_head_kv, head_dim, window, tokens;
    } shapes[] = {{"llama3-8b", 32, 8, 128, 0, 512}, {"gemma3-270m", 4, 1, 256, 512, 512}, {"llama3-8b 2k", 32, 8, 128, 0, 2048}};
    std::mt19937 rng(1);
    std::normal_distribution<float> dist;
    for (const Shape& s : shapes) {
        KcapAttentionParams p{};
        p.n_tokens = s.tokens, p.n_head = s.n_head, p.n_head_kv = s.n_head_kv, p.head_dim = p.head_dim_v = s.head_dim;
        p.k_width = p.v_width = s.n_head_kv * s.head_dim, p.window = s.window;
        p.scale = 1.0f / std::sqrt(float(s.head_dim)), p.kv_f16 = 1, p.n_splits = 1, p.min_chunk = 64, p.append = 1;
        const size_t nq = size_t(s.tokens) * s.n_head * s.head_dim, nkv = size_t(s.tokens) * p.k_width;
        std::vector<float> q(nq);
        for (float& x : q) x = dist(rng);
        std::vector<__half> kv(2 * nkv);
        for (__half& x : kv) x = __float2half(dist(rng));
        float *dq, *d_old, *d_new;
        kcap_u8* dkv;
        int* dstep;
        cudaMalloc(&dq, nq * 4), cudaMalloc(&d_old, nq * 4), cudaMalloc(&d_new, nq * 4);
        cudaMalloc(&dkv, kv.size() * 2), cudaMalloc(&dstep, 8);
        cudaMemcpy(dq, q.data(), nq * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(dkv, kv.data(), kv.size() * 2, cudaMemcpyHostToDevice);
        cudaMemset(dstep, 0, 8);
        const int group = s.n_head / s.n_head_kv;
        const dim3 old_grid(s.tokens, s.n_head_kv), old_block(32 * (group < 8 ? group : 8));
        const dim3 new_grid(unsigned((int64_t(s.tokens) * group + attn_prefill_rows(s.head_dim) - 1) / attn_prefill_rows(s.head_dim)),
                            s.n_head_kv),
            new_block(32 * attn_prefill_simds(s.head_dim));
        cudaEvent_t a, b;
        cudaEventCreate(&a), cudaEventCreate(&b);
        float ms[2];
        for (int which = 0; which < 2; ++which) {
            for (int rep = 0; rep < 23; ++rep) {
                if (rep == 3) cudaEventRecord(a);
                if (which == 0)
                    old_kernel<<<old_grid, old_block>>>(p, dstep, dq, dkv, dkv + nkv * 2, d_old);
                else
                    new_kernel<<<new_grid, new_block>>>(p, dstep, dq, dkv, dkv + nkv * 2, d_new);
            }
            cudaEventRecord(b);
            cudaEventSynchronize(b);
            cudaEventElapsedTime(&ms[which], a, b);
            ms[which] /= 20;
        }
        std::vector<float> o_old(nq), o_new(nq);
        cudaMemcpy(o_old.data(), d_old, nq * 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(o_new.data(), d_new, nq * 4, cudaMemcpyDeviceToHost);
        double num = 0, den = 0;
        for (size_t i = 0; i < nq; ++i) num += double(o_new[i] - o_old[i]) * (o_new[i] - o_old[i]), den += double(o_old[i]) * o_old[i];
        std::printf("%-13s tokens %d: old %.1f us, tiled %.1f us (%.1fx), grid %ux%u x %u threads, rel err %.2g, %s\n", s.name,
                    s.tokens, 1000 * ms[0], 1000 * ms[1], ms[0] / ms[1], new_grid.x, new_grid.y, new_block.x,
                    std::sqrt(num / den), cudaGetErrorString(cudaGetLastError()));
        cudaFree(dq), cudaFree(d_old), cudaFree(d_new), cudaFree(dkv), cudaFree(dstep);
    }
    return 0;
}
