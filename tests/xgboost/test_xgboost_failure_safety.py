"""A failing hook never stops XGBoost training: one warning, and every round still runs."""
import os
import shutil

import pytest

xgb = pytest.importorskip("xgboost")
pytest.importorskip("sklearn")

import smdebug.xgboost as smd  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402



def test_out_dir_deleted_mid_training(run_dir, data, train, caplog, smdebug_warnings):
    X, y, _, _ = data
    hook = smd.Hook(run_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["average_shap", "trees"], train_data=(X, y))

    class DeleteRunDir(xgb.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log):
            if epoch == 3:
                shutil.rmtree(run_dir)
            return False

    booster = xgb.train({"objective": "binary:logistic", "nthread": 2}, xgb.DMatrix(X, y), 10,
                        evals=[(xgb.DMatrix(X, y), "train")], callbacks=[hook, DeleteRunDir()], verbose_eval=False)
    hook.close()
    assert booster.num_boosted_rounds() == 10
    assert not hook.enabled
    assert len(smdebug_warnings()) == 1, [r.getMessage() for r in smdebug_warnings()]


def test_exception_in_one_collection_skips_only_that_collection(run_dir, data, train, caplog, monkeypatch, smdebug_warnings):
    from smdebug.xgboost import _collect

    def broken(booster):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(_collect, "tree_tensors", broken)
    X, y, _, _ = data
    hook = smd.Hook(run_dir, save_config=smd.SaveConfig(save_interval=2),
                    include_collections=["average_shap", "trees"], train_data=(X, y))
    booster, _ = train(hook, rounds=7)
    hook.close()
    assert booster.num_boosted_rounds() == 7
    warnings = smdebug_warnings()
    assert len(warnings) == 1 and "trees" in warnings[0].getMessage()
    assert "injected failure" in warnings[0].getMessage()
    trial = create_trial(run_dir)
    assert trial.tensor_names(regex="^trees/") == []
    assert trial.tensor("average_shap/f0").steps() == [0, 2, 4, 6]
    assert trial.tensor("train-logloss").steps() == [0, 2, 4, 6]


def test_exception_in_the_hook_itself_disables_it(run_dir, data, train, caplog, monkeypatch, smdebug_warnings):
    from smdebug.xgboost import _collect

    def broken(evals_log):
        raise ValueError("injected metrics failure")

    hook = smd.Hook(run_dir, save_config=smd.SaveConfig(save_interval=1))
    booster, _ = train(hook, rounds=2)  # rounds 0-1 saved normally
    monkeypatch.setattr(_collect, "latest_metrics", broken)
    booster, _ = train(hook, rounds=5)
    hook.close()
    assert booster.num_boosted_rounds() == 5
    assert not hook.enabled
    warnings = smdebug_warnings()
    assert len(warnings) == 1 and "injected metrics failure" in warnings[0].getMessage()
    # What was written before the failure is intact and readable.
    assert create_trial(run_dir).tensor("train-logloss").steps() == [0, 1]


def test_unusable_shap_data_warns_once(run_dir, data, train, caplog, smdebug_warnings):
    X, y, _, _ = data
    hook = smd.Hook(run_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["full_shap"],
                    train_data=(X[:, :3], y))  # three features; the model has six
    booster, _ = train(hook, rounds=4)
    hook.close()
    assert booster.num_boosted_rounds() == 4
    assert hook.enabled
    warnings = smdebug_warnings()
    assert len(warnings) == 1 and "shap" in warnings[0].getMessage()
    assert os.path.exists(os.path.join(run_dir, "training_job_end.ts"))
