"""Built-in rules on real XGBoost runs, and a live rule stopping xgb.train."""
import numpy as np
import pytest

xgb = pytest.importorskip("xgboost")

import smdebug.xgboost as smd  # noqa: E402
from smdebug.rules import (  # noqa: E402
    FeatureImportanceOverweight, Overfit, Rule, StopTraining, TreeDepth, invoke_rule,
)
from smdebug.trials import create_trial  # noqa: E402


def boost(out_dir, X, y, params, rounds, collections, Xv=None, yv=None, rules=()):
    hook = smd.Hook(out_dir=str(out_dir), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=list(collections))
    lives = [hook.add_rule(rule, actions=actions) for rule, actions in rules]
    dtrain = xgb.DMatrix(X, y)
    evals = [(dtrain, "train")] + ([(xgb.DMatrix(Xv, yv), "validation")] if Xv is not None else [])
    booster = xgb.train({"nthread": 2, **params}, dtrain, rounds, evals=evals, callbacks=[hook], verbose_eval=False)
    hook.close()
    return booster, create_trial(str(out_dir)), lives


def test_tree_depth(tmp_path, data):
    X, y, _, _ = data
    _, trial, _ = boost(tmp_path / "deep", X, y, {"objective": "binary:logistic", "max_depth": 6}, 4, ["trees"])
    report = invoke_rule(TreeDepth(trial, depth=2), report_path=None)
    assert report.violation_steps == [0, 1, 2, 3]
    assert 2 < report.to_dict()["violations"][-1]["details"]["max_depth"] <= 6
    assert invoke_rule(TreeDepth(trial, depth=6), report_path=None).triggered == 0

    _, shallow, _ = boost(tmp_path / "shallow", X, y, {"objective": "binary:logistic", "max_depth": 2}, 4, ["trees"])
    assert invoke_rule(TreeDepth(shallow), report_path=None).triggered == 0


def test_feature_importance_overweight(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 10))
    params = {"objective": "binary:logistic", "max_depth": 3}
    one_feature = (X[:, 0] > 0).astype(int)
    _, trial, _ = boost(tmp_path / "one", X, one_feature, params, 15, ["feature_importance"])
    report = invoke_rule(FeatureImportanceOverweight(trial), report_path=None)
    assert report.violation_steps == list(range(15))
    assert "f0" in report.to_dict()["violations"][-1]["message"]

    many_features = (X[:, :8].sum(axis=1) > 0).astype(int)
    _, trial, _ = boost(tmp_path / "many", X, many_features, params, 15, ["feature_importance"])
    assert invoke_rule(FeatureImportanceOverweight(trial), start_step=5, report_path=None).triggered == 0


def test_overfit_on_train_and_validation_metrics(tmp_path):
    rng = np.random.default_rng(1)
    X, Xv = rng.standard_normal((60, 5)), rng.standard_normal((200, 5))
    y, yv = rng.integers(0, 2, 60), rng.integers(0, 2, 200)  # pure noise: a deep model memorizes it
    params = {"objective": "binary:logistic", "max_depth": 8, "eta": 1.0, "min_child_weight": 0,
              "eval_metric": "logloss"}
    _, trial, _ = boost(tmp_path / "run", X, y, params, 8, ["metrics"], Xv, yv)
    assert set(trial.tensor_names()) == {"train-logloss", "validation-logloss"}
    report = invoke_rule(Overfit(trial), report_path=None)
    assert report.triggered and report.violation_steps[-1] == 7
    assert "logloss" in report.to_dict()["violations"][0]["message"]


class LoglossBelow(Rule):
    """Fires once the training logloss is below ``threshold``."""

    def __init__(self, base_trial=None, threshold=0.3):
        super().__init__(base_trial)
        self.threshold = threshold

    def invoke_at_step(self, step):
        return self.view.scalar("train-logloss") < self.threshold


def test_live_stop_training_ends_xgb_train_after_the_next_round(tmp_path, data):
    X, y, _, _ = data
    params = {"objective": "binary:logistic", "max_depth": 3, "eval_metric": "logloss"}
    booster, trial, (live,) = boost(tmp_path / "run", X, y, params, 100, ["metrics"],
                                    rules=[(LoglossBelow(threshold=0.3), StopTraining())])
    trigger = live.violation_steps[0]
    assert 0 < trigger < 90
    assert booster.num_boosted_rounds() == trigger + 2  # the triggering round and the one during which it was evaluated
    assert trial.steps()[-1] == trigger + 1


def test_exploding_tensor_does_not_fire_on_the_nan_cells_of_tree_tables(tmp_path, data, capsys):
    """A healthy run saving trees: leaf rows of trees_to_dataframe have NaN Split/Yes/No/Missing."""
    from smdebug.rules import ExplodingTensor
    from smdebug.analysis.rules.cli import main as cli_main

    X, y, Xv, yv = data
    _, trial, _ = boost(tmp_path / "run", X, y, {"objective": "binary:logistic", "max_depth": 3}, 5,
                        ["trees", "metrics", "feature_importance"], Xv, yv)
    split = trial.tensor("trees/Split").value(4)
    assert np.isnan(split).any()  # the NaN is there...
    assert invoke_rule(ExplodingTensor(trial), report_path=None).triggered == 0  # ...and is no explosion
    # The CLI's default set for an XGBoost run: no gradient or activation rules.
    assert cli_main([str(tmp_path / "run"), "--no-progress"]) in (0, 1)
    out = capsys.readouterr().out
    assert out.startswith("XGBoost run, collections with saved tensors: feature_importance, losses, metrics, trees")
    assert "  skipped VanishingGradient: an XGBoost run has no gradients, weights or activations" in out
    ran = [line.split()[0] for line in out.splitlines() if not line.startswith(("  ", "XGBoost"))]
    assert ran == ["ExplodingTensor", "LossNotDecreasing", "Overfit", "Overtraining", "TreeDepth",
                   "FeatureImportanceOverweight"]
    assert "ExplodingTensor              did not fire: 5 of 5 steps evaluated" in out
