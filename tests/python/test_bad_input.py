"""Bad input gets a clear exception that names the problem; nothing crashes."""
import numpy as np
import pytest

import kcap
from kcap.testing.synth import copy_with_changes, tiny_llama


@pytest.fixture
def good(tmp_path):
    return tiny_llama(str(tmp_path / "good.gguf"))


def test_missing_file(tmp_path):
    with pytest.raises(kcap.GGUFError, match="no such file"):
        kcap.load(tmp_path / "nope.gguf")


def test_wrong_magic(tmp_path, good):
    bad = tmp_path / "bad.gguf"
    data = bytearray(open(good, "rb").read())
    data[:4] = b"GGML"
    bad.write_bytes(bytes(data))
    with pytest.raises(kcap.GGUFError, match="not a GGUF file"):
        kcap.load(bad)


@pytest.mark.parametrize("keep_fraction", [0.0001, 0.01, 0.5, 0.999])
def test_truncated_file(tmp_path, good, keep_fraction):
    data = open(good, "rb").read()
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(data[: max(5, int(len(data) * keep_fraction))])
    with pytest.raises(kcap.GGUFError, match="truncated"):
        kcap.load(bad)


def test_unknown_architecture(tmp_path, good):
    bad = copy_with_changes(good, str(tmp_path / "arch.gguf"), metadata_overrides={"general.architecture": "mamba9"})
    with pytest.raises(kcap.UnknownArchitectureError, match="unknown architecture 'mamba9'.*gemma3.*llama"):
        kcap.load(bad)


def test_unsupported_tensor_type(tmp_path):
    # IQ2_XXS (GGML type 16, 66 bytes per 256 elements) is a real GGUF type kcap does not decode.
    good = tiny_llama(str(tmp_path / "good256.gguf"), n_embd=256, n_ff=256)
    iq_tensor = ("blk.0.attn_q.weight", "IQ2_XXS", (256, 256), np.zeros((256, 66), dtype=np.uint8))
    bad = copy_with_changes(good, str(tmp_path / "iq2.gguf"), drop_tensors={"blk.0.attn_q.weight"},
                            add_tensors=[iq_tensor])
    with pytest.raises(kcap.FormatError, match="'blk.0.attn_q.weight' has type IQ2_XXS"):
        kcap.load(bad)


def test_missing_tensor(tmp_path, good):
    bad = copy_with_changes(good, str(tmp_path / "missing.gguf"), drop_tensors={"blk.1.ffn_up.weight"})
    with pytest.raises(kcap.ModelError, match="missing tensor 'blk.1.ffn_up.weight'"):
        kcap.load(bad)


def test_missing_hyperparameter(tmp_path, good):
    bad = copy_with_changes(good, str(tmp_path / "nohp.gguf"), drop_metadata={"llama.embedding_length"})
    with pytest.raises(kcap.MissingMetadataError, match="llama.embedding_length"):
        kcap.load(bad)


def test_prompt_longer_than_context(smollm):
    text = "word " * (smollm.n_ctx + 10)
    with pytest.raises(kcap.ContextOverflowError, match="does not fit the context"):
        smollm.generate(text, max_tokens=1)


def test_not_a_file_at_all(tmp_path):
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(kcap.GGUFError, match="directory"):
        kcap.load(tmp_path / "dir.gguf")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(kcap.GGUFError, match="not a GGUF file"):
        kcap.load(empty)
