"""smdebug compare on two real XGBoost runs that differ from a known boosting round."""
import pytest

xgb = pytest.importorskip("xgboost")
pytest.importorskip("sklearn")
pytest.importorskip("pandas")

import smdebug.xgboost as smd  # noqa: E402
from smdebug.analysis import compare  # noqa: E402
from smdebug.analysis.cli import main  # noqa: E402

from conftest import PARAMS  # noqa: E402

CHANGED_ROUND = 6


def booster_run(out_dir, data, slower_from=None):
    """10 rounds saved every round; returns xgboost's own evaluation log."""
    hook = smd.Hook(out_dir, include_collections=["metrics", "hyperparameters", "feature_importance"],
                    save_config=smd.SaveConfig(save_interval=1))
    callbacks = [hook]
    if slower_from is not None:
        # A smaller learning rate from round slower_from on: xgboost's scheduler sets the
        # rate after each round, for the next.
        callbacks.append(xgb.callback.LearningRateScheduler(lambda r: 0.3 if r + 1 < slower_from else 0.1))
    X, y, Xv, yv = data
    log = {}
    xgb.train(PARAMS, xgb.DMatrix(X, y), 10, evals=[(xgb.DMatrix(X, y), "train"), (xgb.DMatrix(Xv, yv), "valid")],
              callbacks=callbacks, verbose_eval=False, evals_result=log)
    hook.close()
    return log


def test_xgboost_runs_diverge_at_the_changed_round(tmp_path, data, capsys):
    ref, same, slower = (str(tmp_path / name) for name in ("ref", "same", "slower"))
    ref_log = booster_run(ref, data)
    booster_run(same, data)
    slower_log = booster_run(slower, data, slower_from=CHANGED_ROUND)
    # xgboost's own log: the rounds before agree exactly, that round does not.
    changed = [r for r in range(10) if ref_log["train"]["logloss"][r] != slower_log["train"]["logloss"][r]]
    assert changed[0] == CHANGED_ROUND

    assert main(["compare", ref, same, "--diverge", "--rtol", "0", "--atol", "0"]) == 0
    result = compare([ref, slower])
    div = result.divergence
    # Each round writes its metrics first (train before valid), then the feature importances.
    assert (div.step, div.mode, div.tensor) == (CHANGED_ROUND, "GLOBAL", "train-logloss")
    assert div.values == {"ref": pytest.approx(ref_log["train"]["logloss"][CHANGED_ROUND]),
                          "slower": pytest.approx(slower_log["train"]["logloss"][CHANGED_ROUND])}
    assert not result.frame[result.frame.step < CHANGED_ROUND]["differs"].any()
    capsys.readouterr()
    assert main(["compare", ref, slower, "--diverge"]) == 1
    out, _ = capsys.readouterr()
    assert out.startswith(f"first divergence: step {CHANGED_ROUND}, tensor train-logloss [GLOBAL step")
