"""XGBoost scripts written against smdebug 1.0.34 run unchanged (docs/migrating.md)."""
import json
import os

import numpy as np
import pytest

xgb = pytest.importorskip("xgboost")
pytest.importorskip("sklearn")

import smdebug.xgboost as smd  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402


def collections_file(run_dir):
    folder = os.path.join(run_dir, "collections", "000000000")
    (name,) = os.listdir(folder)
    with open(os.path.join(folder, name)) as fh:
        return json.load(fh)["collections"]


def test_collections_file_lists_the_tensors_each_collection_saved(tmp_path, train):
    metrics = ["train-error", "train-logloss", "valid-error", "valid-logloss"]
    hook = smd.Hook(str(tmp_path / "run"), include_collections=["metrics", "losses"])
    train(hook, rounds=11)
    hook.close()
    colls = collections_file(str(tmp_path / "run"))
    assert colls["metrics"]["tensor_names"] == metrics
    assert colls["losses"]["tensor_names"] == metrics  # logloss and error are losses (not auc/map)
    trial = create_trial(str(tmp_path / "run"))
    assert trial.collection("losses").tensor_names == set(metrics)  # what 1.0.34's readers use

    # "all" matches every name only under save_all (as in 1.0.34); then it lists them too.
    hook = smd.Hook(str(tmp_path / "all"), save_all=True)
    train(hook, rounds=1)
    hook.close()
    listed = collections_file(str(tmp_path / "all"))["all"]["tensor_names"]
    assert set(metrics) <= set(listed)
    assert set(create_trial(str(tmp_path / "all")).tensor_names()) <= set(listed)


def test_shap_and_importance_tensors_are_1034s(run_dir, data, train):
    """AWS's census notebook reads ``trial.tensor("full_shap/f0").value(step)[:, :-1]``: every
    ``full_shap/<feature>`` name holds the whole (samples, features + 1) contribution matrix,
    bias column last; ``average_shap/<f>`` is the signed mean of its column, shape (1,);
    feature importances are shares of their type's total. The bias entries are saved under
    save_all only (1.0.34's regexes leave them out of the SHAP collections)."""
    X, y, _, _ = data
    hook = smd.Hook(run_dir, save_all=True, include_collections=["average_abs_shap"], train_data=(X, y),
                    hyperparameters={"max_depth": 3})
    booster, _ = train(hook, rounds=1)
    hook.close()
    trial = create_trial(run_dir)
    contribs = booster.predict(xgb.DMatrix(X, y), pred_contribs=True)
    features = [f"f{i}" for i in range(X.shape[1])]
    assert trial.tensor_names(collection="full_shap") == sorted(f"full_shap/{f}" for f in features)
    for name in [f"full_shap/{f}" for f in features] + ["full_shap/bias"]:
        np.testing.assert_allclose(trial.tensor(name).value(0), contribs, rtol=1e-6)
    without_bias = trial.tensor("full_shap/f0").value(0)[:, :-1]
    assert without_bias.shape == (X.shape[0], X.shape[1])
    for i, name in enumerate([f"average_shap/{f}" for f in features] + ["average_shap/bias"]):
        value = trial.tensor(name).value(0)
        assert value.shape == (1,)
        np.testing.assert_allclose(value[0], contribs[:, i].mean(), rtol=1e-5, atol=1e-7)
    for i, f in enumerate(features):  # ours, asked for by name: the mean |SHAP| of each feature
        np.testing.assert_allclose(trial.tensor(f"average_abs_shap/{f}").value(0), [np.abs(contribs[:, i]).mean()],
                                   rtol=1e-5)
    gains = [trial.tensor(n).value(0)[0] for n in trial.tensor_names(regex="^feature_importance/gain/")]
    assert sum(gains) == pytest.approx(1.0)
    # hyperparameters: those given, and only those (1.0.34 saved none without them).
    assert trial.tensor_names(collection="hyperparameters") == ["hyperparameters/max_depth"]


def test_without_hyperparameters_none_are_saved_and_one_line_says_why(run_dir, train, caplog):
    hook = smd.Hook(run_dir, include_collections=["hyperparameters"])
    with caplog.at_level("INFO", logger="smdebug"):
        train(hook, rounds=1)
    hook.close()
    assert create_trial(run_dir).tensor_names(regex="^hyperparameters/") == []
    said = [r.getMessage() for r in caplog.records if "hyperparameters" in r.getMessage()]
    assert len(said) == 1 and "hyperparameters={" in said[0], said


def test_del_hook(run_dir):
    hook = smd.Hook(run_dir)
    assert smd.get_hook() is hook
    smd.del_hook()
    assert smd.get_hook() is None
    hook.close()


def _tiny_problem():
    """1.0.34's test_hook_save_all data: 5 rows, 10 features, of which the trees use few."""
    rng = np.random.default_rng(42)
    dtrain = xgb.DMatrix(rng.random((5, 10)), label=rng.integers(2, size=5))
    dtest = xgb.DMatrix(rng.random((5, 10)), label=rng.integers(2, size=5))
    return dtrain, dtest


def test_save_all_lists_in_all_exactly_the_saved_tensors(tmp_path):
    # test_hook_save_all: len(collections["all"].tensor_names) == len(trial.tensor_names()).
    dtrain, dtest = _tiny_problem()
    hook = smd.Hook(str(tmp_path / "run"), save_config=smd.SaveConfig(save_steps=[0, 1, 2, 3]), save_all=True)
    xgb.train({}, dtrain, evals=[(dtrain, "train"), (dtest, "test")], num_boost_round=10, callbacks=[hook])
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    tensors = trial.tensor_names()
    assert len(trial.steps()) == 4
    assert sorted(trial.collections()["all"].tensor_names) == tensors
    assert {"train-rmse", "test-rmse"} <= set(tensors)
    assert any(t.startswith("feature_importance/") for t in tensors) and any(t.startswith("trees/") for t in tensors)


def test_average_abs_shap_is_saved_only_when_its_collection_is_included(tmp_path):
    # Not a 1.0.34 collection: save_all saves what 1.0.34 saved; naming it adds it.
    dtrain, dtest = _tiny_problem()
    for run, extra in (("all", []), ("asked", ["average_abs_shap"])):
        hook = smd.Hook(str(tmp_path / run), save_config=smd.SaveConfig(save_steps=[0]), save_all=True,
                        include_collections=extra or None, train_data=dtrain)
        xgb.train({}, dtrain, evals=[(dtrain, "train")], num_boost_round=2, callbacks=[hook])
        hook.close()
    plain, asked = create_trial(str(tmp_path / "all")), create_trial(str(tmp_path / "asked"))
    assert "full_shap/f0" in plain.tensor_names() and "average_shap/f0" in plain.tensor_names()
    assert not plain.tensor_names(regex="^average_abs_shap/")
    assert not [n for n in plain.collections()["all"].tensor_names if n.startswith("average_abs_shap/")]
    assert len(asked.tensor_names(collection="average_abs_shap")) == 10
