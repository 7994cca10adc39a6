// What the GPU backends' row declarations (cuda/rows.cpp, metal/rows.cpp) share. Their rows
// run the same kernel bodies (kernels/), so the rows of those bodies are declared here once
// (gpu_family_row: formats, features, legal dims, token range, priority, launches); a backend
// adds only its launcher and geometry.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cctype>
#include <string>
#include <vector>

#include "dispatch/capability.h"
#include "kernels/formats_list.h"

namespace kcap {

inline std::string lowercase(std::string s) {
    for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

inline Row gpu_row(Backend backend, const std::string& kernel, Op op, KernelFn fn, Geometry geometry) {
    Row row;
    row.kernel = kernel;
    row.op = op;
    row.backend = backend;
    row.fn = fn;
    row.geometry = geometry;
    return row;
}

inline bool is_float_format(Format format) {
    return format == Format::F32 || format == Format::F16 || format == Format::BF16;
}

// K of the exact bodies (matvec, few-token walk, embed, PLE): they walk rows in 32-element
// runs and read a float format's last k % 32 elements one by one (the tail), so float rows
// take any K that keeps rows and activations 16-byte aligned for the vector loads, a multiple
// of 4; block formats need whole blocks.
inline int64_t exact_k_multiple(Format format) {
    return is_float_format(format) ? 4 : std::max<int64_t>(32, format_info(format).block_elems);
}

// K of bodies with no tail (tensor-core tiles): whole 32-element runs even for float formats.
inline int64_t run_k_multiple(Format format) { return std::max<int64_t>(32, format_info(format).block_elems); }

// Every format the GPU decoders know (KCAP_WEIGHT_FORMATS).
inline std::vector<Format> gpu_weight_formats() {
    std::vector<Format> formats;
#define KCAP_LIST_FORMAT(NAME, DECODER) formats.push_back(Format::NAME);
    KCAP_WEIGHT_FORMATS(KCAP_LIST_FORMAT)
#undef KCAP_LIST_FORMAT
    return formats;
}

// The row families both GPU backends have.
enum class GpuFamily {
    Embed,             // <backend>.embed.<format>: token rows times the scale, + learned positions
    Matvec,            // <backend>.matvec.<format>: one token, x staged in threadgroup memory
    MatmulTokens,      // <backend>.matmul_tokens.<format>: the few-token walk, any tokens
    GateUp,            // <backend>.gate_up.<format>: one token, both matrices and the activation
    GateUpTokens,      // <backend>.gate_up_tokens.<format>: the walk of each matrix, then the activation
    Norm,
    AddNorm,
    Rope,
    AttentionDecode,   // one token: flash-decoding over key splits, then their combine
    AttentionPrefill,  // a chunk: its K/V appended, then every token attends (tiled)
    // Multi-head latent attention (kernels/attention_mla.h): the latent rows appended and the
    // queries absorbed, the attend over the latent cache (one token: in key splits), the
    // splits merged, the V up-projection.
    AttentionMlaDecode,
    AttentionMla,      // a prefill chunk
    FfnActivation,
    Add,
    Softcap,
    Scale,
    PerLayerEmbed,     // <backend>.per_layer_embed.<format>: projection (this format), then combine
    PerLayerGate,
    Argmax,
    MoeRoute,          // <backend>.moe_route: the router's logits (any format), then the top-k per token
    MoeExperts,        // <backend>.moe_experts.<format>: the chosen experts' matvecs, then their sum
    MoeSharedGate,     // <backend>.moe_shared_gate
};

// The family's row on `backend` (format: the weight format of the per-format families).
Row gpu_family_row(GpuFamily family, Backend backend, Format format, KernelFn fn, Geometry geometry);

// The latent attention families' legal dims (their rows' dims.reject_of; a backend's own latent
// attention row adds its own to them): "" when the bodies take the stage, else why not.
std::string mla_rejection(const Stage& stage);

// What the router and the experts' bodies (kernels/moe.h) take beyond their family rows, for a
// backend whose launchers bind it: the router's bias (operand 2: gpt-oss), the sigmoid router
// with its choice bias (operand 3) and group-limited routing of up to KCAP_MOE_MAX_GROUPS groups
// (DeepSeek V2/V3); the experts' gate, up and down biases (operands 3-5, F32) and gpt-oss's
// clamped SwiGLU. cuda/rows.cpp states the same additions for its rows (tests/python/test_metal.py
// holds each Metal row equal to its CUDA twin).
void add_moe_route_variants(Row& route);
void add_moe_expert_biases(Row& experts);

// The key splits of a decode attention launch, fixed at load time (the captured graph replays at
// any position): enough that each takes about min_chunk keys at the stage's longest span, at
// most `budget` groups in all (a few per multiprocessor or core) over the `groups` groups of one
// split, and at most max_splits.
inline int decode_key_splits(int64_t span, int64_t min_chunk, int64_t budget, int64_t groups, int64_t max_splits) {
    const int64_t by_span = (std::max<int64_t>(1, span) + min_chunk - 1) / min_chunk;
    const int64_t cap = std::min<int64_t>(max_splits, std::max<int64_t>(1, budget / std::max<int64_t>(1, groups)));
    return int(std::max<int64_t>(1, std::min(by_span, cap)));
}

// A row's launches without the parentheses that mark the ones its stage's geometry may skip.
std::vector<std::string> launched_kernels(const Row& row);

}  // namespace kcap
