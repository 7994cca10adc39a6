"""The plan is the truth: `kcap explain` routes every stage once per range of tokens per call,
the ranges of each stage cover 1 .. max_batch exactly once, and model.trace shows that what ran
for a one-token decode and for a batched prefill is exactly what explain lists for those token
counts, on the real models and on every conformance fixture (tests/python/test_trace_cuda.py
runs the same checks on a CUDA device)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kcap
from kcap.explain import format_table, route_for
from conftest import MODEL_PATHS

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "conformance"
FIXTURE_PATHS = {p.stem: str(p) for p in sorted(FIXTURES.glob("*.gguf"))}


def check_ranges_cover_each_stage_once(routes: list[dict], max_batch: int) -> None:
    """For each (layer, stage): ranges ascending, contiguous from 1, the last reaching max_batch."""
    by_stage: dict = {}
    for r in routes:
        by_stage.setdefault((r["layer"], r["stage"]), []).append(r)
    for key, rs in by_stage.items():
        expected_min = 1
        for i, r in enumerate(rs):
            assert r["tokens_min"] == expected_min, (key, rs)
            last = i == len(rs) - 1
            if r["tokens_max"] is None:
                assert last, (key, rs)
            else:
                assert r["tokens_max"] >= r["tokens_min"], (key, rs)
                expected_min = r["tokens_max"] + 1
        assert rs[-1]["tokens_max"] is None or rs[-1]["tokens_max"] >= max_batch, (key, rs)


def check_trace_is_the_plan(model, n_tokens: int) -> list[dict]:
    """Traces n_tokens from an empty cache and checks every stage call against explain."""
    routes = model.explain()
    ids = [(7 * i + 3) % model.n_vocab for i in range(n_tokens)]
    ran = model.trace(ids)
    stages = list(dict.fromkeys((r["layer"], r["stage"]) for r in routes))
    assert [(e["layer"], e["stage"]) for e in ran] == stages, "every stage runs once, in plan order"
    head = False
    for e in ran:
        # The LM head and what follows it run on the last position only.
        if e["n_tokens"] != n_tokens:
            assert e["n_tokens"] == 1 and e["layer"] == -1, e
            head = True
        else:
            assert not head, f"{e} runs on every position after a stage that ran on the last one"
        assert e["kernel"] == route_for(routes, e["layer"], e["stage"], e["n_tokens"])["kernel"], e
    return ran


@pytest.mark.parametrize("name", sorted(MODEL_PATHS))
@pytest.mark.parametrize("activations", ["f32", "q8_1"])
def test_real_models_trace_equals_explain(name, activations):
    model = kcap.load(MODEL_PATHS[name](), activations=activations, n_ctx=256, max_batch=64)
    routes = model.explain()
    check_ranges_cover_each_stage_once(routes, 64)
    check_trace_is_the_plan(model, 1)
    check_trace_is_the_plan(model, 40)
    if activations == "q8_1":
        # The q8_1 matmuls take one token on cpu.matvec_q8 and a batch on cpu.matmul_q8.
        q = [r for r in routes if r["layer"] == 0 and r["stage"] == "attn_q"]
        assert [(r["tokens_min"], r["tokens_max"], r["kernel"].split(".")[1]) for r in q] == [
            (1, 1, "matvec_q8"), (2, None, "matmul_q8")]


@pytest.mark.parametrize("fixture", sorted(FIXTURE_PATHS))
def test_conformance_fixtures_trace_equals_explain(fixture):
    model = kcap.load(FIXTURE_PATHS[fixture], max_batch=16)
    check_ranges_cover_each_stage_once(model.explain(), 16)
    check_trace_is_the_plan(model, 1)
    ran = check_trace_is_the_plan(model, 11)
    # A trace leaves the cache holding its tokens: the next eval continues after them.
    assert model.engine.n_past == 11 and len(ran) > 0


def test_trace_evaluates_as_eval_does(tiny_llama_path):
    model = kcap.load(tiny_llama_path)
    ids = [1, 5, 9, 2]
    _, traced = model.engine.trace(np.asarray(ids, dtype=np.int32))
    np.testing.assert_array_equal(traced, model.logits(ids))  # the same call: the same kernels and sums
    # The cache then holds the traced tokens: the next eval continues after them.
    model.trace(ids)
    after_trace = model.eval([3])
    model.reset()
    model.eval(ids)
    np.testing.assert_array_equal(after_trace, model.eval([3]))


def test_gpu_explain_splits_matmuls_by_tokens_per_call():
    # No device needed: a CUDA plan is made for the reference device. A quantized matmul runs the
    # decode matvec for one token, the few-token walk up to 15 and the tensor-core tiles from 16.
    path = MODEL_PATHS["gemma3_270m"]()
    from kcap.explain import explain_file

    routes = explain_file(path, backend="cuda", max_batch=512)
    check_ranges_cover_each_stage_once(routes, 512)
    o = [(r["tokens_min"], r["tokens_max"], r["kernel"]) for r in routes if r["layer"] == 0 and r["stage"] == "attn_output"]
    assert o == [(1, 1, "cuda.matvec.q4_k"), (2, 15, "cuda.matmul_tokens.q4_k"), (16, None, "cuda.matmul_mma.q4_k")]
    text = format_table(routes)
    assert "16+" in text and "cuda.matmul_mma.q4_k" in text
