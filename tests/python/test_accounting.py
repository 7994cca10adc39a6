"""Nothing in a model file is silently ignored (kcap.accounting): a tensor the plan does not use
and a math-changing metadata key the architecture module does not implement refuse the load,
through kcap.load and kcap explain alike, with the names and values found."""
import re
import subprocess
import sys

import numpy as np
import pytest

import kcap
from kcap.accounting import MATH_KEYS
from kcap.arch import FAMILIES as ARCH_MODULES
from kcap.arch import build_spec
from kcap.arch.common import Hyperparameters
from kcap.explain import explain_file
from kcap.gguf import GGUFFile, TensorInfo
from kcap.model import register_tensors
from kcap.testing.synth import copy_with_changes

from conftest import MODEL_PATHS
from test_conformance import FAMILIES, FIXTURES

EXPERT_MESSAGE = "expert tensors: mixture-of-experts parts that this architecture module does not implement"


def f32_tensor(name: str, shape: tuple[int, ...]):
    """(name, type, GGUF-order shape, data) as copy_with_changes takes it."""
    return (name, "F32", shape, np.ones(tuple(reversed(shape)), dtype=np.float32))


def with_unknown_tensors(fixture: str, tmp_path):
    # Expert tensors of kinds no conformance fixture has (the mixture-of-experts ones have routers
    # and merged experts of their own): chunked experts and a router bias.
    src = FIXTURES / f"{fixture}.gguf"
    n_embd = GGUFFile(src).tensors["token_embd.weight"].shape[0]
    extra = [f32_tensor("blk.0.ffn_gate_chexps.weight", (n_embd, 8, 4)),
             f32_tensor("blk.1.ffn_gate_chexps.weight", (n_embd, 8, 4)),
             f32_tensor("blk.0.exp_probs_b.bias", (4,)),
             f32_tensor("blk.1.mystery.weight", (n_embd,))]
    return copy_with_changes(str(src), str(tmp_path / f"{fixture}-extra.gguf"), add_tensors=extra)


@pytest.mark.parametrize("fixture", [f"{name}-{quant}" for name in sorted(FAMILIES) for quant in ("f32", "q8_0")])
def test_unknown_tensors_are_refused(fixture, tmp_path):
    path = with_unknown_tensors(fixture, tmp_path)
    n_tensors = len(GGUFFile(path).tensors)
    expected = (f"4 of the file's {n_tensors} tensors are not used by the .* plan.*"
                + re.escape(f"{EXPERT_MESSAGE}: blk.0.exp_probs_b.bias, blk.[0-1].ffn_gate_chexps.weight; "
                            "tensors the architecture module does not know: blk.1.mystery.weight"))
    with pytest.raises(kcap.UnusedTensorError, match=expected):
        kcap.load(path)
    with pytest.raises(kcap.UnusedTensorError, match=expected):
        explain_file(str(path), backend="cpu")


def test_kcap_explain_command_refuses_unknown_tensors(tmp_path):
    path = with_unknown_tensors("llama3-f32", tmp_path)
    result = subprocess.run([sys.executable, "-m", "kcap.cli", "explain", str(path)], capture_output=True, text=True)
    assert result.returncode == 1
    assert "kcap: error:" in result.stderr and "blk.1.mystery.weight" in result.stderr
    assert EXPERT_MESSAGE in result.stderr


@pytest.mark.parametrize("model", sorted(MODEL_PATHS))
def test_real_models_use_every_tensor_and_refuse_an_unknown_one(model):
    gguf = GGUFFile(MODEL_PATHS[model]())
    spec = build_spec(gguf)
    register_tensors(spec, gguf)  # every tensor of the real file is accounted for
    # The same check with one more tensor in the table (a copy of the file is not cheap).
    base = gguf.tensors["output_norm.weight"]
    gguf.tensors["blk.3.ffn_up_exps.weight"] = TensorInfo("blk.3.ffn_up_exps.weight", base.ggml_type,
                                                          base.type_name, base.shape, base.offset, base.data)
    with pytest.raises(kcap.UnusedTensorError, match=f"1 of the file's {len(gguf.tensors)} tensors.*"
                                                      + re.escape(f"{EXPERT_MESSAGE}: blk.3.ffn_up_exps.weight")):
        register_tensors(build_spec(gguf), gguf)


def test_known_unused_tensors_are_accepted(tmp_path, monkeypatch):
    path = with_unknown_tensors("llama-tied-f32", tmp_path)
    monkeypatch.setattr(ARCH_MODULES["llama"], "KNOWN_UNUSED_TENSORS",
                        {"blk.*.ffn_gate_chexps.weight": "test", "blk.*.exp_probs_b.bias": "test"})
    with pytest.raises(kcap.UnusedTensorError,
                       match="1 of the file's .*: tensors the architecture module does not know: blk.1.mystery.weight$"):
        kcap.load(path)
    monkeypatch.setitem(ARCH_MODULES["llama"].KNOWN_UNUSED_TENSORS, "blk.1.mystery.weight", "test")
    assert kcap.load(path).architecture == "llama"


# --- metadata -------------------------------------------------------------------------------

# A value that is not neutral for keys whose type a plain int would get wrong.
TEST_VALUES = {"rope.scaling.type": "yarn", "attention.causal": False, "use_parallel_residual": True,
               "swin_norm": True, "attention.sliding_window_pattern": [True, False], "attention.scale": 0.5}


def concrete_key(pattern: str) -> str:
    """A key a MATH_KEYS pattern matches ('expert_*' -> 'expert_x')."""
    return pattern.replace("*", "x")


def fixture_without(key: str) -> str | None:
    """The first conformance fixture whose architecture module does not implement key."""
    for name in sorted(FAMILIES):
        if key not in ARCH_MODULES[FAMILIES[name][0]].METADATA_KEYS:
            return name
    return None


UNIMPLEMENTED_SOMEWHERE = [p for p in MATH_KEYS if fixture_without(concrete_key(p))]


@pytest.mark.parametrize("pattern", UNIMPLEMENTED_SOMEWHERE)
def test_unimplemented_math_key_is_refused(pattern, tmp_path):
    key = concrete_key(pattern)
    fixture = fixture_without(key)
    arch = FAMILIES[fixture][0]
    value = TEST_VALUES.get(key, 3)
    path = copy_with_changes(str(FIXTURES / f"{fixture}-f32.gguf"), str(tmp_path / "key.gguf"),
                             metadata_overrides={f"{arch}.{key}": value})
    expected = re.escape(f"{arch}.{key} = {value!r} ({MATH_KEYS[pattern][0]})")
    with pytest.raises(kcap.UnimplementedMetadataError, match=expected):
        kcap.load(path)
    with pytest.raises(kcap.UnimplementedMetadataError, match=expected):
        explain_file(str(path))


def test_math_keys_every_module_implements():
    # The keys left out of the test above are read by every architecture module.
    everywhere = sorted(set(MATH_KEYS) - set(UNIMPLEMENTED_SOMEWHERE))
    assert everywhere == sorted(["attention.head_count", "attention.head_count_kv", "attention.key_length",
                                 "attention.value_length"])
    assert all(set(everywhere) <= set(m.METADATA_KEYS) for m in ARCH_MODULES.values())


def test_llama_sliding_window_is_refused(tmp_path):
    # Mistral-style files say 'llama'; the llama module has no sliding window.
    path = copy_with_changes(str(FIXTURES / "mistral-f32.gguf"), str(tmp_path / "swa.gguf"),
                             metadata_overrides={"llama.attention.sliding_window": 8})
    with pytest.raises(kcap.UnimplementedMetadataError,
                       match="llama.attention.sliding_window = 8 \\(sliding-window attention\\)"):
        kcap.load(path)


def test_neutral_values_load(tmp_path):
    path = copy_with_changes(str(FIXTURES / "llama3-f32.gguf"), str(tmp_path / "neutral.gguf"),
                             metadata_overrides={"llama.expert_count": 0, "llama.attention.sliding_window": 0,
                                                 "llama.final_logit_softcapping": 0.0})
    assert kcap.load(path).architecture == "llama"


def test_reading_an_undeclared_key_is_a_bug():
    hp = Hyperparameters(GGUFFile(FIXTURES / "gpt2-f32.gguf"), "gpt2", ("block_count",))
    assert hp.int("block_count") == 3
    with pytest.raises(AssertionError, match="reads 'gpt2.attention.sliding_window' without declaring it"):
        hp.int("attention.sliding_window", 0)


