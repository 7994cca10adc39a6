"""The GGUF fuzzer (kcap.testing.fuzz) in the test-suite: every input of the regression corpus
(tests/fixtures/fuzz_corpus.json: mutants that once crashed, hung, ran wrong or raised a non-kcap
exception) is now refused with the kcap error it names, and a fixed-seed budget of new mutants
finds nothing (no exception outside KcapError, no MemoryError, hang or crash).
scripts/fuzz_gguf.py runs longer budgets."""
import json
import tempfile
from pathlib import Path

import pytest

from kcap.testing import fuzz

from test_conformance import FIXTURES

CORPUS = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "fuzz_corpus.json").read_text())


@pytest.fixture(scope="module")
def seeds():
    return fuzz.seed_files(FIXTURES)


@pytest.mark.parametrize("entry", CORPUS, ids=[f"{e['seed']}-{i}" for i, e in enumerate(CORPUS)])
def test_corpus_input_is_refused(seeds, entry):
    with tempfile.TemporaryDirectory() as workdir:
        outcome = fuzz.run_input(fuzz.apply_ops(seeds[entry["seed"]], entry["ops"]), workdir)
    assert outcome.kind == "refused" and outcome.detail.startswith(entry["expect"] + ":"), (entry["why"], outcome)


def test_fixed_seed_budget_finds_nothing(seeds):
    campaign = fuzz.fuzz(seeds, 300, rng_seed=0)
    assert not campaign.findings, campaign.summary()
    # the mutants reach past the reader: some load, several kinds of refusal
    assert campaign.outcomes.get("loaded", 0) > 0 and len(campaign.refusals) >= 4, campaign.summary()
