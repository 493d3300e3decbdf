"""Keras' EarlyStopping among fit's callbacks is recorded with the run (issue 45): the
monitored ``val_loss``, patience, best epoch's step, and whether it stopped. The default
rules report a stop 10 epochs after the best as handled; a patience of 60 fires Overtraining.
The runs are the rules corpus's (tests/support/rules_corpus.py)."""
import os
import sys

import pytest

pytest.importorskip("keras")
pytest.importorskip("smdebug.tensorflow")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))

import early_stopping_checks as checks
import rules_corpus


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("keras_early_stopping"))
    return {name: rules_corpus.build(name, root) for name in ("keras_early_stopping", "keras_patience_too_long")}


def test_fit_records_its_early_stopping_and_the_rules_call_it_handled(runs):
    record = checks.assert_recorded(runs["keras_early_stopping"], "keras", "val_loss", 10)
    assert record["stopped"] is True and record["passes_after_best"] == 10 and record["mode"] == "min"
    output = checks.assert_handled(runs["keras_early_stopping"])
    assert f"(metric val_loss {record['best_value']:.6g} at step {record['best_step']})" in output


def test_a_patience_far_past_the_best_fires_overtraining(runs):
    record = checks.assert_recorded(runs["keras_patience_too_long"], "keras", "val_loss", 60)
    assert record["passes_after_best"] == 60
    checks.assert_overtraining_fires(runs["keras_patience_too_long"])
