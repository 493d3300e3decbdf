"""MLflow fed by the hook, on a local SQLite tracking store, read back with MlflowClient."""
import socket
import threading
import time

import numpy as np
import pytest

import smdebug as smd

from tracker_helpers import LAYERS, make_hook, train

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402


def history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_active_run_gets_scalars_and_capped_statistics(tmp_path, mlflow_uri):
    with mlflow.start_run() as run:
        hook = make_hook(tmp_path)
        sink = smd.sinks.MlflowSink(max_series=10, cost_budget=None)
        hook.add_sink(sink)
        losses, weights = train(hook)
        hook.close()
    client = MlflowClient()
    run_id = run.info.run_id
    # scalars keep their names and global steps; EVAL ones get their own series
    assert history(client, run_id, "scalar/loss") == sorted(losses.items())
    assert [v for _, v in history(client, run_id, "scalar/loss_EVAL")] == [2.0, 2.0]
    # per-layer statistics under smdebug/reductions/<stat>/<tensor>, up to the cap (10 of 15)
    keys = set(client.get_run(run_id).data.metrics)
    layer_keys = {k for k in keys if k.startswith("smdebug/reductions/")}
    assert len(layer_keys) == 10
    mean = history(client, run_id, "smdebug/reductions/mean/layer0.weight")
    assert [s for s, _ in mean] == sorted(losses)
    assert mean[-1][1] == pytest.approx(weights[0].mean())
    counts = sink.counts
    assert counts["dropped_series"] == 3 * LAYERS - 10
    assert counts["dropped"] == (3 * LAYERS - 10) * len(losses)
    assert counts["sent"] == 10 * len(losses) + len(losses) + 2
    assert counts["failed_calls"] == 0


def test_no_active_run_makes_one_in_the_experiment_named_by_mlflow(tmp_path, mlflow_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "smdebug-exp")
    hook = make_hook(tmp_path)
    sink = smd.sinks.MlflowSink(cost_budget=None)
    hook.add_sink(sink)
    losses, _ = train(hook, eval_every=0)
    hook.close()
    client = MlflowClient()
    exp = client.get_experiment_by_name("smdebug-exp")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED"
    assert history(client, run.info.run_id, "scalar/loss") == sorted(losses.items())
    assert len([k for k in run.data.metrics if k.startswith("smdebug/")]) == 3 * LAYERS


def test_log_batch_takes_at_most_1000_metrics(tmp_path, mlflow_uri):
    """1,300 scalars in one step: two log_batch calls, every point read back."""
    with mlflow.start_run() as run:
        hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1))
        sink = smd.sinks.MlflowSink(cost_budget=None)
        hook.add_sink(sink)
        hook.begin_step()
        for i in range(1300):
            hook.save_scalar(f"s{i}", float(i))
        hook.close()
    assert sink.counts["sent"] == 1300 and sink.counts["dropped"] == 0
    metrics = MlflowClient().get_run(run.info.run_id).data.metrics
    assert len(metrics) == 1300 and metrics["scalar/s1299"] == 1299.0


@pytest.fixture
def silent_server():
    """An HTTP port that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(2)
    for conn in held:
        conn.close()
    server.close()


def test_a_server_that_never_answers_does_not_stall_training(tmp_path, monkeypatch, silent_server, caplog):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", silent_server)
    hook = make_hook(tmp_path)
    baseline = make_hook(tmp_path, "baseline")
    t0 = time.perf_counter()
    train(baseline, steps=200, eval_every=0)
    baseline.close()
    alone = time.perf_counter() - t0
    sink = smd.sinks.MlflowSink(max_queue=16, close_timeout=1.0)
    hook.add_sink(sink)
    with caplog.at_level("WARNING"):
        t0 = time.perf_counter()
        train(hook, steps=200, eval_every=0)
        trained = time.perf_counter() - t0
        t0 = time.perf_counter()
        hook.close()
        closed = time.perf_counter() - t0
    assert trained < 2 * alone + 1.0, (trained, alone)
    assert closed < 3.0
    counts = sink.counts
    assert counts["sent"] == 0
    assert counts["dropped"] == 200 * (1 + 3 * LAYERS)  # every point, counted
    assert caplog.text.count("values not sent to MLflow") == 1
    # the run's own files are complete
    trial = smd.create_trial(str(tmp_path / "run"))
    assert len(trial.steps()) == 200


def test_export_a_finished_run_to_mlflow(tmp_path, mlflow_uri):
    from smdebug.analysis.cli import main

    hook = make_hook(tmp_path)
    losses, weights = train(hook, steps=30, eval_every=0)
    hook.close()
    assert main(["export", str(tmp_path / "run"), "--to", "mlflow", "--max-points", "10"]) == 0
    client = MlflowClient()
    (run,) = client.search_runs(["0"])
    loss = dict(history(client, run.info.run_id, "scalar/loss"))
    assert len(loss) <= 10
    # 5 bins of 6 steps: each keeps its minimum and its maximum (the loss falls: the bin's ends)
    for lo in range(0, 30, 6):
        assert lo in loss and lo + 5 in loss
    l2 = dict(history(client, run.info.run_id, "smdebug/reductions/l2/layer0.weight"))
    assert l2[29] == pytest.approx(np.sqrt((weights[0] ** 2).sum()))
    assert len([k for k in run.data.metrics if k.startswith("smdebug/reductions/")]) == 3 * LAYERS
