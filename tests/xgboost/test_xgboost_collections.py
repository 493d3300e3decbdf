"""Each XGBoost collection, written by the hook and read back with create_trial, equals
what xgboost's own API returns for that round."""
import json
import os

import numpy as np
import pytest

xgb = pytest.importorskip("xgboost")
pytest.importorskip("sklearn")

import smdebug.xgboost as smd  # noqa: E402
from smdebug.exceptions import ConfigError  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

ALL_COSTLY = ["hyperparameters", "predictions", "labels", "feature_importance", "average_shap", "full_shap", "trees"]


def test_xgboost_profile_regexes():
    from smdebug.collections import CollectionManager

    mgr = CollectionManager(smd.Hook.profile)
    names = lambda t: sorted(c.name for c in mgr.collections_for(t))  # noqa: E731
    assert names("train-logloss") == ["losses", "metrics"]
    assert names("valid-auc") == ["metrics"]  # an AUC is not a loss
    assert names("average_shap/f3") == ["average_shap"]
    assert names("average_shap/bias") == []
    assert names("hyperparameters/max_depth") == ["hyperparameters"]


def test_default_saves_metrics_every_10_rounds(run_dir, train):
    hook = smd.Hook(run_dir)
    _, result = train(hook, rounds=21)
    hook.close()

    trial = create_trial(run_dir)
    assert trial.steps() == [0, 10, 20]
    assert trial.tensor_names() == ["train-error", "train-logloss", "valid-error", "valid-logloss"]
    assert trial.tensor_names(collection="metrics") == trial.tensor_names()
    for dataset, metrics in result.items():
        for metric, history in metrics.items():
            tensor = trial.tensor(f"{dataset}-{metric}")
            for step in (0, 10, 20):
                assert tensor.value(step).tolist() == [history[step]]  # shape (1,), as 1.0.34 stores and reads it
    assert trial.training_ended()
    assert trial.collection("metrics").save_config.to_json_dict()["GLOBAL"]["save_interval"] == 10


def test_costly_collections_match_xgboost_at_each_saved_round(run_dir, data, train):
    X, y, Xv, yv = data
    hook = smd.Hook(run_dir, include_collections=ALL_COSTLY, train_data=(X, y), validation_data=(Xv, yv),
                    hyperparameters={"max_depth": 3, "objective": "binary:logistic"})
    booster, _ = train(hook, rounds=21)
    hook.close()
    trial = create_trial(run_dir)
    assert trial.steps() == [0, 10, 20]
    dtrain, dvalid = xgb.DMatrix(X, y), xgb.DMatrix(Xv, yv)
    features = [f"f{i}" for i in range(X.shape[1])]

    for step in (0, 10, 20):
        at_round = booster[: step + 1]  # the model as it was after round `step`

        np.testing.assert_allclose(trial.tensor("predictions").value(step), at_round.predict(dvalid), rtol=1e-6)
        assert trial.tensor("labels").value(step).tolist() == yv.tolist()

        for importance_type in ("weight", "gain", "cover", "total_gain", "total_cover"):
            scores = at_round.get_score(importance_type=importance_type)
            expected = {f: v / sum(scores.values()) for f, v in scores.items()}  # shares, as 1.0.34 saved
            saved = {name.rsplit("/", 1)[1]: trial.tensor(name).value(step).item()
                     for name in trial.tensor_names(regex=f"^feature_importance/{importance_type}/", step=step)}
            assert saved == pytest.approx(expected, rel=1e-6)

        # 1.0.34: the whole pred_contribs matrix (bias column last) under every feature's name.
        contribs = at_round.predict(dtrain, pred_contribs=True)
        for f in features:
            np.testing.assert_allclose(trial.tensor(f"full_shap/{f}").value(step), contribs, rtol=1e-5, atol=1e-6)
        # SHAP values plus the bias column add up to the margin of each row.
        full = trial.tensor("full_shap/f0").value(step)
        np.testing.assert_allclose(full.sum(axis=1), at_round.predict(dtrain, output_margin=True), atol=1e-4)
        for i, f in enumerate(features):  # the signed mean over the rows, as 1.0.34
            assert trial.tensor(f"average_shap/{f}").value(step).shape == (1,)
            np.testing.assert_allclose(trial.tensor(f"average_shap/{f}").value(step), [contribs[:, i].mean()],
                                       rtol=1e-5, atol=1e-7)

        table = at_round.trees_to_dataframe()
        assert len(trial.tensor("trees/Tree").value(step)) == len(table)
        assert trial.tensor("trees/Feature").value(step).tolist() == table["Feature"].tolist()
        np.testing.assert_array_equal(trial.tensor("trees/Gain").value(step), table["Gain"].to_numpy())

    assert trial.tensor("hyperparameters/max_depth").value(0).item() == 3.0
    assert trial.tensor("hyperparameters/objective").value(0).item() == "binary:logistic"
    # The bias entries are in no SHAP collection (the original's regexes exclude them): not saved here.
    assert not [n for n in trial.tensor_names() if n.endswith("/bias")]
    assert trial.tensor_names(collection="full_shap") == [f"full_shap/{f}" for f in features]


def test_explicit_hyperparameters(run_dir, train):
    hook = smd.Hook(run_dir, include_collections=["hyperparameters"],
                    hyperparameters={"eta": "0.1", "max_depth": 3, "objective": "binary:logistic", "flag": True})
    train(hook, rounds=2)
    hook.close()
    trial = create_trial(run_dir)
    assert trial.tensor_names(collection="hyperparameters") == [
        "hyperparameters/eta", "hyperparameters/flag", "hyperparameters/max_depth", "hyperparameters/objective"]
    assert trial.tensor("hyperparameters/eta").value(0).item() == 0.1
    assert trial.tensor("hyperparameters/flag").value(0).item() == 1.0
    assert trial.tensor("hyperparameters/objective").value(0).item() == "binary:logistic"


def test_costly_collections_computed_only_on_saved_rounds(run_dir, data, train, monkeypatch):
    from smdebug.xgboost import _collect

    calls = {"shap": [], "trees": [], "importance": [], "predictions": []}

    def counting(key, fn):
        def wrapped(*args):
            booster = args[1] if key == "predictions" else args[0]  # method: (hook, booster)
            calls[key].append(booster.num_boosted_rounds() - 1)
            return fn(*args)
        return wrapped

    monkeypatch.setattr(_collect, "shap_contributions", counting("shap", _collect.shap_contributions))
    monkeypatch.setattr(_collect, "tree_tensors", counting("trees", _collect.tree_tensors))
    monkeypatch.setattr(_collect, "feature_importance", counting("importance", _collect.feature_importance))
    monkeypatch.setattr(smd.Hook, "_validation_tensors", counting("predictions", smd.Hook._validation_tensors))
    X, y, Xv, yv = data

    # Metrics only (the default): none of the costly computations run, on any round.
    hook = smd.Hook(os.path.join(run_dir, "a"), train_data=(X, y), validation_data=(Xv, yv))
    train(hook, rounds=12)
    hook.close()
    assert calls == {"shap": [], "trees": [], "importance": [], "predictions": []}

    # Each collection on its own schedule: computed exactly on its rounds.
    hook = smd.Hook(os.path.join(run_dir, "b"), train_data=(X, y), validation_data=(Xv, yv),
                    include_collections=["average_shap", "trees", "feature_importance", "predictions"])
    hook.get_collection("average_shap").save_config = smd.SaveConfig(save_interval=5)
    hook.get_collection("trees").save_config = smd.SaveConfig(save_steps=[3], end_step=0)
    hook.get_collection("feature_importance").save_config = smd.SaveConfig(save_interval=4)
    hook.get_collection("predictions").save_config = smd.SaveConfig(save_interval=6)
    train(hook, rounds=12)
    hook.close()
    assert calls == {"shap": [0, 5, 10], "trees": [3], "importance": [0, 4, 8], "predictions": [0, 6]}
    trial = create_trial(os.path.join(run_dir, "b"))
    assert trial.tensor("average_shap/f0").steps() == [0, 5, 10]
    assert trial.tensor("trees/Node").steps() == [3]
    assert trial.tensor("predictions").steps() == [0, 6]
    assert trial.tensor("train-logloss").steps() == [0, 10]


def test_include_regex_on_one_feature_computes_shap_for_that_name(run_dir, data, train):
    X, y, _, _ = data
    hook = smd.Hook(run_dir, include_regex=["^full_shap/f2$"], train_data=(X, y),
                    save_config=smd.SaveConfig(save_interval=5))
    train(hook, rounds=6)
    hook.close()
    trial = create_trial(run_dir)
    assert trial.tensor_names(regex="shap") == ["full_shap/f2"]
    assert trial.tensor("full_shap/f2").steps() == [0, 5]


def test_multiclass_shapes(run_dir, data):
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=200, n_features=5, n_informative=3, n_redundant=0, n_classes=3, random_state=1)
    hook = smd.Hook(run_dir, include_collections=["full_shap", "average_shap", "predictions"],
                    train_data=(X, y), validation_data=(X[:50], y[:50]))
    d = xgb.DMatrix(X, y)
    booster = xgb.train({"objective": "multi:softprob", "num_class": 3, "nthread": 2, "max_depth": 2}, d, 3,
                        callbacks=[hook])
    hook.close()
    trial = create_trial(run_dir)
    contribs = booster[:1].predict(d, pred_contribs=True)  # (n, classes, features + 1) after round 0
    np.testing.assert_allclose(trial.tensor("full_shap/f1").value(0), contribs, rtol=1e-5, atol=1e-7)
    # 1.0.34 averages over rows and classes: one number per feature.
    np.testing.assert_allclose(trial.tensor("average_shap/f1").value(0), [contribs[:, :, 1].mean()],
                               rtol=1e-5, atol=1e-7)
    assert trial.tensor("predictions").value(0).shape == (50, 3)


def test_dataframe_feature_names_all_land_in_their_collections(run_dir):
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    # "mass" and "class" end in letters of the original's "[^/bias]$" regex.
    frame = pd.DataFrame(rng.normal(size=(200, 3)), columns=["mass", "class", "temperature"])
    y = (frame["mass"] + frame["temperature"] > 0).astype(int)
    hook = smd.Hook(run_dir, include_collections=["full_shap", "average_shap"],
                    train_data=(frame.to_numpy(), y.to_numpy()))  # plain arrays: names come from the model
    xgb.train({"objective": "binary:logistic", "nthread": 2}, xgb.DMatrix(frame, y), 2, callbacks=[hook])
    hook.close()
    trial = create_trial(run_dir)
    assert trial.tensor_names(collection="full_shap") == ["full_shap/class", "full_shap/mass",
                                                          "full_shap/temperature"]
    assert trial.tensor_names(collection="average_shap") == ["average_shap/class", "average_shap/mass",
                                                             "average_shap/temperature"]


def test_gblinear_has_weight_importance_and_no_trees(run_dir, train, caplog):
    hook = smd.Hook(run_dir, include_collections=["feature_importance", "trees"])
    train(hook, rounds=2, params={"booster": "gblinear", "objective": "binary:logistic", "nthread": 2})
    hook.close()
    trial = create_trial(run_dir)
    assert trial.tensor_names(regex="^trees/") == []
    assert trial.tensor_names(regex="^feature_importance/") == [f"feature_importance/weight/f{i}"
                                                                 for i in range(6)]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_sklearn_estimator_and_clone(run_dir, data):
    from sklearn.base import clone

    X, y, Xv, yv = data
    hook = smd.Hook(run_dir, include_collections=["feature_importance"], save_config=smd.SaveConfig(save_interval=4))
    clf = xgb.XGBClassifier(n_estimators=9, max_depth=3, n_jobs=2, callbacks=[hook])
    assert clone(clf).get_params()["callbacks"][0] is hook  # a hook is never duplicated
    clf.fit(X, y, eval_set=[(Xv, yv)], verbose=False)
    hook.close()
    trial = create_trial(run_dir)
    assert trial.steps() == [0, 4, 8]
    logloss = clf.evals_result()["validation_0"]["logloss"]
    assert trial.tensor("validation_0-logloss").value(8).item() == logloss[8]
    # "validation_0" has a digit the original metrics regex does not allow: listed by name.
    assert "validation_0-logloss" in trial.tensor_names(collection="metrics")
    gains = clf.get_booster().get_score(importance_type="gain")
    assert trial.tensor("feature_importance/gain/f0").value(8).item() == pytest.approx(gains["f0"] / sum(gains.values()))


def test_sklearn_eval_set_metrics_are_in_losses_as_their_regex_would_put_them(run_dir, data):
    X, y, Xv, yv = data
    hook = smd.Hook(run_dir, include_collections=["losses"], save_config=smd.SaveConfig(save_interval=4))
    clf = xgb.XGBClassifier(n_estimators=5, max_depth=2, n_jobs=2, callbacks=[hook], eval_metric=["logloss", "auc"])
    clf.fit(X, y, eval_set=[(X, y), (Xv, yv)], verbose=False)
    hook.close()
    losses = create_trial(run_dir).tensor_names(collection="losses")
    assert losses == ["validation_0-logloss", "validation_1-logloss"]  # auc is a score, not a loss


def test_json_config_with_data_overrides(tmp_path, data, train):
    X, y, Xv, yv = data
    out = tmp_path / "run"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "LocalPath": str(out),
        "HookParameters": {"save_interval": "3"},
        "CollectionConfigurations": [
            {"CollectionName": "predictions"},
            {"CollectionName": "average_shap", "CollectionParameters": {"save_steps": "1", "end_step": "0"}},
        ],
    }))
    hook = smd.Hook.create_from_json_file(str(config), train_data=(X, y), validation_data=(Xv, yv))
    assert isinstance(hook, smd.Hook)
    train(hook, rounds=7)
    hook.close()
    trial = create_trial(str(out))
    assert trial.steps() == [0, 1, 3, 6]
    assert trial.tensor("predictions").steps() == [0, 3, 6]
    assert trial.tensor("average_shap/f3").steps() == [1]
    assert trial.tensor("valid-logloss").steps() == [0, 3, 6]


def test_reused_hook_continues_steps_and_cv_saves_mean_metrics(run_dir, data, train):
    X, y, _, _ = data
    hook = smd.Hook(run_dir, save_config=smd.SaveConfig(save_interval=2))
    train(hook, rounds=3)  # rounds 0..2 -> steps 0..2
    train(hook, rounds=3)  # continues: steps 3..5
    history = xgb.cv({"objective": "binary:logistic", "nthread": 2}, xgb.DMatrix(X, y), num_boost_round=2,
                     nfold=2, callbacks=[hook])  # steps 6..7
    hook.close()
    trial = create_trial(run_dir)
    assert trial.tensor("train-logloss").steps() == [0, 2, 4, 6]
    assert trial.tensor("test-logloss").value(6).item() == pytest.approx(history["test-logloss-mean"][0])


def test_dry_run_writes_nothing_but_plans(tmp_path, data, train):
    X, y, _, _ = data
    out = tmp_path / "run"
    hook = smd.Hook(str(out), dry_run=True, include_collections=["average_shap"], train_data=(X, y))
    saved = []
    hook.add_step_listener(lambda values: saved.append((values.global_step, sorted(values.tensors))))
    train(hook, rounds=11)
    hook.close()
    assert not out.exists()
    assert [step for step, _ in saved] == [0, 10]
    assert "average_shap/f0" in saved[1][1] and "valid-logloss" in saved[1][1]


def test_stop_requested_by_a_rule_action_ends_training(run_dir, train):
    hook = smd.Hook(run_dir)

    class StopAtRound3(xgb.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log):
            if epoch == 3:
                hook.request_stop("test rule fired")
            return False

    # The hook comes after the stopping callback: it sees the request in the same round.
    X = xgb.DMatrix(np.arange(40.0).reshape(20, 2), np.arange(20) % 2)
    booster = xgb.train({"objective": "binary:logistic", "nthread": 2}, X, 20, callbacks=[StopAtRound3(), hook])
    hook.close()
    assert booster.num_boosted_rounds() == 4


@pytest.mark.parametrize("kwargs, message", [
    ({"validation_data": np.zeros((3, 2))}, "labels are needed"),
    ({"validation_data": ("x.csv",)}, "tuple of 1"),
    ({"train_data": "train.libsvm"}, "load the file into a DMatrix"),
    ({"hyperparameters": ["eta"]}, "hyperparameters must be a dict"),
])
def test_bad_arguments_fail_fast(run_dir, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        smd.Hook(run_dir, **kwargs)
    assert not os.path.exists(run_dir)


def test_module_exports():
    for name in ("Hook", "SaveConfig", "SaveConfigMode", "ReductionConfig", "Collection", "CollectionKeys",
                 "modes", "ModeKeys", "get_hook", "create_trial"):
        assert hasattr(smd, name), name
    assert issubclass(smd.Hook, xgb.callback.TrainingCallback)
    assert smd.modes.TRAIN is smd.ModeKeys.TRAIN


def test_pickled_estimator_carries_an_inert_stand_in(run_dir, data, caplog):
    import pickle

    X, y, _, _ = data
    hook = smd.Hook(run_dir)
    clf = xgb.XGBClassifier(n_estimators=2, n_jobs=2, callbacks=[hook]).fit(X, y)
    restored = pickle.loads(pickle.dumps(clf))
    hook.close()
    np.testing.assert_array_equal(restored.predict(X), clf.predict(X))
    stand_in = restored.get_params()["callbacks"][0]
    assert not isinstance(stand_in, smd.Hook) and stand_in.out_dir == hook.out_dir
    restored.fit(X, y)  # trains, records nothing, says so once
    restored.fit(X, y)
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("smdebug")]
    assert len(messages) == 1 and "unpickled" in messages[0]
