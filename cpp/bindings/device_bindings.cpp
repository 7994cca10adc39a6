// Which accelerators this build can use on this machine, asked without planning a model:
// Python's default backend choice (kcap.default_backend) reads these; and which CPU kernels
// the loader chose for this CPU (`kcap --version` prints it); the CUDA device's free and total
// memory (the device-memory checks of tests/python/test_long_context_cuda.py).
#include <pybind11/pybind11.h>

#include <string>

#include "core/formats_dot_paths.h"
#include "kcap/errors.h"

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

// cudaMemGetInfo of device 0: (free, total) bytes, so a test can hold what a model took from
// the device against what the engine says it allocated (Engine::device_bytes).
py::tuple cuda_mem_info() {
#if defined(KCAP_WITH_CUDA)
    size_t free_bytes = 0, total_bytes = 0;
    const cudaError_t status = cudaMemGetInfo(&free_bytes, &total_bytes);
    if (status != cudaSuccess) {
        cudaGetLastError();
        throw kcap::BackendUnavailableError(std::string("cuda_mem_info: cudaMemGetInfo failed (") +
                                            cudaGetErrorString(status) + ")");
    }
    return py::make_tuple(free_bytes, total_bytes);
#else
    throw kcap::BackendUnavailableError("cuda_mem_info: the CUDA backend is not compiled into this build");
#endif
}

}  // namespace

void init_devices(py::module_& m) {
    m.def("cuda_device_available", &cuda_device_available,
          "True where the CUDA backend is built in and a CUDA device exists (then the default backend).");
    m.def("cuda_mem_info", &cuda_mem_info,
          "(free, total) bytes of CUDA device 0 (cudaMemGetInfo; the first call creates the CUDA context). "
          "Raises BackendUnavailableError without CUDA.");
    m.def("cap_cpu_kernels", &kcap::cap_cpu_kernels, pybind11::arg("widest"),
          "The widest dot_row kernels allowed, in this architecture's names: on x86-64 avx512 (default), "
          "avx2 or baseline; on AArch64 dotprod (default), neon (NEON without SDOT) or baseline.");
    m.def("cpu_kernels", [] { return std::string(kcap::cpu_kernels_in_use()); },
          "The CPU dot products this process runs: 'avx512+vnni' or 'avx2+fma' (x86-64), 'neon+dotprod' or "
          "'neon' (AArch64) where the build has them, the CPU supports them and cap_cpu_kernels allows them, "
          "else 'baseline'.");
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
