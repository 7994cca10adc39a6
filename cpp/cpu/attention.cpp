// CPU attention: appends the new keys/values to the KV cache, then causal softmax attention
// for every new query over the keys it may see (all earlier positions, or the last
// `sliding_window` of them), with optional score softcap and attention sinks, for any GQA ratio.
// No span ceiling: scores live in a per-thread buffer sized to the span.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/cpu_state.h"
#include "dispatch/stage.h"

namespace kcap {

namespace {

// Query rows [begin, end) (token x KV head) of one call: scores, softmax, the weighted values.
// sinks (attention sinks, or null): a logit per query head that joins each softmax's
// denominator and weighs no value.
KCAP_HOT_LOOP void attend(const StageParams& p, const KernelCall& call, const KvLayer& kv, const float* sinks,
                          int64_t begin, int64_t end) {
    const int group = p.n_head / p.n_head_kv;  // query heads per KV head
    std::vector<float> scores, key(size_t(p.head_dim)), value(size_t(p.head_dim_v));
    for (int64_t t = begin; t < end; ++t) {
        const int64_t m = t / p.n_head_kv;
        const int kvh = int(t % p.n_head_kv);
        const int64_t pos = call.pos0 + m;
        const int64_t first = p.sliding_window > 0 ? std::max<int64_t>(0, pos - p.sliding_window + 1) : 0;
        const int64_t span = pos - first + 1;
        scores.assign(size_t(span) * group, 0.0f);
        for (int64_t j = 0; j < span; ++j) {
            const float* k_row = kv.k_span(first + j, int64_t(kvh) * p.head_dim, p.head_dim, key.data());
            for (int g = 0; g < group; ++g) {
                const float* q = call.in + (m * p.n_head + int64_t(kvh) * group + g) * p.head_dim;
                float s = dot_f32(q, k_row, p.head_dim) * p.scale;
                if (p.softcap > 0) s = p.softcap * std::tanh(s / p.softcap);
                scores[size_t(g) * span + j] = s;
            }
        }
        for (int g = 0; g < group; ++g) {
            float* sc = &scores[size_t(g) * span];
            const float sink = sinks ? sinks[int64_t(kvh) * group + g] : -std::numeric_limits<float>::infinity();
            float max_score = sink;
            for (int64_t j = 0; j < span; ++j) max_score = std::max(max_score, sc[j]);
            double total = sinks ? std::exp(double(sink - max_score)) : 0.0;
            for (int64_t j = 0; j < span; ++j) {
                sc[j] = std::exp(sc[j] - max_score);
                total += sc[j];
            }
            const float inv_total = float(1.0 / total);
            for (int64_t j = 0; j < span; ++j) sc[j] *= inv_total;
        }
        for (int g = 0; g < group; ++g) {
            float* out = call.out + (m * p.n_head + int64_t(kvh) * group + g) * p.head_dim_v;
            std::fill(out, out + p.head_dim_v, 0.0f);
        }
        for (int64_t j = 0; j < span; ++j) {
            const float* v_row = kv.v_span(first + j, int64_t(kvh) * p.head_dim_v, p.head_dim_v, value.data());
            for (int g = 0; g < group; ++g) {
                const float w = scores[size_t(g) * span + j];
                float* out = call.out + (m * p.n_head + int64_t(kvh) * group + g) * p.head_dim_v;
                for (int i = 0; i < p.head_dim_v; ++i) out[i] += w * v_row[i];
            }
        }
    }
}

void attention_kernel(const Stage& stage, const KernelCall& call) {
    const StageParams& p = stage.params;
    CpuState& state = cpu_state(call.backend_state);
    // A shared-KV layer (kv_shared) reads the cache its source layer filled earlier in this
    // same pass, and stores nothing.
    const bool shared = p.kv_layer >= 0;
    KvLayer& kv = state.kv.at(size_t(shared ? p.kv_layer : stage.layer));
    const int64_t k_width = int64_t(p.n_head_kv) * p.head_dim;
    const int64_t v_width = int64_t(p.n_head_kv) * p.head_dim_v;
    if (!shared) {
        kv.reserve_positions(call.pos0 + call.n_tokens);
        for (int m = 0; m < call.n_tokens; ++m)
            kv.store(call.pos0 + m, call.in2 + m * k_width, call.in3 + m * v_width);
    }

    const float* sinks = stage.operands.size() > 3 && stage.operands[3]
                             ? reinterpret_cast<const float*>(stage.operands[3]->data) : nullptr;
    state.pool.parallel_for(int64_t(call.n_tokens) * p.n_head_kv,
                            [&](int64_t begin, int64_t end) { attend(p, call, kv, sinks, begin, end); });
}

}  // namespace

void add_cpu_attention_rows(std::vector<Row>& rows) {

    Row row;
    row.kernel = "cpu.attention";
    row.op = Op::Attention;
    row.backend = Backend::CPU;
    row.kv_formats = {Format::F32, Format::F16};
    row.operand_formats = {{}, {}, {}, {Format::F32}};  // operand 3: the sinks
    row.features = kSlidingWindow | kAttnSoftcap | kGqa | kKvShared | kSinks;
    row.fn = attention_kernel;
    rows.push_back(row);
}

}  // namespace kcap
