"""The Hugging Face Trainer's EarlyStoppingCallback is recorded with the run (issue 45): the
monitored ``metric_for_best_model`` as the tensor the run saved (``scalar/eval_loss``),
patience, the best evaluation's step, and whether it stopped. The default rules report a stop
10 evaluations after the best as handled; a patience of 30 fires Overtraining. The runs are
the rules corpus's (tests/support/rules_corpus.py)."""
import os
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("smdebug.transformers")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))

import early_stopping_checks as checks
import rules_corpus

HEALTHY = rules_corpus.healthy_runs("transformers")
BROKEN = rules_corpus.broken_cases("transformers")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return rules_corpus.build_all("transformers", str(tmp_path_factory.mktemp("transformers_corpus")))


def test_training_records_its_early_stopping_and_the_rules_call_it_handled(runs):
    record = checks.assert_recorded(runs["hf_early_stopping"], "transformers", "scalar/eval_loss", 10)
    assert record["stopped"] is True and record["passes_after_best"] == 10 and record["mode"] == "min"
    output = checks.assert_handled(runs["hf_early_stopping"])
    assert "(metric scalar/eval_loss" in output


def test_a_patience_far_past_the_best_fires_overtraining(runs):
    record = checks.assert_recorded(runs["hf_patience_too_long"], "transformers", "scalar/eval_loss", 30)
    assert record["passes_after_best"] == 30
    checks.assert_overtraining_fires(runs["hf_patience_too_long"])


@pytest.mark.parametrize("name", HEALTHY)
def test_default_rules_are_silent_on_a_healthy_corpus_run(runs, name):
    assert rules_corpus.noise(runs[name]) is None


@pytest.mark.parametrize("name,rule", BROKEN, ids=[f"{n}-{r}" for n, r in BROKEN])
def test_each_rule_fires_on_its_broken_corpus_runs(runs, name, rule):
    assert rules_corpus.misses(runs[name], name, rule) == []
