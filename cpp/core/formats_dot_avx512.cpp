// dot_row with AVX-512 (F, BW, VL, DQ) and VNNI: the kernels of cpp/core/formats_dot_x86.h with
// 16-lane accumulators and vpdpbusd for q8_1 activations. Compiled with those instructions on
// every x86-64 build; chosen at run time where the CPU has them (formats_dot.cpp).
#include "core/formats_dot_paths.h"

#include "kcap/errors.h"

#if !defined(KCAP_DOT_AVX512)

namespace kcap {
namespace avx512 {
bool compiled() { return false; }
float dot_row(Format, const void*, const float*, int64_t) {
    throw Error("kcap was compiled without AVX-512 VNNI: avx512::dot_row is not available");
}
float dot_row_q8_1(Format, const void*, Q8View, int64_t) {
    throw Error("kcap was compiled without AVX-512 VNNI: avx512::dot_row_q8_1 is not available");
}
void quantize_q8_1(const float*, int64_t, int8_t*, float*, int32_t*) {
    throw Error("kcap was compiled without AVX-512 VNNI: avx512::quantize_q8_1 is not available");
}
}  // namespace avx512
}  // namespace kcap

#else

#if defined(__GNUC__) && !defined(__clang__)
// GCC's AVX-512 intrinsics start some results from _mm512_undefined_*(), which -Wuninitialized
// then reports at every inlined use.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define KCAP_DOT_NS avx512
#define KCAP_DOT_WIDE 1
#include "core/formats_dot_x86.h"

#endif  // KCAP_DOT_AVX512
