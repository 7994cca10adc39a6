// dot_row: the fused dot product of one quantized row with an f32 vector, the inner loop of
// the CPU backend's decode matvec. This file holds the argument checks, the run-time dispatch
// and the portable build; formats_dot_avx2.cpp, formats_dot_avx512.cpp (x86-64),
// formats_dot_neon.cpp and formats_dot_neon_dotprod.cpp (AArch64) the builds it dispatches to
// (formats_dot_paths.h).
//
// Portable build: blocks are decoded (with formats_blocks.h, the same decoders as
// dequantize_row) into a small aligned stack buffer that stays in L1, 256 elements at a time,
// and multiplied into 64 independent f32 partial sums. The independent sums let the
// multiply-adds overlap (one running sum would serialise every element) and keep each
// rounding chain short (n/64 additions per lane, then a fixed pairwise fold). Plain loops over
// fixed-size arrays, which gcc/clang -O3 vectorize for whatever the target offers.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "core/formats_blocks.h"
#include "core/formats_dot_paths.h"
#include "kcap/errors.h"
#include "kcap/formats.h"

#if defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)  // the kernel's bit for SDOT/UDOT (asm/hwcap.h)
#endif
#endif

namespace kcap {
namespace {

// Independent partial sums: 64 floats = 8 AVX2 registers or 4 AVX-512 ones, enough to keep
// two FMA ports busy through a 4-cycle latency.
constexpr int kLanes = 64;

struct PartialSums {
    alignas(64) float lane[kLanes] = {};

    // A fixed pairwise order, so the result does not depend on how the loop was vectorized.
    float total() const {
        float fold[kLanes];
        std::memcpy(fold, lane, sizeof fold);
        for (int width = kLanes / 2; width > 0; width /= 2)
            for (int k = 0; k < width; ++k) fold[k] += fold[k + width];
        return fold[0];
    }
};

// lane[k] += w[i + k] * x[i + k] for n a multiple of kLanes.
void multiply_add(const float* __restrict w, const float* __restrict x, int n, float* __restrict lane) {
    float sums[kLanes];
    for (int k = 0; k < kLanes; ++k) sums[k] = lane[k];
    for (int i = 0; i < n; i += kLanes)
        for (int k = 0; k < kLanes; ++k) sums[k] += w[i + k] * x[i + k];
    for (int k = 0; k < kLanes; ++k) lane[k] = sums[k];
}

template <typename Block, void (*decode)(const Block&, float*), int kBlockElems>
void decode_blocks(const Block* __restrict blocks, int count, float* __restrict out) {
    for (int g = 0; g < count; ++g) decode(blocks[g], out + g * kBlockElems);
}

// Decode kGroup consecutive blocks into one buffer so that the multiply-add runs over at least
// kLanes floats (and the 32-element formats get a longer, cheaper inner loop).
template <typename Block, int kBlockElems, void (*decode)(const Block&, float*)>
float dot_blocks(const void* src, const float* x, int64_t n_elems) {
    constexpr int kGroup = kBlockElems >= 256 ? 1 : 256 / kBlockElems;
    constexpr int kBufferElems = kGroup * kBlockElems;
    static_assert(kBufferElems % kLanes == 0, "a decoded group fills whole lane sets");
    const Block* blocks = static_cast<const Block*>(src);
    const int64_t n_blocks = n_elems / kBlockElems;

    PartialSums sums;
    alignas(64) float weights[kBufferElems];
    int64_t b = 0;
    for (; b + kGroup <= n_blocks; b += kGroup) {
        decode_blocks<Block, decode, kBlockElems>(blocks + b, kGroup, weights);
        multiply_add(weights, x + b * kBlockElems, kBufferElems, sums.lane);
    }
    // Tail of fewer than kGroup blocks (e.g. Gemma's 640 = 2 groups + 4 blocks of Q5_0):
    // decode it into the same buffer and zero-pad weights and x up to whole lane sets.
    if (b < n_blocks) {
        const int tail_blocks = static_cast<int>(n_blocks - b);
        const int tail_elems = tail_blocks * kBlockElems;
        const int padded = (tail_elems + kLanes - 1) / kLanes * kLanes;
        alignas(64) float x_tail[kBufferElems];
        decode_blocks<Block, decode, kBlockElems>(blocks + b, tail_blocks, weights);
        std::memcpy(x_tail, x + b * kBlockElems, sizeof(float) * tail_elems);
        for (int i = tail_elems; i < padded; ++i) weights[i] = x_tail[i] = 0.0f;
        multiply_add(weights, x_tail, padded, sums.lane);
    }
    return sums.total();
}

// Float rows: kLanes elements at a time are converted into a stack buffer (which is also an
// aligned copy for F32 rows at odd addresses); the last partial chunk is zero-padded so that
// every element goes through the lane sums (a scalar tail would be one long rounding chain).
template <int kBytes, void (*convert)(const uint8_t*, int, float*)>
float dot_floats(const uint8_t* src, const float* x, int64_t n) {
    PartialSums sums;
    alignas(64) float weights[kLanes];
    alignas(64) float x_chunk[kLanes];
    for (int64_t i = 0; i < n; i += kLanes) {
        const int count = n - i < kLanes ? static_cast<int>(n - i) : kLanes;
        convert(src + kBytes * i, count, weights);
        if (count == kLanes) {
            multiply_add(weights, x + i, kLanes, sums.lane);
        } else {
            std::memcpy(x_chunk, x + i, sizeof(float) * count);
            for (int k = count; k < kLanes; ++k) weights[k] = x_chunk[k] = 0.0f;
            multiply_add(weights, x_chunk, kLanes, sums.lane);
        }
    }
    return sums.total();
}

void convert_f32(const uint8_t* src, int count, float* out) { std::memcpy(out, src, sizeof(float) * count); }

void convert_f16(const uint8_t* src, int count, float* out) {
    for (int k = 0; k < count; ++k) out[k] = blocks::load_half(src + 2 * k);
}

void convert_bf16(const uint8_t* src, int count, float* out) {
    for (int k = 0; k < count; ++k) {
        uint16_t h;
        std::memcpy(&h, src + 2 * k, sizeof h);
        out[k] = blocks::bits_to_float(static_cast<uint32_t>(h) << 16);
    }
}

}  // namespace

namespace portable {

float dot_row(Format format, const void* src, const float* x, int64_t n_elems) {
    using namespace blocks;
    switch (format) {
        case Format::F32:
            return dot_floats<4, convert_f32>(static_cast<const uint8_t*>(src), x, n_elems);
        case Format::F16:
            return dot_floats<2, convert_f16>(static_cast<const uint8_t*>(src), x, n_elems);
        case Format::BF16:
            return dot_floats<2, convert_bf16>(static_cast<const uint8_t*>(src), x, n_elems);
        case Format::Q4_0:
            return dot_blocks<BlockQ4_0, kQK, decode_q4_0>(src, x, n_elems);
        case Format::Q4_1:
            return dot_blocks<BlockQ4_1, kQK, decode_q4_1>(src, x, n_elems);
        case Format::Q5_0:
            return dot_blocks<BlockQ5_0, kQK, decode_q5_0>(src, x, n_elems);
        case Format::Q5_1:
            return dot_blocks<BlockQ5_1, kQK, decode_q5_1>(src, x, n_elems);
        case Format::Q8_0:
            return dot_blocks<BlockQ8_0, kQK, decode_q8_0>(src, x, n_elems);
        case Format::MXFP4:
            return dot_blocks<BlockMXFP4, kQK, decode_mxfp4>(src, x, n_elems);
        case Format::Q2_K:
            return dot_blocks<BlockQ2_K, kQK_K, decode_q2_k>(src, x, n_elems);
        case Format::Q3_K:
            return dot_blocks<BlockQ3_K, kQK_K, decode_q3_k>(src, x, n_elems);
        case Format::Q4_K:
            return dot_blocks<BlockQ4_K, kQK_K, decode_q4_k>(src, x, n_elems);
        case Format::Q5_K:
            return dot_blocks<BlockQ5_K, kQK_K, decode_q5_k>(src, x, n_elems);
        case Format::Q6_K:
            return dot_blocks<BlockQ6_K, kQK_K, decode_q6_k>(src, x, n_elems);
    }
    throw FormatError("dot_row: " + std::string(format_name(format)) + " has no kernel");
}

// q8_1 activations: the values d * q, 256 at a time, through the f32 dot_row above.
float dot_row_q8_1(Format format, const void* src, Q8View x, int64_t n_elems) {
    const auto* bytes = static_cast<const uint8_t*>(src);
    alignas(64) float values[256];
    float sum = 0.0f;
    for (int64_t e = 0; e < n_elems; e += 256) {
        const int64_t count = std::min<int64_t>(256, n_elems - e);
        for (int64_t i = 0; i < count; ++i) values[i] = x.d[(e + i) / 32] * static_cast<float>(x.q[e + i]);
        sum += portable::dot_row(format, bytes + row_bytes(format, e), values, count);
    }
    return sum;
}

}  // namespace portable

namespace {

// The x86 kernels where they were compiled (formats_dot_avx2.cpp and formats_dot_avx512.cpp are
// built with those instructions on x86-64 whatever the rest of the library targets) and this CPU
// runs them: decided once, at the first call, so one wheel serves every x86-64 CPU.
bool cpu_has(const char* which) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const std::string name = which;
    if (name == "avx512")
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    (void)which;
    return false;
#endif
}

// Whether this AArch64 CPU has the dot product instructions (FEAT_DotProd: SDOT/UDOT).
bool cpu_has_dotprod() {
#if defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD)
    return true;  // the whole library targets such CPUs (KCAP_NATIVE on one)
#elif defined(__aarch64__) && defined(__APPLE__)
    int value = 0;
    size_t size = sizeof value;
    if (sysctlbyname("hw.optional.arm.FEAT_DotProd", &value, &size, nullptr, 0) == 0) return value != 0;
    return true;  // every Apple silicon CPU has it; macOS before 12 lacks the key
#elif defined(__aarch64__) && defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
    return false;  // other systems: the NEON kernels without SDOT
#endif
}

// The widest build allowed (cap_cpu_kernels): 2 AVX-512 or NEON with SDOT, 1 AVX2 or NEON
// without it, 0 the portable loops.
std::atomic<int> kernel_cap{2};

// The cap names of this architecture, by level (cap_cpu_kernels; empty: no such level here).
#if defined(__x86_64__) || defined(__i386__)
constexpr const char* kCapNames[3] = {"baseline", "avx2", "avx512"};
constexpr const char* kArchitecture = "x86";
#elif defined(__aarch64__)
constexpr const char* kCapNames[3] = {"baseline", "neon", "dotprod"};
constexpr const char* kArchitecture = "AArch64";
#else
constexpr const char* kCapNames[3] = {"baseline", "", ""};
constexpr const char* kArchitecture = "this architecture";
#endif

bool avx512_runs() {
    static const bool runs = avx512::compiled() && cpu_has("avx512");
    return runs;
}

bool avx2_runs() {
    static const bool runs = avx2::compiled() && cpu_has("avx2");
    return runs;
}

bool neon_dotprod_runs() {
    static const bool runs = neon_dotprod::compiled() && cpu_has_dotprod();
    return runs;
}

int cap() { return kernel_cap.load(std::memory_order_relaxed); }

bool use_avx512() { return cap() >= 2 && avx512_runs(); }
bool use_avx2() { return !use_avx512() && cap() >= 1 && avx2_runs(); }
// Advanced SIMD is part of every AArch64 CPU: the NEON kernels run wherever they were compiled.
bool use_neon() { return cap() >= 1 && neon::compiled(); }
bool use_neon_dotprod() { return cap() >= 2 && neon_dotprod_runs(); }

}  // namespace

void cap_cpu_kernels(const std::string& widest) {
    std::string expected;
    for (int level = 2; level >= 0; --level) {
        const std::string name = kCapNames[level];
        if (name.empty()) continue;
        if (widest == name) {
            kernel_cap.store(level, std::memory_order_relaxed);
            return;
        }
        expected += expected.empty() ? name : (level == 0 ? " or " : ", ") + name;
    }
    throw Error("cpu kernels '" + widest + "': expected " + expected + " on " + kArchitecture);
}

bool avx2_kernels_in_use() { return use_avx2(); }
bool avx512_kernels_in_use() { return use_avx512(); }
bool neon_kernels_in_use() { return use_neon(); }
bool neon_dotprod_kernels_in_use() { return use_neon_dotprod(); }

const char* cpu_kernels_in_use() {
    if (use_avx512()) return "avx512+vnni";
    if (use_avx2()) return "avx2+fma";
    if (use_neon_dotprod()) return "neon+dotprod";
    if (use_neon()) return "neon";
    return "baseline";
}

float dot_row(Format format, const void* src, const float* x, int64_t n_elems) {
    row_bytes(format, n_elems);  // validates the format and that n_elems fills whole blocks
    if (use_avx512()) return avx512::dot_row(format, src, x, n_elems);
    if (use_avx2()) return avx2::dot_row(format, src, x, n_elems);
    // Both AArch64 levels: SDOT has nothing to do with f32 activations.
    if (use_neon()) return neon::dot_row(format, src, x, n_elems);
    return portable::dot_row(format, src, x, n_elems);
}

float dot_row_q8_1(Format format, const void* src, Q8View x, int64_t n_elems) {
    row_bytes(format, n_elems);
    if (format == Format::F32 || format == Format::F16 || format == Format::BF16)
        throw FormatError(std::string("dot_row_q8_1: ") + format_name(format) + " is a float format (no q8_1 path)");
    if (n_elems % 32 != 0) throw FormatError("dot_row_q8_1: " + std::to_string(n_elems) + " is not whole 32-value runs");
    if (use_avx512()) return avx512::dot_row_q8_1(format, src, x, n_elems);
    if (use_avx2()) return avx2::dot_row_q8_1(format, src, x, n_elems);
    if (use_neon_dotprod()) return neon_dotprod::dot_row_q8_1(format, src, x, n_elems);
    if (use_neon()) return neon::dot_row_q8_1(format, src, x, n_elems);
    return portable::dot_row_q8_1(format, src, x, n_elems);
}

}  // namespace kcap
