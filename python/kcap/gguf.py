"""Reads a GGUF file: metadata as plain Python values and tensors as raw byte views.

The file is memory-mapped (gguf.GGUFReader); tensor bytes are numpy views into the map, so
no weight is copied or dequantized in Python. Everything that can be wrong with a file is
turned into a GGUFError that names the file and the problem.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from kcap.errors import GGUFError

GGUF_MAGIC = b"GGUF"
# magic (4) + version (4) + tensor count (8) + metadata count (8)
GGUF_HEADER_BYTES = 24


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    type_name: str
    shape: tuple[int, ...]  # GGUF order: shape[0] is the row length
    data: np.ndarray  # uint8 view of the raw blocks


class GGUFFile:
    """Metadata and tensors of one GGUF file."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        self._check_header()
        try:
            import gguf

            reader = gguf.GGUFReader(self.path, "r")
        except Exception as exc:  # gguf-py raises ValueError, IndexError, struct errors ...
            raise GGUFError(f"{self.path}: malformed or truncated GGUF file ({type(exc).__name__}: {exc})") from exc
        self._reader = reader
        self.metadata: dict = {}
        for key, field in reader.fields.items():
            try:
                self.metadata[key] = field.contents()
            except Exception as exc:
                raise GGUFError(f"{self.path}: metadata key '{key}' cannot be read ({exc})") from exc
        file_size = os.path.getsize(self.path)
        self.tensors: dict[str, TensorInfo] = {}
        for t in reader.tensors:
            type_id = int(t.tensor_type)
            data = np.asarray(t.data).view(np.uint8).reshape(-1)
            if t.data_offset + t.n_bytes > file_size or data.nbytes != t.n_bytes:
                raise GGUFError(
                    f"{self.path}: tensor '{t.name}' needs {t.n_bytes} bytes at offset {t.data_offset}, "
                    f"but the file holds {file_size} bytes (truncated file)"
                )
            self.tensors[t.name] = TensorInfo(
                name=t.name,
                ggml_type=type_id,
                type_name=t.tensor_type.name,
                shape=tuple(int(d) for d in t.shape),
                data=data,
            )

    def _check_header(self) -> None:
        if not os.path.exists(self.path):
            raise GGUFError(f"{self.path}: no such file")
        if os.path.isdir(self.path):
            raise GGUFError(f"{self.path}: is a directory, not a GGUF file")
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            head = f.read(GGUF_HEADER_BYTES)
        if len(head) < 4 or head[:4] != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (magic {head[:4]!r}, expected {GGUF_MAGIC!r})")
        if size < GGUF_HEADER_BYTES:
            raise GGUFError(f"{self.path}: truncated GGUF file ({size} bytes, the header alone is {GGUF_HEADER_BYTES})")

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: metadata has no general.architecture")
        return arch
