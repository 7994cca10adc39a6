// The rotary angles of a rope stage, one definition for every backend: the CPU rope computes
// its cos/sin from rope_inv_freqs and rope_attn_factor, the GPU backends upload the table of
// rope_cos_sin_table (the same numbers: double precision, then float), so every backend
// rotates by bit-identical factors. Linear scaling multiplies positions by rope_freq_scale;
// frequency factors (rope_freqs.weight) divide pair i's frequency; YaRN (StageParams::rope_yarn)
// blends each pair's frequency and scales cos and sin.
#pragma once

#include <cstdint>
#include <tuple>
#include <vector>

#include "dispatch/stage.h"

namespace kcap {

// An attention stage the planner folded a rope (or qk_norm_rope) stage into.
bool stage_owns_rope(const Stage& stage);
// The rope frequency factors of a rope, qk_norm_rope, rope-owning attention or attention_mla
// stage (null when it has none).
const TensorRef* rope_factors(const Stage& stage);
// Pair i's inverse frequency (rope_dim / 2 pairs): base^(-2i/rope_dim), divided by factors[i]
// (may be null), then YaRN's blend.
std::vector<double> rope_inv_freqs(const StageParams& p, const float* factors);
// What cos and sin are multiplied by (YaRN's attention factor; 1 without YaRN).
double rope_attn_factor(const StageParams& p);
// [n_ctx][rope_dim / 2] pairs (cos, sin) of the angles (pos * rope_freq_scale) * inv_freq_i.
std::vector<float> rope_cos_sin_table(const Stage& rope_stage, int64_t n_ctx);
// Stages with equal keys have equal tables (a backend uploads each table once).
using RopeTableKey = std::tuple<float, float, int, const void*, float, int, float, float, float, bool>;
RopeTableKey rope_table_key(const Stage& stage);

}  // namespace kcap
