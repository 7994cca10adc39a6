// The cos/sin table a GPU rope stage reads: [n_ctx][rope_dim / 2] pairs of (cos, sin), computed
// exactly as the CPU reference computes its angles (double precision, then float), so every
// backend rotates by bit-identical factors. Plain C++ (the Metal host will use it too).
#pragma once

#include <cstdint>
#include <vector>

#include "dispatch/stage.h"

namespace kcap {

// An attention stage the planner folded a rope (or qk_norm_rope) stage into.
bool stage_owns_rope(const Stage& stage);
// The rope frequency factors of a rope, qk_norm_rope or rope-owning attention stage (null when
// it has none).
const TensorRef* rope_factors(const Stage& stage);
std::vector<float> rope_cos_sin_table(const Stage& rope_stage, int64_t n_ctx);

}  // namespace kcap
