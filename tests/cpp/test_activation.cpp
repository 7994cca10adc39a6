// C++ host test of the CPU's activation functions (cpp/cpu/cpu_state.h, cpp/cpu/activation.cpp):
// e^x in arithmetic (exp_clamped) against double-precision exp, and activate_span, the
// vectorized loops of every activation, gated or not, in place or not, at lengths with and
// without a vector tail, against double-precision evaluations of the same formulas (SiLU
// x / (1 + e^-x), GELU 0.5 x (1 + tanh(y)), gpt-oss's clamped SwiGLU, GELU erf, ReLU).
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cpu/cpu_state.h"

using namespace kcap;

static int passed = 0, failed = 0;
#define CHECK(cond, ...)                                 \
    do {                                                 \
        if (cond) {                                      \
            ++passed;                                    \
        } else {                                         \
            ++failed;                                    \
            std::printf("FAIL %s:%d ", __FILE__, __LINE__); \
            std::printf(__VA_ARGS__);                    \
            std::printf("\n");                           \
        }                                                \
    } while (0)

// The activation of x (and, gated, times up) in double precision.
static double reference(Activation act, double x, double up, bool gated, double alpha, double limit) {
    double a = 0.0;
    switch (act) {
        case Activation::SiLU: a = x / (1.0 + std::exp(-x)); break;
        case Activation::GeluTanh: a = 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); break;
        case Activation::GeluErf: a = 0.5 * x * (1.0 + std::erf(x * 0.7071067811865476)); break;
        case Activation::ReLU: a = x > 0.0 ? x : 0.0; break;
        case Activation::SwigluOai: {
            const double g = std::min(x, limit), u = std::min(std::max(up, -limit), limit);
            return (u + 1.0) * g / (1.0 + std::exp(-alpha * g));
        }
    }
    return gated ? a * up : a;
}

int main() {
    // e^x over [-87, 88], every 2^-10 and a dense sweep around 0: within 2 ulp (relative 2^-22).
    double worst = 0.0;
    for (int i = -87 * 1024; i <= 88 * 1024; ++i) {
        const float x = float(i) / 1024.0f;
        const double want = std::exp(double(x));
        worst = std::max(worst, std::fabs(double(exp_clamped(x)) - want) / want);
    }
    for (int i = -4096; i <= 4096; ++i) {
        const float x = float(i) * 1e-6f;
        const double want = std::exp(double(x));
        worst = std::max(worst, std::fabs(double(exp_clamped(x)) - want) / want);
    }
    CHECK(worst <= 2.0 * 0x1p-23, "exp_clamped: worst relative error %.3g", worst);
    // Clamped ends: finite, no overflow; NaN stays NaN.
    CHECK(std::isfinite(exp_clamped(1000.0f)) && exp_clamped(1000.0f) > 1e38f, "exp_clamped(1000)");
    CHECK(exp_clamped(-1000.0f) >= 0.0f && exp_clamped(-1000.0f) < 2e-38f, "exp_clamped(-1000)");
    CHECK(std::isnan(exp_clamped(NAN)), "exp_clamped(NaN)");

    // activate_span against the double references: |error| within 4e-7 x max(1, |x|, |up|) (GELU's
    // tanh is within about 1e-7 absolute; the products add a rounding or two).
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> wide(-12.0f, 12.0f), small(-0.05f, 0.05f);
    const float alpha = 1.702f, limit = 7.0f;
    for (Activation act : {Activation::SiLU, Activation::GeluTanh, Activation::GeluErf, Activation::ReLU,
                           Activation::SwigluOai})
        for (const int64_t n : {1, 7, 64, 1001})
            for (const bool gated : {false, true})
                for (const bool in_place : {false, true}) {
                    if (act == Activation::SwigluOai && !gated) continue;  // gated only
                    const size_t count = static_cast<size_t>(n);
                    std::vector<float> gate(count), up(count), out(count, NAN);
                    for (int64_t i = 0; i < n; ++i) {
                        gate[size_t(i)] = i % 4 == 0 ? small(rng) : wide(rng);
                        up[size_t(i)] = wide(rng);
                    }
                    const std::vector<float> x = gate;
                    float* dst = in_place ? gate.data() : out.data();
                    activate_span(act, gate.data(), gated ? up.data() : nullptr, dst, n, alpha, limit);
                    double err = 0.0;
                    for (int64_t i = 0; i < n; ++i) {
                        const double xi = x[size_t(i)], ui = up[size_t(i)];
                        const double want = reference(act, xi, ui, gated, alpha, limit);
                        const double scale = std::max({1.0, std::fabs(xi), gated ? std::fabs(ui) * std::max(1.0, std::fabs(xi)) : 0.0});
                        err = std::isfinite(dst[i]) ? std::max(err, std::fabs(dst[i] - want) / scale) : INFINITY;
                    }
                    CHECK(err <= 4e-7, "activate_span activation %d n=%lld gated=%d in_place=%d: error %.3g", int(act),
                          (long long)n, int(gated), int(in_place), err);
                }
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
