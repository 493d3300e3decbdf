"""Trial.to_dataframe on a real XGBoost run: every row equals value(), metrics are 0-d."""
import os
import sys

import pytest

pytest.importorskip("xgboost")
pytest.importorskip("sklearn")
pytest.importorskip("pandas")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "analysis"))
from check_rows import assert_rows_equal_value_api

import smdebug.xgboost as smd
from smdebug.trials import create_trial


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_xgboost_run_dataframe_matches_value_api(run_dir, train):
    hook = smd.Hook(run_dir, include_collections=["metrics", "hyperparameters", "feature_importance"],
                    save_config=smd.SaveConfig(save_interval=5),
                    hyperparameters={"max_depth": 3, "eta": 0.3, "objective": "binary:logistic"})
    booster, result = train(hook, rounds=21)
    hook.close()

    trial = create_trial(run_dir)
    df = trial.to_dataframe()
    # Numbers are decoded in bulk; only text hyperparameters (objective...) one by one.
    texts = [n for n in trial.tensor_names(collection="hyperparameters") if trial.tensor(n).value(0).dtype.kind == "U"]
    assert trial.stats["table_records_bulk"] == len(df)
    assert trial.stats["table_records_one_by_one"] == len(texts) * len(trial.tensor(texts[0]).steps())
    tensors = set(df["tensor"])
    assert {"train-logloss", "valid-logloss", "valid-error"} <= tensors
    assert any(t.startswith("hyperparameters/") for t in tensors)
    # The metric at each saved round is the one xgboost reported.
    valid = trial.tensor("valid-logloss").to_series()
    assert valid.index.tolist() == [0, 5, 10, 15, 20]
    for step, value in valid.items():
        assert value == pytest.approx(result["valid"]["logloss"][step])
    # Metrics are stored as (1,) vectors and come back so, as in 1.0.34.
    assert trial.tensor("valid-logloss").value(5).shape == (1,)
    assert assert_rows_equal_value_api(trial, df) == len(df)
