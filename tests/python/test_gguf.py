"""kcap's GGUF reader against gguf-py's (the reference): identical metadata and tensor
tables on the real models; malformed files (written byte by byte) refused with a GGUFError
that names the problem."""
import struct

import numpy as np
import pytest

import gguf
from conftest import MODEL_PATHS
from kcap.errors import GGUFError
from kcap.gguf import GGUFFile


@pytest.mark.parametrize("name", sorted(MODEL_PATHS))
def test_reader_matches_gguf_py(name):
    path = MODEL_PATHS[name]()
    ours = GGUFFile(path)
    ref = gguf.GGUFReader(path)
    ref_metadata = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata == ref_metadata
    assert len(ours.tensors) == len(ref.tensors)
    for t in ref.tensors:
        mine = ours.tensors[t.name]
        assert mine.ggml_type == int(t.tensor_type)
        assert mine.shape == tuple(int(d) for d in t.shape)
        assert mine.offset == t.data_offset
        assert mine.data.nbytes == t.n_bytes
    # Spot-check bytes of a few tensors (all would read ~250 MB twice).
    for t in ref.tensors[:: max(1, len(ref.tensors) // 8)]:
        assert np.array_equal(ours.tensors[t.name].data, np.asarray(t.data).view(np.uint8).reshape(-1))


# --- malformed files, written byte by byte ---------------------------------------------------

def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    return _string(key) + struct.pack("<I", vtype) + payload


def _raw_gguf(kvs: list[bytes], tensors: list[tuple[str, tuple, int, int]], data: bytes, alignment: int = 32) -> bytes:
    """A GGUF v3 file: kvs already encoded; tensors as (name, shape, ggml type, data offset)."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    for name, shape, ggml_type, offset in tensors:
        head += _string(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        head += struct.pack("<IQ", ggml_type, offset)
    head += b"\0" * (-len(head) % alignment)
    return head + data


ARCH = _kv("general.architecture", 8, _string("llama"))
F32 = 0


def _read(tmp_path, raw: bytes):
    path = tmp_path / "malformed.gguf"
    path.write_bytes(raw)
    return GGUFFile(path)


def test_well_formed_raw_file_reads(tmp_path):
    # The writer below is right: two F32 tensors back to back read as written.
    f = _read(tmp_path, _raw_gguf([ARCH], [("a", (8,), F32, 0), ("b", (8,), F32, 32)], bytes(64)))
    assert [t.shape for t in f.tensors.values()] == [(8,), (8,)]


def test_duplicate_metadata_key_is_refused(tmp_path):
    count = lambda v: _kv("llama.block_count", 4, struct.pack("<I", v))  # noqa: E731
    with pytest.raises(GGUFError, match="'llama.block_count' appears twice"):
        _read(tmp_path, _raw_gguf([ARCH, count(3), count(1)], [], b""))


def test_misaligned_tensor_offset_is_refused(tmp_path):
    with pytest.raises(GGUFError, match="tensor 'a' starts at data offset 1, not a multiple of the file's alignment 32"):
        _read(tmp_path, _raw_gguf([ARCH], [("a", (8,), F32, 1)], bytes(64)))


def test_wrapping_element_count_is_refused(tmp_path):
    # 2^61 + 1 rows of 8: the product wraps in 64 bits; read exactly, it runs far past the file.
    with pytest.raises(GGUFError, match=r"tensor 'a' needs 73786976294838206496 bytes.*truncated"):
        _read(tmp_path, _raw_gguf([ARCH], [("a", (8, 2**61 + 1), F32, 0)], bytes(64)))


def test_overlapping_tensors_are_refused(tmp_path):
    with pytest.raises(GGUFError, match="tensors 'a' and 'b' overlap"):
        _read(tmp_path, _raw_gguf([ARCH], [("a", (16,), F32, 0), ("b", (8,), F32, 32)], bytes(96)))


@pytest.mark.parametrize("vtype,payload", [(8, _string("32")), (7, struct.pack("<?", True))])
def test_ill_typed_alignment_is_refused(tmp_path, vtype, payload):
    with pytest.raises(GGUFError, match="general.alignment .* must be an integer"):
        _read(tmp_path, _raw_gguf([ARCH, _kv("general.alignment", vtype, payload)], [], b""))


def test_deeply_nested_arrays_are_refused(tmp_path):
    # An array of one array of one array ... 2000 deep (Python's recursion would give out),
    # ending in an empty array of uint32.
    nested = struct.pack("<IQ", 9, 1) * 2000 + struct.pack("<IQ", 4, 0)
    with pytest.raises(GGUFError, match="nested more than"):
        _read(tmp_path, _raw_gguf([ARCH, _kv("x.nested", 9, nested)], [], b""))
