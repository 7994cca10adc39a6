// The planner: turns a ModelSpec into the ordered stage list of one forward pass and routes
// every stage, once, at load time: for each range of tokens per call (1 .. max_batch, split
// where the rows' token ranges begin and end), the highest-priority capability row that fits.
// If a token count has no row, planning fails with a RoutingError that names the layer, the
// stage, its operand formats, dims and features, the tokens, and why each candidate was
// rejected. Executing never re-decides: the executor looks the call's token count up in the
// stage's routes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/capability.h"
#include "dispatch/stage.h"
#include "kcap/model_spec.h"

namespace kcap {

// The KV cache element types a plan may ask for, and their names ("f32", "f16"): the one list
// the engine, the planner and the Python options (kcap._core.KV_TYPES) read.
const std::vector<Format>& kv_formats();
std::string kv_type_name(Format format);
Format kv_format_from_name(const std::string& name);  // throws FormatError naming the supported ones

struct PlanOptions {
    Backend backend = Backend::CPU;
    Format kv_format = Format::F32;  // the KV cache element type is a plan parameter
    // Activations of the matmul stages: F32, or Q8_1 to allow rows that round them to q8_1.
    Encoding activations = Encoding::F32;
    int64_t n_ctx = 0;               // context length the engine serves (≤ the model's)
    int max_batch = 512;             // the most tokens one call of a stage runs (a prefill chunk)
    DeviceInfo device;               // the device the plan is for (GPU rows' limits and ranges)
    // Kernels the planner may not choose, e.g. to prove a refusal when a feature's only row
    // is unavailable. Names as in Row::kernel.
    std::vector<std::string> excluded_kernels;
};

// One row for the calls of a stage whose token count is in `tokens`.
struct Route {
    TokenRange tokens;
    const Row* row = nullptr;
};

struct RoutedStage {
    Stage stage;
    std::vector<Route> routes;  // ascending, covering 1 .. max_batch exactly once
    // The row that runs a call of n tokens (n in 1 .. max_batch).
    const Row* row_for(int64_t n) const {
        for (const Route& route : routes)
            if (route.tokens.contains(n)) return route.row;
        return nullptr;
    }
};

struct Plan {
    PlanOptions options;
    std::vector<RoutedStage> stages;
    // Per-token width (floats) of every activation buffer, indexed by Buffer.
    std::vector<int64_t> buffer_widths;
};

// The grouped experts' token tiles (a GPU backend's rows that sort a call's (token, chosen
// expert) slots by expert, each expert's slots padded to whole tiles of tile_tokens rows): at
// most every full tile of the slots plus one partial tile per expert that has any.
inline int64_t moe_grouped_tiles(int64_t slots, int64_t n_expert, int64_t tile_tokens) {
    return (slots + tile_tokens - 1) / tile_tokens + std::min(n_expert, slots);
}

// The GPU mixture-of-experts rows' scratch for max_batch tokens of the widest stage, in elements:
// the router's logits [tokens][n_expert]; the experts' rows (the slots, or with grouped tiles of
// tile_tokens > 0 rows the padded sorted rows, whichever is more): their FFN activations [rows][ff]
// and (grouped) up outputs [rows][ff], the down outputs [rows][n]; grouped: the source token of
// each sorted row, the sorted row of each slot, the expert of each tile.
struct MoeScratch {
    size_t logits = 0;
    size_t act = 0;
    size_t up = 0;
    size_t down = 0;
    size_t rows = 0;
    size_t slot_rows = 0;
    size_t tiles = 0;
};
inline MoeScratch moe_scratch(const Stage& stage, int64_t max_batch, int64_t tile_tokens) {
    MoeScratch s;
    const int64_t slots = max_batch * stage.params.n_expert_used;
    if (stage.op == Op::MoeRoute) s.logits = size_t(max_batch * stage.params.n_expert);
    if (stage.op != Op::MoeExperts) return s;
    int64_t rows = slots;
    if (tile_tokens > 0) {
        s.tiles = size_t(moe_grouped_tiles(slots, stage.params.n_expert, tile_tokens));
        s.rows = s.tiles * size_t(tile_tokens);
        s.slot_rows = size_t(slots);
        rows = std::max<int64_t>(rows, int64_t(s.rows));
        s.up = size_t(rows) * size_t(stage.k2);
    }
    s.act = size_t(rows) * size_t(stage.k2);
    s.down = size_t(rows) * size_t(stage.n);
    return s;
}
inline MoeScratch moe_scratch(const Plan& plan, int64_t max_batch, int64_t tile_tokens) {
    MoeScratch s;
    for (const RoutedStage& routed : plan.stages) {
        const MoeScratch one = moe_scratch(routed.stage, max_batch, tile_tokens);
        s.logits = std::max(s.logits, one.logits);
        s.act = std::max(s.act, one.act);
        s.up = std::max(s.up, one.up);
        s.down = std::max(s.down, one.down);
        s.rows = std::max(s.rows, one.rows);
        s.slot_rows = std::max(s.slot_rows, one.slot_rows);
        s.tiles = std::max(s.tiles, one.tiles);
    }
    return s;
}

// Which activation buffers one call of a routed stage reads and writes, for every backend:
// buffer(b) is the first row of the backend's buffer b, `logits` where this call's logits go
// (the last position's, or every position's when all_logits). n: tokens of the call. A tail
// stage (the LM head and what follows it) runs on the last position only unless every
// position's logits are wanted, and not at all when none are. Returns false when the stage
// does not run in this call.
template <class BufferFn>
bool bind_stage_buffers(const Plan& plan, const Stage& stage, int64_t n, bool need_logits, bool all_logits,
                        float* logits, BufferFn&& buffer, KernelCall& call) {
    if (stage.last_token_only && !need_logits) return false;
    const bool tail = stage.last_token_only && !all_logits;
    call.n_tokens = int(tail ? 1 : n);
    call.buffer_rows = int(n);
    call.row_offset = int(tail ? n - 1 : 0);
    // A tail stage reads the last row of a per-token buffer (the LM head reads the final
    // position's normed state); the logits hold only the rows this call produces.
    if (stage.input == Buffer::Logits)
        call.in = logits;  // the stages after the LM head (final softcap, logit scale)
    else if (stage.input != Buffer::None)
        call.in = buffer(stage.input) + (tail ? n - 1 : 0) * plan.buffer_widths[size_t(stage.input)];
    if (stage.input2 != Buffer::None) call.in2 = buffer(stage.input2);
    if (stage.input3 != Buffer::None) call.in3 = buffer(stage.input3);
    if (stage.output == Buffer::Logits)
        call.out = logits;
    else if (stage.output != Buffer::None)
        call.out = buffer(stage.output);
    switch (stage.op) {
        case Op::Rope:
        case Op::QkNormRope:  // Q and K in place (no K buffer: a shared-KV layer)
            call.out = buffer(stage.input);
            call.inout2 = stage.input2 != Buffer::None ? buffer(stage.input2) : nullptr;
            break;
        case Op::AddNorm: call.inout2 = buffer(stage.input); break;  // the residual, read and written
        case Op::MoeRoute:  // with the add_norm before it: the residual and the normed row, written
            if (stage.features & kAddNormInput) {
                call.inout2 = buffer(stage.input);
                call.inout3 = buffer(stage.input3);
            }
            break;
        case Op::GateUp:  // the batched path's gate and up scratch
        case Op::Qkv:     // the K and V outputs (Q is out; a pair has no V)
            call.inout2 = buffer(stage.input2);
            call.inout3 = stage.input3 != Buffer::None ? buffer(stage.input3) : nullptr;
            break;
        default: break;
    }
    return true;
}

// The bytes one token adds to the KV cache of an attention stage's layer (kv_widths of its
// geometry in the stage's kv_format; 0 for other stages and for a layer that reads another's cache).
int64_t kv_bytes_per_token(const Stage& stage);

std::vector<Stage> build_stages(const ModelSpec& spec, const PlanOptions& options);
Plan make_plan(const ModelSpec& spec, const PlanOptions& options);

// The routes of a stage on options.backend: for every token count 1 .. options.max_batch, the
// highest-priority row whose formats, dims, features and token range fit and that the caller
// did not exclude, merged into ranges. route_stage throws RoutingError listing every
// candidate's reason; find_routes returns an empty list instead. make_plan routes the plan's
// stages with it, a backend its own stages (the decode step's argmax or sampler).
std::vector<Route> route_stage(const Stage& stage, const PlanOptions& options);
std::vector<Route> find_routes(const Stage& stage, const PlanOptions& options);
// The row for calls of n tokens of a stage outside a plan (a backend's own one-token stages).
const Row* route(const Stage& stage, const PlanOptions& options, int64_t n);
const Row* find_route(const Stage& stage, const PlanOptions& options, int64_t n);

}  // namespace kcap
