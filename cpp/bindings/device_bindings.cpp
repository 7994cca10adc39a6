// Which accelerators this build can use on this machine, asked without planning a model:
// Python's default backend choice (kcap.default_backend) reads these; and which CPU kernels
// the loader chose for this CPU (`kcap --version` prints it).
#include <pybind11/pybind11.h>

#include "core/formats_dot_paths.h"

#if defined(KCAP_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace py = pybind11;

namespace {

bool cuda_device_available() {
#if defined(KCAP_WITH_CUDA)
    int count = 0;
    // No driver, no device or a driver older than the runtime: all mean "no CUDA here".
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky error so a later explicit choice reports its own
        return false;
    }
    return count > 0;
#else
    return false;
#endif
}

}  // namespace

void init_devices(py::module_& m) {
    m.def("cuda_device_available", &cuda_device_available,
          "True where the CUDA backend is built in and a CUDA device exists (then the default backend).");
    m.def("cpu_kernels", [] { return kcap::avx2_kernels_in_use() ? "avx2+fma" : "baseline"; },
          "The CPU dot products this process runs: 'avx2+fma' where the build has them and the CPU "
          "supports them, else 'baseline'.");
#if defined(KCAP_NATIVE_BUILD)
    m.attr("native_build") = true;  // built with -march=native: runs only on CPUs like the builder's
#else
    m.attr("native_build") = false;
#endif
#if defined(KCAP_WITH_CUDA)
    m.attr("cuda_built") = true;
#else
    m.attr("cuda_built") = false;
#endif
}
