"""One Model shared by threads: concurrent generations each get the answer a serial run gives,
the cache stays consistent after an interrupted prefill, and a generation can be cancelled."""
from __future__ import annotations

import threading

import pytest

import kcap
from kcap.generate import GenerationStats

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "Count: 1, 2, 3, 4,",
           "The three primary colors are", "Water boils at"]


def run_threads(target, n):
    start = threading.Barrier(n)
    errors = []

    def body(i):
        try:
            start.wait()
            target(i)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a generation never finished"
    assert not errors, errors


def test_concurrent_generations_match_serial_runs(smollm):
    options = [dict(max_tokens=20), dict(max_tokens=20, temperature=0.9, top_k=40, seed=3)]
    jobs = [(p, o) for p in PROMPTS for o in options]
    expected = [smollm.generate(p, **o) for p, o in jobs]
    results = [None] * len(jobs)

    def work(i):
        results[i] = smollm.generate(jobs[i][0], **jobs[i][1])

    run_threads(work, len(jobs))
    assert results == expected


def test_concurrent_streams_chats_and_logits(smollm):
    messages = [{"role": "user", "content": "Name a fruit."}]
    chat_expected = smollm.chat(messages, temperature=0, max_tokens=16)
    ids = smollm.tokenize("Hello there")
    logits_expected = smollm.logits(ids)
    stream_expected = smollm.generate(PROMPTS[0], max_tokens=16)
    results = {}

    def work(i):
        kind = i % 3
        if kind == 0:
            results[i] = smollm.chat(messages, temperature=0, max_tokens=16) == chat_expected
        elif kind == 1:
            results[i] = (smollm.logits(ids) == logits_expected).all()
        else:
            results[i] = "".join(smollm.stream(PROMPTS[0], max_tokens=16)) == stream_expected

    run_threads(work, 9)
    assert all(results.values()) and len(results) == 9


def test_using_the_model_inside_its_own_open_stream_is_refused(smollm):
    stream = smollm.stream(PROMPTS[0], max_tokens=8)
    next(stream)
    with pytest.raises(kcap.ModelError, match="generation open"):
        smollm.generate("x", max_tokens=2)
    stream.close()
    assert smollm.generate(PROMPTS[0], max_tokens=4)  # the lock was released by close()


def test_cache_record_resyncs_with_the_engine(smollm):
    ids = smollm.tokenize("The capital of France is")
    expected = smollm.logits(ids)
    # As if an interrupt arrived after an engine call but before the record of it.
    smollm._cached = smollm._cached[:-2]
    assert smollm.engine.n_past == len(smollm._cached) + 2
    logits = smollm.prefill(ids)  # evaluates the two unrecorded tokens again, as a chunk of their own
    assert abs(logits - expected).max() <= 1e-4 * abs(expected).max()
    assert smollm.engine.n_past == len(smollm._cached) == len(ids)


def test_long_prompts_are_evaluated_in_chunks_with_the_same_result(smollm):
    # A prompt of more than three chunks of max_batch tokens (64 here) against the same prompt
    # in one call of the default max_batch (512).
    model = kcap.load(smollm.path, max_batch=64)
    assert model.prefill_chunk == 64 and smollm.prefill_chunk == 512
    ids = model.tokenize("one two three four " * 60)
    assert 3 * model.prefill_chunk < len(ids) <= smollm.prefill_chunk
    chunked = model.logits(ids)
    assert model.engine.n_past == len(ids) and model._cached == ids
    whole = smollm.logits(ids)
    assert abs(chunked - whole).max() <= 1e-3 * abs(whole).max()


def test_a_set_cancel_event_stops_before_any_work(smollm):
    cancel = threading.Event()
    cancel.set()
    stats = GenerationStats()
    assert list(smollm.generate_ids(smollm.tokenize("one two " * 200), max_tokens=50, cancel=cancel,
                                    stats=stats)) == []
    assert stats.finish_reason == "cancelled"


def test_the_cpu_engine_stops_a_call_between_stages_when_its_cancel_event_is_set(smollm):
    # The event set before the call: the engine's first check between stages sees it, on a
    # thread that is not the main one (a server's worker), and the call returns None with the
    # cache where it was.
    import numpy as np

    ids = np.asarray(smollm.tokenize("one two three four " * 20), dtype=np.int32)
    smollm.reset()
    cancel = threading.Event()
    cancel.set()
    out = {}
    worker = threading.Thread(target=lambda: out.update(logits=smollm.engine.eval(ids, False, cancel=cancel)))
    worker.start()
    worker.join()
    assert "logits" in out and out["logits"] is None
    assert smollm.engine.n_past == 0
    # Unset, the same call runs to the end and gives what a call without an event gives.
    cancel.clear()
    logits = smollm.engine.eval(ids, False, cancel=cancel)
    smollm.engine.reset()
    assert smollm.engine.n_past == 0
    assert (logits == smollm.engine.eval(ids, False)).all()
    smollm.reset()


def test_a_cancel_during_a_long_prompt_lands_within_a_chunk(gemma):
    # A generation on this (not the main) thread, cancelled mid-chunk of its 3000-token prompt:
    # it ends within a fraction of a chunk's time with no token, and the cache holds whole chunks
    # of the prompt only (stop_a_long_prompt_mid_chunk checks that).
    from conftest import stop_a_long_prompt_mid_chunk

    cancel = threading.Event()
    stats = GenerationStats()
    done = {}

    def prompt(ids):
        done["tokens"] = list(gemma.generate_ids(ids, max_tokens=4, cancel=cancel, stats=stats))

    result = {}

    def on_worker():  # the generation runs on a thread that is not the main one, as a server's
        try:
            result["value"] = stop_a_long_prompt_mid_chunk(gemma, prompt, cancel.set)
        except BaseException as exc:  # a failed check or the skip: raised again below
            result["error"] = exc

    worker = threading.Thread(target=on_worker)
    worker.start()
    worker.join(120)
    if "error" in result:
        raise result["error"]
    _, latency, first_chunk, _ = result["value"]
    assert done["tokens"] == [] and stats.finish_reason == "cancelled"
    assert latency < 0.5 and latency < first_chunk, (latency, first_chunk)
    gemma.reset()
