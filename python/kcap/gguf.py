"""Reads a GGUF file: metadata as plain Python values and tensors as raw byte views.

The file is memory-mapped; tensor bytes are numpy views into the map, so no weight is
copied or dequantized in Python. Everything that can be wrong with a file (missing, wrong
magic, unsupported version, truncated, malformed) becomes a GGUFError naming the file,
the offset and what was being read.

Why not gguf.GGUFReader: it builds numpy objects for every part of every string, which
takes ~10-30 s for a 262144-token vocabulary (Gemma); this parser reads the same file in
well under a second. gguf-py stays the reference: a test checks that both read identical
metadata and tensor tables from the real models, and kcap.testing.synth writes with it.
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

from kcap.errors import GGUFError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ARRAY_NESTING = 8
# Bytes a tensor's data must be aligned to, by type: its element size for the plain types; for a
# block format the largest of 4 and 2 dividing its block size (the decoders read words).
_ELEMENT_ALIGNMENT = {"F32": 4, "I32": 4, "F64": 8, "I64": 8, "F16": 2, "BF16": 2, "I16": 2, "I8": 1}  # arrays of arrays deeper than this are refused (a file needs one level at most)

# GGUF metadata value types.
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = range(13)
_SCALAR_FORMATS = {
    _UINT8: "<B", _INT8: "<b", _UINT16: "<H", _INT16: "<h", _UINT32: "<I", _INT32: "<i",
    _FLOAT32: "<f", _BOOL: "<?", _UINT64: "<Q", _INT64: "<q", _FLOAT64: "<d",
}
_NUMPY_TYPES = {
    _UINT8: "<u1", _INT8: "<i1", _UINT16: "<u2", _INT16: "<i2", _UINT32: "<u4", _INT32: "<i4",
    _FLOAT32: "<f4", _BOOL: "?", _UINT64: "<u8", _INT64: "<i8", _FLOAT64: "<f8",
}

# GGML type id -> (name, elements per block, bytes per block) for sizing tensors. Types
# kcap cannot decode are still sized so the file reads; using one is refused later.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    type_name: str
    shape: tuple[int, ...]  # GGUF order: shape[0] is the row length
    offset: int  # absolute file offset of the first byte
    data: np.ndarray  # uint8 view of the raw blocks


class _Cursor:
    """Bounds-checked little-endian reads from the mapped file."""

    def __init__(self, buf, path: str):
        self.buf = buf
        self.pos = 0
        self.path = path
        self.context = "header"

    def fail(self, what: str):
        raise GGUFError(f"{self.path}: {what} at offset {self.pos} while reading {self.context}")

    def take(self, n: int) -> int:
        if n < 0 or self.pos + n > len(self.buf):
            self.fail(f"truncated file: {n} more bytes needed, {len(self.buf) - self.pos} left")
        start = self.pos
        self.pos += n
        return start

    def scalar(self, vtype: int):
        fmt = _SCALAR_FORMATS[vtype]
        start = self.take(struct.calcsize(fmt))
        return struct.unpack_from(fmt, self.buf, start)[0]

    def string(self) -> str:
        n = self.scalar(_UINT64)
        start = self.take(n)
        try:
            return bytes(self.buf[start:start + n]).decode("utf-8")
        except UnicodeDecodeError:
            self.fail("invalid UTF-8 in a string")

    def value(self, vtype: int, depth: int = 0):
        if vtype == _STRING:
            return self.string()
        if vtype in _SCALAR_FORMATS:
            return self.scalar(vtype)
        if vtype == _ARRAY:
            elem_type = self.scalar(_UINT32)
            count = self.scalar(_UINT64)
            if elem_type == _STRING:
                return [self.string() for _ in range(count)]
            if elem_type in _NUMPY_TYPES:
                dtype = np.dtype(_NUMPY_TYPES[elem_type])
                start = self.take(count * dtype.itemsize)
                return np.frombuffer(self.buf, dtype=dtype, count=count, offset=start).tolist()
            if elem_type == _ARRAY:
                if depth >= MAX_ARRAY_NESTING:
                    self.fail(f"arrays nested more than {MAX_ARRAY_NESTING} deep")
                return [self.value(_ARRAY, depth + 1) for _ in range(count)]
            self.fail(f"unknown array element type {elem_type}")
        self.fail(f"unknown metadata value type {vtype}")


class GGUFFile:
    """Metadata and tensors of one GGUF file (memory-mapped, read-only)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise GGUFError(f"{self.path}: no such file")
        if os.path.isdir(self.path):
            raise GGUFError(f"{self.path}: is a directory, not a GGUF file")
        size = os.path.getsize(self.path)
        if size < 4:
            raise GGUFError(f"{self.path}: not a GGUF file ({size} bytes)")
        try:
            with open(self.path, "rb") as f:
                magic = f.read(4)
                if magic != GGUF_MAGIC:
                    raise GGUFError(f"{self.path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as error:  # unreadable, or no address space left to map it
            raise GGUFError(f"{self.path}: cannot read or map the file ({error})") from error
        self._array = np.frombuffer(self._map, dtype=np.uint8)
        cur = _Cursor(self._map, self.path)
        cur.take(4)
        self.version = cur.scalar(_UINT32)
        if self.version not in SUPPORTED_VERSIONS:
            hint = " (big-endian files are not supported)" if self.version > 0xFFFF else ""
            raise GGUFError(f"{self.path}: GGUF version {self.version} is not supported{hint}; "
                            f"kcap reads versions {SUPPORTED_VERSIONS}")
        n_tensors = cur.scalar(_UINT64)
        n_kv = cur.scalar(_UINT64)
        self.metadata: dict = {}
        for i in range(n_kv):
            cur.context = f"metadata entry {i} of {n_kv}"
            key = cur.string()
            if key in self.metadata:
                # llama.cpp refuses these too ("duplicate key"): which value was meant is unknowable.
                cur.fail(f"metadata key '{key}' appears twice")
            cur.context = f"metadata value '{key}'"
            self.metadata[key] = cur.value(cur.scalar(_UINT32))
        infos = []
        for i in range(n_tensors):
            cur.context = f"tensor info {i} of {n_tensors}"
            name = cur.string()
            n_dims = cur.scalar(_UINT32)
            if n_dims > 8:
                cur.fail(f"tensor '{name}' claims {n_dims} dimensions")
            shape = tuple(cur.scalar(_UINT64) for _ in range(n_dims))
            type_id = cur.scalar(_UINT32)
            offset = cur.scalar(_UINT64)
            infos.append((name, shape, type_id, offset))
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if isinstance(alignment, bool) or not isinstance(alignment, int):
            raise GGUFError(f"{self.path}: general.alignment is {alignment!r} ({type(alignment).__name__}); "
                            "it must be an integer (GGUF writes a uint32)")
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"{self.path}: general.alignment {alignment} is not a power of two")
        data_start = (cur.pos + alignment - 1) // alignment * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, type_id, offset in infos:
            if type_id not in GGML_TYPES:
                raise GGUFError(f"{self.path}: tensor '{name}' has unknown GGML type id {type_id}")
            type_name, block_elems, block_bytes = GGML_TYPES[type_id]
            if offset % alignment:
                raise GGUFError(f"{self.path}: tensor '{name}' starts at data offset {offset}, not a multiple of "
                                f"the file's alignment {alignment}")
            # The kernels read a tensor's elements (or its blocks' words) at their natural
            # alignment; a file whose general.alignment is 1 or 2 can place them off it.
            natural = _ELEMENT_ALIGNMENT.get(type_name, 4 if block_bytes % 4 == 0 else 2 if block_bytes % 2 == 0 else 1)
            if (data_start + offset) % natural:
                raise GGUFError(f"{self.path}: tensor '{name}' ({type_name}) starts at byte {data_start + offset}, "
                                f"not a multiple of {natural} (its elements' alignment; the file's alignment is "
                                f"{alignment})")
            n_elems = math.prod(int(d) for d in shape)  # Python ints: a product of huge dims cannot wrap
            if not shape or shape[0] % block_elems:
                raise GGUFError(f"{self.path}: tensor '{name}' of type {type_name} has row length "
                                f"{shape[0] if shape else 0}, not a multiple of its block size {block_elems}")
            n_bytes = n_elems // block_elems * block_bytes
            start = data_start + offset
            if start + n_bytes > size:
                raise GGUFError(f"{self.path}: tensor '{name}' needs {n_bytes} bytes at offset {start}, but the "
                                f"file ends at {size} bytes (truncated file)")
            if name in self.tensors:
                raise GGUFError(f"{self.path}: tensor '{name}' appears twice")
            self.tensors[name] = TensorInfo(name, type_id, type_name, tuple(int(d) for d in shape), start,
                                            self._array[start:start + n_bytes])
        # No two tensors share bytes (a writer lays them out one after another).
        spans = sorted((t.offset, t.offset + t.data.nbytes, t.name) for t in self.tensors.values() if t.data.nbytes)
        for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
            if start < end:
                raise GGUFError(f"{self.path}: tensors '{first}' and '{second}' overlap (bytes {start}..{end})")

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: metadata has no general.architecture")
        return arch
