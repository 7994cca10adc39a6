// CPU elementwise stages: residual add (with an optional branch scale), the final logit
// softcap, the logit scale and a block's output scale.
#include <cmath>

#include "cpu/cpu_state.h"
#include "dispatch/stage.h"

namespace kcap {

namespace {

void add_kernel(const Stage& stage, const KernelCall& call) {
    const int64_t total = int64_t(call.n_tokens) * stage.n;
    const float scale = stage.params.scale;
    if (scale == 1.0f) {
        for (int64_t i = 0; i < total; ++i) call.out[i] = call.in[i] + call.in2[i];
    } else {
        for (int64_t i = 0; i < total; ++i) call.out[i] = call.in[i] + scale * call.in2[i];
    }
}

void scale_kernel(const Stage& stage, const KernelCall& call) {
    const int64_t total = int64_t(call.n_tokens) * stage.n;
    for (int64_t i = 0; i < total; ++i) call.out[i] = call.in[i] * stage.params.scale;
}

void softcap_kernel(const Stage& stage, const KernelCall& call) {
    const int64_t total = int64_t(call.n_tokens) * stage.n;
    const float cap = stage.params.softcap;
    cpu_state(call.backend_state).pool.parallel_for(total, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) call.out[i] = cap * std::tanh(call.in[i] / cap);
    });
}

Row make_row(const char* kernel, Op op, KernelFn fn) {
    Row row;
    row.kernel = kernel;
    row.op = op;
    row.backend = Backend::CPU;
    row.fn = fn;
    return row;
}

}  // namespace

void add_cpu_elementwise_rows(std::vector<Row>& rows) {
    Row add = make_row("cpu.add", Op::Add, add_kernel);
    add.features = kResidualScale;
    rows.push_back(add);
    rows.push_back(make_row("cpu.softcap", Op::Softcap, softcap_kernel));
    Row scale = make_row("cpu.scale", Op::Scale, scale_kernel);
    scale.features = kLayerOutputScale;  // also scales the residual stream after a block
    rows.push_back(scale);
}

}  // namespace kcap
