// The CUDA backend's capability rows, declared once.
//
// Each kernel is one line in a list below. cuda/rows.cpp (plain C++, compiled in every build)
// expands the lists into capability rows, so any machine can plan and explain for CUDA; the
// .cu entry files expand the same lists into the launchers the rows point at. The tuning
// constants (geometry) sit here too, and both the rows and the launchers read them, so a
// row's declared geometry is the geometry its launcher uses.
#pragma once

#include "dispatch/capability.h"
#include "kernels/formats_list.h"

namespace kcap {

struct Stage;
struct KernelCall;

namespace cuda_rows {

// Matmul, exact (f32 activations): decode matvec and the few-token walk.
constexpr int kMatvecSimds = 4;  // simd groups (warps) per group
constexpr int kMatvecRows = 2;   // weight rows per team: each lane's 32 activations are reused this often
// A row's runs of 32 weights are spread over `split` simd groups (1, 2, 4 .. kMatvecSimds):
// the most that still gives every lane at least kMatvecMinRunsPerLane runs, so long rows
// (K = 4096: 128 runs) use the whole group and short ones (K = 640) one simd group each.
constexpr int kMatvecMinRunsPerLane = 1;
constexpr int matvec_split(long long k) {
    int split = kMatvecSimds;
    while (split > 1 && k / 32 < (long long)split * 32 * kMatvecMinRunsPerLane) split /= 2;
    return split;
}
constexpr int kMatvecSharedBytes = kMatvecSimds * kMatvecRows * 4;  // the teams' partial sums
constexpr int kTokensSimds = 4;
constexpr int kTokensRows = 2;
constexpr int kTokensPerPass = 8;  // tokens that reuse one decoded run of weights
// Matmul, tensor cores (TF32 mma.sync, CUDA only): prefill tiles.
constexpr int kMmaTokens = 64;     // tokens per tile
constexpr int kMmaRows = 64;       // weight rows per tile
constexpr int kMmaThreads = 128;   // 4 warps, each 32 tokens x 32 rows
constexpr int kMmaMinTokens = 16;  // fewer tokens take the few-token walk
// Norm: one group per row.
constexpr int kNormThreads = 256;
// Attention: one simd group per query head of a KV head; decode splits keys over groups.
constexpr int kAttnMaxSimds = 8;
constexpr int kAttnMinChunk = 64;  // fewest keys per decode split (a multiple of 32)
constexpr int kAttnSplitsPerSm = 4;  // decode grid: at most this many groups per multiprocessor
// Elementwise, rope, KV append: one thread per value.
constexpr int kElementwiseThreads = 256;
// Argmax: first-pass groups cover this many logits each.
constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxChunk = 4096;
constexpr int kEmbedThreads = 128;

}  // namespace cuda_rows

// Launchers, one per row (defined in cuda/*.cu; absent where CUDA is not compiled in).
#define KCAP_CUDA_DECLARE_FORMAT_LAUNCHERS(NAME, DECODER)                   \
    void kcap_cuda_matmul_##NAME(const Stage& stage, const KernelCall& call);     \
    void kcap_cuda_matmul_mma_##NAME(const Stage& stage, const KernelCall& call); \
    void kcap_cuda_embed_##NAME(const Stage& stage, const KernelCall& call);       \
    void kcap_cuda_per_layer_embed_##NAME(const Stage& stage, const KernelCall& call);
KCAP_WEIGHT_FORMATS(KCAP_CUDA_DECLARE_FORMAT_LAUNCHERS)
#undef KCAP_CUDA_DECLARE_FORMAT_LAUNCHERS

void kcap_cuda_norm(const Stage& stage, const KernelCall& call);
void kcap_cuda_rope(const Stage& stage, const KernelCall& call);
void kcap_cuda_attention(const Stage& stage, const KernelCall& call);
void kcap_cuda_ffn_activation(const Stage& stage, const KernelCall& call);
void kcap_cuda_add(const Stage& stage, const KernelCall& call);
void kcap_cuda_softcap(const Stage& stage, const KernelCall& call);
void kcap_cuda_scale(const Stage& stage, const KernelCall& call);
void kcap_cuda_argmax(const Stage& stage, const KernelCall& call);
void kcap_cuda_per_layer_gate(const Stage& stage, const KernelCall& call);

}  // namespace kcap
