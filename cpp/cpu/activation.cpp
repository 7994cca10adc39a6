// CPU FFN activation: act(gate) * up for gated FFNs, act(x) otherwise.
#include <cmath>

#include "cpu/cpu_state.h"
#include "dispatch/stage.h"

namespace kcap {

namespace {

void activation_kernel(const Stage& stage, const KernelCall& call) {
    const int64_t total = int64_t(call.n_tokens) * stage.n;
    const Activation activation = stage.params.activation;
    const float* up = call.in2;  // null for a non-gated FFN
    cpu_state(call.backend_state).pool.parallel_for(total, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            float a = apply_activation(activation, call.in[i]);
            call.out[i] = up ? a * up[i] : a;
        }
    });
}

}  // namespace

void add_cpu_activation_rows(std::vector<Row>& rows) {
    Row row;
    row.kernel = "cpu.ffn_activation";
    row.op = Op::FfnActivation;
    row.backend = Backend::CPU;
    row.features = kSilu | kGeluTanh | kGeluErf | kRelu | kGated;
    row.fn = activation_kernel;
    rows.push_back(row);
}

}  // namespace kcap
