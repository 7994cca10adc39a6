// The exceptions kcap raises. Each maps to a Python exception class of the same name
// (kcap.FormatError, kcap.RoutingError, ...) that derives from kcap.KcapError.
#pragma once

#include <stdexcept>
#include <string>

namespace kcap {

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// A tensor format kcap does not decode, or a malformed block/row size.
struct FormatError : Error {
    using Error::Error;
};
// No capability row fits a stage: the message names layer, stage, formats, dims and why
// every candidate was rejected.
struct RoutingError : Error {
    using Error::Error;
};
// The model description is inconsistent (missing tensor, wrong shape, bad hyperparameter).
struct ModelError : Error {
    using Error::Error;
};
// A request past the context length the engine was built with.
struct ContextOverflowError : Error {
    using Error::Error;
};
// A stage produced NaN or infinity (EngineOptions::check_finite), or a number that must be
// finite is not: the message names the stage.
struct NumericalError : Error {
    using Error::Error;
};
// A backend that does not exist in this build or has no device on this machine.
struct BackendUnavailableError : Error {
    using Error::Error;
};

}  // namespace kcap
