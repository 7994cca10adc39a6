// kcap._core: the thin pybind11 surface over the C++ core. One init_<area>() per file.
#include <pybind11/pybind11.h>

namespace py = pybind11;

void init_errors(py::module_& m);
void init_formats(py::module_& m);
void init_engine(py::module_& m);
void init_devices(py::module_& m);
void init_bundle(py::module_& m);

PYBIND11_MODULE(_core, m) {
    m.doc() = "kcap core: formats, capability table, planner and backends";
    init_errors(m);
    init_formats(m);
    init_engine(m);
    init_devices(m);
    init_bundle(m);
}
