// dot_row with AVX2+FMA: the CPU backend's decode matvec inner loop on x86 (the kernels are
// cpp/core/formats_dot_x86.h's, 8-lane accumulators). Compiled with -mavx2 -mfma -mf16c on every
// x86-64 build; chosen at run time where the CPU has them and not AVX-512 VNNI.
#include "core/formats_dot_paths.h"

#include "kcap/errors.h"

#if !defined(KCAP_DOT_AVX2)

namespace kcap {
namespace avx2 {
bool compiled() { return false; }
float dot_row(Format, const void*, const float*, int64_t) {
    throw Error("kcap was compiled without AVX2+FMA: avx2::dot_row is not available");
}
float dot_row_q8_1(Format, const void*, Q8View, int64_t) {
    throw Error("kcap was compiled without AVX2+FMA: avx2::dot_row_q8_1 is not available");
}
void quantize_q8_1(const float*, int64_t, int8_t*, float*, int32_t*) {
    throw Error("kcap was compiled without AVX2+FMA: avx2::quantize_q8_1 is not available");
}
}  // namespace avx2
}  // namespace kcap

#else

#define KCAP_DOT_NS avx2
#define KCAP_DOT_WIDE 0
#include "core/formats_dot_x86.h"

#endif  // KCAP_DOT_AVX2
