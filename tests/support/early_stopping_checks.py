"""Checks shared by the early-stopping tests of each framework (issue 45): the run records
its early stopping, the default ``smdebug rules`` reports a stop in time as handled, and a
patience that lets training run far past the best still fires Overtraining."""
import json
import os

import rules_corpus


def assert_recorded(run_dir: str, framework: str, monitor: str, patience: int) -> dict:
    """The run's early_stopping.json (a side file in the run root) as ``trial.early_stopping()`` reads it."""
    from smdebug.trials import create_trial

    record = create_trial(run_dir, wait_timeout=0).early_stopping()
    assert record is not None
    assert (record["framework"], record["monitor"], record["patience"]) == (framework, monitor, patience), record
    assert record["best_step"] <= record["stopped_step"] and record["best_pass"] >= 0, record
    with open(os.path.join(run_dir, "early_stopping.json")) as fh:
        assert json.load(fh) == record
    return record


def assert_handled(run_dir: str) -> str:
    """The default rules exit 0 and say early stopping handled what they saw."""
    status, output = rules_corpus.default_rules(run_dir)
    assert status == 0 and "FIRED" not in output, output
    assert "handled: early stopping ended training" in output, output
    return output


def assert_overtraining_fires(run_dir: str) -> str:
    status, output = rules_corpus.default_rules(run_dir)
    assert status == 1, output
    assert any(line.startswith("Overtraining") and "FIRED" in line for line in output.splitlines()), output
    return output
