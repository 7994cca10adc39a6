"""Bundles (`kcap export`, kcap/bundle.h): what a C++ host loads without Python.

The bundle is read back here by the C++ reader a host uses (_core.load_bundle is
kcap::load_bundle): its spec must equal the one Python built, field by field and tensor by
tensor, and run to the same logits; its tokenizer.json must encode as kcap does; and every way a
bundle can be wrong must be a kcap error naming the file and field. The C++ example host built
against the installed package is the ctest embed_example (tests/cpp/embed_example.py).
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

import kcap
from kcap import _core
from kcap.arch import build_spec
from kcap.bundle import MANIFEST, TOKENIZER, export_bundle
from kcap.gguf import GGUFFile
from kcap.model import LAYER_TENSOR_FIELDS, MODEL_TENSOR_FIELDS, register_tensors

from conftest import gemma_path, smollm_path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "conformance"
FIXTURE_NAMES = sorted(p.name[:-len(".gguf")] for p in FIXTURES.glob("*-f32.gguf"))
TEXTS = ["The capital of France is", "  two spaces,\ttab and\nnewline ", "über 日本語 🎉 <b>x</b>", ""]


def scalar_fields(obj, names) -> dict:
    """The declared scalar fields (model_spec.h's lists) of a spec or layer, as plain values."""
    out = {}
    for name in names:
        value = getattr(obj, name)
        if name == "rope_yarn":
            value = {f: getattr(value, f) for f in ("factor", "original_context", "beta_fast", "beta_slow", "attn_factor")}
        out[name] = value
    return out


def python_spec(path):
    gguf = GGUFFile(path)
    spec = build_spec(gguf)
    register_tensors(spec, gguf)
    return spec


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_bundle_spec_equals_python_spec_and_runs_the_same(name, tmp_path):
    path = FIXTURES / f"{name}.gguf"
    export_bundle(path, tmp_path / "b")
    loaded, fields = _core.load_bundle(str(tmp_path / "b"))
    spec = python_spec(path)
    assert scalar_fields(loaded, _core.MODEL_SCALAR_FIELDS) == scalar_fields(spec, _core.MODEL_SCALAR_FIELDS)
    for f in MODEL_TENSOR_FIELDS:
        assert getattr(loaded, f) == getattr(spec, f), f
    assert len(loaded.layers) == len(spec.layers)
    for i, (a, b) in enumerate(zip(loaded.layers, spec.layers)):
        assert scalar_fields(a, _core.LAYER_SCALAR_FIELDS) == scalar_fields(b, _core.LAYER_SCALAR_FIELDS), f"layer {i}"
        for f in LAYER_TENSOR_FIELDS:
            assert getattr(a, f) == getattr(b, f), (i, f)
    assert fields["gguf_path"] == str(path.resolve())
    # Same spec, same plan, same arithmetic: the logits are equal bit for bit.
    model = kcap.load(path, backend="cpu", n_ctx=64)
    ids = [int(x) for x in np.random.default_rng(3).integers(0, model.n_vocab, 12)]
    engine = _core.Engine(loaded, backend="cpu", n_ctx=64)
    assert engine.routes() == model.explain()
    np.testing.assert_array_equal(engine.eval(np.array(ids, dtype=np.int32), True), model.eval(ids, all_logits=True))


@pytest.mark.parametrize("name", FIXTURE_NAMES[:6])
def test_tokenizer_json_encodes_and_decodes_as_kcap(name, tmp_path):
    from tokenizers import Tokenizer

    path = FIXTURES / f"{name}.gguf"
    fields = export_bundle(path, tmp_path / "b")
    model = kcap.load(path, backend="cpu")
    tokenizer = Tokenizer.from_file(fields["tokenizer_json"])
    for text in TEXTS:
        ids = model.tokenize(text)
        assert tokenizer.encode(text).ids == ids, text
        assert tokenizer.decode(ids, skip_special_tokens=True) == model.detokenize(
            [i for i in ids if not model.tokenizer.is_special(i)]), text
    assert fields["eos_ids"] == sorted(model.tokenizer.eos_ids)
    assert fields["bos_id"] == model.tokenizer.bos_id
    assert fields["add_bos"] == model.tokenizer.add_bos


def test_default_model_bundle_and_its_manifest(tmp_path):
    default_model_path = gemma_path()
    fields = export_bundle(default_model_path, tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / MANIFEST).read_text())
    assert manifest["format"] == "kcap-bundle" and manifest["version"] == _core.BUNDLE_VERSION == 1
    assert manifest["kcap_version"] == kcap.__version__
    assert manifest["gguf"]["size"] == os.path.getsize(default_model_path)
    assert manifest["tokenizer"] == {"file": TOKENIZER, "bos_id": 2, "eos_ids": [1, 106, 212], "add_bos": True,
                                     "add_eos": False}
    assert manifest["chat_template"] is None  # Gemma 3 270M is a base model
    spec = manifest["spec"]
    assert spec["architecture"] == "gemma3" and len(spec["layers"]) == 18
    # Every tensor is a byte range of the GGUF file, at the offset gguf-py reads it from.
    from gguf import GGUFReader

    reader = GGUFReader(default_model_path)
    offsets = {t.name: int(t.data_offset) for t in reader.tensors}
    assert {t["name"]: t["offset"] for t in spec["tensors"]} == {n: offsets[n] for n in (t["name"] for t in spec["tensors"])}
    assert fields["tokenizer_json"] == str(tmp_path / "b" / TOKENIZER)


def test_a_model_with_a_chat_template_carries_it(tmp_path):
    smollm2_path = smollm_path()
    fields = export_bundle(smollm2_path, tmp_path / "b")
    model = kcap.load(smollm2_path)
    assert fields["chat_template"] == model.tokenizer.chat_template and "im_start" in fields["chat_template"]


def test_relative_bundle_moves_with_its_file(tmp_path):
    shutil.copy(FIXTURES / "qwen3-f32.gguf", tmp_path / "model.gguf")
    export_bundle(tmp_path / "model.gguf", tmp_path / "b", relative=True)
    assert json.loads((tmp_path / "b" / MANIFEST).read_text())["gguf"]["path"] == "../model.gguf"
    shutil.move(tmp_path, tmp_path.parent / (tmp_path.name + "-moved"))
    moved = tmp_path.parent / (tmp_path.name + "-moved")
    _, fields = _core.load_bundle(str(moved / "b"))
    assert fields["gguf_path"] == str(moved / "b" / "../model.gguf")


def test_cli_export(tmp_path):
    from kcap.cli import main

    assert main(["export", str(FIXTURES / "qwen3-f32.gguf"), "-o", str(tmp_path / "b")]) == 0
    assert (tmp_path / "b" / MANIFEST).is_file() and (tmp_path / "b" / TOKENIZER).is_file()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert main(["export", str(FIXTURES / "qwen3-f32.gguf"), "-o", str(tmp_path / "other")]) == 1
    assert os.listdir(tmp_path / "other") == ["notes.txt"]  # nothing written into someone's folder


# --- every way a bundle can be wrong -----------------------------------------------------

@pytest.fixture()
def bundle(tmp_path):
    shutil.copy(FIXTURES / "qwen3-f32.gguf", tmp_path / "model.gguf")
    export_bundle(tmp_path / "model.gguf", tmp_path / "b")
    return tmp_path


def edit_manifest(root, edit):
    path = root / "b" / MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def load_error(root, gguf_path=""):
    with pytest.raises(kcap.ModelError) as info:
        _core.load_bundle(str(root / "b"), gguf_path)
    return str(info.value)


def test_missing_bundle_and_missing_or_changed_gguf(bundle):
    assert "cannot be read" in load_error(bundle / "nowhere")
    os.rename(bundle / "model.gguf", bundle / "moved.gguf")
    assert "cannot be opened" in load_error(bundle) and "model.gguf" in load_error(bundle)
    _core.load_bundle(str(bundle / "b"), str(bundle / "moved.gguf"))  # the new path, given
    data = bytearray((bundle / "moved.gguf").read_bytes())
    data[100] ^= 1
    (bundle / "model.gguf").write_bytes(bytes(data))
    assert "fingerprint" in load_error(bundle)
    (bundle / "model.gguf").write_bytes(bytes(data[:-32]))
    assert "bytes; the bundle was made from a file of" in load_error(bundle)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(version=2), "version: the bundle is version 2; this kcap reads version 1"),
    (lambda m: m.update(format="gguf"), 'format: expected "kcap-bundle"'),
    (lambda m: m["spec"].update(rope_theta=1.0), "spec: unknown field 'rope_theta'"),
    (lambda m: m["spec"]["layers"][1].pop("n_head"), "spec.layers[1]: missing field 'n_head'"),
    (lambda m: m["spec"]["layers"][0].update(n_head=2.5), "spec.layers[0].n_head: expected an integer, got 2.5"),
    (lambda m: m["spec"]["layers"][0].update(n_head=2 ** 40), "spec.layers[0].n_head: 1099511627776 is outside"),
    (lambda m: m["spec"]["layers"][0].update(activation="swish"), "'swish' is none of silu, gelu_tanh, gelu_erf, relu"),
    (lambda m: m["spec"]["layers"][0]["rope_yarn"].update(factor="4"), "rope_yarn.factor: expected a number"),
    (lambda m: m["spec"]["layers"][0].update(gated_ffn=1), "gated_ffn: expected true or false"),
    (lambda m: m["spec"]["tensors"][0].update(offset=10 ** 12), "run past the end of"),
    (lambda m: m["spec"]["tensors"][0].update(offset=m["spec"]["tensors"][0]["offset"] + 1), "alignment"),
    (lambda m: m["spec"]["tensors"][0].update(nbytes=4), "bytes; its shape and type"),
    (lambda m: m["spec"]["tensors"][0].update(type="Q9_K"), "Q9_K"),
    (lambda m: m["spec"]["tensors"][0].update(shape=[]), "shape must be an array of 1 to 4 dimensions"),
    (lambda m: m["spec"]["tensors"].append(m["spec"]["tensors"][0]), "appears twice"),
    (lambda m: m["tokenizer"].update(eos_ids=[-1]), "tokenizer.eos_ids: -1 is outside"),
])
def test_bad_manifest_fields_are_named(bundle, edit, message):
    edit_manifest(bundle, edit)
    error = load_error(bundle)
    assert str(bundle / "b" / MANIFEST) in error and message in error, error


def test_a_spec_naming_a_tensor_the_bundle_lacks_is_refused_by_the_planner(bundle):
    def drop(m):
        m["spec"]["tensors"] = [t for t in m["spec"]["tensors"] if t["name"] != "blk.0.attn_q.weight"]
    edit_manifest(bundle, drop)
    spec, _ = _core.load_bundle(str(bundle / "b"))
    with pytest.raises(kcap.ModelError, match="missing tensor 'blk.0.attn_q.weight'"):
        _core.Engine(spec, backend="cpu")


def test_routing_errors_have_the_same_message_as_python(bundle):
    row = next(r["kernel"] for r in kcap.load(bundle / "model.gguf").explain() if r["stage"] == "attn_q_norm")
    with pytest.raises(kcap.RoutingError) as python_error:
        kcap.load(bundle / "model.gguf", excluded_kernels=[row])
    spec, _ = _core.load_bundle(str(bundle / "b"))
    with pytest.raises(kcap.RoutingError) as host_error:
        _core.Engine(spec, backend="cpu", excluded_kernels=[row])
    assert str(host_error.value) == str(python_error.value)


@pytest.mark.parametrize("text, message", [
    ("", "expected a value, found the end of the text"),
    ('{"format": "kcap-bundle",}', "expected a member name"),
    ('{"a": 1, "a": 2}', '"a" repeats'),
    ('{"a": "\\x"}', "expected an escape"),
    ('{"a": "\\ud800"}', "low surrogate"),
    ('{"a": 01}', "expected ',' or"),
    ("[" * 100 + "]" * 100, "levels of nesting"),
    ('{"a": 1} x', "the end of the document"),
])
def test_malformed_json_names_the_byte(bundle, text, message):
    (bundle / "b" / MANIFEST).write_text(text)
    error = load_error(bundle)
    assert "invalid JSON at byte" in error or "levels of nesting" in error, error
    if message != "expected ',' or":
        assert message in error, error


def test_mutated_manifests_raise_kcap_errors_only(bundle):
    """A few hundred random edits of a real manifest (bytes flipped, cut, duplicated): each
    loads or raises a kcap error; never a crash or another exception."""
    text = (bundle / "b" / MANIFEST).read_bytes()
    rng = random.Random(7)
    outcomes = {"loaded": 0, "refused": 0}
    for _ in range(300):
        data = bytearray(text)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(data))
            kind = rng.random()
            if kind < 0.5:
                data[i] = rng.randrange(256)
            elif kind < 0.75:
                del data[i:i + rng.randint(1, 64)]
            else:
                data[i:i] = data[i:i + rng.randint(1, 64)]
        (bundle / "b" / MANIFEST).write_bytes(bytes(data))
        try:
            _core.load_bundle(str(bundle / "b"))
            outcomes["loaded"] += 1
        except kcap.KcapError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 200, outcomes


def test_tensors_made_outside_the_file_cannot_be_bundled(tmp_path):
    gguf = GGUFFile(FIXTURES / "qwen3-f32.gguf")
    spec = build_spec(gguf)
    register_tensors(spec, gguf)
    outside = np.zeros(spec.n_embd, dtype=np.float32)
    spec.add_tensor("made_in_python", 0, [spec.n_embd], outside.view(np.uint8))
    with pytest.raises(kcap.ModelError, match="'made_in_python' is not a byte range of"):
        _core.bundle_manifest(spec, gguf._array, "x.gguf", -1, [], False, False, "", False, "0")


# --- the installed C++ package ------------------------------------------------------------

def test_installed_cmake_package_has_only_the_public_headers():
    try:
        cmake_dir = Path(kcap.cmake_dir())
    except kcap.KcapError:
        pytest.skip("kcap runs from a source tree here, without its installed C++ package")
    root = Path(kcap.__file__).parent
    headers = sorted(p.name for p in (root / "include" / "kcap").glob("*.h"))
    assert headers == sorted(p.name for p in (Path(__file__).parents[2] / "cpp" / "include" / "kcap").glob("*.h")) \
        if (Path(__file__).parents[2] / "cpp").is_dir() else headers
    assert {"kcap.h", "bundle.h", "engine.h", "errors.h", "formats.h", "model_spec.h"} == set(headers)
    assert (cmake_dir / "kcapConfig.cmake").is_file() and (cmake_dir / "kcapTargets.cmake").is_file()
    libs = [p.name for p in (root / "lib").iterdir() if p.name.startswith("libkcap")]
    assert libs in (["libkcap.so"], ["libkcap.dylib"]), libs


# --- sampling on the host ------------------------------------------------------------------

def test_host_decode_sample_repeats_and_keeps_to_the_top_k():
    model = kcap.load(FIXTURES / "qwen3-f32.gguf", backend="cpu", n_ctx=64)
    engine = model.engine
    assert not engine.samples_on_device
    ids = np.array([5, 9, 17, 3], dtype=np.int32)

    def sample(k, top_p, seed, n=10):
        engine.reset()
        engine.eval(ids[:-1])
        return engine.decode_sample(int(ids[-1]), n, 1.0, k, top_p, 0.0, seed).tolist()

    engine.reset()
    engine.eval(ids[:-1])
    greedy = engine.decode_greedy(int(ids[-1]), 10).tolist()
    assert sample(1, 1.0, 5) == greedy and sample(50, 1e-6, 5) == greedy
    assert sample(40, 0.95, 11) == sample(40, 0.95, 11)
    assert len({tuple(sample(40, 1.0, seed)) for seed in range(6)}) > 1
    # The first draw is one of the k most likely tokens after the prompt.
    engine.reset()
    logits = engine.eval(ids)
    top3 = set(np.argsort(-logits, kind="stable")[:3].tolist())
    for seed in range(20):
        engine.truncate(len(ids) - 1)
        assert int(engine.decode_sample(int(ids[-1]), 1, 2.0, 3, 1.0, 0.0, seed)[0]) in top3
    with pytest.raises(kcap.ModelError, match="top_k must be in 1.."):
        engine.decode_sample(int(ids[-1]), 1, 1.0, model.n_vocab + 1, 1.0, 0.0, 0)


def test_host_decode_sample_cuts_top_p_at_temperature_one():
    # The C++ sampler (the device sampler's reference) keeps llama.cpp's order, as kcap.sampling:
    # at T=4 its draws stay in the T=1 nucleus of kcap.sampling's distribution, which is smaller
    # than the nucleus of the T=4 probabilities.
    from kcap.sampling import Sampler, SamplerConfig

    model = kcap.load(FIXTURES / "qwen3-f32.gguf", backend="cpu", n_ctx=64)
    engine = model.engine
    ids = np.array([5, 9, 17, 3], dtype=np.int32)
    engine.reset()
    logits = engine.eval(ids)
    allowed, _ = Sampler(SamplerConfig(temperature=4.0, top_k=40, top_p=0.6)).distribution(logits)
    hot = np.sort(logits.astype(np.float64))[::-1][:40] / 4.0
    hot = np.exp(hot - hot[0]) / np.exp(hot - hot[0]).sum()
    assert len(allowed) < int(np.searchsorted(np.cumsum(hot), 0.6)) + 1  # the orders differ here
    drawn = set()
    for seed in range(60):
        engine.truncate(len(ids) - 1)
        drawn.add(int(engine.decode_sample(int(ids[-1]), 1, 4.0, 40, 0.6, 0.0, seed)[0]))
    assert drawn <= set(allowed.tolist()) and len(drawn) > 1
