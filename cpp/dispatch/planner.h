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

std::vector<Stage> build_stages(const ModelSpec& spec, const PlanOptions& options);
Plan make_plan(const ModelSpec& spec, const PlanOptions& options);

}  // namespace kcap
