// dot_row with Arm NEON (Advanced SIMD): the CPU backend's decode matvec inner loop on AArch64
// (the kernels are cpp/core/formats_dot_neon.h's, with widening int8 products for q8_1
// activations). NEON is part of every AArch64 CPU, so no run-time check is needed; on other
// machines this file compiles to the stubs below.
#include "core/formats_dot_paths.h"

#include "kcap/errors.h"

#if !defined(KCAP_DOT_NEON)

namespace kcap {
namespace neon {
bool compiled() { return false; }
float dot_row(Format, const void*, const float*, int64_t) {
    throw Error("kcap was compiled without NEON (not an AArch64 build): neon::dot_row is not available");
}
float dot_row_q8_1(Format, const void*, Q8View, int64_t) {
    throw Error("kcap was compiled without NEON (not an AArch64 build): neon::dot_row_q8_1 is not available");
}
}  // namespace neon
}  // namespace kcap

#else

#define KCAP_DOT_NS neon
#define KCAP_DOT_SDOT 0
#include "core/formats_dot_neon.h"

#endif  // KCAP_DOT_NEON
