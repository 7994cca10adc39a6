// The planner: turns a ModelSpec into the ordered stage list of one forward pass and routes
// every stage, once, at load time, to the highest-priority capability row that fits it.
// If no row fits a stage, planning fails with a RoutingError that names the layer, the
// stage, its operand formats, dims and features, and why each candidate row was rejected.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/capability.h"
#include "dispatch/stage.h"
#include "kcap/model_spec.h"

namespace kcap {

struct PlanOptions {
    Backend backend = Backend::CPU;
    Format kv_format = Format::F32;  // the KV cache element type is a plan parameter
    // Activations of the matmul stages: F32, or Q8_1 to allow rows that round them to q8_1.
    Encoding activations = Encoding::F32;
    int64_t n_ctx = 0;               // context length the engine serves (≤ the model's)
    // Kernels the planner may not choose, e.g. to prove a refusal when a feature's only row
    // is unavailable. Names as in Row::kernel.
    std::vector<std::string> excluded_kernels;
};

struct RoutedStage {
    Stage stage;
    const Row* row = nullptr;
};

struct Plan {
    PlanOptions options;
    std::vector<RoutedStage> stages;
    // Per-token width (floats) of every activation buffer, indexed by Buffer.
    std::vector<int64_t> buffer_widths;
};

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
        case Op::GateUp:  // the batched path's gate and up scratch
        case Op::Qkv:     // the K and V outputs (Q is out)
            call.inout2 = buffer(stage.input2);
            call.inout3 = buffer(stage.input3);
            break;
        default: break;
    }
    return true;
}

std::vector<Stage> build_stages(const ModelSpec& spec, const PlanOptions& options);
Plan make_plan(const ModelSpec& spec, const PlanOptions& options);

// The row of options.backend a stage runs on: the highest-priority row whose formats, dims and
// features fit and that the caller did not exclude. route throws RoutingError listing every
// candidate's reason; find_route returns null. make_plan routes the plan's stages with it, a
// backend its own stages (the decode step's argmax or sampler).
const Row* route(const Stage& stage, const PlanOptions& options);
const Row* find_route(const Stage& stage, const PlanOptions& options);

}  // namespace kcap
