// CPU rotary position embedding of Q and K, in place.
// Normal style rotates adjacent pairs (x[2i], x[2i+1]); NeoX rotates halves
// (x[i], x[i + rope_dim/2]). Only the first rope_dim dims of a head rotate (partial rotary).
#include <cmath>

#include "cpu/cpu_state.h"
#include "dispatch/rope_table.h"
#include "dispatch/stage.h"

namespace kcap {

namespace {

void rope_kernel(const Stage& stage, const KernelCall& call) {
    const StageParams& p = stage.params;
    const int half = p.rope_dim / 2;
    const bool neox = stage.features & kRopeNeox;
    const float* factors =
        !stage.operands.empty() && stage.operands[0] ? reinterpret_cast<const float*>(stage.operands[0]->data) : nullptr;
    const std::vector<float> cos_sin = rope_cos_sin(p, factors, call.pos0, call.n_tokens);
    const int heads = p.n_head + (call.inout2 ? p.n_head_kv : 0);  // no K: a shared-KV layer
    cpu_state(call.backend_state).pool.parallel_for(int64_t(call.n_tokens) * heads, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const int64_t m = t / heads;
            const int h = int(t % heads);
            float* x = h < p.n_head ? call.out + (m * p.n_head + h) * p.head_dim
                                    : call.inout2 + (m * p.n_head_kv + (h - p.n_head)) * p.head_dim;
            rotate_pairs(x, &cos_sin[size_t(m) * 2 * half], &cos_sin[size_t(m) * 2 * half + half], p.rope_dim, neox);
        }
    });
}

}  // namespace

void add_cpu_rope_rows(std::vector<Row>& rows) {
    Row row;
    row.kernel = "cpu.rope";
    row.op = Op::Rope;
    row.backend = Backend::CPU;
    row.operand_formats = {{Format::F32}};
    row.features = kRopeNormal | kRopeNeox | kPartialRotary | kRopeFreqFactors;
    row.fn = rope_kernel;
    rows.push_back(row);
}

}  // namespace kcap
