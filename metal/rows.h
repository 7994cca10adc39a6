// The Metal backend's capability rows, their geometry and their entry points, declared once.
//
// Three readers, one declaration:
//   metal/rows.cpp   (plain C++, every build)  expands the rows into the capability table, so
//                                               any machine can plan and explain for Metal;
//   metal/*.mm       (Objective-C++, Apple)     looks up each row's entry points by name and
//                                               dispatches with the geometry below;
//   metal/*.metal    (MSL, and the Linux check) instantiates the kernels under the same names
//                                               and sizes their threadgroup memory from the
//                                               same constants.
// So this header has two parts: preprocessor text and enumerators that MSL can read (the
// kernels include it), and the C++ declarations, hidden from MSL (which has no <string>).
//
// Every Metal row mirrors a CUDA row whose body lives in kernels/ and is exercised on the H200
// and on the CPU (tests/cpp/test_cuda_kernels_host.cpp); the constants equal cuda/rows.h's
// where the body's shape depends on them (kMatvecRows, kTokensPerPass), so the exact order of
// every sum is the order CUDA's tests checked.
#pragma once

#include "kernels/formats_list.h"

namespace kcap {
namespace metal_rows {

// Enumerators, not constexpr variables: MSL puts program-scope variables in an address space,
// enumerators are plain constants in both languages.
enum : int {
    kSimdWidth = 32,  // KCAP_SIMD_WIDTH of kernels/dialect.h (static_assert in metal/matmul.metal)
    // Matmul, exact (f32 activations): the decode matvec and the few-token walk.
    kMatvecSimds = 4,   // simd groups per threadgroup
    kMatvecRows = 2,    // weight rows per team (the template argument of kcap_matvec_split)
    kMatvecSharedFloats = kMatvecSimds * kMatvecRows,  // the teams' partial sums
    kTokensSimds = 4,
    kTokensRows = 2,
    kTokensPerPass = 8,  // tokens that reuse one decoded run of weights
    // Norm: one threadgroup per row.
    kNormThreads = 256,
    kNormScratchFloats = 32,  // one per simd group (1024 threads at most)
    // Attention: one simd group per query head of a KV head; decode splits keys over groups.
    kAttnMaxSimds = 8,  // KCAP_ATTN_MAX_SIMDS
    kAttnMinChunk = 64,
    kAttnMaxSplits = 64,  // decode splits at the longest span (the GPU has fewer cores than an H200)
    kAttnCombineThreads = 256,
    // Elementwise, rope, KV append: one thread per value.
    kElementwiseThreads = 256,
    // Argmax: first-pass groups cover this many logits each.
    kArgmaxThreads = 256,
    kArgmaxChunk = 4096,
    kEmbedThreads = 128,
};

}  // namespace metal_rows
}  // namespace kcap

// Entry point names, "kcap_metal_<entry>" or "kcap_metal_<entry>_<FORMAT>". The .metal files
// give these names to their kernels (host_name) and the rows list them, so the pipeline cache
// finds a row's functions by the names the row declares.
#define KCAP_METAL_STRINGIZE(x) #x
#define KCAP_METAL_NAME_STR(x) KCAP_METAL_STRINGIZE(x)
#define KCAP_METAL_ENTRY(entry) KCAP_METAL_NAME_STR(kcap_metal_##entry)
#define KCAP_METAL_FORMAT_ENTRY(entry, FORMAT) KCAP_METAL_NAME_STR(kcap_metal_##entry##_##FORMAT)

#if !defined(__METAL_VERSION__)
#include <string>
#include <vector>

#include "dispatch/capability.h"

namespace kcap {

struct Stage;
struct KernelCall;

namespace metal_rows {

// A long row's runs spread over up to kMatvecSimds simd groups (the same rule as cuda_rows).
constexpr int matvec_split(long long k) {
    int split = kMatvecSimds;
    while (split > 1 && k / 32 < (long long)split * 32) split /= 2;
    return split;
}

// The entry points of a Metal row, in the order its launcher indexes them (the pipeline cache
// key is (row, index)). Empty for a name that is not a Metal row.
const std::vector<std::string>& entry_points(const std::string& kernel);
// Every Metal row's kernel name with its entry points (tests check them against the .metal sources).
std::vector<std::pair<std::string, std::vector<std::string>>> all_entry_points();

// Entry indexes of the multi-entry rows.
enum MatmulEntry { kMatvec = 0, kMatmulTokens = 1 };
enum AttentionEntry { kAttnDecode = 0, kAttnCombine = 1, kAttnAppend = 2, kAttnPrefill = 3 };
enum ArgmaxEntry { kArgmaxPartial = 0, kArgmaxFinal = 1 };

}  // namespace metal_rows

// Launchers, one per row (metal/*.mm; absent where the Metal backend is not compiled in).
// Each encodes its dispatches into the command buffer the backend has open.
#define KCAP_METAL_DECLARE_FORMAT_LAUNCHERS(NAME, DECODER)                 \
    void kcap_metal_matmul_##NAME(const Stage& stage, const KernelCall& call); \
    void kcap_metal_embed_##NAME(const Stage& stage, const KernelCall& call);
KCAP_WEIGHT_FORMATS(KCAP_METAL_DECLARE_FORMAT_LAUNCHERS)
#undef KCAP_METAL_DECLARE_FORMAT_LAUNCHERS

void kcap_metal_norm(const Stage& stage, const KernelCall& call);
void kcap_metal_rope(const Stage& stage, const KernelCall& call);
void kcap_metal_attention(const Stage& stage, const KernelCall& call);
void kcap_metal_ffn_activation(const Stage& stage, const KernelCall& call);
void kcap_metal_add(const Stage& stage, const KernelCall& call);
void kcap_metal_softcap(const Stage& stage, const KernelCall& call);
void kcap_metal_scale(const Stage& stage, const KernelCall& call);
void kcap_metal_argmax(const Stage& stage, const KernelCall& call);

// Metal rows (metal/rows.cpp), in the table in every build; fn is null unless the Metal
// backend is compiled in (Apple, KCAP_WITH_METAL), and an Engine on "metal" is then refused.
void add_metal_rows(std::vector<Row>& rows);

// Whether this build has the Metal backend and the machine a Metal device (the default
// backend on macOS then is "metal"); false wherever KCAP_WITH_METAL is not defined.
bool metal_device_available();

}  // namespace kcap
#endif  // !__METAL_VERSION__
