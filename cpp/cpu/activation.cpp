// CPU FFN activation: act(gate) * up for gated FFNs, act(x) otherwise.
#include <cmath>

#include "cpu/cpu_state.h"
#include "dispatch/stage.h"

namespace kcap {

namespace {

// The loops of activate_span: the activation chosen outside, so each inner loop is one
// expression of the arrays (a gated one's product taken in the same loop), which GCC vectorizes
// (this file is compiled with -fno-trapping-math, so that the clamps' selects may be
// if-converted; CMakeLists.txt). In place (out == gate) as its own loop: the vectorizer's overlap
// check would send that case to the scalar loop.
template <class Act>
[[gnu::always_inline]] inline void activate_loop(Act act, const float* gate, const float* up, float* out, int64_t n) {
    if (out == gate && up)
        for (int64_t i = 0; i < n; ++i) out[i] = act(out[i], up[i]);
    else if (up)
        for (int64_t i = 0; i < n; ++i) out[i] = act(gate[i], up[i]);
    else
        for (int64_t i = 0; i < n; ++i) out[i] = act(gate[i], 1.0f);
}

}  // namespace

KCAP_HOT_LOOP void activate_span(Activation activation, const float* gate, const float* up, float* out, int64_t n,
                                 float alpha, float limit) {
    switch (activation) {
        case Activation::SiLU:
            return activate_loop([](float g, float u) { return apply_activation(Activation::SiLU, g) * u; }, gate, up,
                                 out, n);
        case Activation::GeluTanh:
            return activate_loop([](float g, float u) { return apply_activation(Activation::GeluTanh, g) * u; }, gate,
                                 up, out, n);
        case Activation::SwigluOai:
            return activate_loop(
                [alpha, limit](float g, float u) { return gated_activation(Activation::SwigluOai, g, u, alpha, limit); },
                gate, up, out, n);
        default:  // GELU erf (std::erf per value) and ReLU
            return activate_loop([activation](float g, float u) { return apply_activation(activation, g) * u; }, gate,
                                 up, out, n);
    }
}

namespace {

void activation_kernel(const Stage& stage, const KernelCall& call) {
    const int64_t total = int64_t(call.n_tokens) * stage.n;
    const Activation activation = stage.params.activation;
    const float* up = call.in2;  // null for a non-gated FFN
    cpu_state(call.backend_state).pool.parallel_for(total, [&](int64_t begin, int64_t end) {
        activate_span(activation, call.in + begin, up ? up + begin : nullptr, call.out + begin, end - begin, 0.0f, 0.0f);
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
