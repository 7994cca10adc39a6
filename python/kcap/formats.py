"""GGUF tensor formats: exact dequantization and the fused quantized-row dot product.

A thin layer over ``kcap._core``: it accepts a format as a GGML type id, a
``gguf.GGMLQuantizationType`` or a name such as ``"Q4_K"``, and raw tensor data as any
buffer (``bytes``, a ``numpy`` array of any dtype, a ``GGUFReader`` tensor's ``data``).
``dequantize`` is bit-exact with ``gguf.quants.dequantize``; every problem with a format or
a size raises ``FormatError``.
"""

from __future__ import annotations

import operator
from typing import Any, Sequence

import numpy as np

from kcap import _core
from kcap.errors import InvalidArgumentTypeError

FormatError = _core.FormatError

__all__ = ["FormatError", "dequantize", "dot", "format_info", "supported_formats"]


def _format_arg(ggml_type: Any) -> int | str:
    """A GGML type id (int, IntEnum, numpy integer) or a format name, as _core expects."""
    if isinstance(ggml_type, str):
        return ggml_type
    if isinstance(ggml_type, bool):
        raise InvalidArgumentTypeError("ggml_type must be a GGML type id or a format name, not bool")
    try:
        return operator.index(ggml_type)  # also gguf.GGMLQuantizationType (an IntEnum)
    except TypeError:
        raise InvalidArgumentTypeError(
            f"ggml_type must be a GGML type id or a format name, not {type(ggml_type).__name__}"
        ) from None


def _raw_array(raw: Any) -> np.ndarray:
    """The bytes of raw as a flat uint8 array, without copying when raw is contiguous."""
    array = np.ascontiguousarray(raw) if isinstance(raw, np.ndarray) else np.frombuffer(raw, dtype=np.uint8)
    return array.reshape(-1).view(np.uint8)


def dequantize(ggml_type: Any, raw: Any, shape: Sequence[int]) -> np.ndarray:
    """Decode raw GGUF tensor data to float32 of ``shape`` (numpy order; the last
    dimension is the row length, a multiple of the format's block size)."""
    shape = tuple(operator.index(d) for d in shape)
    return _core.dequantize(_format_arg(ggml_type), _raw_array(raw), shape)


def dot(ggml_type: Any, raw_row: Any, x: Any) -> float:
    """``dot(dequantize(raw_row), x)`` accumulated in float32 without materialising the
    row; ``len(x)`` is the row length."""
    return _core.dot(_format_arg(ggml_type), _raw_array(raw_row), np.ascontiguousarray(x, dtype=np.float32))


def format_info(ggml_type: Any) -> dict:
    """``{"name", "block_elems", "block_bytes", "ggml_type"}`` of a format."""
    return _core.format_info(_format_arg(ggml_type))


def supported_formats() -> list[str]:
    """Names of every format kcap decodes, in GGML id order."""
    return _core.supported_formats()
