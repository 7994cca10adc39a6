// CPU rotary position embedding of Q and K, in place.
// Normal style rotates adjacent pairs (x[2i], x[2i+1]); NeoX rotates halves
// (x[i], x[i + rope_dim/2]). Only the first rope_dim dims of a head rotate (partial rotary).
#include <cmath>

#include "cpu/cpu_state.h"
#include "dispatch/rope_table.h"
#include "dispatch/stage.h"

namespace kcap {

namespace {

void rotate_head(float* x, const float* cos_t, const float* sin_t, int rope_dim, bool neox) {
    const int half = rope_dim / 2;
    for (int i = 0; i < half; ++i) {
        const int a = neox ? i : 2 * i;
        const int b = neox ? i + half : 2 * i + 1;
        const float x0 = x[a], x1 = x[b];
        x[a] = x0 * cos_t[i] - x1 * sin_t[i];
        x[b] = x0 * sin_t[i] + x1 * cos_t[i];
    }
}

void rope_kernel(const Stage& stage, const KernelCall& call) {
    const StageParams& p = stage.params;
    const int half = p.rope_dim / 2;
    const bool neox = stage.features & kRopeNeox;
    const float* factors =
        !stage.operands.empty() && stage.operands[0] ? reinterpret_cast<const float*>(stage.operands[0]->data) : nullptr;
    // Angles in double: (position * freq_scale) * inv_freq_i (dispatch/rope_table.h, as the GPU
    // tables), then cos/sin times the attention factor.
    const std::vector<double> inv_freq = rope_inv_freqs(p, factors);
    const double scale = rope_attn_factor(p);
    std::vector<float> cos_t(size_t(call.n_tokens) * half), sin_t(size_t(call.n_tokens) * half);
    for (int m = 0; m < call.n_tokens; ++m) {
        const double pos = double(call.pos0 + m) * double(p.rope_freq_scale);
        for (int i = 0; i < half; ++i) {
            cos_t[size_t(m) * half + i] = float(std::cos(pos * inv_freq[size_t(i)]) * scale);
            sin_t[size_t(m) * half + i] = float(std::sin(pos * inv_freq[size_t(i)]) * scale);
        }
    }
    const int heads = p.n_head + (call.inout2 ? p.n_head_kv : 0);  // no K: a shared-KV layer
    cpu_state(call.backend_state).pool.parallel_for(int64_t(call.n_tokens) * heads, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const int64_t m = t / heads;
            const int h = int(t % heads);
            float* x = h < p.n_head ? call.out + (m * p.n_head + h) * p.head_dim
                                    : call.inout2 + (m * p.n_head_kv + (h - p.n_head)) * p.head_dim;
            rotate_head(x, &cos_t[size_t(m) * half], &sin_t[size_t(m) * half], p.rope_dim, neox);
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
