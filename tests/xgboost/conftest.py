"""Shared data and helpers for the XGBoost adapter tests (small, so the folder runs in seconds).

xgboost and scikit-learn are imported inside the fixtures: each test module skips itself
with ``pytest.importorskip`` when they are missing.
"""
import pytest

PARAMS = {"objective": "binary:logistic", "max_depth": 3, "nthread": 2, "eval_metric": ["logloss", "error"]}


@pytest.fixture(scope="session")
def data():
    """(X_train, y_train, X_valid, y_valid): a 6-feature binary problem."""
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=400, n_features=6, n_informative=4, random_state=0)
    return X[:300], y[:300], X[300:], y[300:]


@pytest.fixture
def run_dir(tmp_path):
    return str(tmp_path / "run")


@pytest.fixture
def train(data):
    """``train(hook, rounds=21, params=None, **xgb_train_kwargs) -> (booster, evals_result)``."""
    import xgboost as xgb

    X, y, Xv, yv = data

    def run(hook, rounds=21, params=None, **kwargs):
        dtrain, dvalid = xgb.DMatrix(X, y), xgb.DMatrix(Xv, yv)
        result = {}
        booster = xgb.train(params or PARAMS, dtrain, rounds, evals=[(dtrain, "train"), (dvalid, "valid")],
                            callbacks=[hook] if hook is not None else None, verbose_eval=False,
                            evals_result=result, **kwargs)
        return booster, result

    return run
