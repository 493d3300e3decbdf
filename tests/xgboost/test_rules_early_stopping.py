"""Early stopping is known to the run and to the rules (issue 45): an XGBoost classifier
with ``early_stopping_rounds=10`` stops 10 rounds after its best validation logloss, which is
the plateau that Overfit, Overtraining and LossNotDecreasing look for. The default
``smdebug rules`` then reports it handled; a patience that lets training run far past the
best still fires.
"""
import contextlib
import io
import json

import numpy as np
import pytest

xgb = pytest.importorskip("xgboost")
smd = pytest.importorskip("smdebug.xgboost")

from smdebug.analysis.rules.cli import main as rules_main  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402


def train(out_dir, early_stopping_rounds, rounds=200):
    """A binary classifier on noisy labels, validation logloss and error watched, the logloss
    last (the metric XGBoost's early stopping monitors)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1200, 10))
    y = (x[:, :4] @ np.array([1.0, -1.0, 0.5, 0.5]) + 1.0 * rng.standard_normal(1200) > 0).astype(int)
    train_set, valid_set = xgb.DMatrix(x[:800], label=y[:800]), xgb.DMatrix(x[800:], label=y[800:])
    hook = smd.Hook(out_dir=str(out_dir), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["metrics"])
    params = {"objective": "binary:logistic", "max_depth": 6, "eta": 0.3, "nthread": 1,
              "eval_metric": ["error", "logloss"]}
    booster = xgb.train(params, train_set, rounds, evals=[(train_set, "train"), (valid_set, "valid")],
                        early_stopping_rounds=early_stopping_rounds, callbacks=[hook], verbose_eval=False)
    hook.close()
    return booster


def default_rules(run_dir, *extra):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = rules_main([str(run_dir), "--no-progress", *extra])
    return status, out.getvalue()


def test_the_run_records_what_early_stopping_did(tmp_path):
    booster = train(tmp_path / "run", 10)
    record = create_trial(str(tmp_path / "run")).early_stopping()
    assert record["framework"] == "xgboost" and record["mechanism"] == "early_stopping_rounds"
    assert record["monitor"] == "valid-logloss" and record["mode"] == "min" and record["patience"] == 10
    assert record["best_pass"] == booster.best_iteration and record["passes_after_best"] == 10
    assert record["stopped"] is True
    assert record["stopped_step"] == booster.num_boosted_rounds() - 1
    with open(tmp_path / "run" / "early_stopping.json") as fh:
        assert json.load(fh)["best_step"] == booster.best_iteration


def test_default_rules_report_early_stopping_as_handled(tmp_path):
    run = tmp_path / "run"
    train(run, 10)
    # Constructed as SageMaker documents them (no early-stopping awareness), the rules fire on
    # the plateau early stopping ended: the three false alarms.
    fired = {name: default_rules(run, "--rules", name, "--param", f"{name}.follow_early_stopping=False")[0]
             for name in ("Overfit", "Overtraining")}
    assert fired == {"Overfit": 1, "Overtraining": 1}, fired
    status, output = default_rules(run, "--report", str(tmp_path / "reports"))
    assert status == 0, output
    assert "FIRED" not in output
    handled = [line for line in output.splitlines() if "handled: early stopping ended training 10 passes after the best "
               "(metric valid-logloss" in line]
    assert [line.split()[0] for line in handled] == ["Overtraining"], output
    # Overfit follows the monitored logloss too, where training and validation did not part:
    # the valid-error gap it fired on above is not what early stopping watched.
    with open(tmp_path / "reports" / "Overtraining.json") as fh:
        report = json.load(fh)
    assert report["triggered"] == 0 and report["handled_count"] >= 1
    assert "validation logloss" in report["handled"][0]["message"]  # it judged the monitored metric


def test_a_patience_that_runs_far_past_the_best_still_fires(tmp_path):
    run = tmp_path / "run"
    booster = train(run, 150)
    record = create_trial(str(run)).early_stopping()
    assert record["passes_after_best"] > 50, record
    status, output = default_rules(run)
    assert status == 1 and any(line.startswith("Overtraining") and "FIRED" in line for line in output.splitlines()), \
        output
    assert booster.best_iteration < 50
