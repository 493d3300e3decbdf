"""Lightning's EarlyStopping among ``trainer.callbacks`` is recorded with the run (issue 45):
the monitored ``val_loss`` as the tensor the run saved (``scalar/val_loss``), patience, the
best check's step, and whether it stopped. The default rules report a stop 10 epochs after
the best as handled; early stopping on the wrong metric (``train_loss``, which keeps falling)
never stops, and Overtraining fires. The runs are the rules corpus's."""
import os
import sys

import pytest

pytest.importorskip("pytorch_lightning")
pytest.importorskip("smdebug.lightning")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))

import early_stopping_checks as checks
import rules_corpus


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("lightning_early_stopping"))
    return {name: rules_corpus.build(name, root)
            for name in ("lightning_early_stopping", "lightning_early_stopping_on_train_loss")}


def test_fit_records_its_early_stopping_and_the_rules_call_it_handled(runs):
    record = checks.assert_recorded(runs["lightning_early_stopping"], "lightning", "scalar/val_loss", 10)
    assert record["stopped"] is True and record["passes_after_best"] == 10 and record["mode"] == "min"
    output = checks.assert_handled(runs["lightning_early_stopping"])
    assert "(metric scalar/val_loss" in output


def test_early_stopping_on_the_wrong_metric_fires_overtraining(runs):
    record = checks.assert_recorded(runs["lightning_early_stopping_on_train_loss"], "lightning", "scalar/train_loss", 10)
    assert record["stopped"] is False
    output = checks.assert_overtraining_fires(runs["lightning_early_stopping_on_train_loss"])
    assert "validation loss has not improved" in output  # judged on the validation loss, not the monitored one
