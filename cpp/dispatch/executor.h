// The executor: the one walk over a plan's stages that every backend runs. For a call of n
// tokens it binds each stage's buffers (bind_stage_buffers), looks up the stage's route for the
// call's token count (the plan decided it at load time), and runs that row; where a trace is
// attached it records each stage that ran, so model.trace can show what ran next to what
// `kcap explain` printed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/planner.h"
#include "kcap/engine.h"
#include "kcap/errors.h"

namespace kcap {

class Executor {
public:
    explicit Executor(const Plan& plan) : plan_(plan) {}

    // Records every stage that runs into `trace` until detached (null).
    void attach_trace(std::vector<TraceEntry>* trace) { trace_ = trace; }
    std::vector<TraceEntry>* trace() const { return trace_; }

    // Runs tokens [0, n) at positions pos0.. through every stage. buffer(b): the first row of
    // the backend's buffer b; stage_state(i): what the backend bound to stage i; run(row,
    // stage, call): the backend runs the row (row.fn, or the same under a timer).
    template <class BufferFn, class StateFn, class RunFn>
    void run(int64_t n, int64_t pos0, const int32_t* tokens, bool need_logits, bool all_logits, float* logits,
             void* backend_state, BufferFn&& buffer, StateFn&& stage_state, RunFn&& run_row) const {
        for (size_t i = 0; i < plan_.stages.size(); ++i) {
            const RoutedStage& routed = plan_.stages[i];
            const Stage& stage = routed.stage;
            KernelCall call;
            if (!bind_stage_buffers(plan_, stage, n, need_logits, all_logits, logits, buffer, call)) continue;
            call.pos0 = int(pos0);
            call.tokens = tokens;
            call.backend_state = backend_state;
            call.stage_state = stage_state(i);
            call.row = routed.row_for(call.n_tokens);
            if (!call.row)
                throw Error("stage '" + stage.name + "' has no route for " + std::to_string(call.n_tokens) +
                            " tokens (the plan covers 1.." + std::to_string(plan_.options.max_batch) + ")");
            if (trace_) trace_->push_back({stage.layer, stage.name, call.row->kernel, call.n_tokens, {}});
            run_row(*call.row, stage, call);
        }
    }

    // The Routing rows a router call (Op::MoeRoute) wrote: call.n_tokens rows of `values` floats
    // (n_used ids, then n_used weights) from call.out, packed as every router and experts row
    // reads them.
    struct RoutingRows {
        const float* first;
        int rows;
        int values;
    };
    static RoutingRows routing_rows(const Stage& stage, const KernelCall& call) {
        return {call.out, call.n_tokens, 2 * stage.params.n_expert_used};
    }

private:
    const Plan& plan_;
    std::vector<TraceEntry>* trace_ = nullptr;
};

}  // namespace kcap
