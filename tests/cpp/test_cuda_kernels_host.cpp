// The shared GPU kernel bodies (kernels/*.h), run on the CPU through the host target of the
// kernel dialect (kernels/dialect_host.h: one fiber per GPU thread, real barriers and simd
// exchanges), against the CPU backend's rows. Runs everywhere, GPU or not, so:
//   - every line of shared kernel math is checked on every CI run, not only on the device;
//   - the dialect's promise holds: a body that used anything CUDA-only would not compile here.
// Driven by the capability table: each CUDA row's body is run at the edges of its legal dims
// with NaN-poisoned outputs. The device run (test_cuda_rows.cpp) checks the real launches.
//
// Tolerances (relative L2 error against the CPU row): 1e-5 for matmul, relative to
// ||(|W| |x|)|| (exact weights, f32 sums in another order; one output's terms may cancel),
// 2e-6 for embed/elementwise/norm/rope, 1e-5 for attention (exp and online softmax).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>

#include "dispatch/rope_table.h"
#include "kcap/engine.h"
#include "dispatch/kernel_params.h"
#include "dispatch/planner.h"
#include "cuda/rows.h"
#include "kernels/activation.h"
#include "kernels/argmax.h"
#include "kernels/sample.h"
#include "kernels/attention.h"
#include "kernels/attention_mla.h"
#include "kernels/elementwise.h"
#include "kernels/embed.h"
#include "kernels/matmul.h"
#include "kernels/matvec.h"
#include "kernels/matvec_q8.h"
#include "kernels/moe.h"
#include "kernels/moe_q8.h"
#include "kernels/norm.h"
#include "kernels/ple.h"
#include "kernels/quant_codes.h"
#include "kernels/rope.h"
#include "test_cuda_common.h"

using namespace kcap_test;
using kcap::cuda_rows::kMatvecRows;
using kcap::cuda_rows::kMatvecQ8Simds;
using kcap::cuda_rows::kMatvecSimds;
using kcap::cuda_rows::kMoeQ8DownRows;
using kcap::cuda_rows::kMoeQ8GateUpRows;
using kcap::cuda_rows::kTokensPerPass;
using kcap::cuda_rows::kTokensRows;
using kcap::cuda_rows::kTokensSimds;

namespace {

constexpr double kExactTolerance = 2e-6;
constexpr double kMatmulTolerance = 1e-5;
constexpr double kGateUpTolerance = 1e-5;  // gate_up_error: the matmul bound carried through act(g) * u
constexpr double kAttentionTolerance = 1e-5;

unsigned ceil_div(int64_t a, int64_t b) { return unsigned((a + b - 1) / b); }

std::vector<float> nan_filled(size_t n) { return std::vector<float>(n, NAN); }

// Calls fn with a value of the decoder struct of format f.
template <class Fn>
void with_decoder(Format f, Fn&& fn) {
    switch (f) {
#define KCAP_CASE(NAME, DECODER) \
    case Format::NAME: fn(DECODER{}); return;
        KCAP_WEIGHT_FORMATS(KCAP_CASE)
#undef KCAP_CASE
        default: throw std::runtime_error("no decoder");
    }
}

// decode32 of every run equals the exact dequantization (formats.h).
void test_decoders(std::mt19937& rng) {
    for (const FormatInfo& info : all_formats()) {
        bool known = false;
        with_decoder(info.format, [&](auto decoder) {
            using F = decltype(decoder);
            known = true;
            const int64_t k = std::max<int64_t>(32, info.block_elems) * 2;
            auto w = random_weights(rng, info.format, k, 3);
            std::vector<float> ref(static_cast<size_t>(k)), got = nan_filled(static_cast<size_t>(k));
            for (int row = 0; row < 3; ++row) {
                dequantize_row(info.format, w->ref.row(row), ref.data(), k);
                for (int run = 0; run < k / 32; ++run) {
                    const int per_block = F::block_elems / 32;
                    F::decode32(w->ref.row(row) + (run / per_block) * F::block_bytes, run % per_block, got.data() + 32 * run);
                }
                double worst = 0.0;  // infinity past a value that is not finite (std::max passes over a NaN)
                for (int64_t i = 0; i < k; ++i)
                    worst = !std::isfinite(got[size_t(i)])
                                ? INFINITY
                                : std::max(worst, std::fabs(double(got[size_t(i)]) - ref[size_t(i)]) /
                                                      std::max(1e-30, std::fabs(double(ref[size_t(i)]))));
                // One rounding may differ where the GPU form fuses a multiply-add.
                KCAP_EXPECT(worst <= 1e-6, "decode32 %s row %d: worst relative difference %.3g", info.name, row, worst);
            }
        });
        (void)known;
    }
}

// Every decoder reads only its own block, at each start alignment its format allows (blocks of
// 18, 22, 34, 110, 210 bytes at 0 and 2 mod 4, MXFP4 at any byte): each block is copied to a
// buffer at that offset and decoded with the host loads limited to its exact bytes, and the
// values must be bit-identical to decoding it in place. A block that ends a weight tensor ends
// a device allocation, so the aligned-load helpers (kcap_load_u32s_a2 and friends) may not
// stray past it. codes32 (quant_codes.h) is held to the same.
void test_decoder_bounds(std::mt19937& rng) {
    int checked = 0;
    for (const FormatInfo& info : all_formats()) {
        with_decoder(info.format, [&](auto decoder) {
            using F = decltype(decoder);
            const int step = F::block_bytes % 2 ? 1 : F::block_bytes % 4 ? 2 : 4;  // legal start offsets mod 4
            const int64_t k = std::max<int64_t>(32, info.block_elems) * 2;
            const int rows = 3;
            auto w = random_weights(rng, info.format, k, rows);
            alignas(16) static kcap_u8 buffer[512];
            for (int row = 0; row < rows; ++row)
                for (int run = 0; run < k / 32; ++run) {
                    const int per_block = F::block_elems / 32;
                    const kcap_u8* block = w->ref.row(row) + (run / per_block) * F::block_bytes;
                    float want[32], got[32];
                    F::decode32(block, run % per_block, want);
                    for (int offset = 0; offset < 4; offset += step) {
                        kcap_u8* copy = buffer + offset;
                        std::memcpy(copy, block, F::block_bytes);
                        kcap_sim::Readable only(copy, copy + F::block_bytes);
                        F::decode32(copy, run % per_block, got);
                        KCAP_EXPECT(std::memcmp(got, want, sizeof got) == 0, "decode32 %s at offset %d: other values",
                                    info.name, offset);
                        using C = KcapCodes<F>;
                        if constexpr (C::factorable) {
                            float q[32], scale[2], off[2], q_want[32], scale_want[2], off_want[2];
                            {
                                kcap_sim::Readable anything(nullptr, nullptr);
                                C::codes32(block, run % per_block, q_want, scale_want, off_want);
                            }
                            C::codes32(copy, run % per_block, q, scale, off);
                            KCAP_EXPECT(std::memcmp(q, q_want, sizeof q) == 0 && std::memcmp(scale, scale_want, sizeof scale) == 0 &&
                                            std::memcmp(off, off_want, sizeof off) == 0,
                                        "codes32 %s at offset %d: other values", info.name, offset);
                        }
                        ++checked;
                    }
                }
        });
    }
    std::printf("decoder bounds: %d block decodes at every legal start alignment, each within its block\n", checked);
}

// Ulps between two floats (0 for equal values, +0 and -0 included).
int64_t ulp_distance(float a, float b) {
    if (a == b) return 0;
    if (!std::isfinite(a) || !std::isfinite(b)) return INT64_MAX;
    int32_t ia, ib;
    std::memcpy(&ia, &a, 4);
    std::memcpy(&ib, &b, 4);
    const int64_t la = ia < 0 ? int64_t(INT32_MIN) - ia : ia, lb = ib < 0 ? int64_t(INT32_MIN) - ib : ib;
    return la > lb ? la - lb : lb - la;
}

// KcapCodes<F>::codes32 (kernels/quant_codes.h, the bf16 tensor-core rows' weights) against
// decode32: every code exact in bf16 (an integer |q| <= 128, or for BF16 a bf16 value), the
// sub-block pairs consistent with F's sub-block size, and scale * q + offset, evaluated once
// rounded (as a GPU fused multiply-add does), equal to decode32 bit for bit; Q6_K within 1 ulp
// (decode32 rounds a * q6 before adding -32a on a host that does not fuse).
void test_codes(std::mt19937& rng) {
    int formats = 0;
    for (const FormatInfo& info : all_formats()) {
        with_decoder(info.format, [&](auto decoder) {
            using F = decltype(decoder);
            using C = KcapCodes<F>;
            if constexpr (C::factorable) {
                ++formats;
                const int64_t k = std::max<int64_t>(32, info.block_elems) * 3;
                const int rows = 8;
                auto w = random_weights(rng, info.format, k, rows);
                const int64_t max_ulps = info.format == Format::Q6_K ? 1 : 0;
                const bool integer_codes = info.format != Format::BF16;
                int64_t worst = 0, off_by_one = 0, values = 0;
                for (int row = 0; row < rows; ++row)
                    for (int run = 0; run < k / 32; ++run) {
                        const int per_block = F::block_elems / 32;
                        const kcap_u8* block = w->ref.row(row) + (run / per_block) * F::block_bytes;
                        float ref[32], q[32], scale[2] = {NAN, NAN}, offset[2] = {NAN, NAN};
                        F::decode32(block, run % per_block, ref);
                        C::codes32(block, run % per_block, q, scale, offset);
                        if (C::sub == 32)
                            KCAP_EXPECT(scale[0] == scale[1] && offset[0] == offset[1],
                                        "codes32 %s: a 32-element sub-block with two (scale, offset) pairs", info.name);
                        if (!C::has_offset)
                            KCAP_EXPECT(offset[0] == 0.0f && offset[1] == 0.0f, "codes32 %s: offset without has_offset",
                                        info.name);
                        for (int i = 0; i < 32; ++i) {
                            uint32_t bits;
                            std::memcpy(&bits, &q[i], 4);
                            KCAP_EXPECT((bits & 0xffffu) == 0, "codes32 %s run %d: code %.9g not exact in bf16", info.name,
                                        run, q[i]);
                            if (integer_codes)
                                KCAP_EXPECT(q[i] == std::nearbyint(q[i]) && std::fabs(q[i]) <= 128.0f,
                                            "codes32 %s run %d: code %.9g is not a small integer", info.name, run, q[i]);
                            const int h = i / 16;
                            const float v = float(double(scale[h]) * double(q[i]) + double(offset[h]));
                            const int64_t ulps = ulp_distance(v, ref[i]);
                            worst = std::max(worst, ulps);
                            off_by_one += ulps != 0;
                            ++values;
                            KCAP_EXPECT(ulps <= max_ulps, "codes32 %s row %d run %d elem %d: %.9g * %.9g + %.9g = %.9g, decode32 %.9g",
                                        info.name, row, run, i, scale[h], q[i], offset[h], v, ref[i]);
                        }
                    }
                std::printf("codes32 %-5s sub %d: %lld values, worst %lld ulp (%lld not bit-identical)\n", info.name, C::sub,
                            (long long)values, (long long)worst, (long long)off_by_one);
            }
        });
    }
    KCAP_EXPECT(formats == 12, "codes32 checked for %d formats, expected 12", formats);
}

// KcapCodes<F>::codes8 (the q8_1 rows' weights). codes32 is built from it, so test_codes
// (codes32 against decode32, bit for bit) is what checks its codes, scales and offsets; here: the
// formats that have it are those of KCAP_Q8_WEIGHT_FORMATS (the list the q8_1 rows are declared
// from), a format whose bytes are not flagged signed_codes has no byte above 127, and every
// code byte - bias fits the int8 operands (|code| <= 128).
// The byte-permutation table of the MXFP4 decoders against the arithmetic it replaced: every
// code in every nibble of a word (the others random), as signed bytes in place.
void test_mxfp4_table(std::mt19937& rng) {
    int checked = 0;
    for (int nibble = 0; nibble < 8; ++nibble)
        for (kcap_u32 code = 0; code < 16; ++code) {
            const kcap_u32 q = (kcap_u32(rng()) & ~(0xfu << (4 * nibble))) | (code << (4 * nibble));
            kcap_u32 lo = 0, hi = 0;
            kcap_mxfp4_doubled_bytes(q, lo, hi);
            for (int byte = 0; byte < 4; ++byte)
                for (int high = 0; high < 2; ++high) {
                    const kcap_u32 c = (q >> (8 * byte + 4 * high)) & 0xfu;
                    const int got = int(int8_t(((high ? hi : lo) >> (8 * byte)) & 0xffu));
                    KCAP_EXPECT(float(got) == kcap_mxfp4_doubled(c), "mxfp4 code %u: %d, want %g", c, got,
                                double(kcap_mxfp4_doubled(c)));
                    ++checked;
                }
        }
    std::printf("mxfp4 table: %d values\n", checked);
}

void test_codes8(std::mt19937& rng) {
    int formats = 0, listed = 0;
#define KCAP_COUNT_Q8(NAME, DECODER) ++listed;
    KCAP_Q8_WEIGHT_FORMATS(KCAP_COUNT_Q8)
#undef KCAP_COUNT_Q8
    for (const FormatInfo& info : all_formats()) {
        with_decoder(info.format, [&](auto decoder) {
            using F = decltype(decoder);
            using C = KcapCodes<F>;
            if constexpr (C::has_codes8) {
                ++formats;
                const int64_t k = std::max<int64_t>(32, info.block_elems) * 3;
                auto w = random_weights(rng, info.format, k, 8);
                for (int row = 0; row < 8; ++row)
                    for (int run = 0; run < k / 32; ++run) {
                        const int per_block = F::block_elems / 32;
                        const kcap_u8* block = w->ref.row(row) + (run / per_block) * F::block_bytes;
                        float scale[2], offset[2];
                        kcap_u32 u[8];
                        C::codes8(block, run % per_block, u, scale, offset);
                        for (int i = 0; i < 32; ++i) {
                            const int byte = int(int8_t(uint8_t(u[i / 4] >> (8 * (i % 4)))));
                            KCAP_EXPECT(C::signed_codes || byte >= 0, "codes8 %s: byte %d of a format with unsigned codes",
                                        info.name, byte);
                            KCAP_EXPECT(std::abs(byte - C::bias) <= 128, "codes8 %s: code %d", info.name, byte - C::bias);
                        }
                    }
            }
        });
    }
    KCAP_EXPECT(formats == listed && formats == 11, "codes8 in %d formats, %d listed", formats, listed);
    std::printf("codes8: %d formats\n", formats);
}

// The kernels' q8_1 rounding (kcap_q8_quantize_rows, a matmul's input quantized once, and
// kcap_q8_stage_runs, the matvec's groups quantizing x themselves) and the CPU rows' (round_q8_1)
// against the tests' restatement (q8_1_values), bit for bit, on runs with ties, zeros and wide
// ranges; and the matvec's copy of quantized rows into its records (kcap_q8_copy_runs).
void test_q8_rounding(std::mt19937& rng) {
    const int runs = 64;
    std::vector<float> x = random_floats(rng, size_t(runs * 32));
    for (int i = 0; i < 32; ++i) x[size_t(i)] = 0.0f;                      // run 0: all zeros
    for (int i = 0; i < 32; ++i) x[size_t(32 + i)] = float(i - 16) * 0.5f;  // run 1: halves (ties at amax 8)
    for (int i = 0; i < 32; ++i) x[size_t(64 + i)] *= i == 5 ? 1e4f : 1e-3f;  // run 2: one large value
    for (int i = 0; i < 32; ++i) x[size_t(96 + i)] = (i % 3 - 1) * 1e-38f;    // run 3: subnormal d: q = 0
    // Run 4: amax 127, so d = 1 and the halves are ties: to even (0.5 -> 0, 1.5 -> 2, 2.5 -> 2).
    const float ties[8] = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3.5f};
    const int tie_codes[8] = {127, 0, 2, 2, 0, -2, -2, 4};
    for (int i = 0; i < 32; ++i) x[size_t(128 + i)] = i < 8 ? ties[i] : 0.25f;
    const std::vector<float> want = q8_1_values(x);
    std::vector<float> core(x.size());  // the CPU rows' rounding (cpu.matmul_q8.*)
    kcap::round_q8_1(x.data(), int64_t(x.size()), core.data());
    KCAP_EXPECT(core == want, "round_q8_1 differs from the restated q8_1 rounding");
    // The batch form: 2 rows of 1024 values.
    std::vector<kcap_u32> codes(x.size() / 4, 0xdeadbeefu);
    std::vector<float> row_d(size_t(runs), NAN);
    std::vector<kcap_i32> half_sums(size_t(2 * runs), -7777);
    kcap_sim::launch({unsigned((x.size() / 4 + 127) / 128), 1, 1}, 128, 0, [&](const KcapThread& t, void*) {
        kcap_q8_quantize_rows(t, x.data(), 2, int(x.size() / 2), codes.data(), row_d.data(), half_sums.data());
    });
    // What test_cuda_rows writes into the q8_1 scratch for the rows that read it (kQ8Input): the
    // same words, scales and half sums, bit for bit.
    const Q8Scratch restated = q8_1_scratch(x, 2, int(x.size() / 2));
    KCAP_EXPECT(restated.codes == std::vector<uint32_t>(codes.begin(), codes.end()) &&
                    std::memcmp(restated.d.data(), row_d.data(), row_d.size() * 4) == 0 &&
                    restated.half_sums == std::vector<int32_t>(half_sums.begin(), half_sums.end()),
                "q8_1_scratch differs from kcap_q8_quantize_rows");
    // The matvec's copy (3 simd groups: 48 runs a round), into poisoned records.
    std::vector<kcap_i32> records(size_t(runs * KCAP_Q8_RUN_WORDS), -7777);
    std::vector<float> scales(static_cast<size_t>(runs), NAN);
    kcap_sim::launch({1, 1, 1}, 96, 0, [&](const KcapThread& t, void*) {
        kcap_q8_copy_runs(t, codes.data(), row_d.data(), half_sums.data(), runs, records.data(), scales.data());
    });
    // The groups' own rounding (3 simd groups: 12 runs a round) gives the same records.
    std::vector<kcap_i32> staged(records.size(), -7777);
    std::vector<float> staged_scales(scales.size(), NAN);
    kcap_sim::launch({1, 1, 1}, 96, 0, [&](const KcapThread& t, void*) {
        kcap_q8_stage_runs(t, x.data(), runs, staged.data(), staged_scales.data());
    });
    for (int r = 0; r < runs; ++r)
        for (int i = 0; i < 10; ++i)  // the 8 code words and 2 half sums (the 2 padding words are not written)
            KCAP_EXPECT(staged[size_t(r * KCAP_Q8_RUN_WORDS + i)] == records[size_t(r * KCAP_Q8_RUN_WORDS + i)] &&
                            staged_scales[size_t(r)] == scales[size_t(r)],
                        "q8_1 run %d: the groups' rounding differs from the quantized rows' (word %d)", r, i);
    for (int r = 0; r < runs; ++r) {
        // The copied records' codes and scale against the restated values.
        int q[32];
        const float d = scales[size_t(r)];
        int sums[2] = {0, 0};
        for (int i = 0; i < 32; ++i) {
            q[i] = int(int8_t(uint8_t(uint32_t(records[size_t(r * KCAP_Q8_RUN_WORDS + i / 4)]) >> (8 * (i % 4)))));
            KCAP_EXPECT(d * float(q[i]) == want[size_t(32 * r + i)], "q8_1 staged run %d elem %d: %g * %d, want %g", r,
                        i, d, q[i], want[size_t(32 * r + i)]);
            sums[i / 16] += q[i];
        }
        if (r == 3)
            for (int i = 0; i < 32; ++i) KCAP_EXPECT(q[i] == 0, "q8_1 run of subnormal scale: q[%d] = %d", i, q[i]);
        if (r == 4)
            for (int i = 0; i < 8; ++i)
                KCAP_EXPECT(q[i] == tie_codes[i], "q8_1 tie %g: q %d, want %d (ties to even)", ties[i], q[i], tie_codes[i]);
        KCAP_EXPECT(row_d[size_t(r)] == d && half_sums[size_t(2 * r)] == sums[0] && half_sums[size_t(2 * r + 1)] == sums[1],
                    "q8_1 rows run %d: scale or half sums", r);
        for (int i = 0; i < 32; ++i)
            KCAP_EXPECT(int(int8_t(uint8_t(codes[size_t(8 * r + i / 4)] >> (8 * (i % 4))))) == q[i], "q8_1 rows run %d elem %d", r, i);
        KCAP_EXPECT(records[size_t(r * KCAP_Q8_RUN_WORDS + 8)] == sums[0] && records[size_t(r * KCAP_Q8_RUN_WORDS + 9)] == sums[1],
                    "q8_1 staged run %d: half sums", r);
    }
    // MXFP4's records (nibble order), from both the copy and the groups' own rounding, into
    // poisoned records: code byte of element e where KcapQ8Units<KcapMXFP4> reads it (byte j of
    // word 2w is element 4w + j / 2 + 16 (j % 2), of word 2w + 1 element 4w + 2 + j / 2 + 16 (j % 2)),
    // the half sums and d as in element order.
    std::vector<kcap_i32> nibble_copied(records.size(), -7777), nibble_staged(records.size(), -7777);
    std::vector<float> nibble_copied_scales(scales.size(), NAN), nibble_staged_scales(scales.size(), NAN);
    kcap_sim::launch({1, 1, 1}, 96, 0, [&](const KcapThread& t, void*) {
        kcap_q8_copy_runs<true>(t, codes.data(), row_d.data(), half_sums.data(), runs, nibble_copied.data(),
                                nibble_copied_scales.data());
    });
    kcap_sim::launch({1, 1, 1}, 96, 0, [&](const KcapThread& t, void*) {
        kcap_q8_stage_runs<true>(t, x.data(), runs, nibble_staged.data(), nibble_staged_scales.data());
    });
    for (int r = 0; r < runs; ++r) {
        const kcap_i32* plain = records.data() + r * KCAP_Q8_RUN_WORDS;
        for (const auto* nibble : {nibble_copied.data() + r * KCAP_Q8_RUN_WORDS, nibble_staged.data() + r * KCAP_Q8_RUN_WORDS}) {
            for (int word = 0; word < 8; ++word)
                for (int j = 0; j < 4; ++j) {
                    const int e = 4 * (word / 2) + 2 * (word % 2) + j / 2 + 16 * (j % 2);
                    const uint32_t got = (uint32_t(nibble[word]) >> (8 * j)) & 0xffu;
                    const uint32_t want_byte = (uint32_t(plain[e / 4]) >> (8 * (e % 4))) & 0xffu;
                    KCAP_EXPECT(got == want_byte, "q8_1 nibble-order run %d word %d byte %d: element %d", r, word, j, e);
                }
            KCAP_EXPECT(nibble[8] == plain[8] && nibble[9] == plain[9], "q8_1 nibble-order run %d: half sums", r);
        }
        KCAP_EXPECT(nibble_copied_scales[size_t(r)] == scales[size_t(r)] && nibble_staged_scales[size_t(r)] == scales[size_t(r)],
                    "q8_1 nibble-order run %d: d", r);
    }
    // One group's row quantization (kcap_q8_quantize_row, cuda.add_norm's epilogue), several rounds
    // per thread at the wide widths, against kcap_q8_quantize_rows, bit for bit; the row starts with
    // the special runs above.
    int rows_checked = 0;
    for (int width : {640, 4096, 14336})
        for (unsigned threads : {160u, 1024u}) {
            std::vector<float> row = random_floats(rng, size_t(width));
            std::copy(x.begin(), x.begin() + 5 * 32, row.begin());  // runs 0-4 above: zeros, ties, subnormal d
            std::vector<kcap_u32> want_codes(size_t(width / 4));
            std::vector<float> want_d(size_t(width / 32));
            std::vector<kcap_i32> want_sums(size_t(width / 16));
            kcap_sim::launch({unsigned((width / 4 + 127) / 128), 1, 1}, 128, 0, [&](const KcapThread& t, void*) {
                kcap_q8_quantize_rows(t, row.data(), 1, width, want_codes.data(), want_d.data(), want_sums.data());
            });
            std::vector<kcap_u32> got_codes(want_codes.size(), 0xdeadbeefu);
            std::vector<float> got_d(want_d.size(), NAN);
            std::vector<kcap_i32> got_sums(want_sums.size(), -7777);
            kcap_sim::launch({1, 1, 1}, threads, 0, [&](const KcapThread& t, void*) {
                kcap_q8_quantize_row(t, row.data(), width, got_codes.data(), got_d.data(), got_sums.data());
            });
            KCAP_EXPECT(got_codes == want_codes && got_sums == want_sums &&
                            std::memcmp(got_d.data(), want_d.data(), want_d.size() * 4) == 0,
                        "kcap_q8_quantize_row width %d, %u threads: differs from kcap_q8_quantize_rows", width, threads);
            ++rows_checked;
            // The one-value-per-lane form (kcap_q8_quantize_lane, the decode combine's epilogue).
            std::fill(got_codes.begin(), got_codes.end(), 0xdeadbeefu);
            std::fill(got_d.begin(), got_d.end(), NAN);
            std::fill(got_sums.begin(), got_sums.end(), -7777);
            kcap_sim::launch({1, 1, 1}, threads, 0, [&](const KcapThread& t, void*) {
                for (unsigned e = t.index; e < unsigned(width); e += t.threads)
                    kcap_q8_quantize_lane(t, row[e], e, got_codes.data(), got_d.data(), got_sums.data());
            });
            KCAP_EXPECT(got_codes == want_codes && got_sums == want_sums &&
                            std::memcmp(got_d.data(), want_d.data(), want_d.size() * 4) == 0,
                        "kcap_q8_quantize_lane width %d, %u threads: differs from kcap_q8_quantize_rows", width, threads);
            ++rows_checked;
        }
    std::printf("q8_1 rounding: %d runs, %d group rows\n", runs, rows_checked);
}

// The matvec team shapes a launcher may pick (kernels/matvec.h, cuda_rows::matvec_teams): whole
// simd groups in 1 to `simds` parts (a group's simd groups), and short rows' teams of 16, 8 and
// 4 lanes.
std::vector<KcapMatvecTeams> matvec_team_shapes(int simds = kMatvecSimds) {
    std::vector<KcapMatvecTeams> shapes;
    for (int split = 1; split <= simds; split *= 2) shapes.push_back(kcap_matvec_parts(split));
    for (int lanes = 16; lanes >= kcap::cuda_rows::kMatvecFewestLanes; lanes /= 2) shapes.push_back(KcapMatvecTeams{1, lanes});
    return shapes;
}
unsigned matvec_test_groups(int64_t n, const KcapMatvecTeams& teams, int rows, int simds = kMatvecSimds) {
    return ceil_div(n, kcap::cuda_rows::matvec_group_rows(teams.split, teams.lanes, rows, simds));
}

void test_matmul_rows(std::mt19937& rng, CpuState& cpu) {
    int checked = 0;
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA || row.op != Op::MatMul) continue;
        // The exact bodies (the decode matvec and the few-token walk) of every format, once per
        // format through its walk row; the tensor-core tiles are CUDA-only and checked on the device.
        if (row.kernel.rfind("cuda.matmul_tokens.", 0) != 0) continue;
        const Format f = row_format(row);
        const Row& reference = cpu_twin(row);
        with_decoder(f, [&](auto decoder) {
            using F = decltype(decoder);
            for (int64_t k : k_edges(row, 4096))
                for (int64_t n : {1, 9})
                    for (int m : {1, 3, 10})
                        for (bool with_bias : {false, true}) {
                            auto w = random_weights(rng, f, k, n);
                            auto bias = float_vector(random_floats(rng, size_t(n)), "bias");
                            const Stage stage = matmul_stage(&w->ref, with_bias ? &bias->ref : nullptr, k, n);
                            const std::vector<float> x = random_floats(rng, size_t(m * k));
                            std::vector<float> ref(static_cast<size_t>(m * n)), got = nan_filled(size_t(m * n));
                            KernelCall call;
                            call.n_tokens = m;
                            call.in = x.data();
                            call.out = ref.data();
                            run_cpu(reference, stage, call, cpu);
                            KcapMatmulParams p;
                            p.k = int(k), p.n = int(n), p.m = m;
                            p.row_bytes = unsigned(row_bytes(f, k));
                            p.has_bias = with_bias;
                            const float* b = with_bias ? reinterpret_cast<const float*>(bias->ref.data) : nullptr;
                            if (m == 1) {
                                // Every team shape the launcher may pick (its own pick for this K included).
                                for (const KcapMatvecTeams teams : matvec_team_shapes()) {
                                    got = nan_filled(size_t(m * n));
                                    kcap_sim::launch({matvec_test_groups(n, teams, kMatvecRows), 1, 1},
                                                     kMatvecSimds * 32, kcap::cuda_rows::kMatvecSharedBytes,
                                                     [&](const KcapThread& t, void* shared) {
                                                         // x staged whole, and (split 2, 8 lanes) in chunks of 32 runs.
                                                         const int runs = int(k / 32);
                                                         const int chunk = std::min(
                                                             runs, teams.split == 2 || teams.lanes == 8
                                                                       ? 32
                                                                       : kcap::cuda_rows::kMatvecChunkRuns);
                                                         kcap::cuda_rows::with_matvec_body<
                                                             kcap::cuda_rows::kMatvecFewestLanes>(
                                                             teams.lanes, [&](auto body) {
                                                                 kcap_matvec_staged<F, kMatvecRows, KCAP_MATVEC_PLAIN,
                                                                                    decltype(body)::value>(
                                                                     t, p, teams, chunk, w->ref.data, w->ref.data,
                                                                     x.data(), b, 0, got.data(),
                                                                     static_cast<float*>(shared));
                                                             });
                                                     });
                                    const double err = matmul_error(got, ref, w->ref, x.data(), k, n, m);
                                    KCAP_EXPECT(err <= kMatmulTolerance,
                                                "%s K=%lld N=%lld split=%d lanes=%d bias=%d: error %.3g",
                                                row.kernel.c_str(), (long long)k, (long long)n, teams.split,
                                                teams.lanes, int(with_bias), err);
                                }
                            } else {
                                kcap_sim::launch({ceil_div(n, kTokensSimds * kTokensRows), ceil_div(m, kTokensPerPass), 1},
                                                 kTokensSimds * 32, 0, [&](const KcapThread& t, void*) {
                                                     kcap_matmul_tokens<F, kTokensRows, kTokensPerPass>(
                                                         t, p, w->ref.data, x.data(), b, got.data());
                                                 });
                            }
                            const double err = matmul_error(got, ref, w->ref, x.data(), k, n, m);
                            KCAP_EXPECT(err <= kMatmulTolerance, "%s K=%lld N=%lld M=%d bias=%d: error %.3g",
                                        row.kernel.c_str(), (long long)k, (long long)n, m, int(with_bias), err);
                            ++checked;
                        }
        });
    }
    std::printf("matmul bodies: %d cases\n", checked);
}

void test_embed_rows(std::mt19937& rng, CpuState& cpu) {
    int checked = 0;
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA || row.op != Op::Embed) continue;
        const Format f = row_format(row);
        with_decoder(f, [&](auto decoder) {
            using F = decltype(decoder);
            // Widths: three blocks; and for float tables (k_multiple 4) three runs plus a tail.
            std::vector<int64_t> widths = {row.dims.k_multiple * 3};
            if (row.dims.k_multiple < 32) widths.push_back(row.dims.k_multiple * 25);
            for (int64_t width : widths)
                for (int positions : {0, 1, 2}) {  // none, f32, f16 learned position embedding
                    const int64_t vocab = 11, n_pos = 12, pos0 = 5;
                    auto table = random_weights(rng, f, width, vocab);
                    auto pos_table = random_weights(rng, positions == 2 ? Format::F16 : Format::F32, width, n_pos, "pos");
                    Stage stage;
                    stage.op = Op::Embed;
                    stage.operands = {&table->ref};
                    if (positions) stage.operands.push_back(&pos_table->ref);
                    stage.k = stage.n = width;
                    stage.params.scale = 1.5f;
                    stage.features = kEmbedScale | (positions ? FeatureMask(kPositionEmbedding) : FeatureMask(0));
                    KCAP_EXPECT(rejection_reason(row, stage).empty(), "%s refuses width %lld positions %d: %s",
                                row.kernel.c_str(), (long long)width, positions, rejection_reason(row, stage).c_str());
                    const std::vector<int32_t> tokens = {3, 0, 10, 3};
                    std::vector<float> ref(tokens.size() * size_t(width)), got = nan_filled(ref.size());
                    KernelCall call;
                    call.n_tokens = int(tokens.size());
                    call.pos0 = int(pos0);
                    call.tokens = tokens.data();
                    call.out = ref.data();
                    run_cpu(cpu_twin(row), stage, call, cpu);
                    KcapEmbedParams p;
                    p.n_tokens = int(tokens.size()), p.width = int(width), p.row_bytes = unsigned(row_bytes(f, width));
                    p.scale = 1.5f;
                    p.positions = positions;
                    const int32_t step[2] = {int32_t(pos0), 0};
                    kcap_sim::launch({unsigned(tokens.size()), 1, 1}, 32, 0, [&](const KcapThread& t, void*) {
                        kcap_embed<F>(t, p, tokens.data(), step, table->ref.data, pos_table->ref.data, got.data());
                    });
                    const double err = relative_error(got, ref);
                    KCAP_EXPECT(err <= kExactTolerance, "%s width=%lld positions=%d: error %.3g", row.kernel.c_str(),
                                (long long)width, positions, err);
                    ++checked;
                }
        });
    }
    std::printf("embed bodies: %d cases\n", checked);
}

// Per-layer embeddings: every cuda.per_layer_embed.<proj> row's projection (the few-token
// matmul body) and combine, for tables in F32, F16 and the projection's own format, against
// cpu.per_layer_embed; then the gate body against cpu.per_layer_gate.
void test_ple(std::mt19937& rng, CpuState& cpu) {
    int checked = 0;
    const Row& cpu_row = find_row("cpu.per_layer_embed");
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA || row.op != Op::PerLayerEmbed) continue;
        const Format pf = row.operand_formats.at(1).at(0);
        for (Format tf : {Format::F32, Format::F16, pf}) {
            const int64_t block = format_info(tf).block_elems;
            const int n_layer = 4;
            const int per = block >= 256 ? 64 : block == 32 && tf != Format::F32 && tf != Format::F16 ? 24 : 20;
            const int64_t width = int64_t(n_layer) * per, k = row.dims.k_multiple * 3, vocab = 9;
            auto table = random_weights(rng, tf, width, vocab, "ple_table");
            auto proj = random_weights(rng, pf, k, width, "ple_proj");
            auto norm = float_vector(random_floats(rng, size_t(per)), "ple_norm");
            Stage stage;
            stage.op = Op::PerLayerEmbed;
            stage.operands = {&table->ref, &proj->ref, &norm->ref};
            stage.k = k, stage.n = width, stage.groups = n_layer;
            stage.params.eps = 1e-6f, stage.params.n_layer = n_layer;
            stage.params.ple_token_scale = 1.7f, stage.params.ple_model_proj_scale = 0.3f;
            stage.params.ple_combine_scale = 0.7f;
            stage.features = kPerLayerEmbedding | kRmsNorm;
            KCAP_EXPECT(rejection_reason(row, stage).empty(), "%s refuses table %s: %s", row.kernel.c_str(),
                        format_name(tf), rejection_reason(row, stage).c_str());
            for (int m : {1, 3, 10}) {
                std::vector<int32_t> tokens(static_cast<size_t>(m));
                for (int i = 0; i < m; ++i) tokens[size_t(i)] = int32_t((i * 5 + 3) % vocab);
                const std::vector<float> e = random_floats(rng, size_t(m) * size_t(k));
                std::vector<float> ref(size_t(m) * size_t(width)), got = nan_filled(ref.size());
                KernelCall call;
                call.n_tokens = m;
                call.tokens = tokens.data();
                call.in = e.data();
                call.out = ref.data();
                run_cpu(cpu_row, stage, call, cpu);
                KcapMatmulParams mp;
                mp.k = int(k), mp.n = int(width), mp.m = m, mp.row_bytes = unsigned(row_bytes(pf, k)), mp.has_bias = 0;
                KcapPleParams p;
                p.n_tokens = m, p.width = int(width), p.per = per, p.table_row_bytes = unsigned(row_bytes(tf, width));
                p.eps = 1e-6f, p.proj_scale = 0.3f, p.token_scale = 1.7f, p.combine_scale = 0.7f;
                with_decoder(pf, [&](auto pdecoder) {
                    using P = decltype(pdecoder);
                    kcap_sim::launch({ceil_div(width, kTokensSimds * kTokensRows), ceil_div(m, kTokensPerPass), 1},
                                     kTokensSimds * 32, 0, [&](const KcapThread& t, void*) {
                                         kcap_matmul_tokens<P, kTokensRows, kTokensPerPass>(t, mp, proj->ref.data, e.data(),
                                                                                            nullptr, got.data());
                                     });
                });
                with_decoder(tf, [&](auto tdecoder) {
                    using T = decltype(tdecoder);
                    kcap_sim::launch({unsigned(m), unsigned(n_layer), 1}, 32, 0, [&](const KcapThread& t, void*) {
                        kcap_ple_combine<T>(t, p, tokens.data(), table->ref.data,
                                            reinterpret_cast<const float*>(norm->ref.data), got.data());
                    });
                });
                const double err = relative_error(got, ref);
                KCAP_EXPECT(err <= kMatmulTolerance, "%s table %s K=%lld per=%d M=%d: error %.3g", row.kernel.c_str(),
                            format_name(tf), (long long)k, per, m, err);
                ++checked;
            }
        }
    }
    const Row& gate_row = find_row("cuda.per_layer_gate");
    for (Activation act : {Activation::SiLU, Activation::GeluTanh, Activation::GeluErf, Activation::ReLU})
        for (int layer : {0, 3}) {
            const int tokens = 5, per = 20, n_layer = 4, stride = per * n_layer;
            Stage stage;
            stage.op = Op::PerLayerGate;
            stage.k = stride, stage.n = per, stage.groups = layer;
            stage.params.activation = act;
            stage.features = kPerLayerEmbedding;
            KCAP_EXPECT(rejection_reason(gate_row, stage).empty(), "cuda.per_layer_gate refuses");
            const std::vector<float> gate = random_floats(rng, size_t(tokens * per), 3.0f);
            const std::vector<float> ple = random_floats(rng, size_t(tokens * stride));
            std::vector<float> ref(gate.size()), got = nan_filled(gate.size());
            KernelCall call;
            call.n_tokens = tokens;
            call.in = gate.data(), call.in2 = ple.data(), call.out = ref.data();
            run_cpu(find_row("cpu.per_layer_gate"), stage, call, cpu);
            KcapPleGateParams p;
            p.n_tokens = tokens, p.per = per, p.stride = stride, p.offset = layer * per, p.activation = int(act);
            kcap_sim::launch({ceil_div(tokens * per, 64), 1, 1}, 64, 0, [&](const KcapThread& t, void*) {
                kcap_ple_gate(t, p, gate.data(), ple.data(), got.data());
            });
            const double err = relative_error(got, ref);
            KCAP_EXPECT(err <= kExactTolerance, "cuda.per_layer_gate %s layer %d: error %.3g", activation_name(act), layer, err);
            ++checked;
        }
    std::printf("per-layer embedding bodies: %d cases\n", checked);
}

void test_norm(std::mt19937& rng, CpuState& cpu) {
    const Row& row = find_row("cuda.norm");
    int checked = 0;
    for (int64_t width : {64, 640, 1000})
        for (int64_t groups : {1, 4})
            for (bool layer : {false, true})
                for (int variant : {0, 1, 2}) {  // weight; weight and bias; neither (parameter-free)
                    const bool with_bias = variant == 1, with_weight = variant != 2;
                    const int tokens = 3;
                    auto weight = float_vector(random_floats(rng, size_t(width)), "w");
                    auto bias = float_vector(random_floats(rng, size_t(width)), "b");
                    Stage stage;
                    stage.op = Op::Norm;
                    stage.operands = {with_weight ? &weight->ref : nullptr, with_bias ? &bias->ref : nullptr};
                    stage.k = width;
                    stage.groups = groups;
                    stage.n = width * groups;
                    stage.params.eps = 1e-6f;
                    stage.features = (layer ? kLayerNorm : kRmsNorm) | (with_bias ? FeatureMask(kBias) : FeatureMask(0)) |
                                     (with_weight ? FeatureMask(0) : FeatureMask(kParameterFreeNorm));
                    const std::vector<float> x = random_floats(rng, size_t(tokens * width * groups), 3.0f);
                    std::vector<float> ref(x.size()), got = nan_filled(x.size());
                    KernelCall call;
                    call.n_tokens = tokens;
                    call.in = x.data();
                    call.out = ref.data();
                    run_cpu(cpu_twin(row), stage, call, cpu);
                    KcapNormParams p;
                    p.width = int(width), p.rows = int(tokens * groups), p.eps = 1e-6f, p.layer_norm = layer;
                    p.has_weight = with_weight, p.has_bias = with_bias;
                    kcap_sim::launch({unsigned(p.rows), 1, 1}, width <= 64 ? 64 : 256, 32 * 4,
                                     [&](const KcapThread& t, void* shared) {
                                         kcap_norm(t, p, x.data(), reinterpret_cast<const float*>(weight->ref.data),
                                                   reinterpret_cast<const float*>(bias->ref.data), got.data(),
                                                   static_cast<float*>(shared));
                                     });
                    const double err = relative_error(got, ref);
                    KCAP_EXPECT(err <= kExactTolerance, "cuda.norm width=%lld groups=%lld layer=%d bias=%d: error %.3g",
                                (long long)width, (long long)groups, int(layer), int(with_bias), err);
                    ++checked;
                }
    std::printf("norm body: %d cases\n", checked);
}

void test_rope(std::mt19937& rng, CpuState& cpu) {
    const Row& row = find_row("cuda.rope");
    int checked = 0;
    for (bool neox : {false, true})
        for (int rope_dim : {64, 32})
            for (bool with_factors : {false, true}) {
                const int tokens = 3, n_head = 4, n_head_kv = 2, head_dim = 64, pos0 = 5;
                std::vector<float> factor_values = random_floats(rng, size_t(rope_dim / 2));
                for (auto& f : factor_values) f = 1.0f + std::fabs(f);
                auto factors = float_vector(factor_values, "rope_freqs");
                Stage stage;
                stage.op = Op::Rope;
                stage.operands = {with_factors ? &factors->ref : nullptr};
                stage.params.n_head = n_head, stage.params.n_head_kv = n_head_kv, stage.params.head_dim = head_dim;
                stage.params.rope_dim = rope_dim, stage.params.rope_base = 10000.0f, stage.params.rope_freq_scale = 0.5f;
                stage.features = neox ? kRopeNeox : kRopeNormal;
                const std::vector<float> q0 = random_floats(rng, size_t(tokens * n_head * head_dim));
                const std::vector<float> k0 = random_floats(rng, size_t(tokens * n_head_kv * head_dim));
                std::vector<float> q_ref = q0, k_ref = k0, q_got = q0, k_got = k0;
                KernelCall call;
                call.n_tokens = tokens;
                call.pos0 = pos0;
                call.out = q_ref.data();
                call.inout2 = k_ref.data();
                run_cpu(cpu_twin(row), stage, call, cpu);
                const std::vector<float> table = rope_cos_sin_table(stage, 64);
                KcapRopeParams p;
                p.n_tokens = tokens, p.n_head = n_head, p.n_head_kv = n_head_kv, p.head_dim = head_dim;
                p.rope_dim = rope_dim, p.neox = neox;
                const int32_t step[2] = {pos0, 0};
                const int total = tokens * (n_head + n_head_kv) * rope_dim / 2;
                kcap_sim::launch({ceil_div(total, 64), 1, 1}, 64, 0, [&](const KcapThread& t, void*) {
                    kcap_rope(t, p, step, reinterpret_cast<const float2*>(table.data()), q_got.data(), k_got.data());
                });
                const double err = std::max(relative_error(q_got, q_ref), relative_error(k_got, k_ref));
                KCAP_EXPECT(err <= kExactTolerance, "cuda.rope neox=%d rope_dim=%d factors=%d: error %.3g", int(neox),
                            rope_dim, int(with_factors), err);
                ++checked;
            }
    std::printf("rope body: %d cases\n", checked);
}

void test_qk_norm_rope(std::mt19937& rng, CpuState& cpu) {
    int checked = 0;
    for (bool neox : {false, true})
        for (int rope_dim : {64, 32})
            for (bool with_factors : {false, true}) {
                const int tokens = 3, n_head = 4, n_head_kv = 2, head_dim = 64, pos0 = 5;
                std::vector<float> factor_values = random_floats(rng, size_t(rope_dim / 2));
                for (auto& f : factor_values) f = 1.0f + std::fabs(f);
                auto factors = float_vector(factor_values, "rope_freqs");
                auto qw = float_vector(random_floats(rng, size_t(head_dim)), "q_norm");
                auto kw = float_vector(random_floats(rng, size_t(head_dim)), "k_norm");
                Stage stage;
                stage.op = Op::QkNormRope;
                stage.operands = {&qw->ref, &kw->ref, with_factors ? &factors->ref : nullptr};
                stage.params.n_head = n_head, stage.params.n_head_kv = n_head_kv, stage.params.head_dim = head_dim;
                stage.params.rope_dim = rope_dim, stage.params.rope_base = 10000.0f, stage.params.rope_freq_scale = 0.5f;
                stage.params.eps = 1e-6f;
                stage.features = kRmsNorm | (neox ? kRopeNeox : kRopeNormal);
                const std::vector<float> q0 = random_floats(rng, size_t(tokens * n_head * head_dim), 3.0f);
                const std::vector<float> k0 = random_floats(rng, size_t(tokens * n_head_kv * head_dim), 3.0f);
                std::vector<float> q_ref = q0, k_ref = k0, q_got = q0, k_got = k0;
                cpu_qk_norm_rope(stage, tokens, pos0, q_ref, k_ref, cpu);
                const std::vector<float> table = rope_cos_sin_table(stage, 64);
                KcapRopeParams p;
                p.n_tokens = tokens, p.n_head = n_head, p.n_head_kv = n_head_kv, p.head_dim = head_dim;
                p.rope_dim = rope_dim, p.neox = neox;
                const int32_t step[2] = {pos0, 0};
                const int simds = kcap::cuda_rows::kQkNormRopeSimds;
                kcap_sim::launch({ceil_div(tokens * (n_head + n_head_kv), simds), 1, 1}, 32 * simds,
                                 sizeof(float) * simds * head_dim, [&](const KcapThread& t, void* shared) {
                                     kcap_qk_norm_rope(t, p, 1e-6f, step, reinterpret_cast<const float2*>(table.data()),
                                                       reinterpret_cast<const float*>(qw->ref.data),
                                                       reinterpret_cast<const float*>(kw->ref.data), q_got.data(),
                                                       k_got.data(), static_cast<float*>(shared));
                                 });
                const double err = std::max(relative_error(q_got, q_ref), relative_error(k_got, k_ref));
                KCAP_EXPECT(err <= kExactTolerance, "cuda.qk_norm_rope neox=%d rope_dim=%d factors=%d: error %.3g",
                            int(neox), rope_dim, int(with_factors), err);
                ++checked;
            }
    std::printf("qk_norm_rope body: %d cases\n", checked);
}

// The router bodies (the logits, then the top-k) against cpu.moe_route: the same experts, in the
// same order, and their weights.
// Expert counts below, at and above a simd group's width (each lane then scans several), and
// logits that are small integers (integer x and router rows: exact f32 dot products), so that
// many experts tie and the lower index must win as in the CPU row; then random logits.
// The router's logits body (kcap_moe_logits, F32 weights) over p.n_tokens tokens of x, as
// cuda.moe_route launches it: [tokens][n_expert].
std::vector<float> router_logits(const KcapMoeParams& p, const uint8_t* w, const std::vector<float>& x) {
    std::vector<float> logits = nan_filled(size_t(p.n_tokens) * size_t(p.n_expert));
    constexpr int kPerGroup = kcap::cuda_rows::kMoeLogitThreads / 32 * KCAP_MOE_LOGIT_EXPERTS;
    kcap_sim::launch({unsigned((p.n_expert + kPerGroup - 1) / kPerGroup),
                      unsigned((p.n_tokens + KCAP_MOE_LOGIT_TOKENS - 1) / KCAP_MOE_LOGIT_TOKENS), 1},
                     kcap::cuda_rows::kMoeLogitThreads, KCAP_MOE_LOGIT_SHARED_FLOATS * 4,
                     [&](const KcapThread& t, void* shared) {
                         kcap_moe_logits<KcapF32>(t, p, w, x.data(), logits.data(), static_cast<float*>(shared));
                     });
    return logits;
}

// The partial sums of the tiled body (kcap_moe_logits_tiled, cuda.moe_route_tiled's) over its
// p.logit_splits slices of K: [split][tokens][n_expert].
std::vector<float> router_logits_tiled(const KcapMoeParams& p, const uint8_t* w, const std::vector<float>& x) {
    std::vector<float> logits = nan_filled(size_t(p.logit_splits) * size_t(p.n_tokens) * size_t(p.n_expert));
    kcap_sim::launch({unsigned((p.n_expert + KCAP_MOE_TILE - 1) / KCAP_MOE_TILE * p.logit_splits),
                      unsigned((p.n_tokens + KCAP_MOE_TILE - 1) / KCAP_MOE_TILE), 1},
                     KCAP_MOE_TILE_THREADS, KCAP_MOE_TILE_SHARED_FLOATS * 4, [&](const KcapThread& t, void* shared) {
                         kcap_moe_logits_tiled<KcapF32>(t, p, w, x.data(), logits.data(), static_cast<float*>(shared));
                     });
    return logits;
}

// cuda.moe_route_cluster's top-k (kcap_moe_route_ranked) over p.n_tokens tokens' logits as
// kcap_moe_logits writes them: groups of KCAP_MOE_LOGIT_TOKENS tokens, `threads` threads each (the
// cluster's group 0 has 2 to kMoeRouteClusterMaxSimds simd groups), the logits staged first.
std::vector<float> route_ranked(const KcapMoeParams& p, const std::vector<float>& logits, unsigned threads,
                                const float* choice_bias = nullptr) {
    std::vector<float> got = nan_filled(size_t(p.n_tokens) * 2 * size_t(p.n_used));
    const unsigned groups = unsigned((p.n_tokens + KCAP_MOE_LOGIT_TOKENS - 1) / KCAP_MOE_LOGIT_TOKENS);
    const size_t shared = size_t(KCAP_MOE_LOGIT_TOKENS * p.n_expert + KCAP_MOE_RANKED_FLOATS(p.n_expert)) * 4;
    kcap_sim::launch({groups, 1, 1}, threads, shared, [&](const KcapThread& t, void* memory) {
        float* staged = static_cast<float*>(memory);
        const int token0 = int(t.group_x) * KCAP_MOE_LOGIT_TOKENS;
        const int tokens = std::min(KCAP_MOE_LOGIT_TOKENS, p.n_tokens - token0);
        for (int i = int(t.index); i < tokens * p.n_expert; i += int(t.threads))
            staged[i] = logits[size_t(token0) * size_t(p.n_expert) + size_t(i)];
        kcap_barrier();
        kcap_moe_route_ranked(t, p, tokens, staged, staged + KCAP_MOE_LOGIT_TOKENS * p.n_expert, nullptr,
                              got.data() + size_t(token0) * 2 * size_t(p.n_used), choice_bias);
    });
    return got;
}

void test_moe_route(std::mt19937& rng, CpuState& cpu) {
    int checked = 0;
    const Row& reference = find_row("cpu.moe_route");
    std::uniform_int_distribution<int> small(-2, 2);
    // K of two runs, and of 33: two chunks of the logits' staged x, the second partial (the tiled
    // body: 5 slices of K, the last of one run); the tiled body also at 130 runs (15 slices of 9,
    // past KCAP_MOE_TILE_MAX_SPLITS slices of KCAP_MOE_TILE_SPLIT_RUNS).
    for (const int64_t k : {int64_t(64), int64_t(33 * 32), int64_t(130 * 32)})
    for (const int n_expert : {8, 61, 128, 256})
        for (const int used : {1, 2, 8})
            for (const bool ties : {true, false})
                for (const bool renormalize : {false, true})
                for (const bool tiled : {false, true}) {
                    if (k == 130 * 32 && (!tiled || n_expert == 256 || used == 2)) continue;
                    // More than one group of the logits' tokens, a partial one; the tiled body's
                    // tiles: a whole one and a partial one.
                    const int m = tiled ? 45 : 11;
                    std::vector<float> x = random_floats(rng, size_t(m * k));
                    auto w = random_weights(rng, Format::F32, k, n_expert, "router");
                    if (ties) {
                        for (auto& v : x) v = float(small(rng));
                        float* rows = reinterpret_cast<float*>(w->bytes.data());
                        for (int64_t i = 0; i < k * n_expert; ++i) rows[i] = float(small(rng));
                    }
                    Stage stage;
                    stage.op = Op::MoeRoute;
                    stage.k = k;
                    stage.n = 2 * used;
                    stage.operands = {&w->ref};
                    stage.params.n_expert = n_expert;
                    stage.params.n_expert_used = used;
                    stage.params.expert_weights_scale = 1.5f;
                    stage.features = kExpertSoftmax | (renormalize ? FeatureMask(kExpertWeightsNorm) : 0u);
                    std::vector<float> ref(size_t(m) * 2 * used), got = nan_filled(ref.size());
                    KernelCall call;
                    call.n_tokens = m;
                    call.in = x.data();
                    call.out = ref.data();
                    run_cpu(reference, stage, call, cpu);
                    KcapMoeParams p{};
                    p.n_tokens = m, p.k = int(k), p.n_expert = n_expert, p.n_used = used;
                    p.renormalize = renormalize, p.scale = 1.5f, p.logit_scale = 1.0f;
                    p.router_row_bytes = unsigned(row_bytes(Format::F32, k));
                    p.logit_splits = tiled ? kcap_moe_tile_splits(int(k)) : 0;
                    if (tiled && k == 33 * 32)
                        KCAP_EXPECT(p.logit_splits == 5 && kcap_moe_tile_split_runs(int(k)) == 8, "33 runs: 5 slices of 8");
                    if (tiled && k == 130 * 32)
                        KCAP_EXPECT(p.logit_splits == 15 && kcap_moe_tile_split_runs(int(k)) == 9, "130 runs: 15 slices of 9");
                    const std::vector<float> logits =
                        tiled ? router_logits_tiled(p, w->ref.data, x) : router_logits(p, w->ref.data, x);
                    kcap_sim::launch({unsigned(m), 1, 1}, kcap::cuda_rows::kMoeRouteThreads, KCAP_MOE_MAX_EXPERTS * 4,
                                     [&](const KcapThread& t, void* shared) {
                                         kcap_moe_route(t, p, logits.data(), nullptr, got.data(),
                                                        static_cast<float*>(shared));
                                     });
                    const RoutingDiff diff = routing_diff(got, ref, m, used);
                    KCAP_EXPECT(diff.wrong_ids == 0 && diff.weights_error <= kExactTolerance,
                                "moe_route%s K=%lld, %d experts, %d used, ties %d, renormalize %d: %d ids differ, weights error %.3g",
                                tiled ? " (tiled logits)" : "", (long long)k, n_expert, used, int(ties), int(renormalize),
                                diff.wrong_ids, diff.weights_error);
                    ++checked;
                    if (tiled || n_expert > kcap::cuda_rows::kMoeRouteClusterMaxExperts) continue;
                    // The cluster row's top-k by rank, in groups of 2 and 8 simd groups (fewer and as
                    // many as the KCAP_MOE_LOGIT_TOKENS tokens of a group).
                    for (const unsigned threads : {64u, 256u}) {
                        const RoutingDiff ranked = routing_diff(route_ranked(p, logits, threads), ref, m, used);
                        KCAP_EXPECT(ranked.wrong_ids == 0 && ranked.weights_error <= kExactTolerance,
                                    "moe_route ranked (%u threads) K=%lld, %d experts, %d used, ties %d, renormalize %d: "
                                    "%d ids differ, weights error %.3g",
                                    threads, (long long)k, n_expert, used, int(ties), int(renormalize), ranked.wrong_ids,
                                    ranked.weights_error);
                        ++checked;
                    }
                }
    std::printf("moe_route body: %d cases\n", checked);
}

// DeepSeek's routers (cuda.moe_route with expert groups): V3's sigmoid scores with a choice bias,
// groups scored by their two best, and V2's softmax with groups scored by their best, against the
// CPU row: the chosen ids and their weights (the unbiased scores), renormalized or not; on the
// logits of both bodies (cuda.moe_route_tiled's partial sums over slices of K: a sigmoid weight
// is taken from the whole logit, not the first slice's sum).
void test_moe_route_grouped(std::mt19937& rng, CpuState& cpu) {
    int checked = 0;
    const Row& reference = find_row("cpu.moe_route");
    const int m = 9;
    for (const bool tiled : {false, true})
    for (const int n_expert : {8, 64, 256})
        for (const int groups : {4, 8})
            for (const int groups_used : {1, 2, 3})
                for (const int used : {2, 6, 8})
                    for (const bool sigmoid : {false, true}) {
                        if (groups_used > groups || used > groups_used * (n_expert / groups)) continue;
                        if (sigmoid && n_expert / groups < 2) continue;
                        const int64_t k = tiled ? 33 * 32 : 64;  // tiled: 5 slices of K
                        std::vector<float> x = random_floats(rng, size_t(m * k));
                        auto w = random_weights(rng, Format::F32, k, n_expert, "router");
                        std::vector<float> bias = random_floats(rng, size_t(n_expert), 0.1f);
                        TensorRef bias_tensor;
                        bias_tensor.name = "exp_probs_b", bias_tensor.format = Format::F32, bias_tensor.shape = {n_expert};
                        bias_tensor.data = reinterpret_cast<const uint8_t*>(bias.data());
                        bias_tensor.nbytes = 4 * size_t(n_expert);
                        Stage stage;
                        stage.op = Op::MoeRoute;
                        stage.k = k;
                        stage.n = 2 * used;
                        stage.operands = {&w->ref, nullptr, nullptr, sigmoid ? &bias_tensor : nullptr};
                        stage.params.n_expert = n_expert;
                        stage.params.n_expert_used = used;
                        stage.params.expert_weights_scale = 2.5f;
                        stage.params.n_expert_groups = groups;
                        stage.params.n_expert_groups_used = groups_used;
                        stage.params.expert_group_score = sigmoid ? ExpertGroupScore::TopTwoSum : ExpertGroupScore::Max;
                        stage.features = kExpertGroups | (sigmoid ? kExpertSigmoid | kExpertChoiceBias | kExpertWeightsNorm
                                                                  : FeatureMask(kExpertSoftmax));
                        std::vector<float> ref(size_t(m) * 2 * used), got = nan_filled(ref.size());
                        KernelCall call;
                        call.n_tokens = m;
                        call.in = x.data();
                        call.out = ref.data();
                        run_cpu(reference, stage, call, cpu);
                        KcapMoeParams p = moe_params(stage, m);
                        p.logit_splits = tiled ? kcap_moe_tile_splits(int(k)) : 0;
                        const std::vector<float> logits =
                            tiled ? router_logits_tiled(p, w->ref.data, x) : router_logits(p, w->ref.data, x);
                        kcap_sim::launch({unsigned(m), 1, 1}, kcap::cuda_rows::kMoeRouteThreads, KCAP_MOE_MAX_EXPERTS * 4,
                                         [&](const KcapThread& t, void* shared) {
                                             kcap_moe_route(t, p, logits.data(), nullptr, got.data(),
                                                            static_cast<float*>(shared), sigmoid ? bias.data() : nullptr);
                                         });
                        const RoutingDiff diff = routing_diff(got, ref, m, used);
                        KCAP_EXPECT(diff.wrong_ids == 0 && diff.weights_error <= kExactTolerance,
                                    "grouped moe_route%s %d experts in %d groups (%d used), %d used, %s: %d ids differ, "
                                    "weights error %.3g",
                                    tiled ? " (tiled logits)" : "", n_expert, groups, groups_used, used,
                                    sigmoid ? "sigmoid" : "softmax", diff.wrong_ids,
                                    diff.weights_error);
                        ++checked;
                        if (tiled) continue;
                        const RoutingDiff ranked =
                            routing_diff(route_ranked(p, logits, 128u, sigmoid ? bias.data() : nullptr), ref, m, used);
                        KCAP_EXPECT(ranked.wrong_ids == 0 && ranked.weights_error <= kExactTolerance,
                                    "grouped moe_route ranked %d experts in %d groups (%d used), %d used, %s: %d ids "
                                    "differ, weights error %.3g",
                                    n_expert, groups, groups_used, used, sigmoid ? "sigmoid" : "softmax", ranked.wrong_ids,
                                    ranked.weights_error);
                        ++checked;
                    }
    std::printf("grouped moe_route body: %d cases\n", checked);
}

// The experts' decode bodies (cuda.moe_experts.<format>: kcap_moe_gate_up, kcap_moe_down,
// kcap_moe_combine) against the CPU row, with and without gpt-oss's biases and clamped SwiGLU,
// on routing with distinct experts per token. Gate and up values scaled past the clamp (x4).
void test_moe_experts(std::mt19937& rng, CpuState& cpu) {
    int checked = 0;
    const Row& reference = find_row("cpu.moe_experts");
    const int64_t k = 64, ff = 64, n = 64;
    const int n_expert = 6, used = 2, m = 5;
    for (const Format f : {Format::F32, Format::Q8_0, Format::MXFP4})
        for (const bool gpt_oss : {false, true}) {
            with_decoder(f, [&](auto decoder) {
                using F = decltype(decoder);
                auto gate = random_weights(rng, f, k, ff * n_expert, "gate");
                auto up = random_weights(rng, f, k, ff * n_expert, "up");
                auto down = random_weights(rng, f, ff, n * n_expert, "down");
                std::vector<float> x = random_floats(rng, size_t(m * k), gpt_oss ? 12.0f : 4.0f);
                std::vector<float> gate_bias = random_floats(rng, size_t(ff * n_expert));
                std::vector<float> up_bias = random_floats(rng, size_t(ff * n_expert));
                std::vector<float> down_bias = random_floats(rng, size_t(n * n_expert));
                auto vector_ref = [](const std::vector<float>& v, const char* name) {
                    TensorRef t;
                    t.name = name, t.format = Format::F32, t.shape = {int64_t(v.size())};
                    t.data = reinterpret_cast<const uint8_t*>(v.data()), t.nbytes = 4 * v.size();
                    return t;
                };
                const TensorRef gb = vector_ref(gate_bias, "gate_bias"), ub = vector_ref(up_bias, "up_bias"),
                                db = vector_ref(down_bias, "down_bias");
                // Routing: token t's experts (t, t + 1 + t % 3) mod n_expert, weights 0.7 / 0.3.
                std::vector<float> routing(size_t(m) * 2 * used);
                for (int t = 0; t < m; ++t) {
                    float* row = &routing[size_t(t) * 2 * used];
                    row[0] = float(t % n_expert), row[1] = float((t + 1 + t % 3) % n_expert);
                    row[2] = 0.7f, row[3] = 0.3f;
                }
                Stage stage;
                stage.op = Op::MoeExperts;
                stage.k = k, stage.k2 = ff, stage.n = n;
                stage.operands = {&gate->ref, &up->ref, &down->ref};
                if (gpt_oss) stage.operands.insert(stage.operands.end(), {&gb, &ub, &db});
                stage.params.n_expert = n_expert, stage.params.n_expert_used = used;
                stage.params.activation = gpt_oss ? Activation::SwigluOai : Activation::SiLU;
                stage.params.swiglu_alpha = 1.702f, stage.params.swiglu_limit = 7.0f;
                stage.features = kGated | (gpt_oss ? (kSwigluOai | kBias) : kSilu);
                std::vector<float> ref(size_t(m * n)), got = nan_filled(size_t(m * n));
                KernelCall call;
                call.n_tokens = m, call.in = x.data(), call.in2 = routing.data(), call.out = ref.data();
                run_cpu(reference, stage, call, cpu);

                KcapMoeParams moe{};
                moe.n_tokens = m, moe.k = int(k), moe.ff = int(ff), moe.n = int(n), moe.n_expert = n_expert;
                moe.n_used = used, moe.swiglu_alpha = 1.702f, moe.swiglu_limit = 7.0f;
                const int slots = m * used;
                KcapMatmulParams pg{};
                pg.k = int(k), pg.n = int(ff), pg.m = 1, pg.row_bytes = unsigned(row_bytes(f, k));
                const int activation = gpt_oss ? KCAP_ACTIVATION_SWIGLU_OAI : 0;
                KcapMatmulParams pd{};
                pd.k = int(ff), pd.n = int(n), pd.m = 1, pd.row_bytes = unsigned(row_bytes(f, ff)), pd.has_bias = gpt_oss;
                // Teams of 4 lanes, as the launchers take for these short rows (2 runs: half of each
                // team idle), and whole simd groups in 2 parts.
                for (const KcapMatvecTeams teams : {KcapMatvecTeams{1, 4}, kcap_matvec_parts(2)}) {
                    std::vector<float> act = nan_filled(size_t(slots) * ff), down_out = nan_filled(size_t(slots) * n);
                    got = nan_filled(size_t(m * n));
                    kcap_sim::launch(
                        {matvec_test_groups(ff, teams, kMatvecRows), unsigned(slots), 1}, kMatvecSimds * 32,
                        kcap::cuda_rows::kMatvecSharedBytes, [&](const KcapThread& t, void* shared) {
                            kcap::cuda_rows::with_matvec_body<kcap::cuda_rows::kMatvecFewestLanes>(
                                teams.lanes, [&](auto body) {
                                    kcap_moe_gate_up<F, kMatvecRows, decltype(body)::value>(
                                        t, moe, pg, teams, int(k / 32), gate->ref.data, up->ref.data, routing.data(),
                                        x.data(), activation, act.data(), static_cast<float*>(shared),
                                        gpt_oss ? gate_bias.data() : nullptr, gpt_oss ? up_bias.data() : nullptr);
                                });
                        });
                    kcap_sim::launch({matvec_test_groups(n, teams, kMatvecRows), unsigned(slots), 1}, kMatvecSimds * 32,
                                     kcap::cuda_rows::kMatvecSharedBytes, [&](const KcapThread& t, void* shared) {
                                         kcap::cuda_rows::with_matvec_body<kcap::cuda_rows::kMatvecFewestLanes>(
                                             teams.lanes, [&](auto body) {
                                                 kcap_moe_down<F, kMatvecRows, decltype(body)::value>(
                                                     t, moe, pd, teams, int(ff / 32), down->ref.data, routing.data(),
                                                     act.data(), down_out.data(), static_cast<float*>(shared),
                                                     gpt_oss ? down_bias.data() : nullptr);
                                             });
                                     });
                    kcap_sim::launch({ceil_div(m * n, 256), 1, 1}, 256, 0, [&](const KcapThread& t, void*) {
                        kcap_moe_combine(t, moe, routing.data(), down_out.data(), nullptr, got.data());
                    });
                    const double err = relative_error(got, ref);
                    KCAP_EXPECT(err <= kGateUpTolerance, "moe_experts %s %s split %d lanes %d: error %.3g",
                                format_name(f), gpt_oss ? "biases + swiglu_oai" : "silu", teams.split, teams.lanes,
                                err);
                    ++checked;
                }
            });
        }
    std::printf("moe_experts bodies: %d cases\n", checked);
}

// The CUDA q8_1 experts row's bodies (cuda.moe_experts_q8.<format>: kcap_moe_gate_up_q8,
// kcap_moe_down_q8, kcap_moe_combine) as it launches them, at splits 1 and 2, against the
// reference of the CPU row's test (ref, with its allowance for activations on a rounding boundary).
void check_moe_experts_q8_bodies(Format gate_up_format, Format down_format, bool gpt_oss, bool merged, bool with_shared,
                                 const Stage& stage, const std::vector<float>& x, const std::vector<float>& routing,
                                 const std::vector<float>& gate_bias, const std::vector<float>& up_bias,
                                 const std::vector<float>& down_bias, const std::vector<float>& shared,
                                 const std::vector<float>& ref, const std::vector<double>& allow) {
    const int64_t k = stage.k, ff = stage.k2, n = stage.n;
    const int used = stage.params.n_expert_used, m = int(x.size() / size_t(k));
    KcapMoeParams moe{};
    moe.n_tokens = m, moe.k = int(k), moe.ff = int(ff), moe.n = int(n), moe.n_expert = stage.params.n_expert;
    moe.n_used = used, moe.gate_up_merged = merged, moe.swiglu_alpha = 1.702f, moe.swiglu_limit = 7.0f;
    const int slots = m * used;
    KcapMatmulParams pg{};
    pg.k = int(k), pg.n = int(ff), pg.m = 1, pg.row_bytes = unsigned(row_bytes(gate_up_format, k));
    KcapMatmulParams pd{};
    pd.k = int(ff), pd.n = int(n), pd.m = 1, pd.row_bytes = unsigned(row_bytes(down_format, ff)), pd.has_bias = gpt_oss;
    const int activation = gpt_oss ? KCAP_ACTIVATION_SWIGLU_OAI : 0;
    for (const KcapMatvecTeams teams : {kcap_matvec_parts(1), kcap_matvec_parts(2), KcapMatvecTeams{1, 4},
                                        KcapMatvecTeams{1, 8}, KcapMatvecTeams{1, 16}}) {
        std::vector<float> act = nan_filled(size_t(slots) * ff), down_out = nan_filled(size_t(slots) * n);
        std::vector<float> got = nan_filled(size_t(m) * n);
        with_decoder(gate_up_format, [&](auto decoder) {
            using F = decltype(decoder);
            if constexpr (KcapCodes<F>::has_codes8)
                kcap_sim::launch(
                    {matvec_test_groups(ff, teams, kMoeQ8GateUpRows, kMatvecQ8Simds), unsigned(slots), 1}, kMatvecQ8Simds * 32,
                    size_t(kcap::cuda_rows::matvec_q8_shared_words(k, kMoeQ8GateUpRows)) * 4,
                    [&](const KcapThread& t, void* words) {
                        kcap::cuda_rows::with_matvec_body<kcap::cuda_rows::kMatvecFewestLanes>(
                            teams.lanes, [&](auto body) {
                                kcap_moe_gate_up_q8<F, kMoeQ8GateUpRows, decltype(body)::value>(
                                    t, moe, pg, teams, int(k / 32), stage.operands[0]->data, stage.operands[1]->data,
                                    routing.data(), x.data(), activation, act.data(), static_cast<kcap_i32*>(words),
                                    gpt_oss ? gate_bias.data() : nullptr, gpt_oss ? up_bias.data() : nullptr);
                            });
                    });
        });
        with_decoder(down_format, [&](auto decoder) {
            using F = decltype(decoder);
            if constexpr (KcapCodes<F>::has_codes8)
                kcap_sim::launch({matvec_test_groups(n, teams, kMoeQ8DownRows, kMatvecQ8Simds), unsigned(slots), 1},
                                 kMatvecQ8Simds * 32,
                                 size_t(kcap::cuda_rows::matvec_q8_shared_words(ff, kMoeQ8DownRows)) * 4,
                                 [&](const KcapThread& t, void* words) {
                                     kcap::cuda_rows::with_matvec_body<kcap::cuda_rows::kMatvecFewestLanes>(
                                         teams.lanes, [&](auto body) {
                                             kcap_moe_down_q8<F, kMoeQ8DownRows, decltype(body)::value>(
                                                 t, moe, pd, teams, int(ff / 32), stage.operands[2]->data,
                                                 routing.data(), act.data(), down_out.data(),
                                                 static_cast<kcap_i32*>(words), gpt_oss ? down_bias.data() : nullptr);
                                         });
                                 });
        });
        kcap_sim::launch({ceil_div(int64_t(m) * n, 256), 1, 1}, 256, 0, [&](const KcapThread& t, void*) {
            kcap_moe_combine(t, moe, routing.data(), down_out.data(), nullptr, got.data(),
                             with_shared ? shared.data() : nullptr);
        });
        const double err = relative_error_beyond(got, ref, allow);
        KCAP_EXPECT(err <= kGateUpTolerance, "moe_experts_q8 bodies %s/%s%s%s%s split %d lanes %d: error %.3g",
                    format_name(gate_up_format), format_name(down_format), gpt_oss ? " biases + swiglu_oai" : "",
                    merged ? " merged" : "", with_shared ? " shared" : "", teams.split, teams.lanes, err);
    }
}

// The CPU experts rows against a reference in double built from gguf's dequantized weights:
// gate_e and up_e times x, the gated activation in f32, down_e times the slot's activations,
// weighed and summed; with q8_1 activations (cpu.moe_experts_q8) x and each slot's activations
// first rounded (q8_1_values). Routing that gives some experts several slots and leaves some
// without. For each format with integer products, gate/up and down in different formats (a Q4_K_M file's Q6_K
// down), with gpt-oss's biases and clamped SwiGLU, a merged gate/up tensor, and a shared
// expert's output added. Then the CUDA q8_1 row's bodies against the CPU row.
void test_moe_experts_cpu(std::mt19937& rng, CpuState& cpu) {
    int checked = 0;
    const int64_t k = 256, ff = 256, n = 64;
    const int n_expert = 6, used = 2, m = 5;
    struct Case {
        Format gate_up, down;
        bool gpt_oss, merged, shared;
    };
    const Case cases[] = {{Format::Q8_0, Format::Q8_0, false, false, false},
                          {Format::Q4_0, Format::Q4_1, false, false, true},
                          {Format::Q5_0, Format::Q5_1, false, true, false},
                          {Format::Q4_K, Format::Q6_K, false, false, false},
                          {Format::Q5_K, Format::Q2_K, false, false, true},
                          {Format::Q3_K, Format::Q8_0, false, true, false},
                          {Format::MXFP4, Format::MXFP4, true, false, false},
                          {Format::Q8_0, Format::Q4_K, true, true, true}};
    for (const Case& c : cases) {
        const int64_t gate_rows = c.merged ? 2 * ff : ff;
        auto gate = random_weights(rng, c.gate_up, k, gate_rows * n_expert, "gate");
        auto up = c.merged ? nullptr : random_weights(rng, c.gate_up, k, ff * n_expert, "up");
        auto down = random_weights(rng, c.down, ff, n * n_expert, "down");
        const TensorRef& up_ref = c.merged ? gate->ref : up->ref;
        std::vector<float> x = random_floats(rng, size_t(m * k), c.gpt_oss ? 12.0f : 4.0f);
        std::vector<float> gate_bias = random_floats(rng, size_t(ff * n_expert));
        std::vector<float> up_bias = random_floats(rng, size_t(ff * n_expert));
        std::vector<float> down_bias = random_floats(rng, size_t(n * n_expert));
        std::vector<float> shared = random_floats(rng, size_t(m * n));
        auto gb = float_vector(gate_bias, "gate_bias"), ub = float_vector(up_bias, "up_bias"),
             db = float_vector(down_bias, "down_bias");
        // Routing: token t's experts (t, t + 1 + t % 3) mod n_expert, weights 0.7 / 0.3: experts
        // 0, 1 and 4 get two slots each.
        std::vector<float> routing(size_t(m) * 2 * used);
        for (int t = 0; t < m; ++t) {
            float* r = &routing[size_t(t) * 2 * used];
            r[0] = float(t % n_expert), r[1] = float((t + 1 + t % 3) % n_expert), r[2] = 0.7f, r[3] = 0.3f;
        }
        Stage stage;
        stage.op = Op::MoeExperts;
        stage.k = k, stage.k2 = ff, stage.n = n;
        stage.operands = {&gate->ref, &up_ref, &down->ref};
        if (c.gpt_oss) stage.operands.insert(stage.operands.end(), {&gb->ref, &ub->ref, &db->ref});
        stage.params.n_expert = n_expert, stage.params.n_expert_used = used;
        stage.params.activation = c.gpt_oss ? Activation::SwigluOai : Activation::SiLU;
        stage.params.swiglu_alpha = 1.702f, stage.params.swiglu_limit = 7.0f;
        stage.features = kGated | (c.gpt_oss ? FeatureMask(kSwigluOai | kBias) : FeatureMask(kSilu)) |
                         (c.merged ? FeatureMask(kExpertGateUpMerged) : 0u) | (c.shared ? FeatureMask(kSharedExpertSum) : 0u);

        std::vector<float> w_row(static_cast<size_t>(std::max(k, ff)));
        const auto dot = [&](const TensorRef& w, int64_t r, const std::vector<float>& v, int64_t len) {
            dequantize_row(w.format, w.data + size_t(r) * row_bytes(w.format, len), w_row.data(), len);
            double sum = 0.0;
            for (int64_t i = 0; i < len; ++i) sum += double(w_row[size_t(i)]) * double(v[size_t(i)]);
            return sum;
        };
        // The reference, and per output how far the roundings of the activations that lie on a
        // rounding boundary (q8_1_near_boundary) may move it: a code (d) times |down| times the
        // slot's weight, for each such value.
        std::vector<double> allow(size_t(m * n), 0.0);
        const auto reference = [&](bool q8) {
            const auto rounded = [&](std::vector<float> v) { return q8 ? q8_1_values(v) : v; };
            std::fill(allow.begin(), allow.end(), 0.0);
            std::vector<float> ref(size_t(m * n));
            for (int t = 0; t < m; ++t) {
                const std::vector<float> xq = rounded(std::vector<float>(x.begin() + t * k, x.begin() + (t + 1) * k));
                std::vector<double> y(size_t(n), 0.0);
                for (int j = 0; j < used; ++j) {
                    const int e = int(routing[size_t(t) * 2 * used + j]);
                    const double weight = routing[size_t(t) * 2 * used + used + j];
                    std::vector<float> slot_act(static_cast<size_t>(ff));
                    for (int64_t r = 0; r < ff; ++r) {
                        const int64_t g_row = e * gate_rows + r, u_row = c.merged ? g_row + ff : e * ff + r;
                        const double g = dot(gate->ref, g_row, xq, k) + (c.gpt_oss ? gate_bias[size_t(e * ff + r)] : 0.0);
                        const double u = dot(up_ref, u_row, xq, k) + (c.gpt_oss ? up_bias[size_t(e * ff + r)] : 0.0);
                        slot_act[size_t(r)] = gated_activation(stage.params.activation, float(g), float(u), 1.702f, 7.0f);
                    }
                    const std::vector<float> aq = rounded(slot_act);
                    const std::vector<char> near = q8 ? q8_1_near_boundary(slot_act) : std::vector<char>(size_t(ff), 0);
                    for (int64_t o = 0; o < n; ++o) {
                        y[size_t(o)] +=
                            weight * (dot(down->ref, e * n + o, aq, ff) + (c.gpt_oss ? down_bias[size_t(e * n + o)] : 0.0));
                        for (int64_t r = 0; r < ff; ++r)
                            if (near[size_t(r)]) {
                                float amax = 0.0f;
                                for (int64_t i = r / 32 * 32; i < r / 32 * 32 + 32; ++i)
                                    amax = std::max(amax, std::fabs(slot_act[size_t(i)]));
                                allow[size_t(t * n + o)] += weight * std::fabs(double(w_row[size_t(r)])) * amax / 127.0;
                            }
                    }
                }
                for (int64_t o = 0; o < n; ++o)
                    ref[size_t(t * n + o)] = float(y[size_t(o)] + (c.shared ? shared[size_t(t * n + o)] : 0.0));
            }
            return ref;
        };
        for (const bool q8 : {false, true}) {
            const std::vector<float> ref = reference(q8);
            stage.input_encoding = q8 ? Encoding::Q8_1 : Encoding::F32;
            {
                const std::string kernel = q8 ? "cpu.moe_experts_q8" : "cpu.moe_experts";
                std::vector<float> got = nan_filled(size_t(m * n));
                KernelCall call;
                call.n_tokens = m, call.in = x.data(), call.in2 = routing.data(), call.out = got.data();
                call.in3 = c.shared ? shared.data() : nullptr;
                run_cpu(find_row(kernel), stage, call, cpu);
                const double err = relative_error_beyond(got, ref, allow);
                KCAP_EXPECT(err <= kGateUpTolerance, "%s %s/%s%s%s%s: error %.3g", kernel.c_str(), format_name(c.gate_up),
                            format_name(c.down), c.gpt_oss ? " biases + swiglu_oai" : "", c.merged ? " merged" : "",
                            c.shared ? " shared" : "", err);
                ++checked;
                if (q8) {
                    check_moe_experts_q8_bodies(c.gate_up, c.down, c.gpt_oss, c.merged, c.shared, stage, x, routing,
                                                gate_bias, up_bias, down_bias, shared, ref, allow);
                    checked += 2;
                }
            }
        }
    }
    std::printf("cpu experts rows: %d cases\n", checked);
}

void test_elementwise(std::mt19937& rng, CpuState& cpu) {
    int checked = 0;
    const int count = 1000;
    for (Activation act : {Activation::SiLU, Activation::GeluTanh, Activation::GeluErf, Activation::ReLU})
        for (bool gated : {false, true}) {
            Stage stage;
            stage.op = Op::FfnActivation;
            stage.n = stage.k = count;
            stage.params.activation = act;
            const std::vector<float> gate = random_floats(rng, count, 4.0f), up = random_floats(rng, count);
            std::vector<float> ref(count), got = nan_filled(count);
            KernelCall call;
            call.n_tokens = 1;
            call.in = gate.data();
            call.in2 = gated ? up.data() : nullptr;
            call.out = ref.data();
            run_cpu(find_row("cpu.ffn_activation"), stage, call, cpu);
            KcapElementwiseParams p;
            p.count = count, p.activation = int(act), p.gated = gated, p.cap = 0.0f;
            kcap_sim::launch({ceil_div(count, 256), 1, 1}, 256, 0, [&](const KcapThread& t, void*) {
                kcap_ffn_activation(t, p, gate.data(), up.data(), got.data());
            });
            const double err = relative_error(got, ref);
            KCAP_EXPECT(err <= kExactTolerance, "cuda.ffn_activation %s gated=%d: error %.3g", activation_name(act),
                        int(gated), err);
            ++checked;
        }
    {
        const std::vector<float> a = random_floats(rng, count), b = random_floats(rng, count);
        std::vector<float> got = nan_filled(count), ref(count);
        for (int i = 0; i < count; ++i) ref[size_t(i)] = a[size_t(i)] + b[size_t(i)];
        KcapElementwiseParams p;
        p.count = count;
        p.scale = 1.0f;
        kcap_sim::launch({ceil_div(count, 256), 1, 1}, 256, 0,
                         [&](const KcapThread& t, void*) { kcap_add(t, p, a.data(), b.data(), got.data()); });
        KCAP_EXPECT(relative_error(got, ref) == 0.0, "cuda.add differs");
        for (const char* op : {"add", "scale"}) {  // residual scale (Granite) and logit scale
            Stage scaled;
            scaled.op = std::string(op) == "add" ? Op::Add : Op::Scale;
            scaled.n = count;
            scaled.params.scale = 0.22f;
            std::vector<float> scaled_ref(count), scaled_got = nan_filled(count);
            KernelCall call;
            call.n_tokens = 1;
            call.in = a.data(), call.in2 = b.data(), call.out = scaled_ref.data();
            run_cpu(find_row(std::string("cpu.") + op), scaled, call, cpu);
            p.scale = 0.22f;
            kcap_sim::launch({ceil_div(count, 256), 1, 1}, 256, 0, [&](const KcapThread& t, void*) {
                if (scaled.op == Op::Add)
                    kcap_add(t, p, a.data(), b.data(), scaled_got.data());
                else
                    kcap_scale(t, p, a.data(), scaled_got.data());
            });
            KCAP_EXPECT(relative_error(scaled_got, scaled_ref) <= kExactTolerance, "cuda.%s with scale differs", op);
            ++checked;
        }
        Stage stage;
        stage.op = Op::Softcap;
        stage.n = count;
        stage.params.softcap = 30.0f;
        const std::vector<float> logits = random_floats(rng, count, 50.0f);
        std::vector<float> capped(count), capped_got = nan_filled(count);
        KernelCall call;
        call.n_tokens = 1;
        call.in = logits.data();
        call.out = capped.data();
        run_cpu(find_row("cpu.softcap"), stage, call, cpu);
        p.cap = 30.0f;
        kcap_sim::launch({ceil_div(count, 256), 1, 1}, 256, 0,
                         [&](const KcapThread& t, void*) { kcap_softcap(t, p, logits.data(), capped_got.data()); });
        KCAP_EXPECT(relative_error(capped_got, capped) <= kExactTolerance, "cuda.softcap differs");
        checked += 2;
    }
    std::printf("elementwise bodies: %d cases\n", checked);
}

void test_argmax(std::mt19937& rng) {
    for (int count : {1, 31, 10007}) {
        std::vector<float> logits = random_floats(rng, size_t(count));
        // A tie for the maximum: the lower index must win.
        if (count > 10) {
            const float top = *std::max_element(logits.begin(), logits.end()) + 1.0f;
            logits[size_t(count / 3)] = top;
            logits[size_t(count - 2)] = top;
        }
        const int expected = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
        KcapArgmaxParams p;
        p.count = count, p.chunk = 1000, p.n_partials = int(ceil_div(count, 1000)), p.advance = 1;
        std::vector<float> partial_value(static_cast<size_t>(p.n_partials), NAN);
        std::vector<int32_t> partial_index(static_cast<size_t>(p.n_partials), -1);
        int32_t result = -1, tokens[1] = {-1}, step[2] = {7, 2}, history[4] = {-1, -1, -1, -1};
        kcap_sim::launch({unsigned(p.n_partials), 1, 1}, 256, 2 * 32 * 4, [&](const KcapThread& t, void* shared) {
            kcap_argmax_partial(t, p, logits.data(), partial_value.data(), partial_index.data(), static_cast<float*>(shared),
                                static_cast<int*>(shared) + 32);
        });
        kcap_sim::launch({1, 1, 1}, 64, 2 * 32 * 4, [&](const KcapThread& t, void* shared) {
            kcap_argmax_final(t, p, partial_value.data(), partial_index.data(), &result, tokens, step, history,
                              static_cast<float*>(shared), static_cast<int*>(shared) + 32);
        });
        KCAP_EXPECT(result == expected && tokens[0] == expected && history[2] == expected && step[0] == 8 && step[1] == 3,
                    "argmax of %d: got %d (token %d, step %d/%d), expected %d", count, result, tokens[0], step[0], step[1],
                    expected);
    }
    std::printf("argmax bodies: 3 cases\n");
}

// The sampler's reference: the CPU's sampler (kcap::sample_token, cpp/core/sampling.cpp), which
// decode_sample runs on backends without device sampling.
int reference_sample(const std::vector<float>& logits, const KcapSampleSettings& s, int position) {
    kcap::SampleSettings settings;
    settings.temperature = s.temperature;
    settings.top_k = s.top_k;
    settings.top_p = s.top_p;
    settings.min_p = s.min_p;
    settings.seed = s.seed;
    return kcap::sample_token(logits.data(), int64_t(logits.size()), settings, position);
}

void test_sample(std::mt19937& rng) {
    int cases = 0;
    for (int count : {7, 5000, 262144})
        for (int top_k : {1, 5, 40, 64})
            for (float temperature : {0.7f, 1.0f, 3.0f})
                for (float top_p : {1.0f, 0.6f})
                    for (float min_p : {0.0f, 0.2f}) {
                        if (count == 262144 && (temperature != 1.0f || min_p != 0.0f)) continue;  // keep it quick
                        // Logits on a coarse grid, so ties happen (lower index first) and the
                        // weights are not all negligible next to the best one.
                        std::vector<float> logits(static_cast<size_t>(count));
                        std::uniform_int_distribution<int> level(0, 40);
                        for (auto& v : logits) v = 0.1f * float(level(rng));
                        KcapSampleSettings settings{};
                        settings.temperature = temperature, settings.top_p = top_p, settings.min_p = min_p;
                        settings.top_k = top_k, settings.seed = unsigned(rng());
                        KcapSampleParams p;
                        p.count = count, p.n_partials = int(ceil_div(count, KCAP_SAMPLE_CHUNK)), p.advance = 1;
                        std::vector<float> partial_value(size_t(p.n_partials * top_k), NAN);
                        std::vector<int32_t> partial_index(size_t(p.n_partials * top_k), -1);
                        const int position = 1000 + cases;
                        int32_t result = -1, tokens[1] = {-1}, step[2] = {position, 1}, history[3] = {-1, -1, -1};
                        const size_t shared = (2 * KCAP_SAMPLE_MAX_TOP_K + 2 * 32) * 4;
                        auto layout = [](void* sh, float** tv, int** ti, float** sv, int** si) {
                            *tv = static_cast<float*>(sh);
                            *ti = reinterpret_cast<int*>(*tv + KCAP_SAMPLE_MAX_TOP_K);
                            *sv = reinterpret_cast<float*>(*ti + KCAP_SAMPLE_MAX_TOP_K);
                            *si = reinterpret_cast<int*>(*sv + 32);
                        };
                        kcap_sim::launch({unsigned(p.n_partials), 1, 1}, KCAP_SAMPLE_THREADS, shared,
                                         [&](const KcapThread& t, void* sh) {
                                             float *tv, *sv;
                                             int *ti, *si;
                                             layout(sh, &tv, &ti, &sv, &si);
                                             kcap_sample_partial(t, p, &settings, logits.data(), partial_value.data(),
                                                                 partial_index.data(), tv, ti, sv, si);
                                         });
                        kcap_sim::launch({1, 1, 1}, KCAP_SAMPLE_THREADS, shared, [&](const KcapThread& t, void* sh) {
                            float *tv, *sv;
                            int *ti, *si;
                            layout(sh, &tv, &ti, &sv, &si);
                            kcap_sample_final(t, p, &settings, partial_value.data(), partial_index.data(), &result, tokens,
                                              step, history, tv, ti, sv, si);
                        });
                        const int expected = reference_sample(logits, settings, position);
                        KCAP_EXPECT(result == expected && tokens[0] == expected && history[1] == expected &&
                                        step[0] == position + 1 && step[1] == 2,
                                    "sample of %d, k=%d T=%.1f top_p=%.1f min_p=%.1f: got %d (token %d), expected %d",
                                    count, top_k, temperature, top_p, min_p, result, tokens[0], expected);
                        ++cases;
                    }
    std::printf("sample bodies: %d cases\n", cases);
}

// The tiled prefill body with the launch geometry cuda/attention.cu uses (cuda_rows), or with
// another key split (1 or 2) where the body allows it.
// The decode as the CUDA row launches it (cuda/attention.cu): head_blocks groups per KV head
// and the dim groups and key streams of the heads' dims, so the host runs the shapes the device
// runs.
void sim_attention_decode(KcapAttentionParams p, int n_splits, const int32_t* step, const float* q, const float* k,
                          const float* v, uint8_t* k_cache, uint8_t* v_cache, float* partial_o, float* partial_ml,
                          float* out, const float2* cos_sin = nullptr, const float* q_norm = nullptr,
                          const float* k_norm = nullptr, const float* sinks = nullptr) {
    using namespace kcap::cuda_rows;
    p.head_blocks = attn_decode_head_blocks(p.n_head, p.n_head_kv, p.head_dim, p.head_dim_v);
    const unsigned threads = 32 * attn_decode_simds(p.n_head, p.n_head_kv, p.head_dim, p.head_dim_v);
    if (attn_decode_tiles(p.n_head, p.n_head_kv, p.head_dim, p.head_dim_v)) {
        with_attn_decode_tiles(p.head_dim, p.kv_f16, p.n_head / p.n_head_kv, [&](auto d, auto f16, auto s) {
            constexpr int D = decltype(d)::value;
            kcap_sim::launch({unsigned(p.n_head_kv), unsigned(n_splits), 1}, threads,
                             sizeof(float) * KCAP_ATTN_TILE_SHARED_FLOATS(D), [&](const KcapThread& t, void* shared) {
                                 kcap_attention_decode_tiles<D, decltype(f16)::value, decltype(s)::value>(
                                     t, p, step, q, k, v, k_cache, v_cache, partial_o, partial_ml, out,
                                     static_cast<float*>(shared), cos_sin, q_norm, k_norm, sinks);
                             });
        });
        return;
    }
    with_attn_decode_body(p.head_dim, p.head_dim_v, [&](auto dg, auto ks) {
        kcap_sim::launch({unsigned(p.n_head_kv * p.head_blocks), unsigned(n_splits), 1}, threads,
                         sizeof(float) * KCAP_ATTN_DECODE_SHARED_FLOATS, [&](const KcapThread& t, void* shared) {
                             kcap_attention_decode_dims<decltype(dg)::value, decltype(ks)::value>(
                                 t, p, step, q, k, v, k_cache, v_cache, partial_o, partial_ml, out,
                                 static_cast<float*>(shared), cos_sin, q_norm, k_norm, sinks);
                         });
    });
}

void run_prefill(const KcapAttentionParams& p, const int32_t* step, const float* q, const uint8_t* k_cache,
                 const uint8_t* v_cache, float* out, int key_split = 0, const float* sinks = nullptr) {
    using namespace kcap::cuda_rows;
    const int row_simds = attn_prefill_row_simds(p.head_dim);
    const int split = key_split > 0 ? key_split : attn_prefill_key_split(p.head_dim);
    const int64_t query_rows = int64_t(p.n_tokens) * (p.n_head / p.n_head_kv);
    kcap_sim::launch({ceil_div(query_rows, kAttnPrefillRowsPerSimd * row_simds), unsigned(p.n_head_kv), 1},
                     unsigned(32 * row_simds * split), kAttnPrefillSharedBytes, [&](const KcapThread& t, void* shared) {
                         kcap_attention_prefill(t, p, step, q, k_cache, v_cache, out, static_cast<float*>(shared), sinks);
                     });
}

// One attention layer's stage (CPU reference), its one-layer CPU KV cache and the body's
// parameters, for the decode and prefill cases below.
void attention_setup(int n_head, int n_head_kv, int head_dim, int head_dim_v, int window, float softcap, Format kv,
                     CpuState& cpu, Stage& stage, KcapAttentionParams& p) {
    stage = Stage();
    stage.layer = 0;
    stage.op = Op::Attention;
    stage.params.n_head = n_head, stage.params.n_head_kv = n_head_kv;
    stage.params.head_dim = head_dim, stage.params.head_dim_v = head_dim_v;
    stage.params.sliding_window = window, stage.params.softcap = softcap;
    stage.params.scale = 1.0f / std::sqrt(float(head_dim));
    stage.kv_format = kv;
    stage.n = int64_t(n_head) * head_dim_v;
    cpu.kv.assign(1, KvLayer());
    cpu.kv[0].format = kv;
    cpu.kv[0].k_width = int64_t(n_head_kv) * head_dim;
    cpu.kv[0].v_width = int64_t(n_head_kv) * head_dim_v;
    p = KcapAttentionParams();
    p.n_head = n_head, p.n_head_kv = n_head_kv, p.head_dim = head_dim, p.head_dim_v = head_dim_v;
    p.k_width = n_head_kv * head_dim, p.v_width = n_head_kv * head_dim_v;
    p.window = window, p.scale = stage.params.scale, p.softcap = softcap, p.kv_f16 = kv == Format::F16;
}

struct AttentionCase {
    int n_head, n_head_kv, head_dim, head_dim_v, window;
    float softcap;
    Format kv;
    int prefill, decode_steps, n_splits;
    bool sinks = false;  // a learned logit per head in the softmax's denominator (gpt-oss)
};

// The CPU row's attention of m tokens from position pos into out (k and v null for a shared-KV
// stage): the reference the attention bodies are held to.
void cpu_attention(const Stage& stage, int m, int pos, const float* q, const float* k, const float* v, float* out,
                   CpuState& cpu) {
    KernelCall call;
    call.n_tokens = m;
    call.pos0 = pos;
    call.in = q, call.in2 = k, call.in3 = v, call.out = out;
    run_cpu(cpu_twin(find_row("cuda.attention_prefill")), stage, call, cpu);
}

// NaN in cache rows [0, rows) of K and V (f16 or f32 elements of elem bytes).
void poison_cache_rows(std::vector<uint8_t>& k_cache, std::vector<uint8_t>& v_cache, const KcapAttentionParams& p,
                       int rows, size_t elem) {
    const uint16_t half_nan = 0x7e00;
    const float nan = NAN;
    const auto fill = [&](std::vector<uint8_t>& cache, int width) {
        for (size_t i = 0; i < size_t(rows) * size_t(width); ++i)
            std::memcpy(cache.data() + i * elem, elem == 2 ? static_cast<const void*>(&half_nan) : &nan, elem);
    };
    fill(k_cache, p.k_width);
    fill(v_cache, p.v_width);
}

void test_attention(std::mt19937& rng, CpuState& cpu) {
    const AttentionCase cases[] = {
        {4, 1, 256, 256, 0, 0.0f, Format::F32, 70, 3, 3},   // Gemma-like heads, three splits
        {4, 1, 256, 256, 20, 0.0f, Format::F16, 30, 4, 2},  // sliding window, f16 cache
        {9, 3, 64, 64, 0, 0.0f, Format::F16, 9, 3, 1},      // SmolLM2-like GQA 3:1, one split
        {8, 8, 128, 128, 0, 30.0f, Format::F32, 40, 2, 4},  // no GQA, softcap, a split left empty
        {10, 1, 32, 48, 0, 0.0f, Format::F32, 5, 2, 2},      // more query heads than simd groups, dv != d
        {8, 2, 64, 64, 0, 0.0f, Format::F32, 40, 3, 3, true},   // sinks (gpt-oss heads), three splits
        {8, 2, 64, 64, 16, 0.0f, Format::F16, 30, 2, 1, true},  // sinks, sliding window, one split
        {32, 4, 128, 128, 0, 0.0f, Format::F16, 70, 3, 3},      // Qwen3-MoE heads: 8 per KV head, two groups each
        {16, 2, 64, 64, 0, 0.0f, Format::F32, 40, 2, 2, true},  // gpt-oss's ratio (8): two groups, sinks
        {12, 1, 128, 128, 0, 0.0f, Format::F32, 33, 2, 2},      // 12 per KV head: three groups
        {16, 2, 128, 128, 0, 0.0f, Format::F32, 150, 3, 2},     // staged tiles: three tiles a split
        {16, 4, 64, 64, 40, 0.0f, Format::F16, 100, 3, 1, true},  // staged tiles, window, one split, sinks
        {8, 2, 64, 64, 0, 10.0f, Format::F32, 45, 2, 3},        // staged tiles, softcap, a split left empty
    };
    int checked = 0;
    for (const AttentionCase& c : cases) {
        const int n_ctx = c.prefill + c.decode_steps;
        Stage stage;
        KcapAttentionParams p = {};
        attention_setup(c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.window, c.softcap, c.kv, cpu, stage, p);
        p.min_chunk = 32;
        p.append = 1;
        // Sink logits around the scores' range, one far above them (that head's outputs shrink
        // toward 0) and one far below (no effect).
        std::vector<float> sink_values = random_floats(rng, size_t(c.n_head));
        if (c.sinks) sink_values[0] = 12.0f, sink_values[size_t(c.n_head) - 1] = -40.0f;
        TensorRef sink_tensor;
        sink_tensor.name = "sinks", sink_tensor.format = Format::F32, sink_tensor.shape = {c.n_head};
        sink_tensor.data = reinterpret_cast<const uint8_t*>(sink_values.data()), sink_tensor.nbytes = 4 * size_t(c.n_head);
        if (c.sinks) {
            stage.operands = {nullptr, nullptr, nullptr, &sink_tensor};
            stage.features |= kSinks;
        }
        const float* sinks = c.sinks ? sink_values.data() : nullptr;
        const size_t elem = c.kv == Format::F16 ? 2 : 4;
        std::vector<uint8_t> k_cache(static_cast<size_t>(n_ctx) * p.k_width * elem + 16), v_cache(size_t(n_ctx) * p.v_width * elem + 16);
        std::vector<float> partial_o(static_cast<size_t>(c.n_head) * c.n_splits * c.head_dim_v, NAN);
        std::vector<float> partial_ml(static_cast<size_t>(c.n_head) * c.n_splits * 2, NAN);
        int pos = 0;
        for (int call_index = 0; call_index <= c.decode_steps; ++call_index) {
            const int m = call_index == 0 ? c.prefill : 1;
            const std::vector<float> q = random_floats(rng, size_t(m) * c.n_head * c.head_dim);
            const std::vector<float> k = random_floats(rng, size_t(m) * p.k_width);
            const std::vector<float> v = random_floats(rng, size_t(m) * p.v_width);
            std::vector<float> ref(static_cast<size_t>(m) * c.n_head * c.head_dim_v), got = nan_filled(ref.size());
            cpu_attention(stage, m, pos, q.data(), k.data(), v.data(), ref.data(), cpu);
            const int32_t step[2] = {pos, 0};
            p.n_tokens = m;
            if (m == 1) {
                p.n_splits = c.n_splits;
                std::fill(partial_o.begin(), partial_o.end(), NAN);
                // A sliding-window layer reads only its window: the cached rows before it are
                // made NaN first, so one read of them would reach the output.
                if (c.window > 0) poison_cache_rows(k_cache, v_cache, p, std::max(0, pos - c.window + 1), elem);
                sim_attention_decode(p, c.n_splits, step, q.data(), k.data(), v.data(), k_cache.data(), v_cache.data(),
                                     partial_o.data(), partial_ml.data(), got.data(), nullptr, nullptr, nullptr, sinks);
                if (c.n_splits > 1)
                    kcap_sim::launch({unsigned(c.n_head), 1, 1}, cuda_rows::attn_combine_threads(c.head_dim_v),
                                     sizeof(float) * KCAP_ATTN_COMBINE_SHARED_FLOATS, [&](const KcapThread& t, void* sh) {
                        kcap_attention_combine(t, p, step, partial_o.data(), partial_ml.data(), got.data(), static_cast<float*>(sh),
                                               sinks);
                    });
            } else {
                const int64_t appended = int64_t(m) * (p.k_width + p.v_width);
                kcap_sim::launch({ceil_div(appended, 256), 1, 1}, 256, 0, [&](const KcapThread& t, void*) {
                    kcap_kv_append(t, p, step, k.data(), v.data(), k_cache.data(), v_cache.data());
                });
                run_prefill(p, step, q.data(), k_cache.data(), v_cache.data(), got.data(), 0, sinks);
            }
            const double err = relative_error(got, ref);
            KCAP_EXPECT(err <= kAttentionTolerance,
                        "attention heads %d/%d dim %d/%d window %d softcap %g kv %s%s, %s of %d at %d (splits %d): error %.3g",
                        c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.window, double(c.softcap), format_name(c.kv),
                        c.sinks ? " sinks" : "", m == 1 ? "decode" : "prefill", m, pos, c.n_splits, err);
            ++checked;
            // A shared-KV layer (kv_shared) at the same positions: other queries over the cache
            // this call just filled, no K/V of its own, nothing stored.
            {
                Stage shared = stage;
                shared.layer = 1;
                shared.params.kv_layer = 0;
                shared.features = kKvShared;
                shared.operands.clear();  // without sinks
                const std::vector<float> q2 = random_floats(rng, size_t(m) * c.n_head * c.head_dim);
                std::vector<float> ref2(ref.size()), got2 = nan_filled(ref.size());
                const std::vector<uint8_t> k_before = k_cache, v_before = v_cache;
                cpu_attention(shared, m, pos, q2.data(), nullptr, nullptr, ref2.data(), cpu);
                KcapAttentionParams ps = p;
                ps.append = 0;
                if (m == 1) {
                    ps.n_splits = c.n_splits;
                    sim_attention_decode(ps, c.n_splits, step, q2.data(), nullptr, nullptr, k_cache.data(),
                                         v_cache.data(), partial_o.data(), partial_ml.data(), got2.data());
                    if (c.n_splits > 1)
                        kcap_sim::launch({unsigned(c.n_head), 1, 1}, cuda_rows::attn_combine_threads(c.head_dim_v),
                                     sizeof(float) * KCAP_ATTN_COMBINE_SHARED_FLOATS, [&](const KcapThread& t, void* sh) {
                            kcap_attention_combine(t, ps, step, partial_o.data(), partial_ml.data(), got2.data(),
                                                   static_cast<float*>(sh));
                        });
                } else {
                    kcap_sim::launch({ceil_div(int64_t(m) * (p.k_width + p.v_width), 256), 1, 1}, 256, 0,
                                     [&](const KcapThread& t, void*) {
                                         kcap_kv_append(t, ps, step, nullptr, nullptr, k_cache.data(), v_cache.data());
                                     });
                    run_prefill(ps, step, q2.data(), k_cache.data(), v_cache.data(), got2.data());
                }
                const double err2 = relative_error(got2, ref2);
                KCAP_EXPECT(err2 <= kAttentionTolerance && k_cache == k_before && v_cache == v_before,
                            "shared-KV attention heads %d/%d, %s of %d at %d: error %.3g, cache %s", c.n_head,
                            c.n_head_kv, m == 1 ? "decode" : "prefill", m, pos, err2,
                            k_cache == k_before && v_cache == v_before ? "untouched" : "written");
                ++checked;
            }
            pos += m;
        }
    }
    std::printf("attention bodies: %d calls\n", checked);
}

// Multi-head latent attention (cuda.attention_mla[_decode]: kcap_mla_append, _absorb, _attend,
// _combine, _v_up) against cpu.attention_mla: a prefill chunk in one key split, then decode steps
// in the launch's splits (as many as the position needs), W_k_b and W_v_b split or in one W_kv_b,
// in several formats, f32 and f16 caches, a partial group of heads; outputs and scratch poisoned.
void test_attention_mla(std::mt19937& rng, CpuState& cpu) {
    struct Case {
        int n_head, lora, nope, rope, dv;
        Format kb, vb, kv;
        bool combined;
        int prefill, decode_steps, n_splits;
        int second = 0;  // a second prefill chunk after the first (its rows see the first's)
    };
    const Case cases[] = {
        {4, 64, 32, 16, 32, Format::F32, Format::F32, Format::F32, false, 70, 2, 4},       // two splits used of four
        {6, 64, 32, 16, 32, Format::Q8_0, Format::F16, Format::F16, false, 20, 2, 3, 37},  // a partial head group
        {5, 96, 64, 8, 48, Format::Q5_0, Format::Q5_0, Format::F32, true, 9, 2, 2, 19},    // combined W_kv_b
        {4, 64, 32, 16, 32, Format::F16, Format::F16, Format::F16, true, 130, 1, 4},       // three splits used
        // DeepSeek-V2-Lite's dims and formats (8 absorb rows per simd group, 2 V rows), 8 heads
        {8, 512, 128, 64, 128, Format::Q5_0, Format::Q4_K, Format::F16, false, 80, 2, 4, 33},
        {3, 64, 96, 16, 32, Format::Q8_0, Format::Q8_0, Format::F32, false, 40, 2, 2},  // 3 runs of q_nope
    };
    int checked = 0;
    for (const Case& c : cases) {
        const int n_ctx = c.prefill + c.second + c.decode_steps, width = c.lora + c.rope;
        auto kb = c.combined ? random_weights(rng, c.kb, c.lora, int64_t(c.n_head) * (c.nope + c.dv), "kv_b")
                             : random_weights(rng, c.kb, c.nope, int64_t(c.n_head) * c.lora, "k_b");
        auto vb = random_weights(rng, c.vb, c.lora, int64_t(c.n_head) * c.dv, "v_b");
        std::vector<float> norm_values = random_floats(rng, size_t(c.lora), 0.1f);
        for (float& v : norm_values) v += 1.0f;
        TensorRef norm;
        norm.name = "kv_a_norm", norm.format = Format::F32, norm.shape = {c.lora};
        norm.data = reinterpret_cast<const uint8_t*>(norm_values.data()), norm.nbytes = 4 * size_t(c.lora);
        Stage stage;
        stage.layer = 0;
        stage.op = Op::AttentionMla;
        stage.operands = {&norm, &kb->ref, c.combined ? nullptr : &vb->ref, nullptr};
        stage.params.n_head = c.n_head, stage.params.n_head_kv = 1;
        stage.params.head_dim = c.nope + c.rope, stage.params.head_dim_v = c.dv;
        stage.params.kv_lora_rank = c.lora, stage.params.rope_dim = c.rope, stage.params.rope_base = 10000.0f;
        stage.params.eps = 1e-6f;
        stage.params.scale = 1.0f / std::sqrt(float(c.nope + c.rope));
        stage.kv_format = c.kv;
        stage.k = c.nope + c.rope, stage.n = int64_t(c.n_head) * c.dv;
        stage.features = kRopeNormal | kRmsNorm | (c.combined ? FeatureMask(kMlaKvBCombined) : FeatureMask(0));
        cpu.kv.assign(1, KvLayer());
        cpu.kv[0].format = c.kv, cpu.kv[0].k_width = width, cpu.kv[0].v_width = 0;
        const std::vector<float> table = rope_cos_sin_table(stage, n_ctx);
        const auto* cos_sin = reinterpret_cast<const float2*>(table.data());
        const size_t elem = c.kv == Format::F16 ? 2 : 4;
        std::vector<uint8_t> cache(size_t(n_ctx) * size_t(width) * elem + 16);
        int pos = 0;
        std::vector<int> calls = {c.prefill};
        if (c.second) calls.push_back(c.second);
        calls.insert(calls.end(), size_t(c.decode_steps), 1);
        for (const int m : calls) {
            const int splits = m == 1 ? c.n_splits : 1;
            const std::vector<float> q = random_floats(rng, size_t(m) * c.n_head * (c.nope + c.rope));
            const std::vector<float> kv_new = random_floats(rng, size_t(m) * width);
            std::vector<float> ref(size_t(m) * c.n_head * c.dv), got = nan_filled(ref.size());
            KernelCall call;
            call.n_tokens = m, call.pos0 = pos, call.in = q.data(), call.in2 = kv_new.data(), call.out = ref.data();
            run_cpu(find_row("cpu.attention_mla"), stage, call, cpu);
            const KcapMlaParams p = mla_params(stage, m, c.kv);
            const int32_t step[2] = {pos, 0};
            const unsigned slots = unsigned(m * c.n_head);
            std::vector<float> absorbed = nan_filled(size_t(slots) * width), latent = nan_filled(size_t(slots) * c.lora);
            std::vector<float> partial_o = nan_filled(size_t(slots) * splits * c.lora);
            std::vector<float> partial_ml = nan_filled(size_t(slots) * splits * 2);
            kcap_sim::launch({unsigned(m), 1, 1}, KCAP_MLA_THREADS, KCAP_MLA_MAX_SIMDS * 4, [&](const KcapThread& t, void* sh) {
                kcap_mla_append(t, p, step, kv_new.data(), norm_values.data(), cos_sin, cache.data(), static_cast<float*>(sh));
            });
            // The appended rows against the CPU row's cache (an f16 value may land on the
            // neighbouring half: the norm sums in another order); then the CPU's rows replace
            // them, so what follows is compared on the same cache.
            std::vector<float> rows_got(size_t(m) * width), rows_want(rows_got.size());
            const KvLayer& kv = cpu.kv[0];
            for (int64_t e = 0; e < int64_t(m) * width; ++e) {
                const kcap_u64 at = kcap_u64(pos) * kcap_u64(width) + kcap_u64(e);
                rows_got[size_t(e)] = kcap_kv_load(cache.data(), at, p.kv_f16);
                rows_want[size_t(e)] = c.kv == Format::F16 ? f16_to_f32(kv.k16[at]) : kv.k32[at];
            }
            const double rows_err = relative_error(rows_got, rows_want);
            KCAP_EXPECT(rows_err <= (c.kv == Format::F16 ? 1e-3 : kExactTolerance),
                        "attention_mla appended rows, kv %s, %d at %d: error %.3g", format_name(c.kv), m, pos, rows_err);
            for (int64_t e = 0; e < int64_t(m) * width; ++e) {
                const size_t at = size_t(pos) * size_t(width) + size_t(e);
                if (c.kv == Format::F16)
                    std::memcpy(cache.data() + 2 * at, &kv.k16[at], 2);
                else
                    std::memcpy(cache.data() + 4 * at, &kv.k32[at], 4);
            }
            with_decoder(c.kb, [&](auto decoder) {
                using F = decltype(decoder);
                kcap_sim::launch({slots, unsigned(KCAP_MLA_ABSORB_BLOCKS(p)), 1}, KCAP_MLA_THREADS,
                                 KCAP_MLA_ROWS_SHARED_FLOATS * 4, [&](const KcapThread& t, void* sh) {
                                     kcap_mla_absorb<F>(t, p, step, q.data(), kb->ref.data, cos_sin, absorbed.data(),
                                                        static_cast<float*>(sh));
                                 });
            });
            const unsigned groups = unsigned(m * ((c.n_head + KCAP_MLA_HEADS_PER_GROUP - 1) / KCAP_MLA_HEADS_PER_GROUP));
            kcap_sim::launch({groups, unsigned(splits), 1}, KCAP_MLA_THREADS, KCAP_MLA_ATTEND_SHARED_FLOATS * 4,
                             [&](const KcapThread& t, void* sh) {
                                 kcap_mla_attend(t, p, step, absorbed.data(), cache.data(), splits, partial_o.data(),
                                                 partial_ml.data(), static_cast<float*>(sh));
                             });
            kcap_sim::launch({slots, unsigned(KCAP_MLA_COMBINE_BLOCKS(p)), 1}, KCAP_MLA_THREADS,
                             KCAP_MLA_COMBINE_SHARED_FLOATS * 4, [&](const KcapThread& t, void* sh) {
                                 kcap_mla_combine(t, p, step, splits, partial_o.data(), partial_ml.data(), latent.data(),
                                                  static_cast<float*>(sh));
                             });
            const Format vb_format = c.combined ? c.kb : c.vb;
            const uint8_t* vb_data = c.combined ? kb->ref.data : vb->ref.data;
            with_decoder(vb_format, [&](auto decoder) {
                using F = decltype(decoder);
                kcap_sim::launch({slots, unsigned(KCAP_MLA_V_UP_BLOCKS(p)), 1}, KCAP_MLA_THREADS,
                                 KCAP_MLA_ROWS_SHARED_FLOATS * 4, [&](const KcapThread& t, void* sh) {
                                     kcap_mla_v_up<F>(t, p, latent.data(), vb_data, got.data(), static_cast<float*>(sh));
                                 });
            });
            const double err = relative_error(got, ref);
            KCAP_EXPECT(err <= kAttentionTolerance,
                        "attention_mla heads %d lora %d nope %d rope %d dv %d W_k_b %s W_v_b %s%s kv %s, %s of %d at %d "
                        "(splits %d): error %.3g",
                        c.n_head, c.lora, c.nope, c.rope, c.dv, format_name(c.kb), format_name(c.vb),
                        c.combined ? " (combined)" : "", format_name(c.kv), m == 1 ? "decode" : "prefill", m, pos, splits,
                        err);
            ++checked;
            if (m > 1) {
                // The same prefill chunk through the tiled forms (cuda.attention_mla_tiled): token
                // tiles of the absorb and V up, the tiled attend writing the latents (no combine).
                absorbed = nan_filled(absorbed.size()), latent = nan_filled(latent.size()),
                got = nan_filled(got.size());
                const unsigned token_groups = unsigned(KCAP_MLA_TOKEN_TILES(p) * c.n_head);
                with_decoder(c.kb, [&](auto decoder) {
                    using F = decltype(decoder);
                    kcap_sim::launch({token_groups, unsigned(KCAP_MLA_ABSORB_BLOCKS(p)), 1}, KCAP_MLA_THREADS,
                                     KCAP_MLA_TOKENS_SHARED_FLOATS(KCAP_MLA_MAX_WIDTH) * 4,
                                     [&](const KcapThread& t, void* sh) {
                                         kcap_mla_absorb_tokens<F>(t, p, step, q.data(), kb->ref.data, cos_sin,
                                                                   absorbed.data(), static_cast<float*>(sh));
                                     });
                });
                kcap_sim::launch({unsigned(KCAP_MLA_ATTEND_TILES(p)), 1, 1}, KCAP_MLA_THREADS,
                                 KCAP_MLA_TILE_SHARED_FLOATS(width) * 4, [&](const KcapThread& t, void* sh) {
                                     kcap_mla_attend_tiled(t, p, step, absorbed.data(), cache.data(), latent.data(),
                                                           static_cast<float*>(sh));
                                 });
                with_decoder(vb_format, [&](auto decoder) {
                    using F = decltype(decoder);
                    kcap_sim::launch(
                        {token_groups, unsigned(KCAP_MLA_V_UP_BLOCKS(p)), 1}, KCAP_MLA_THREADS,
                        KCAP_MLA_TOKENS_SHARED_FLOATS(KCAP_MLA_MAX_LORA) * 4, [&](const KcapThread& t, void* sh) {
                            kcap_mla_v_up_tokens<F>(t, p, latent.data(), vb_data, got.data(), static_cast<float*>(sh));
                        });
                });
                const double tiled_err = relative_error(got, ref);
                KCAP_EXPECT(
                    tiled_err <= kAttentionTolerance,
                    "attention_mla tiled heads %d lora %d nope %d rope %d dv %d W_k_b %s W_v_b %s%s kv %s, prefill of "
                    "%d at %d: error %.3g",
                    c.n_head, c.lora, c.nope, c.rope, c.dv, format_name(c.kb), format_name(c.vb),
                    c.combined ? " (combined)" : "", format_name(c.kv), m, pos, tiled_err);
                ++checked;
            }
            pos += m;
        }
    }
    std::printf("attention_mla bodies: %d calls\n", checked);
}

// The decode of a stage that owns its rope (p.rope; planner: rope or qk_norm_rope + attention):
// raw Q and new K in, the decode rotates (and QK-norms) them itself. Reference: the CPU rope
// (or QK-norm + rope), then the CPU attention. Also checks the appended cache row: the rotated
// K as the cache rounds it, V as it came. Head dims 32..256 take every NeoX pairing (lane xor
// 4, 8, 16; the other dim group at 256); group 6 takes two passes of query heads.
void test_attention_own_rope(std::mt19937& rng, CpuState& cpu) {
    struct Case {
        int n_head, n_head_kv, head_dim;
        bool neox, qk_norm, factors;
        Format kv;
        int prefill, decode_steps, n_splits;
        int window = 0;
        float softcap = 0.0f;
    };
    const Case cases[] = {
        {4, 1, 256, true, true, false, Format::F16, 40, 3, 2},    // Gemma 3-like
        {8, 2, 128, false, false, true, Format::F32, 33, 2, 3},   // Llama 3-like: normal pairs, factors
        {6, 3, 64, true, false, false, Format::F16, 10, 2, 1},    // SmolLM2-like, one split
        {4, 4, 32, true, true, true, Format::F32, 5, 2, 2},       // no GQA, every option
        {12, 2, 128, true, true, false, Format::F16, 20, 2, 2},   // Qwen 3-like: two groups of heads (4 + 2)
        {16, 2, 128, true, true, false, Format::F16, 20, 2, 2},   // Qwen3-MoE's ratio: two groups of 4
        {4, 2, 64, false, true, false, Format::F32, 3, 2, 1},     // normal pairs with the QK-norm
        {8, 2, 16, true, false, true, Format::F32, 12, 3, 2, 7, 20.0f},  // NeoX lane xor 2, window, softcap
        {2, 1, 8, true, true, false, Format::F16, 6, 2, 1, 4, 0.0f},     // NeoX lane xor 1, window
        {16, 2, 64, true, false, false, Format::F32, 70, 2, 1},   // gpt-oss-like: staged tiles, one split
        {32, 4, 128, true, true, false, Format::F16, 80, 2, 2},   // Qwen3-MoE-like: staged tiles, two a split
    };
    int checked = 0;
    for (const Case& c : cases) {
        const int n_ctx = c.prefill + c.decode_steps;
        Stage stage;
        KcapAttentionParams p = {};
        attention_setup(c.n_head, c.n_head_kv, c.head_dim, c.head_dim, c.window, c.softcap, c.kv, cpu, stage, p);
        stage.features |= (c.window ? FeatureMask(kSlidingWindow) : 0u) | (c.softcap > 0.0f ? FeatureMask(kAttnSoftcap) : 0u);
        std::vector<float> factor_values = random_floats(rng, size_t(c.head_dim / 2));
        for (auto& f : factor_values) f = 1.0f + std::fabs(f);
        auto factors = float_vector(factor_values, "rope_freqs");
        auto qw = float_vector(random_floats(rng, size_t(c.head_dim)), "q_norm");
        auto kw = float_vector(random_floats(rng, size_t(c.head_dim)), "k_norm");
        stage.operands = {c.qk_norm ? &qw->ref : nullptr, c.qk_norm ? &kw->ref : nullptr, c.factors ? &factors->ref : nullptr};
        stage.params.rope_dim = c.head_dim, stage.params.rope_base = 10000.0f, stage.params.rope_freq_scale = 0.5f;
        stage.params.eps = 1e-6f;
        stage.features |= (c.neox ? kRopeNeox : kRopeNormal) | (c.qk_norm ? FeatureMask(kRmsNorm) : 0u) |
                          (c.factors ? FeatureMask(kRopeFreqFactors) : 0u) | (c.n_head != c.n_head_kv ? FeatureMask(kGqa) : 0u);
        const KcapAttentionParams owned = attention_params(stage, 1, c.kv, c.n_splits, 32);
        KCAP_EXPECT(owned.rope == (c.neox ? 2 : 1) && owned.qk_norm == int(c.qk_norm),
                    "attention_params: rope %d qk_norm %d", owned.rope, owned.qk_norm);
        const Stage plain = without_rope(stage);
        const std::vector<float> table = rope_cos_sin_table(stage, n_ctx);
        const size_t elem = c.kv == Format::F16 ? 2 : 4;
        std::vector<uint8_t> k_cache(size_t(n_ctx) * p.k_width * elem + 16), v_cache(size_t(n_ctx) * p.v_width * elem + 16);
        std::vector<float> partial_o(size_t(c.n_head) * c.n_splits * c.head_dim, NAN);
        std::vector<float> partial_ml(size_t(c.n_head) * c.n_splits * 2, NAN);
        int pos = 0;
        for (int call_index = 0; call_index <= c.decode_steps; ++call_index) {
            const int m = call_index == 0 ? c.prefill : 1;
            const std::vector<float> q = random_floats(rng, size_t(m) * c.n_head * c.head_dim, 2.0f);
            const std::vector<float> k = random_floats(rng, size_t(m) * p.k_width, 2.0f);
            const std::vector<float> v = random_floats(rng, size_t(m) * p.v_width);
            std::vector<float> q_rot = q, k_rot = k;
            cpu_owned_rope(stage, m, pos, q_rot, k_rot, cpu);
            std::vector<float> ref(size_t(m) * c.n_head * c.head_dim), got = nan_filled(ref.size());
            cpu_attention(plain, m, pos, q_rot.data(), k_rot.data(), v.data(), ref.data(), cpu);
            const int32_t step[2] = {pos, 0};
            if (m > 1) {  // the prefill: the rotated rows into the cache (the rope row's kernel, then append)
                KcapAttentionParams pa = p;
                pa.n_tokens = m, pa.append = 1;
                kcap_sim::launch({ceil_div(int64_t(m) * (p.k_width + p.v_width), 256), 1, 1}, 256, 0,
                                 [&](const KcapThread& t, void*) {
                                     kcap_kv_append(t, pa, step, k_rot.data(), v.data(), k_cache.data(), v_cache.data());
                                 });
                pos += m;
                continue;
            }
            KcapAttentionParams pd = owned;
            std::fill(partial_o.begin(), partial_o.end(), NAN);
            sim_attention_decode(pd, c.n_splits, step, q.data(), k.data(), v.data(), k_cache.data(), v_cache.data(),
                                 partial_o.data(), partial_ml.data(), got.data(),
                                 reinterpret_cast<const float2*>(table.data()),
                                 reinterpret_cast<const float*>(qw->ref.data), reinterpret_cast<const float*>(kw->ref.data));
            if (c.n_splits > 1)
                kcap_sim::launch({unsigned(c.n_head), 1, 1}, cuda_rows::attn_combine_threads(c.head_dim),
                                 sizeof(float) * KCAP_ATTN_COMBINE_SHARED_FLOATS, [&](const KcapThread& t, void* sh) {
                                     kcap_attention_combine(t, pd, step, partial_o.data(), partial_ml.data(), got.data(),
                                                            static_cast<float*>(sh));
                                 });
            const double err = relative_error(got, ref);
            // The appended row: K rotated as the reference rotated it, rounded as the cache
            // stores it (a value may land on the neighbouring half: the order of the norm's sum
            // differs); V exactly as it came.
            std::vector<float> k_row(size_t(p.k_width)), k_want(size_t(p.k_width));
            bool v_exact = true;
            for (int e = 0; e < p.k_width; ++e) {
                k_row[size_t(e)] = kcap_kv_load(k_cache.data(), kcap_u64(pos) * p.k_width + e, p.kv_f16);
                k_want[size_t(e)] = kcap_kv_round(k_rot[size_t(e)], p.kv_f16);
            }
            for (int e = 0; e < p.v_width; ++e)
                v_exact = v_exact && kcap_kv_load(v_cache.data(), kcap_u64(pos) * p.v_width + e, p.kv_f16) ==
                                         kcap_kv_round(v[size_t(e)], p.kv_f16);
            const double k_err = relative_error(k_row, k_want);
            KCAP_EXPECT(err <= kAttentionTolerance && k_err <= (p.kv_f16 ? 1e-3 : kExactTolerance) && v_exact,
                        "own-rope decode heads %d/%d dim %d neox %d qk_norm %d factors %d window %d softcap %g kv %s "
                        "at %d (splits %d): error %.3g, appended K error %.3g, V %s",
                        c.n_head, c.n_head_kv, c.head_dim, int(c.neox), int(c.qk_norm), int(c.factors), c.window,
                        double(c.softcap), format_name(c.kv), pos, c.n_splits, err, k_err, v_exact ? "exact" : "differs");
            ++checked;
            pos += m;
        }
    }
    std::printf("attention decode owning its rope: %d calls\n", checked);
}

// The decode combine alone, on random split states, against an f64 merge: many splits (more
// than one chunk of KCAP_ATTN_COMBINE_CHUNK staged weights), head dims off the thread count,
// and splits past `active` (a graph captured at another position) poisoned so a read of one fails.
void test_attention_combine(std::mt19937& rng) {
    struct Case {
        int n_head, head_dim_v, n_splits, pos;
    };
    const Case cases[] = {
        {3, 64, 600, 600 * 32 - 1},  // 600 active splits of 32 keys: three chunks of weights
        {2, 256, 40, 33 * 32 - 5},   // 33 active of 40 (the rest poisoned), 256 dims
        {4, 48, 300, 257 * 32 - 1},  // 257 active: one split into a second chunk
        // Up to 32 active splits: the simd-group path (a split per lane, no barrier).
        {2, 128, 33, 4 * 32 - 1},    // 4 active of 33, the 8B's head dim
        {3, 48, 40, 32 * 32 - 1},    // exactly 32 active, dims off the thread count
        {1, 256, 10, 7 * 32 - 3},    // 7 active: past the 4-split loads, Gemma's head dim
    };
    std::uniform_real_distribution<float> score(-30.0f, 5.0f), sum(1.0f, 40.0f);
    int checked = 0;
    for (const Case& c : cases) {
        KcapAttentionParams p = {};
        p.n_head = c.n_head, p.n_head_kv = 1, p.head_dim = c.head_dim_v, p.head_dim_v = c.head_dim_v;
        p.n_splits = c.n_splits, p.min_chunk = 32, p.n_tokens = 1;
        const int active = kcap_decode_splits(p, c.pos).active;
        std::vector<float> partial_o = random_floats(rng, size_t(c.n_head) * c.n_splits * c.head_dim_v);
        std::vector<float> partial_ml(size_t(c.n_head) * c.n_splits * 2);
        for (int h = 0; h < c.n_head; ++h)
            for (int s = 0; s < c.n_splits; ++s) {
                float* ml = &partial_ml[(size_t(h) * c.n_splits + s) * 2];
                ml[0] = s < active ? score(rng) : NAN;
                ml[1] = s < active ? sum(rng) : NAN;
                if (s >= active)
                    std::fill_n(&partial_o[(size_t(h) * c.n_splits + s) * c.head_dim_v], c.head_dim_v, NAN);
            }
        std::vector<float> got = nan_filled(size_t(c.n_head) * c.head_dim_v);
        std::vector<double> want(got.size());
        for (int h = 0; h < c.n_head; ++h) {
            double m = -INFINITY, l = 0.0;
            for (int s = 0; s < active; ++s) m = std::max(m, double(partial_ml[(size_t(h) * c.n_splits + s) * 2]));
            for (int s = 0; s < active; ++s) {
                const float* ml = &partial_ml[(size_t(h) * c.n_splits + s) * 2];
                l += double(ml[1]) * std::exp(double(ml[0]) - m);
            }
            for (int d = 0; d < c.head_dim_v; ++d) {
                double acc = 0.0;
                for (int s = 0; s < active; ++s)
                    acc += double(partial_o[(size_t(h) * c.n_splits + s) * c.head_dim_v + d]) *
                           std::exp(double(partial_ml[(size_t(h) * c.n_splits + s) * 2]) - m);
                want[size_t(h) * c.head_dim_v + d] = acc / l;
            }
        }
        const int32_t step[2] = {c.pos, 0};
        int returned_wrong = 0;
        kcap_sim::launch({unsigned(c.n_head), 1, 1}, cuda_rows::attn_combine_threads(c.head_dim_v),
                         sizeof(float) * KCAP_ATTN_COMBINE_SHARED_FLOATS, [&](const KcapThread& t, void* sh) {
                             const float v = kcap_attention_combine(t, p, step, partial_o.data(), partial_ml.data(),
                                                                    got.data(), static_cast<float*>(sh));
                             // It returns what it wrote (the combine's q8_1 epilogue quantizes it).
                             const float wrote = int(t.index) < c.head_dim_v
                                                     ? got[size_t(t.group_x) * c.head_dim_v + t.index]
                                                     : 0.0f;
                             if (std::memcmp(&v, &wrote, 4) != 0) ++returned_wrong;
                         });
        KCAP_EXPECT(returned_wrong == 0, "combine of %d splits (%d active): %d threads returned another value than they wrote",
                    c.n_splits, active, returned_wrong);
        // The largest error relative to the largest value; infinity where a value is not finite
        // (an output left poisoned: std::max would pass over a NaN).
        double worst = 0.0, scale = 0.0;
        for (size_t i = 0; i < got.size(); ++i) scale = std::max(scale, std::fabs(want[i]));
        for (size_t i = 0; i < got.size(); ++i)
            worst = std::isfinite(got[i]) ? std::max(worst, std::fabs(double(got[i]) - want[i]) / scale) : INFINITY;
        KCAP_EXPECT(worst <= 1e-5, "combine of %d splits (%d active), %d dims: error %.3g",
                    c.n_splits, active, c.head_dim_v, worst);
        ++checked;
    }
    std::printf("attention combine: %d cases\n", checked);
}

// The tiled prefill at the edges of its tiles: several chunks (positions > 0 after earlier
// tokens), token counts that are no multiple of a row tile, windows shorter than a chunk,
// softcap, GQA 1/3/4/8/10, head dims 32..256 with head_dim_v != head_dim, f16 and f32 caches;
// each chunk also as a shared-KV layer (other queries over the same cache, nothing stored).
struct PrefillCase {
    int n_head, n_head_kv, head_dim, head_dim_v, window;
    float softcap;
    Format kv;
    std::vector<int> chunks;
    int key_split;  // 0: the launch's rule
};

void test_attention_prefill(std::mt19937& rng, CpuState& cpu) {
    const PrefillCase cases[] = {
        {4, 1, 256, 256, 0, 0.0f, Format::F16, {37, 29}, 0},     // Gemma 3 heads (two key halves), second chunk at 37
        {4, 1, 256, 256, 16, 0.0f, Format::F32, {50, 21}, 0},    // window shorter than a chunk and a key tile
        {4, 1, 256, 256, 40, 0.0f, Format::F16, {70, 3}, 1},     // one key half at head_dim 256
        {8, 8, 128, 128, 0, 30.0f, Format::F32, {33, 6}, 0},     // GQA 1, softcap
        {9, 3, 64, 64, 0, 0.0f, Format::F16, {19, 13, 2}, 0},    // GQA 3: row tiles cut through a token's heads
        {32, 8, 128, 128, 24, 0.0f, Format::F16, {45, 20}, 0},   // Llama-3-8B heads (GQA 4), window
        {16, 2, 128, 64, 0, 0.0f, Format::F32, {23, 9}, 0},      // GQA 8, head_dim_v < head_dim
        {10, 1, 32, 48, 7, 0.0f, Format::F16, {11, 5}, 0},       // GQA 10, head_dim_v > head_dim, tiny window
        {4, 2, 96, 160, 0, 20.0f, Format::F32, {17, 40}, 0},     // dims no multiple of a chunk, softcap
        {4, 1, 200, 256, 9, 0.0f, Format::F16, {22, 3}, 0},      // 5 simd groups (160 threads), window
    };
    int checked = 0;
    for (const PrefillCase& c : cases) {
        int n_ctx = 0;
        for (int m : c.chunks) n_ctx += m;
        Stage stage;
        KcapAttentionParams p = {};
        attention_setup(c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.window, c.softcap, c.kv, cpu, stage, p);
        p.n_splits = 1, p.min_chunk = 32, p.append = 1;
        const size_t elem = c.kv == Format::F16 ? 2 : 4;
        std::vector<uint8_t> k_cache(size_t(n_ctx) * p.k_width * elem), v_cache(size_t(n_ctx) * p.v_width * elem);
        int pos = 0;
        for (int m : c.chunks) {
            const std::vector<float> q = random_floats(rng, size_t(m) * c.n_head * c.head_dim, 3.0f);
            const std::vector<float> k = random_floats(rng, size_t(m) * p.k_width);
            const std::vector<float> v = random_floats(rng, size_t(m) * p.v_width);
            std::vector<float> ref(size_t(m) * c.n_head * c.head_dim_v), got = nan_filled(ref.size());
            cpu_attention(stage, m, pos, q.data(), k.data(), v.data(), ref.data(), cpu);
            const int32_t step[2] = {pos, 0};
            p.n_tokens = m;
            kcap_sim::launch({ceil_div(int64_t(m) * (p.k_width + p.v_width), 256), 1, 1}, 256, 0,
                             [&](const KcapThread& t, void*) {
                                 kcap_kv_append(t, p, step, k.data(), v.data(), k_cache.data(), v_cache.data());
                             });
            run_prefill(p, step, q.data(), k_cache.data(), v_cache.data(), got.data(), c.key_split);
            const double err = relative_error(got, ref);
            KCAP_EXPECT(err <= kAttentionTolerance,
                        "prefill heads %d/%d dim %d/%d window %d softcap %g kv %s split %d, %d tokens at %d: error %.3g",
                        c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, c.window, double(c.softcap), format_name(c.kv),
                        c.key_split, m, pos, err);
            ++checked;
            Stage shared = stage;
            shared.layer = 1;
            shared.params.kv_layer = 0;
            shared.features = kKvShared;
            const std::vector<float> q2 = random_floats(rng, size_t(m) * c.n_head * c.head_dim, 3.0f);
            std::vector<float> ref2(ref.size()), got2 = nan_filled(ref.size());
            const std::vector<uint8_t> k_before = k_cache, v_before = v_cache;
            cpu_attention(shared, m, pos, q2.data(), nullptr, nullptr, ref2.data(), cpu);
            KcapAttentionParams ps = p;
            ps.append = 0;
            run_prefill(ps, step, q2.data(), k_cache.data(), v_cache.data(), got2.data(), c.key_split);
            const double err2 = relative_error(got2, ref2);
            KCAP_EXPECT(err2 <= kAttentionTolerance && k_cache == k_before && v_cache == v_before,
                        "shared-KV prefill heads %d/%d dim %d/%d, %d tokens at %d: error %.3g", c.n_head, c.n_head_kv,
                        c.head_dim, c.head_dim_v, m, pos, err2);
            ++checked;
            pos += m;
        }
    }
    std::printf("attention prefill body: %d calls\n", checked);
}

// The fused rows' bodies against the CPU rows of the stages they replace.
void test_add_norm(std::mt19937& rng, CpuState& cpu) {
    int checked = 0;
    for (int64_t width : {64, 640, 1000})
        for (bool layer : {false, true})
            for (bool post : {false, true})
                for (float scale : {1.0f, 0.3f}) {
                    const int tokens = 3;
                    auto post_w = float_vector(random_floats(rng, size_t(width)), "pw");
                    auto post_b = float_vector(random_floats(rng, size_t(width)), "pb");
                    auto w = float_vector(random_floats(rng, size_t(width)), "w");
                    auto b = float_vector(random_floats(rng, size_t(width)), "b");
                    const bool post_bias = post && layer;  // a Layer post-norm with its bias
                    Stage stage;
                    stage.op = Op::AddNorm;
                    stage.operands = {post ? &post_w->ref : nullptr, post_bias ? &post_b->ref : nullptr, &w->ref,
                                      layer ? &b->ref : nullptr};
                    stage.k = stage.n = width;
                    stage.params.eps = 1e-6f;
                    stage.params.scale = scale;
                    stage.features = (layer ? kLayerNorm | kBias : kRmsNorm) | (post ? FeatureMask(kPostNorm) : FeatureMask(0)) |
                                     (scale != 1.0f ? FeatureMask(kResidualScale) : FeatureMask(0));
                    std::vector<float> residual = random_floats(rng, size_t(tokens * width), 8.0f);
                    const std::vector<float> branch = random_floats(rng, size_t(tokens * width), 3.0f);
                    std::vector<float> got_residual = residual, got = nan_filled(residual.size());
                    const std::vector<float> residual_before = residual;
                    const std::vector<float> ref = cpu_add_norm(stage, tokens, residual, branch, cpu);
                    KcapAddNormParams p;
                    p.width = int(width), p.eps = 1e-6f, p.scale = scale, p.layer_norm = layer, p.has_post = post;
                    p.has_post_weight = post, p.has_post_bias = post_bias, p.has_weight = 1, p.has_bias = layer;
                    kcap_sim::launch({unsigned(tokens), 1, 1}, 256, 32 * 8, [&](const KcapThread& t, void* shared) {
                        kcap_add_norm(t, p, got_residual.data(), branch.data(),
                                      reinterpret_cast<const float*>(post_w->ref.data),
                                      reinterpret_cast<const float*>(post_b->ref.data),
                                      reinterpret_cast<const float*>(w->ref.data),
                                      reinterpret_cast<const float*>(b->ref.data), got.data(), static_cast<float*>(shared));
                    });
                    const double err = std::max(relative_error(got, ref), relative_error(got_residual, residual));
                    KCAP_EXPECT(err <= kExactTolerance, "cuda.add_norm width=%lld layer=%d post=%d scale=%g: error %.3g",
                                (long long)width, int(layer), int(post), double(scale), err);
                    ++checked;
                    // The register form (kcap_add_norm_vec), 128 threads: V = 1 (64) or 2 float4 per
                    // thread (640, 1000: the last round ragged); its normed registers must be the row it wrote.
                    std::vector<float> vec_residual = residual_before, vec_got = nan_filled(residual.size());
                    std::vector<float> vec_regs = nan_filled(residual.size());
                    const int n4 = int(width / 4), threads = 128;
                    const auto vec_body = [&](auto v_tag) {
                        constexpr int V = decltype(v_tag)::value;
                        kcap_sim::launch({unsigned(tokens), 1, 1}, threads, 32 * 4, [&](const KcapThread& t, void* shared) {
                            float4 regs[V];
                            kcap_add_norm_vec<V>(t, p, vec_residual.data(), branch.data(),
                                                 reinterpret_cast<const float*>(post_w->ref.data),
                                                 reinterpret_cast<const float*>(post_b->ref.data),
                                                 reinterpret_cast<const float*>(w->ref.data),
                                                 reinterpret_cast<const float*>(b->ref.data), vec_got.data(),
                                                 static_cast<float*>(shared), regs);
                            for (int k = 0; k < V; ++k) {
                                const int i = int(t.index) + k * threads;
                                if (i < n4) std::memcpy(&vec_regs[size_t(t.group_x) * width + 4 * i], &regs[k], 16);
                            }
                        });
                    };
                    if ((n4 + threads - 1) / threads == 1)
                        vec_body(std::integral_constant<int, 1>());
                    else
                        vec_body(std::integral_constant<int, 2>());
                    const double vec_err = std::max(relative_error(vec_got, ref), relative_error(vec_residual, residual));
                    KCAP_EXPECT(vec_err <= kExactTolerance && vec_regs == vec_got,
                                "cuda.add_norm (registers) width=%lld layer=%d post=%d scale=%g: error %.3g%s",
                                (long long)width, int(layer), int(post), double(scale), vec_err,
                                vec_regs == vec_got ? "" : ", registers differ from the written row");
                    ++checked;
                }
    std::printf("add_norm body: %d cases\n", checked);
}

// The q8_1 matvec body (cuda.matvec_q8.* and cuda.gate_up_q8.*, up to kMmaMinTokens - 1 tokens;
// the int8 tiles of the _mma rows are CUDA-only and checked on the device) against the CPU rows on q8_1(x), at every
// split the launcher may pick and with x staged in chunks, for one and several tokens, with x
// quantized by the groups and quantized once (kcap_q8_quantize_rows).
void test_matvec_q8(std::mt19937& rng, CpuState& cpu) {
    int checked = 0;
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA || row.input_encoding != Encoding::Q8_1) continue;
        if (row.op != Op::MatMul && row.op != Op::GateUp) continue;  // the experts: check_moe_experts_q8_bodies
        // Each format's body once, through its matvec rows that round x in their groups (the
        // _quant and _in rows run the same body on x quantized once, as `quantized` below).
        if (row.tokens.max == 0 || row.dims.k_min != 0 || row.requires_all != 0) continue;
        const Format f = row_format(row);
        const bool gate_up = row.op == Op::GateUp;
        with_decoder(f, [&](auto decoder) {
            using F = decltype(decoder);
            if constexpr (KcapCodes<F>::has_codes8) {
                for (int64_t k : k_edges(row, 4096))
                    for (int m : {1, 3}) {
                        const int64_t n = 9;
                        auto w0 = random_weights(rng, f, k, n);
                        auto w1 = random_weights(rng, f, k, n);
                        auto bias = float_vector(random_floats(rng, size_t(n)), "bias");
                        const std::vector<float> x = random_floats(rng, size_t(m * k));
                        const std::vector<float> xr = q8_1_values(x);
                        // The kernels' input: x quantized by kcap_q8_quantize_rows (as the launchers do).
                        std::vector<kcap_u32> codes(size_t(m * k / 4));
                        std::vector<float> x_d(size_t(m * k / 32));
                        std::vector<kcap_i32> half_sums(size_t(m * k / 16));
                        kcap_sim::launch({unsigned((m * k / 4 + 127) / 128), 1, 1}, 128, 0, [&](const KcapThread& t, void*) {
                            kcap_q8_quantize_rows(t, x.data(), m, int(k), codes.data(), x_d.data(), half_sums.data());
                        });
                        std::vector<float> ref(size_t(m * n));
                        if (gate_up) {
                            ref = cpu_gate_up(cpu_matmul_row(f), w0->ref, w1->ref, xr, k, n, m, Activation::SiLU, cpu);
                        } else {
                            KernelCall call;
                            call.n_tokens = m;
                            call.in = xr.data();
                            call.out = ref.data();
                            run_cpu(cpu_matmul_row(f), matmul_stage(&w0->ref, &bias->ref, k, n), call, cpu);
                        }
                        KcapMatmulParams p;
                        p.k = int(k), p.n = int(n), p.m = m;
                        p.row_bytes = unsigned(row_bytes(f, k));
                        p.has_bias = !gate_up;
                        for (const KcapMatvecTeams teams : matvec_team_shapes(kMatvecQ8Simds))
                        for (bool quantized : {false, true}) {  // x quantized by the groups, or once
                            std::vector<float> got = nan_filled(size_t(m * n));
                            const int runs = int(k / 32);
                            const int split = teams.split;
                            // Chunks of 40 runs leave a ragged last chunk (K = 4096: 40, 40, 40, 8).
                            const int chunk = std::min(runs, split == 2 || teams.lanes == 16 ? 40
                                                             : split == 4 || teams.lanes == 4 ? 32
                                                                          : kcap::cuda_rows::kMatvecQ8ChunkRuns);
                            kcap_sim::launch({matvec_test_groups(n, teams, kMatvecRows, kMatvecQ8Simds), unsigned(m), 1},
                                             kMatvecQ8Simds * 32, kcap::cuda_rows::kMatvecQ8SharedBytes,
                                             [&](const KcapThread& t, void* shared) {
                                                 auto* words = static_cast<kcap_i32*>(shared);
                                                 kcap::cuda_rows::with_matvec_body<kcap::cuda_rows::kMatvecFewestLanes>(
                                                     teams.lanes, [&](auto body) {
                                                         constexpr bool TEAMS = decltype(body)::value;
                                                         if (gate_up)
                                                             kcap_matvec_q8<F, kMatvecRows, KCAP_MATVEC_GATE_UP, TEAMS>(
                                                                 t, p, teams, chunk, w0->ref.data, w1->ref.data,
                                                                 quantized ? nullptr : x.data(),
                                                                 quantized ? codes.data() : nullptr, x_d.data(),
                                                                 half_sums.data(), nullptr, int(Activation::SiLU),
                                                                 got.data(), words);
                                                         else
                                                             kcap_matvec_q8<F, kMatvecRows, KCAP_MATVEC_PLAIN, TEAMS>(
                                                                 t, p, teams, chunk, w0->ref.data, w0->ref.data,
                                                                 quantized ? nullptr : x.data(),
                                                                 quantized ? codes.data() : nullptr, x_d.data(),
                                                                 half_sums.data(),
                                                                 reinterpret_cast<const float*>(bias->ref.data), 0,
                                                                 got.data(), words);
                                                     });
                                             });
                            const double err = gate_up ? gate_up_error(got, ref, w0->ref, w1->ref, xr.data(), k, n, m,
                                                                       Activation::SiLU)
                                                       : matmul_error(got, ref, w0->ref, xr.data(), k, n, m);
                            KCAP_EXPECT(err <= kMatmulTolerance, "%s K=%lld M=%d split=%d lanes=%d quantized=%d: error %.3g",
                                        row.kernel.c_str(), (long long)k, m, split, teams.lanes, int(quantized), err);
                            ++checked;
                        }
                    }
            }
        });
    }
    KCAP_EXPECT(checked > 0, "no q8_1 rows");
    std::printf("q8_1 matvec bodies: %d cases\n", checked);
}

void test_gate_up(std::mt19937& rng, CpuState& cpu) {
    int checked = 0;
    for (const Row& row : capability_table()) {
        // The f32 gate_up matvec body of each format, through its one-token row.
        if (row.backend != Backend::CUDA || row.kernel.rfind("cuda.gate_up.", 0) != 0) continue;
        const Format f = row_format(row);
        with_decoder(f, [&](auto decoder) {
            using F = decltype(decoder);
            for (int64_t k : k_edges(row, 4096))
                for (int64_t n : {1, 37})
                    for (Activation act : {Activation::SiLU, Activation::GeluTanh}) {
                        auto gate = random_weights(rng, f, k, n);
                        auto up = random_weights(rng, f, k, n);
                        const std::vector<float> x = random_floats(rng, size_t(k));
                        const std::vector<float> ref =
                            cpu_gate_up(cpu_matmul_row(f), gate->ref, up->ref, x, k, n, 1, act, cpu);
                        KcapMatmulParams p;
                        p.k = int(k), p.n = int(n), p.m = 1, p.row_bytes = unsigned(row_bytes(f, k)), p.has_bias = 0;
                        for (const KcapMatvecTeams teams : {kcap_matvec_parts(1), kcap_matvec_parts(4),
                                                            KcapMatvecTeams{1, 8}}) {
                            std::vector<float> got = nan_filled(size_t(n));
                            const int chunk =
                                std::min(int(k / 32), teams.split == 4 ? 32 : kcap::cuda_rows::kMatvecChunkRuns);
                            kcap_sim::launch(
                                {matvec_test_groups(n, teams, kMatvecRows), 1, 1}, kMatvecSimds * 32,
                                kcap::cuda_rows::kMatvecSharedBytes, [&](const KcapThread& t, void* shared) {
                                    kcap::cuda_rows::with_matvec_body<kcap::cuda_rows::kMatvecFewestLanes>(
                                        teams.lanes, [&](auto body) {
                                            kcap_matvec_staged<F, kMatvecRows, KCAP_MATVEC_GATE_UP,
                                                               decltype(body)::value>(
                                                t, p, teams, chunk, gate->ref.data, up->ref.data, x.data(), nullptr,
                                                int(act), got.data(), static_cast<float*>(shared));
                                        });
                                });
                            const double err = gate_up_error(got, ref, gate->ref, up->ref, x.data(), k, n, 1, act);
                            KCAP_EXPECT(err <= kGateUpTolerance, "%s K=%lld N=%lld %s split=%d lanes=%d: error %.3g",
                                        row.kernel.c_str(), (long long)k, (long long)n, activation_name(act),
                                        teams.split, teams.lanes, err);
                            ++checked;
                        }
                    }
        });
    }
    std::printf("gate_up bodies: %d cases\n", checked);
}

// The grouped experts' input scratch (Context::moe_bf16, cuda_rows::moe_input_values of the
// stage's moe_scratch) holds what cuda/moe.cu puts there for every batch a plan may run: x of
// n_tokens x k and the activations of the batch's sorted rows, in bf16 or split
// (split_rows_values), for the families' expert shapes and every batch from the grouped rows'
// first up to max_batch.
void test_moe_input_scratch() {
    struct Shape {
        const char* name;
        int64_t k, ff, n_expert, used;
    };
    const Shape shapes[] = {{"Qwen3-30B-A3B", 2048, 768, 128, 8}, {"gpt-oss-20b", 2880, 2880, 32, 4},
                            {"Mixtral-8x7B", 4096, 14336, 8, 2},  {"Qwen2-57B-A14B", 3584, 2560, 64, 8},
                            {"DeepSeek-V2-Lite", 2048, 1408, 64, 6}, {"tiny", 64, 32, 8, 2}};
    int checked = 0;
    for (const Shape& sh : shapes)
        for (const int64_t max_batch : {16, 17, 64, 100, 512, 2048}) {
            Stage stage;
            stage.op = Op::MoeExperts;
            stage.k = sh.k, stage.k2 = sh.ff, stage.n = sh.k;
            stage.params.n_expert = int(sh.n_expert), stage.params.n_expert_used = int(sh.used);
            const MoeScratch scratch = moe_scratch(stage, max_batch, cuda_rows::kMmaTokens);
            const int64_t capacity = int64_t(cuda_rows::moe_input_values(scratch.down, scratch.act));
            for (int64_t tokens = cuda_rows::kMoeGroupedMinTokens; tokens <= max_batch; ++tokens) {
                const int64_t rows =
                    moe_grouped_tiles(tokens * sh.used, sh.n_expert, cuda_rows::kMmaTokens) * cuda_rows::kMmaTokens;
                const int64_t split = cuda_rows::split_rows_values(tokens, sh.k) + cuda_rows::split_rows_values(rows, sh.ff);
                const int64_t bf16 = tokens * sh.k + rows * sh.ff;
                KCAP_EXPECT(split <= capacity && bf16 <= capacity && rows * sh.ff <= int64_t(scratch.act),
                            "%s, max_batch %lld, %lld tokens: the experts' inputs need %lld values (bf16 %lld), the "
                            "scratch has %lld",
                            sh.name, (long long)max_batch, (long long)tokens, (long long)split, (long long)bf16,
                            (long long)capacity);
                ++checked;
            }
        }
    std::printf("moe input scratch: %d batches\n", checked);
}

// Every CUDA row is declared (also where CUDA is not compiled in) and has its kernel exactly
// where CUDA is; the legal and just-illegal stages of every row of every backend and the token
// ranges of the routes are test_rows_table's.
void test_table() {
    int rows = 0;
    for (const Row& row : capability_table()) {
        if (row.backend != Backend::CUDA) continue;
        ++rows;
#if !defined(KCAP_WITH_CUDA)
        KCAP_EXPECT(row.fn == nullptr, "%s has a kernel in a build without CUDA", row.kernel.c_str());
#else
        KCAP_EXPECT(row.fn != nullptr, "%s has no kernel in a CUDA build", row.kernel.c_str());
#endif
        KCAP_EXPECT(!row.launches.empty(), "%s names no kernel it launches", row.kernel.c_str());
        if (row.op == Op::MatMul && row.input_encoding != Encoding::F32) {
            // Only where the plan allows q8_1 (bf16) activations; the reason names the option.
            Weights w;
            w.ref.format = row_format(row);
            const int64_t k = std::max<int64_t>(row.dims.k_multiple, (row.dims.k_min + row.dims.k_multiple - 1) /
                                                                          row.dims.k_multiple * row.dims.k_multiple);
            Stage stage = matmul_stage(&w.ref, nullptr, k, 7);
            stage.features |= row.requires_all;
            const std::string why = rejection_reason(row, stage);
            KCAP_EXPECT(why.find("activations=f32") != std::string::npos, "%s on an f32 plan: '%s'", row.kernel.c_str(),
                        why.c_str());
        }
    }
    KCAP_EXPECT(rows >= 35, "only %d CUDA rows", rows);
    // The decode matvec's rows per team: the wide matrices (LM heads) take kMatvecWideRows.
    static_assert(cuda_rows::matvec_rows_for(262144) == 2 && cuda_rows::matvec_rows_for(32768) == 2 &&
                      cuda_rows::matvec_rows_for(32767) == 1 && cuda_rows::matvec_rows_for(14336) == 1,
                  "wide matrices: n >= kMatvecWideN");
    std::printf("table: %d CUDA rows\n", rows);
}

}  // namespace

// KCAP_HOST_ONLY=NAME runs only the tests whose names contain NAME (all by default; the random
// draws then differ from a full run's).
static bool wanted(const char* name) {
    const char* only = std::getenv("KCAP_HOST_ONLY");
    return !only || std::strstr(name, only) != nullptr;
}

int main() {
    std::mt19937 rng(1234);
    CpuState cpu(2);
    if (wanted("test_table")) test_table();
    if (wanted("test_decoders")) test_decoders(rng);
    if (wanted("test_decoder_bounds")) test_decoder_bounds(rng);
    if (wanted("test_codes")) test_codes(rng);
    if (wanted("test_codes8")) test_codes8(rng);
    if (wanted("test_mxfp4_table")) test_mxfp4_table(rng);
    if (wanted("test_q8_rounding")) test_q8_rounding(rng);
    if (wanted("test_matvec_q8")) test_matvec_q8(rng, cpu);
    if (wanted("test_matmul_rows")) test_matmul_rows(rng, cpu);
    if (wanted("test_embed_rows")) test_embed_rows(rng, cpu);
    if (wanted("test_norm")) test_norm(rng, cpu);
    if (wanted("test_add_norm")) test_add_norm(rng, cpu);
    if (wanted("test_gate_up")) test_gate_up(rng, cpu);
    if (wanted("test_rope")) test_rope(rng, cpu);
    if (wanted("test_qk_norm_rope")) test_qk_norm_rope(rng, cpu);
    if (wanted("test_elementwise")) test_elementwise(rng, cpu);
    if (wanted("test_moe_route")) test_moe_route(rng, cpu);
    if (wanted("test_moe_route_grouped")) test_moe_route_grouped(rng, cpu);
    if (wanted("test_moe_experts")) test_moe_experts(rng, cpu);
    if (wanted("test_moe_experts_cpu")) test_moe_experts_cpu(rng, cpu);
    if (wanted("test_moe_input_scratch")) test_moe_input_scratch();
    if (wanted("test_ple")) test_ple(rng, cpu);
    if (wanted("test_argmax")) test_argmax(rng);
    if (wanted("test_sample")) test_sample(rng);
    if (wanted("test_attention")) test_attention(rng, cpu);
    if (wanted("test_attention_mla")) test_attention_mla(rng, cpu);
    if (wanted("test_attention_own_rope")) test_attention_own_rope(rng, cpu);
    if (wanted("test_attention_combine")) test_attention_combine(rng);
    if (wanted("test_attention_prefill")) test_attention_prefill(rng, cpu);
    if (failures()) {
        std::printf("%d failures\n", failures());
        return 1;
    }
    std::printf("all host-simulated kernel bodies match the CPU reference\n");
    return 0;
}
