"""kcap's exceptions. Every one derives from KcapError and names the problem it reports.

The core (C++) raises FormatError, RoutingError, ModelError, ContextOverflowError,
NumericalError (NaN or infinity: also a ValueError) and BackendUnavailableError; the Python side
adds the errors about files, architectures and arguments.
"""
from kcap._core import (  # noqa: F401  (re-exported)
    BackendUnavailableError,
    ContextOverflowError,
    FormatError,
    KcapError,
    ModelError,
    NumericalError,
    RoutingError,
)


class GGUFError(KcapError):
    """The file is not a readable GGUF file (missing, wrong magic, truncated, malformed)."""


class UnknownArchitectureError(KcapError):
    """general.architecture names a family kcap has no arch/ module for."""


class MissingMetadataError(ModelError):
    """A hyperparameter the architecture needs is absent from the GGUF metadata."""


class UnimplementedMetadataError(ModelError):
    """The file sets metadata that changes the computation (kcap.accounting.MATH_KEYS) which its
    architecture module does not implement."""


class UnusedTensorError(ModelError):
    """The file holds tensors that the plan does not use and that its architecture module does not
    list as known to be unneeded."""


class InvalidArgumentError(KcapError, ValueError):
    """An argument of a kcap call is out of its domain; the message names the argument, its value
    and what is allowed. Also a ValueError, as Python code expects of a bad value."""


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of a kcap call has the wrong type (also a TypeError)."""


class HubError(KcapError):
    """A Hugging Face Hub reference (hf://ORG/REPO/FILE) is malformed or cannot be fetched."""
