// The CPU attention's softmax exponential (cpp/cpu/cpu_state.h: exp_nonpositive, exp_shifted)
// against exp in double: every float from 0 down to -87 at a stride of 2^-12 and around the
// ends, within 2 ulp (2^-22 relative); 0 below -87 and for -inf, NaN kept; exp_shifted's values
// and sum on lengths around its 8 lanes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_state.h"

namespace {

int passed = 0, failed = 0;

void check(bool ok, const std::string& what) {
    if (ok) {
        ++passed;
    } else {
        ++failed;
        std::printf("FAIL: %s\n", what.c_str());
    }
}

void test_exp_nonpositive() {
    double worst = 0.0;
    float worst_x = 0.0f;
    int64_t count = 0;
    const auto measure = [&](float x) {
        const double exact = std::exp(double(x));
        const double error = std::fabs(double(kcap::exp_nonpositive(x)) - exact) / exact;
        if (error > worst) worst = error, worst_x = x;
        ++count;
    };
    for (int64_t i = 0; i <= int64_t(87) * 4096; ++i) measure(-float(i) / 4096.0f);
    // The first and last floats of the range, and the neighbours of each multiple of ln 2 / 2
    // (where the rounding of k switches).
    float tiny = 0.0f;
    for (int step = 0; step < 4096; ++step, tiny = std::nextafter(tiny, -1.0f)) measure(tiny);
    for (float x = -1e-6f; x > -1.001e-6f; x = std::nextafter(x, -1.0f)) measure(x);
    for (float x = -87.0f; x < -86.9999f; x = std::nextafter(x, 0.0f)) measure(x);
    for (int k = 1; k < 251; ++k) {
        float x = -float(k) * 0.34657359f;
        for (int step = 0; step < 64; ++step, x = std::nextafter(x, 0.0f)) measure(x);
    }
    std::printf("exp_nonpositive: %lld values, largest relative error %.3g at %.9g (2 ulp: %.3g)\n",
                static_cast<long long>(count), worst, worst_x, std::ldexp(1.0, -22));
    check(worst <= std::ldexp(1.0, -22), "exp_nonpositive within 2 ulp of exp on [-87, 0]");
    check(kcap::exp_nonpositive(0.0f) == 1.0f, "exp(0) is 1");
    check(kcap::exp_nonpositive(-87.5f) == 0.0f, "below -87: 0");
    check(kcap::exp_nonpositive(-std::numeric_limits<float>::infinity()) == 0.0f, "exp(-inf) is 0");
    check(std::isnan(kcap::exp_nonpositive(std::numeric_limits<float>::quiet_NaN())), "NaN stays NaN");
}

void test_exp_shifted() {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 4.0f);
    for (const int64_t n : {1, 7, 8, 9, 16, 31, 1000}) {
        std::vector<float> v(static_cast<size_t>(n));
        for (float& x : v) x = normal(rng);
        const float shift = *std::max_element(v.begin(), v.end());
        std::vector<float> expected(v.size());
        double sum = 0.0;
        for (size_t i = 0; i < v.size(); ++i) sum += (expected[i] = float(std::exp(double(v[i] - shift))));
        const double total = kcap::exp_shifted(v.data(), n, shift);
        bool values_ok = true;
        for (size_t i = 0; i < v.size(); ++i)
            values_ok &= std::fabs(double(v[i]) - expected[i]) <= std::ldexp(1.0, -22) * expected[i];
        check(values_ok, "exp_shifted's values, n = " + std::to_string(n));
        check(std::fabs(total - sum) <= 1e-6 * sum, "exp_shifted's sum, n = " + std::to_string(n));
    }
}

}  // namespace

int main() {
    test_exp_nonpositive();
    test_exp_shifted();
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
