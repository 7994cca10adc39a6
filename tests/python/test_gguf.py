"""kcap's GGUF reader against gguf-py's (the reference): identical metadata and tensor
tables on the real models."""
import numpy as np
import pytest

import gguf
from conftest import MODEL_PATHS
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
