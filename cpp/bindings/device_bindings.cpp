// Which accelerators this build can use on this machine, asked without planning a model:
// Python's default backend choice (kcap.default_backend) reads these.
#include <pybind11/pybind11.h>

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
#if defined(KCAP_WITH_CUDA)
    m.attr("cuda_built") = true;
#else
    m.attr("cuda_built") = false;
#endif
}
