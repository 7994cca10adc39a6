// dot_row_q8_1 with the Arm dot product instructions (SDOT, FEAT_DotProd: Armv8.2 and later,
// e.g. Cortex-A55/A76, Neoverse N1, Apple silicon): the kernels of cpp/core/formats_dot_neon.h
// with vdotq_s32 for the integer products. Compiled with -march=armv8.2-a+dotprod on every
// AArch64 build (CMakeLists.txt); chosen at run time where the CPU has it (formats_dot.cpp).
// dot_row's f32 activations have no integer products: it stays with formats_dot_neon.cpp.
#include "core/formats_dot_paths.h"

#include "kcap/errors.h"

#if !defined(KCAP_DOT_NEON_DOTPROD)

namespace kcap {
namespace neon_dotprod {
bool compiled() { return false; }
float dot_row_q8_1(Format, const void*, Q8View, int64_t) {
    throw Error("kcap was compiled without the Arm dot product instructions: neon_dotprod::dot_row_q8_1 is not available");
}
}  // namespace neon_dotprod
}  // namespace kcap

#else

#define KCAP_DOT_NS neon_dotprod
#define KCAP_DOT_SDOT 1
#include "core/formats_dot_neon.h"

#endif  // KCAP_DOT_NEON_DOTPROD
