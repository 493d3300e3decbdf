"""Zero-code-change: an unmodified training script gets the JSON-configured hook attached."""
import json
import os
import subprocess
import sys

import pytest

xgb = pytest.importorskip("xgboost")
pytest.importorskip("sklearn")

import smdebug.xgboost as smd  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402
from smdebug.xgboost import _instrument  # noqa: E402

# A user's script: nothing in it mentions smdebug.
TRAINING = """
import xgboost as xgb
from sklearn.datasets import make_regression
X, y = make_regression(n_samples=200, n_features=4, random_state=0)
dtrain, dvalid = xgb.DMatrix(X[:150], y[:150]), xgb.DMatrix(X[150:], y[150:])
xgb.train({"nthread": 2, "max_depth": 2}, dtrain, 6, evals=[(dtrain, "train"), (dvalid, "valid")], verbose_eval=False)
model = xgb.XGBRegressor(n_estimators=5, max_depth=2, n_jobs=2)
model.fit(X[:150], y[:150], eval_set=[(X[150:], y[150:])], verbose=False)
print("trained", model.get_booster().num_boosted_rounds())
"""


def write_config(tmp_path, **hook_parameters):
    out = tmp_path / "run"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "LocalPath": str(out),
        "HookParameters": {"save_interval": "2", **hook_parameters},
        "CollectionConfigurations": [{"CollectionName": "predictions"}, {"CollectionName": "average_shap"}],
    }))
    return str(config), str(out)


def run_script(tmp_path, prelude, env_overrides):
    script = tmp_path / "train.py"
    script.write_text(prelude + TRAINING)
    env = {k: v for k, v in os.environ.items() if k not in ("SMDEBUG_CONFIG_FILE_PATH", "USE_SMDEBUG")}
    env.update(env_overrides)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "trained 5" in done.stdout
    return done


INSTRUMENT = "from smdebug.xgboost._instrument import instrument\ninstrument()\n"


def test_instrument_attaches_the_configured_hook(tmp_path):
    config, out = write_config(tmp_path)
    run_script(tmp_path, INSTRUMENT, {"SMDEBUG_CONFIG_FILE_PATH": config})

    trial = create_trial(out)
    assert trial.training_ended()
    # xgb.train: rounds 0-5 are steps 0-5; the estimator's 5 rounds continue as steps 6-10.
    assert trial.tensor("train-rmse").steps() == [0, 2, 4]
    assert trial.tensor("validation_0-rmse").steps() == [6, 8, 10]
    # Data taken from the calls: predictions on the evaluation set, SHAP on the training set.
    assert trial.tensor("predictions").value(4).shape == (50,)
    assert trial.tensor("average_shap/f0").steps() == [0, 2, 4, 6, 8, 10]


def test_use_smdebug_0_turns_it_off(tmp_path):
    config, out = write_config(tmp_path)
    run_script(tmp_path, INSTRUMENT, {"SMDEBUG_CONFIG_FILE_PATH": config, "USE_SMDEBUG": "0"})
    assert not os.path.exists(out)


def test_no_config_means_no_hook(tmp_path):
    if os.path.exists("/opt/ml/input/config/debughookconfig.json"):
        pytest.skip("a SageMaker hook config exists on this machine")
    run_script(tmp_path, INSTRUMENT, {})
    assert os.listdir(tmp_path) == ["train.py"]


def test_bootstrap_instruments_xgboost_on_import(tmp_path):
    pytest.importorskip("smdebug.capture.zero_code_change")
    config, out = write_config(tmp_path)
    # The bootstrap starts from a sitecustomize, as a launcher would set it up: the training
    # script itself is untouched.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import smdebug.capture.zero_code_change\n")
    env = {"SMDEBUG_CONFIG_FILE_PATH": config, "PYTHONPATH": str(site)}
    run_script(tmp_path, "", env)
    assert create_trial(out).tensor("train-rmse").steps() == [0, 2, 4]

    # USE_SMDEBUG=0 turns the bootstrap off.
    (tmp_path / "off").mkdir()
    config_off, out_off = write_config(tmp_path / "off")
    run_script(tmp_path, "", {**env, "SMDEBUG_CONFIG_FILE_PATH": config_off, "USE_SMDEBUG": "0"})
    assert not os.path.exists(out_off)


@pytest.fixture
def instrumented():
    _instrument.instrument()
    try:
        yield
    finally:
        _instrument.uninstrument()


def test_uninstrument_restores_the_originals():
    import xgboost.sklearn
    import xgboost.training

    originals = (xgb.train, xgboost.training.train, xgboost.sklearn.train)
    _instrument.instrument()
    _instrument.instrument()  # idempotent
    try:
        assert xgb.train is not originals[0] and xgb.train._smdebug_original is originals[0]
        assert xgboost.sklearn.train is xgb.train
    finally:
        _instrument.uninstrument()
    assert (xgb.train, xgboost.training.train, xgboost.sklearn.train) == originals
    assert not _instrument.is_instrumented()


def test_a_hook_already_in_callbacks_is_not_added_twice(instrumented, run_dir, train):
    hook = smd.Hook(run_dir, save_config=smd.SaveConfig(save_interval=1))
    seen = []
    original = hook.after_iteration
    hook.after_iteration = lambda model, epoch, log: seen.append(epoch) or original(model, epoch, log)
    train(hook, rounds=3)
    hook.close()
    assert seen == [0, 1, 2]
    assert create_trial(run_dir).steps() == [0, 1, 2]


def test_example_script_runs(tmp_path):
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "xgboost", "train_classifier.py")
    out = tmp_path / "example_run"
    done = subprocess.run([sys.executable, example, "--out-dir", str(out), "--rounds", "10", "--interval", "5"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "saved steps: [0, 5]" in done.stdout
    assert "top features at round 5" in done.stdout
    assert create_trial(str(out)).tensor("valid-auc").steps() == [0, 5]


def test_a_broken_config_warns_once_and_training_runs_uncaptured(instrumented, tmp_path, monkeypatch, train,
                                                                  caplog):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"LocalPath": str(tmp_path / "run"), "HookParameters": {"save_interval": "often"}}))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(config))
    with caplog.at_level("WARNING", logger="smdebug"):
        train(None, rounds=2)
        train(None, rounds=2)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "save_interval" in warnings[0] and str(config) in warnings[0], warnings
    assert not (tmp_path / "run").exists()


def test_attached_hook_keeps_user_data_and_adopts_the_rest(instrumented, run_dir, data):
    X, y, Xv, yv = data
    # Made by hand but not passed to xgb.train: get_hook() returns it and the wrapper attaches it.
    hook = smd.Hook(run_dir, include_collections=["predictions", "full_shap"],
                    save_config=smd.SaveConfig(save_interval=2), validation_data=(Xv[:7], yv[:7]))
    for rows in (100, 120):  # a second call replaces the adopted training data, not the user's
        dtrain = xgb.DMatrix(X[:rows], y[:rows])
        xgb.train({"objective": "binary:logistic", "nthread": 2}, dtrain, 2,
                  evals=[(dtrain, "train"), (xgb.DMatrix(Xv, yv), "valid")], verbose_eval=False)
    hook.close()
    trial = create_trial(run_dir)
    assert trial.tensor("predictions").steps() == [0, 2]
    assert [trial.tensor("predictions").value(s).shape for s in (0, 2)] == [(7,), (7,)]
    features = X.shape[1] + 1  # and the bias column
    assert [trial.tensor("full_shap/f0").value(s).shape for s in (0, 2)] == [(100, features), (120, features)]
