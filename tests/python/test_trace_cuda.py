"""On a CUDA device: what ran equals what `kcap explain` lists for that token count, for a
one-token decode (the captured graph replays exactly the stages its capture walked), a few
tokens and a batched prefill, on both real models' layouts (exact, q8_1 and bf16 activations;
the files of test_cuda.py's model_files: the real file where its package is installed, else a
clone of its exact layout) and on every conformance fixture. Skipped without a CUDA device
(tests/python/test_trace.py runs the same checks on the CPU)."""
from __future__ import annotations

import pytest

import kcap
from test_cuda import MODELS, model_files  # noqa: F401 (the fixture)
from test_trace import FIXTURE_PATHS, check_ranges_cover_each_stage_once, check_trace_is_the_plan


@pytest.fixture(scope="module")
def cuda_device(tiny_llama_path):
    try:
        kcap.load(tiny_llama_path, backend="cuda", n_ctx=64)
    except kcap.BackendUnavailableError:
        pytest.skip("no CUDA device")


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("activations", ["f32", "q8_1", "bf16"])
def test_real_models_trace_equals_explain_on_cuda(cuda_device, model_files, name, activations):
    path, _ = model_files[name]
    model = kcap.load(path, backend="cuda", kv_type="f16", activations=activations, n_ctx=512,
                      max_batch=128)
    check_ranges_cover_each_stage_once(model.explain(), 128)
    for n in (1, 7, 100):
        ran = check_trace_is_the_plan(model, n)
        assert {e["kernel"].split(".")[0] for e in ran} == {"cuda"}
    # A decode after a prefill replays the captured step: what it ran is the one-token plan.
    model.trace(list(range(3, 40)))
    check_trace_is_the_plan(model, 1)


@pytest.mark.parametrize("fixture", sorted(FIXTURE_PATHS))
def test_conformance_fixtures_trace_equals_explain_on_cuda(cuda_device, fixture):
    model = kcap.load(FIXTURE_PATHS[fixture], backend="cuda", max_batch=32)
    check_ranges_cover_each_stage_once(model.explain(), 32)
    for n in (1, 5, 20):
        check_trace_is_the_plan(model, n)
