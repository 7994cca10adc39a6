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
// So this header has two parts: preprocessor text, enumerators and constexpr functions that MSL
// can read (the kernels include it), and the C++ declarations, hidden from MSL (which has no
// <string>).
//
// Every Metal row mirrors a CUDA row whose body lives in kernels/ and is exercised on the H200
// and on the CPU (tests/cpp/test_cuda_kernels_host.cpp); the constants equal cuda/rows.h's
// where the body's shape depends on them (kMatvecRows, kMatvecChunkRuns, kTokensPerPass), so
// each sum is ordered as in CUDA's tests. One exception: the decode matvec's split into parts
// is chosen from the output rows and a core count (kGpuCores here, the H200's 132
// multiprocessors there), so a Metal matvec may add its parts in another grouping than the
// H200 did for the same shape (still exact f32, within rounding of the CPU).
#pragma once

#include "kernels/formats_list.h"
#include "kernels/params.h"

namespace kcap {
namespace metal_rows {

// Enumerators, not constexpr variables: MSL puts program-scope variables in an address space,
// enumerators are plain constants in both languages.
enum : int {
    kSimdWidth = 32,  // KCAP_SIMD_WIDTH of kernels/dialect.h (static_assert in metal/matmul.metal)
    // Metal has no multiprocessor count to ask for: this stands in for cuda's sm_count where a
    // grid is sized to cover the GPU (matvec teams, decode attention splits). An M-series Max
    // has 30-40 GPU cores, a base chip 8-10; 32 errs towards more, smaller groups.
    kGpuCores = 32,
    // Matmul, exact (f32 activations): the decode matvec (kernels/matvec.h, x staged in
    // threadgroup memory) and the few-token walk. As cuda_rows.
    kMatvecSimds = 8,        // simd groups per threadgroup
    kMatvecRows = 2,         // weight rows per team (the ROWS of kcap_matvec_staged; CUDA's 1 was measured on an H200, not on Apple GPUs)
    kMatvecChunkRuns = 128,  // runs of x staged at a time: 128 * 36 * 4 B = 18 KB, under Metal's 32 KB
    kMatvecRunStride = 36,   // KCAP_MATVEC_RUN_STRIDE (static_assert in metal/matmul.metal)
    // The most threadgroup memory a matvec takes (staged runs + two partials per row for gate_up).
    kMatvecSharedBytes = (kMatvecChunkRuns * kMatvecRunStride + kMatvecSimds * kMatvecRows * 2) * 4,
    kTokensSimds = 4,
    kTokensRows = 2,
    kTokensPerPass = 8,  // tokens that reuse one decoded run of weights
    // Norm (and add_norm): one threadgroup per row.
    kNormThreads = 256,
    kNormScratchFloats = 32,  // one per simd group (1024 threads at most)
    // Attention: decode is kcap_attention_decode (KCAP_ATTN_DECODE_SIMDS simd groups per
    // threadgroup, static_assert in metal/attention.metal); prefill is the tiled
    // kcap_attention_prefill (kernels/attention_prefill.h): a threadgroup owns
    // kAttnPrefillRowsPerSimd * row_simds query rows of one KV head, as cuda_rows
    // (attn_prefill_* below; static_asserts in metal/attention.metal).
    kAttnDecodeSimds = 4,
    kAttnMaxSimds = 8,  // KCAP_ATTN_MAX_SIMDS: the most simd groups of an attention threadgroup
    kAttnPrefillRowsPerSimd = 4,                          // KCAP_ATTN_PREFILL_ROWS
    kAttnPrefillMaxSimds = 8,                             // KCAP_ATTN_PREFILL_MAX_SIMDS
    kAttnPrefillQFloats = 4096,                           // KCAP_ATTN_PREFILL_Q_FLOATS
    kAttnPrefillSharedBytes = (4096 + 2304 + 8 * 32 * 4) * 4,  // KCAP_ATTN_PREFILL_SHARED_FLOATS: 29 KB
    kAttnMinChunk = 64,
    kAttnSplitsPerCore = 4,  // decode grid: at most this many threadgroups per kGpuCores core
    kAttnCombineThreads = 256,
    // Multi-head latent attention (kernels/attention_mla.h): KCAP_MLA_THREADS threads in every
    // launch; the decode's key splits take at least KCAP_MLA_MIN_CHUNK cache rows each, and at
    // most kMlaGroupsPerCore attend groups (a token's head groups x splits) run per kGpuCores
    // core (an attend group holds KCAP_MLA_HEADS_PER_GROUP heads' weighted latents in registers;
    // one per core until measured on Apple hardware).
    kMlaThreads = KCAP_MLA_THREADS,
    kMlaMinChunk = KCAP_MLA_MIN_CHUNK,
    kMlaGroupsPerCore = 1,
    kMlaAttendSharedBytes = KCAP_MLA_ATTEND_SHARED_FLOATS * 4,  // the most of its launches: 21 KB
    // Elementwise, rope, KV append: one thread per value.
    kElementwiseThreads = 256,
    // Argmax: first-pass groups cover this many logits each.
    kArgmaxThreads = 256,
    kArgmaxChunk = 4096,
    kEmbedThreads = 128,
    kMoeLogitThreads = 128,  // the router's logits: 4 simd groups, an expert's row each
    kMoeRouteThreads = 32,   // the router's top-k: one simd group per token
};

// The y extents of the latent attention launches (append and absorb, combine, V up-projection),
// as kernels/attention_mla.h's KCAP_MLA_ABSORB_BLOCKS, KCAP_MLA_COMBINE_BLOCKS and
// KCAP_MLA_V_UP_BLOCKS compute them from KcapMlaParams: the host includes no kernel bodies, so
// they are restated here for metal/launch_attention_mla.mm, and metal/attention_mla.metal holds
// them equal to the body's macros.
constexpr int mla_absorb_blocks(int lora, int nope, int combined) {
    return combined ? 1 : (lora + KCAP_MLA_ROWS_PER_GROUP(nope) - 1) / KCAP_MLA_ROWS_PER_GROUP(nope);
}
constexpr int mla_combine_blocks(int lora) { return (lora + KCAP_MLA_COMBINE_COLS - 1) / KCAP_MLA_COMBINE_COLS; }
constexpr int mla_v_up_blocks(int lora, int dv) {
    return (dv + KCAP_MLA_ROWS_PER_GROUP(lora) - 1) / KCAP_MLA_ROWS_PER_GROUP(lora);
}

}  // namespace metal_rows
}  // namespace kcap

// Entry point names, "kcap_metal_<entry>" or "kcap_metal_<entry>_<FORMAT>". The .metal files
// give these names to their kernels (host_name) and the rows list them, so the pipeline cache
// finds a row's functions by the names the row declares.
#define KCAP_METAL_STRINGIZE(x) #x
#define KCAP_METAL_NAME_STR(x) KCAP_METAL_STRINGIZE(x)
#define KCAP_METAL_ENTRY(entry) KCAP_METAL_NAME_STR(kcap_metal_##entry)
#define KCAP_METAL_FORMAT_ENTRY(entry, FORMAT) KCAP_METAL_NAME_STR(kcap_metal_##entry##_##FORMAT)

// A kernel argument in threadgroup memory whose length the host sets
// (setThreadgroupMemoryLength:atIndex:). Spelled through a macro because `threadgroup` is also
// the address-space keyword, which the Linux stand-in defines away; it defines this macro too.
#ifndef KCAP_METAL_THREADGROUP_INDEX
#define KCAP_METAL_THREADGROUP_INDEX(index) [[threadgroup(index)]]
#endif

// The matvec's scalar arguments, one setBytes (plain ints: the same bytes in MSL and C++).
struct KcapMetalMatvecArgs {
    int split;       // parts per team (metal_rows::matvec_split)
    int chunk_runs;  // runs of x staged at a time
    int activation;  // gate_up: kcap_activate's activation; unused by the plain matvec
};

#if !defined(__METAL_VERSION__)
#include <string>
#include <vector>

#include "dispatch/capability.h"

namespace kcap {

struct Stage;
struct KernelCall;

namespace metal_rows {

// The threadgroup's simd groups form kMatvecSimds / split teams; a team's `split` parts share
// its rows' runs. cuda_rows::matvec_split with kGpuCores for the multiprocessor count: most
// teams per group (each staged x serves the most rows) while the grid still covers the cores.
constexpr int matvec_split(long long n) {
    int teams = kMatvecSimds;
    while (teams > 1 && (n + teams * kMatvecRows - 1) / (teams * kMatvecRows) < kGpuCores) teams /= 2;
    return kMatvecSimds / teams;
}
// Threadgroup memory of a matvec over rows of k: the staged runs and the parts' partial sums
// (cuda_rows::matvec_shared_floats).
constexpr int matvec_chunk_runs(long long k) { return int(k / 32 < (long long)kMatvecChunkRuns ? k / 32 : (long long)kMatvecChunkRuns); }
constexpr int matvec_shared_floats(long long k) {
    return matvec_chunk_runs(k) * kMatvecRunStride + kMatvecSimds * kMatvecRows * 2;
}
static_assert(matvec_shared_floats(1 << 20) * 4 == kMatvecSharedBytes, "the largest matvec takes kMatvecSharedBytes");
static_assert(kMatvecSharedBytes <= 32768, "Metal gives a threadgroup 32 KB");
// Prefill attention geometry (cuda_rows::attn_prefill_*, the same rule).
constexpr int attn_prefill_row_simds(int head_dim) {
    return kAttnPrefillQFloats / (kAttnPrefillRowsPerSimd * head_dim) < kAttnPrefillMaxSimds
               ? kAttnPrefillQFloats / (kAttnPrefillRowsPerSimd * head_dim)
               : int(kAttnPrefillMaxSimds);
}
constexpr int attn_prefill_key_split(int head_dim) {
    return 2 * attn_prefill_row_simds(head_dim) <= kAttnPrefillMaxSimds ? 2 : 1;
}
constexpr int attn_prefill_simds(int head_dim) { return attn_prefill_row_simds(head_dim) * attn_prefill_key_split(head_dim); }
constexpr int attn_prefill_rows(int head_dim) { return kAttnPrefillRowsPerSimd * attn_prefill_row_simds(head_dim); }
static_assert(kAttnPrefillSharedBytes <= 32768, "Metal gives a threadgroup 32 KB");
static_assert(kMlaAttendSharedBytes <= 32768, "Metal gives a threadgroup 32 KB");

// The entry points of a Metal row, in the order its launcher indexes them (the pipeline cache
// key is (row, index)). Empty for a name that is not a Metal row.
const std::vector<std::string>& entry_points(const std::string& kernel);
// Every Metal row's kernel name with its entry points (tests check them against the .metal sources).
std::vector<std::pair<std::string, std::vector<std::string>>> all_entry_points();

// Entry indexes of the multi-entry rows (the order of their launches, dispatch/gpu_rows.cpp).
// gate_up_tokens: the format's few-token walk per matrix, then the activation.
enum GateUpTokensEntry { kGateUpTokens = 0, kGateUpActivation = 2 };
// per_layer_embed: the projection (few-token walk), then the combine of the table's format:
// entry kPleCombine + the format's index in KCAP_WEIGHT_FORMATS (ple_combine_index).
enum PerLayerEmbedEntry { kPleProjection = 0, kPleCombine = 1 };
// The index of a weight format in KCAP_WEIGHT_FORMATS, -1 for any other.
int ple_combine_index(Format format);
enum AttentionDecodeEntry { kAttnDecode = 0, kAttnCombine = 1 };
enum AttentionPrefillEntry { kAttnAppend = 0, kAttnPrefill = 1 };
// attention_mla(_decode): the append and absorb of W_k_b's format (entry = its index in
// KCAP_WEIGHT_FORMATS), the attend, the combine, then the V up-projection of W_v_b's format
// (mla_v_up_entry).
int mla_attend_entry();
int mla_combine_entry();
int mla_v_up_entry(Format format);
enum ArgmaxEntry { kArgmaxPartial = 0, kArgmaxFinal = 1 };
// moe_route: the logits of the router's format (entry = its index in KCAP_WEIGHT_FORMATS), then
// the top-k (moe_route_entry); moe_experts: the gate / up matvec, then the down matvec of the down
// matrix's format (kMoeDown + its index), then the combine.
enum MoeExpertsEntry { kMoeGateUp = 0, kMoeDown = 1 };
int moe_combine_entry();
int moe_route_entry();

}  // namespace metal_rows

// Launchers, one per row (metal/*.mm; absent where the Metal backend is not compiled in).
// Each encodes its dispatches into the command buffer the backend has open.
#define KCAP_METAL_DECLARE_FORMAT_LAUNCHERS(NAME, DECODER)                          \
    void kcap_metal_matvec_##NAME(const Stage& stage, const KernelCall& call);         \
    void kcap_metal_matmul_tokens_##NAME(const Stage& stage, const KernelCall& call);  \
    void kcap_metal_embed_##NAME(const Stage& stage, const KernelCall& call);          \
    void kcap_metal_gate_up_##NAME(const Stage& stage, const KernelCall& call);        \
    void kcap_metal_gate_up_tokens_##NAME(const Stage& stage, const KernelCall& call); \
    void kcap_metal_per_layer_embed_##NAME(const Stage& stage, const KernelCall& call); \
    void kcap_metal_moe_experts_##NAME(const Stage& stage, const KernelCall& call);
KCAP_WEIGHT_FORMATS(KCAP_METAL_DECLARE_FORMAT_LAUNCHERS)
#undef KCAP_METAL_DECLARE_FORMAT_LAUNCHERS

void kcap_metal_norm(const Stage& stage, const KernelCall& call);
void kcap_metal_add_norm(const Stage& stage, const KernelCall& call);
void kcap_metal_rope(const Stage& stage, const KernelCall& call);
void kcap_metal_attention_decode(const Stage& stage, const KernelCall& call);
void kcap_metal_attention_prefill(const Stage& stage, const KernelCall& call);
void kcap_metal_ffn_activation(const Stage& stage, const KernelCall& call);
void kcap_metal_add(const Stage& stage, const KernelCall& call);
void kcap_metal_softcap(const Stage& stage, const KernelCall& call);
void kcap_metal_scale(const Stage& stage, const KernelCall& call);
void kcap_metal_argmax(const Stage& stage, const KernelCall& call);
void kcap_metal_per_layer_gate(const Stage& stage, const KernelCall& call);
void kcap_metal_moe_route(const Stage& stage, const KernelCall& call);
void kcap_metal_moe_shared_gate(const Stage& stage, const KernelCall& call);
void kcap_metal_attention_mla_decode(const Stage& stage, const KernelCall& call);
void kcap_metal_attention_mla(const Stage& stage, const KernelCall& call);

// Metal rows (metal/rows.cpp), in the table in every build; fn is null unless the Metal
// backend is compiled in (Apple, KCAP_WITH_METAL), and an Engine on "metal" is then refused.
void add_metal_rows(std::vector<Row>& rows);

// Whether this build has the Metal backend and the machine a Metal device (the default
// backend on macOS then is "metal"); false wherever KCAP_WITH_METAL is not defined.
bool metal_device_available();

}  // namespace kcap
#endif  // !__METAL_VERSION__
