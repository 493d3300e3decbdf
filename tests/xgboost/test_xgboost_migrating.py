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


def test_full_shap_holds_one_column_per_feature(run_dir, data, train):
    """1.0.34 stored the whole (samples, features + 1) contribution matrix under every
    ``full_shap/<feature>`` name; here each name holds its own feature's column
    (docs/migrating.md), and stacking them rebuilds the matrix without its bias column."""
    X, y, _, _ = data
    hook = smd.Hook(run_dir, include_collections=["full_shap"], train_data=(X, y))
    booster, _ = train(hook, rounds=1)
    hook.close()
    trial = create_trial(run_dir)
    contribs = booster.predict(xgb.DMatrix(X, y), pred_contribs=True)  # what 1.0.34 saved, bias last
    features = [f"f{i}" for i in range(X.shape[1])]
    assert trial.tensor_names(collection="full_shap") == sorted(f"full_shap/{f}" for f in features)
    for i, feature in enumerate(features):
        column = trial.tensor(f"full_shap/{feature}").value(0)
        assert column.shape == (X.shape[0],)
        np.testing.assert_allclose(column, contribs[:, i], rtol=1e-6)
    matrix = np.stack([trial.tensor(f"full_shap/{f}").value(0) for f in features], axis=-1)
    np.testing.assert_allclose(matrix, contribs[:, :-1], rtol=1e-6)


def test_del_hook(run_dir):
    hook = smd.Hook(run_dir)
    assert smd.get_hook() is hook
    smd.del_hook()
    assert smd.get_hook() is None
    hook.close()
