// The version of this build (pyproject.toml's, passed in by CMake).
#include "kcap/kcap.h"

namespace kcap {

const char* version() { return KCAP_VERSION; }

}  // namespace kcap
