// The interface each backend implements to execute a Plan.
#pragma once

#include <cstdint>

#include "dispatch/planner.h"
#include "kcap/engine.h"

namespace kcap {

class Backend_ {
public:
    virtual ~Backend_() = default;
    // Runs tokens [0, n) at positions pos0.. through the plan; logits as in Engine::eval.
    virtual void eval(const int32_t* tokens, int64_t n, int64_t pos0, float* logits, bool all_logits) = 0;
};

std::unique_ptr<Backend_> make_cpu_backend(const ModelSpec& spec, Plan plan, const EngineOptions& options);

}  // namespace kcap
