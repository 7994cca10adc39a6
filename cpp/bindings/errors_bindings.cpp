// Maps kcap's C++ exceptions to Python classes: KcapError is the base of all of them.
#include <pybind11/pybind11.h>

#include "kcap/errors.h"

namespace py = pybind11;

void init_errors(py::module_& m) {
    static py::exception<kcap::Error> base(m, "KcapError", PyExc_RuntimeError);
    static py::exception<kcap::FormatError> format_error(m, "FormatError", base.ptr());
    static py::exception<kcap::RoutingError> routing_error(m, "RoutingError", base.ptr());
    static py::exception<kcap::ModelError> model_error(m, "ModelError", base.ptr());
    static py::exception<kcap::ContextOverflowError> context_error(m, "ContextOverflowError", base.ptr());
    static py::exception<kcap::BackendUnavailableError> backend_error(m, "BackendUnavailableError",
                                                                     base.ptr());
    // Also a ValueError, as Python code expects of a bad number.
    static py::exception<kcap::NumericalError> numerical_error(
        m, "NumericalError", py::make_tuple(base, py::handle(PyExc_ValueError)));
    // Most derived first: pybind11 tries translators in reverse registration order.
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const kcap::FormatError& e) {
            py::set_error(format_error, e.what());
        } catch (const kcap::RoutingError& e) {
            py::set_error(routing_error, e.what());
        } catch (const kcap::ModelError& e) {
            py::set_error(model_error, e.what());
        } catch (const kcap::ContextOverflowError& e) {
            py::set_error(context_error, e.what());
        } catch (const kcap::BackendUnavailableError& e) {
            py::set_error(backend_error, e.what());
        } catch (const kcap::NumericalError& e) {
            py::set_error(numerical_error, e.what());
        } catch (const kcap::Error& e) {
            py::set_error(base, e.what());
        }
    });
}
