"""The trackers env (tox -e trackers): W&B offline and MLflow on a SQLite store, both real."""
import pytest


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri
