// Internal to cpp/core: the builds of dot_row. kcap::dot_row validates its arguments and runs
// the widest build this CPU has, checked once at run time, else the portable loops:
// - x86-64: the AVX-512 VNNI kernels (formats_dot_avx512.cpp) or else the AVX2+FMA ones
//   (formats_dot_avx2.cpp), each built with those instructions on every x86-64 build;
// - AArch64: the NEON kernels (formats_dot_neon.cpp; NEON is part of every AArch64 CPU), with
//   dot_row_q8_1 taken by the SDOT ones (formats_dot_neon_dotprod.cpp, built with
//   -march=armv8.2-a+dotprod on every AArch64 build) where the CPU has the dot product
//   instructions.
// The files of the other architecture compile to stubs whose compiled() is false. All are
// declared here so that the C++ tests can check each against the same f64 reference.
#pragma once

#include <cstdint>
#include <string>

#include "kcap/formats.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KCAP_DOT_AVX2 1
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__) && defined(__FMA__) && defined(__F16C__)
#define KCAP_DOT_AVX512 1
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#define KCAP_DOT_NEON 1
#endif
#if defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#define KCAP_DOT_NEON_DOTPROD 1
#endif

namespace kcap {

namespace portable {
// dot_row for a format and a length already validated by the caller (formats_dot.cpp).
float dot_row(Format format, const void* src, const float* x, int64_t n_elems);
float dot_row_q8_1(Format format, const void* src, Q8View x, int64_t n_elems);
// kcap::quantize_q8_1's loops, n a multiple of 32 (formats_dequantize.cpp).
void quantize_q8_1(const float* x, int64_t n, int8_t* q, float* d, int32_t* sum16);
}  // namespace portable

namespace avx2 {
// Whether the library was compiled with the AVX2+FMA kernels.
bool compiled();
// The same as portable::dot_row, with AVX2+FMA (formats_dot_avx2.cpp); throws kcap::Error
// when !compiled().
float dot_row(Format format, const void* src, const float* x, int64_t n_elems);
// dot_row_q8_1: the same code extraction, integer products (maddubs) per 16 values.
float dot_row_q8_1(Format format, const void* src, Q8View x, int64_t n_elems);
// portable::quantize_q8_1's codes, scales and sums bit for bit, 8 lanes at a time.
void quantize_q8_1(const float* x, int64_t n, int8_t* q, float* d, int32_t* sum16);
}  // namespace avx2

namespace avx512 {
// The same kernels with AVX-512 and VNNI (formats_dot_avx512.cpp): 16-lane accumulators, vpdpbusd
// for q8_1 activations.
bool compiled();
float dot_row(Format format, const void* src, const float* x, int64_t n_elems);
float dot_row_q8_1(Format format, const void* src, Q8View x, int64_t n_elems);
void quantize_q8_1(const float* x, int64_t n, int8_t* q, float* d, int32_t* sum16);
}  // namespace avx512

namespace neon {
// Whether the library was compiled with the NEON kernels (an AArch64 build).
bool compiled();
// The same as portable::dot_row with NEON (formats_dot_neon.cpp): eight 4-lane accumulators;
// throws kcap::Error when !compiled().
float dot_row(Format format, const void* src, const float* x, int64_t n_elems);
// dot_row_q8_1 with widening int8 products (vmull_s8, pairwise-added into int32) per 16 values.
float dot_row_q8_1(Format format, const void* src, Q8View x, int64_t n_elems);
}  // namespace neon

namespace neon_dotprod {
// Whether the library was compiled with the SDOT kernels (formats_dot_neon_dotprod.cpp).
bool compiled();
// dot_row_q8_1 with SDOT (vdotq_s32) for the integer products; only on a CPU with FEAT_DotProd.
float dot_row_q8_1(Format format, const void* src, Q8View x, int64_t n_elems);
}  // namespace neon_dotprod

// Whether dot_row runs the AVX2+FMA kernels on this CPU (not the AVX-512 ones).
bool avx2_kernels_in_use();
// Whether dot_row runs the AVX-512 VNNI kernels on this CPU.
bool avx512_kernels_in_use();
// Whether dot_row runs the NEON kernels on this CPU (with or without SDOT for q8_1).
bool neon_kernels_in_use();
// Whether dot_row_q8_1 runs the SDOT kernels on this CPU.
bool neon_dotprod_kernels_in_use();
// The kernels dot_row runs here: "avx512+vnni", "avx2+fma", "neon+dotprod", "neon" or "baseline".
const char* cpu_kernels_in_use();
// Caps the kernels dot_row may run (kcap.cap_cpu_kernels; KCAP_CPU_KERNELS at import). The names
// are this architecture's, widest first: on x86-64 "avx512" (the default: the widest the CPU has),
// "avx2" or "baseline"; on AArch64 "dotprod" (the default), "neon" (NEON without SDOT) or
// "baseline"; elsewhere "baseline". Any other name throws kcap::Error listing those names.
void cap_cpu_kernels(const std::string& widest);

}  // namespace kcap
