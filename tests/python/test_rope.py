"""Rope scaling read from a file: YaRN's frequencies and attention factor against transformers'
own computation, and the YaRN metadata kcap refuses (with the key it names).

The qwen3-yarn conformance fixture checks YaRN end to end (logits against transformers); these
tests check the pieces and the refusals on edited copies of it."""
import math

import numpy as np
import pytest

import kcap
from kcap.arch import build_spec
from kcap.errors import MissingMetadataError, ModelError, UnimplementedMetadataError
from kcap.gguf import GGUFFile
from kcap.testing.synth import copy_with_changes

from test_conformance import FIXTURES, golden

YARN = FIXTURES / "qwen3-yarn-f32.gguf"


def edited(tmp_path, **changes):
    overrides = {k.replace("__", "."): v for k, v in changes.items() if v is not None}
    dropped = [k.replace("__", ".") for k, v in changes.items() if v is None]
    return copy_with_changes(str(YARN), str(tmp_path / "edited.gguf"), metadata_overrides=overrides,
                             drop_metadata=dropped)


def test_yarn_spec_is_transformers_parameters():
    spec = build_spec(GGUFFile(str(YARN)))
    for layer in spec.layers:
        y = layer.rope_yarn
        assert (y.factor, y.original_context, y.beta_fast, y.beta_slow) == (4.0, 64, 32.0, 1.0)
        assert y.attn_factor == pytest.approx(0.1 * math.log(4.0) + 1.0)
        assert layer.rope_freq_scale == 1.0


def test_yarn_frequencies_match_transformers():
    # transformers' own YaRN frequencies and cos/sin factor for the fixture's model (stored in its
    # golden by scripts/make_conformance_fixtures.py) against the (cos, sin) table every kcap
    # backend rotates by (the CPU rope computes the same numbers).
    g = golden("qwen3-yarn")
    inv_freq, attention_factor = g["rope_inv_freq"].astype(np.float64), float(g["rope_attention_factor"])
    yarn = build_spec(GGUFFile(str(YARN))).layers[0].rope_yarn
    assert yarn.attn_factor == pytest.approx(attention_factor, rel=1e-6)
    n_ctx = 64
    table = np.asarray(kcap._core.rope_table(rope_dim=32, rope_base=10000.0, yarn=yarn, n_ctx=n_ctx))
    angles = np.arange(n_ctx, dtype=np.float64)[:, None] * inv_freq[None, :]
    want = np.stack([np.cos(angles), np.sin(angles)], axis=-1) * attention_factor
    # transformers computes inv_freq in float32, kcap in double: at position 63 the angles agree
    # to a few float32 ulps of the frequencies.
    assert np.abs(table.reshape(want.shape) - want).max() < 2e-5
    # YaRN changed the table (pairs past the ramp turn 4 times slower, cos/sin scaled).
    plain = np.asarray(kcap._core.rope_table(rope_dim=32, rope_base=10000.0, n_ctx=n_ctx))
    assert np.abs(plain - table).max() > 0.1


@pytest.mark.parametrize("changes,error,named", [
    (dict(qwen3__rope__scaling__original_context_length=None), MissingMetadataError,
     "qwen3.rope.scaling.original_context_length"),
    (dict(qwen3__rope__scaling__original_context_length=0), ModelError, "original_context_length = 0"),
    (dict(qwen3__rope__scaling__factor=-2.0), ModelError, "qwen3.rope.scaling.factor"),
    (dict(qwen3__rope__scaling__yarn_beta_fast=0.0), ModelError, "yarn_beta_fast"),
    (dict(qwen3__rope__scaling__yarn_log_multiplier=0.1), UnimplementedMetadataError, "yarn_log_multiplier"),
    (dict(qwen3__rope__scaling__yarn_ext_factor=0.5), UnimplementedMetadataError, "yarn_ext_factor"),
])
def test_bad_yarn_metadata_is_refused(tmp_path, changes, error, named):
    with pytest.raises(error, match=named.replace(".", r"\.")):
        kcap.load(edited(tmp_path, **changes))


def test_neutral_yarn_variants_load(tmp_path):
    # llama.cpp's ext_factor of 1 and a log multiplier of 0 change nothing: the file loads.
    path = edited(tmp_path, qwen3__rope__scaling__yarn_ext_factor=1.0, qwen3__rope__scaling__yarn_log_multiplier=0.0)
    assert kcap.load(path).n_vocab > 0


def test_given_attention_factor_is_used(tmp_path):
    # transformers takes a model's attention_factor as it is (the converter writes it as
    # rope.scaling.yarn_attn_factor); the logits then differ from the default's.
    path = edited(tmp_path, qwen3__rope__scaling__yarn_attn_factor=1.5)
    assert build_spec(GGUFFile(path)).layers[0].rope_yarn.attn_factor == 1.5
    ids = [1, 2, 3, 4, 5]
    assert not np.allclose(kcap.load(path).eval(ids), kcap.load(YARN).eval(ids), atol=1e-3)


def test_family_without_yarn_refuses_it(tmp_path):
    # Gemma 3 does not implement YaRN: a file that asks for it is refused, not run unscaled.
    src = FIXTURES / "gemma3-f32.gguf"
    path = copy_with_changes(str(src), str(tmp_path / "g.gguf"), metadata_overrides={
        "gemma3.rope.scaling.type": "yarn", "gemma3.rope.scaling.factor": 4.0})
    with pytest.raises((ModelError, UnimplementedMetadataError), match="yarn|rope scaling"):
        kcap.load(path)


def test_gpt_oss_yarn_keeps_fractional_bounds():
    # gpt-oss's YaRN (transformers' truncate = False): the blend's bounds are not floored and
    # ceiled. The table matches transformers' frequencies for the gpt-oss fixture, and differs
    # from the truncated blend (which the qwen3 fixture uses).
    g = golden("gpt-oss")
    inv_freq, attention_factor = g["rope_inv_freq"].astype(np.float64), float(g["rope_attention_factor"])
    yarn = build_spec(GGUFFile(str(FIXTURES / "gpt-oss-f32.gguf"))).layers[0].rope_yarn
    assert not yarn.truncate and yarn.factor == 32.0 and yarn.original_context == 64
    n_ctx = 64
    table = np.asarray(kcap._core.rope_table(rope_dim=16, rope_base=150000.0, yarn=yarn, n_ctx=n_ctx))
    angles = np.arange(n_ctx, dtype=np.float64)[:, None] * inv_freq[None, :]
    want = np.stack([np.cos(angles), np.sin(angles)], axis=-1) * attention_factor
    assert np.abs(table.reshape(want.shape) - want).max() < 2e-5
    yarn.truncate = True
    truncated = np.asarray(kcap._core.rope_table(rope_dim=16, rope_base=150000.0, yarn=yarn, n_ctx=n_ctx))
    assert np.abs(truncated - table).max() > 1e-3


@pytest.mark.parametrize("fixture, arch", [("llama3", "llama"), ("qwen2", "qwen2"), ("granite", "granite")])
def test_a_factor_without_a_type_is_linear_scaling(tmp_path, fixture, arch):
    # llama.cpp reads rope.scaling.factor without rope.scaling.type as linear scaling, and the
    # older key rope.scale_linear as the factor: each gives the linear-scaled logits, not the
    # unscaled ones.
    src = str(FIXTURES / f"{fixture}-f32.gguf")
    ids = [1, 5, 9, 13, 17, 21, 25, 29]

    def logits(name, **overrides):
        path = copy_with_changes(src, str(tmp_path / f"{name}.gguf"), metadata_overrides=overrides,
                                 drop_metadata=[f"{arch}.rope.scaling.type"])
        return kcap.load(path, backend="cpu").eval(ids)

    linear = logits("linear", **{f"{arch}.rope.scaling.type": "linear", f"{arch}.rope.scaling.factor": 4.0})
    assert build_spec(GGUFFile(str(tmp_path / "linear.gguf"))).layers[0].rope_freq_scale == 0.25
    plain = logits("plain")
    assert not np.allclose(linear, plain, atol=1e-3)
    np.testing.assert_array_equal(logits("factor", **{f"{arch}.rope.scaling.factor": 4.0}), linear)
    np.testing.assert_array_equal(logits("old", **{f"{arch}.rope.scale_linear": 4.0}), linear)


def test_a_factor_without_a_type_is_refused_where_linear_scaling_is(tmp_path):
    # gpt-oss implements YaRN only: its factor without the type would be linear scaling.
    src = str(FIXTURES / "gpt-oss-f32.gguf")
    path = copy_with_changes(src, str(tmp_path / "g.gguf"), drop_metadata=["gpt-oss.rope.scaling.type"])
    with pytest.raises(ModelError, match="rope scaling 'linear' is not supported .*without gpt-oss.rope.scaling.type"):
        kcap.load(path, backend="cpu")
