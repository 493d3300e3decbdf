"""W&B fed by the hook, in offline mode, the run read back from its own .wandb file."""
import json
import os

import numpy as np
import pytest

import smdebug as smd

from tracker_helpers import LAYERS, make_hook, train
from wandb_reader import history

wandb = pytest.importorskip("wandb")


@pytest.fixture
def wandb_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_PROJECT", "smdebug-tests")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()  # wandb's process-wide settings (WANDB_DIR) are read again
    yield str(tmp_path)
    wandb.teardown()


def rows_with(rows, key):
    return [r for r in rows if key in r]


def test_active_run_gets_scalars_and_one_table_per_statistic_and_step(tmp_path, wandb_dir):
    run = wandb.init()
    hook = make_hook(tmp_path)
    sink = smd.sinks.WandbSink(grouped="table", cost_budget=None)  # every step, whatever it costs
    hook.add_sink(sink)
    losses, weights = train(hook)
    hook.close()
    run.finish()
    rows, run_dir = history(wandb_dir)
    loss = {r["smdebug/step"]: r["scalar/loss"] for r in rows_with(rows, "scalar/loss")}
    assert loss == losses  # names and global steps kept
    assert [r["scalar/loss_EVAL"] for r in rows_with(rows, "scalar/loss_EVAL")] == [2.0, 2.0]
    # no per-layer series: one table per statistic and step
    assert not any(k.startswith("smdebug/reductions/mean/layer") for r in rows for k in r)
    tables = rows_with(rows, "smdebug/reductions/mean/path")
    assert sorted(r["smdebug/step"] for r in tables) == sorted(losses)
    with open(os.path.join(run_dir, "files", tables[-1]["smdebug/reductions/mean/path"])) as fh:
        table = json.load(fh)
    assert table["columns"] == ["tensor", "value"]
    got = dict(map(tuple, table["data"]))
    assert set(got) == {f"layer{i}.weight" for i in range(LAYERS)}
    assert got["layer0.weight"] == pytest.approx(weights[0].mean())
    assert sink.counts["dropped"] == 0 and sink.counts["sent"] == len(losses) * (1 + 3 * LAYERS) + 2


def test_histograms_and_a_run_of_its_own(tmp_path, wandb_dir):
    """No active run: the sink starts one (wandb.init with W&B's own settings) and finishes it."""
    hook = make_hook(tmp_path)
    hook.add_sink(smd.sinks.WandbSink(cost_budget=None))  # histograms by default
    losses, _ = train(hook, eval_every=0)
    hook.close()
    assert wandb.run is None  # finished by the sink
    rows, _ = history(wandb_dir)
    hists = rows_with(rows, "smdebug/reductions/l2/_type")
    assert len(hists) == len(losses) and hists[0]["smdebug/reductions/l2/_type"] == "histogram"
    assert sum(hists[0]["smdebug/reductions/l2/values"]) == LAYERS


def test_missing_package_names_the_extra(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb" or name.startswith("wandb."):
            raise ImportError("No module named 'wandb'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ImportError, match=r"smdebug-core\[wandb\]"):
        smd.sinks.WandbSink()


def test_export_a_finished_run_keeps_each_bins_extremes(tmp_path, wandb_dir):
    from smdebug.analysis.cli import main

    hook = make_hook(tmp_path)
    rng = np.random.default_rng(3)
    values = rng.standard_normal(100)
    values[37] = 50.0  # a spike the downsampling must keep
    for step, v in enumerate(values):
        hook.begin_step()
        hook.record("layer0.weight", np.full(3, v))
        hook.save_scalar("loss", float(v))
    hook.close()
    assert main(["export", str(tmp_path / "run"), "--to", "wandb", "--max-points", "20"]) == 0
    rows, _ = history(wandb_dir)
    loss = {r["smdebug/step"]: r["scalar/loss"] for r in rows_with(rows, "scalar/loss")}
    assert len(loss) <= 20 and loss[37] == 50.0
    for lo in range(0, 100, 10):  # 10 bins of 10 steps: each keeps its minimum and maximum
        part = values[lo:lo + 10]
        assert loss[lo + int(np.argmin(part))] == part.min() and loss[lo + int(np.argmax(part))] == part.max()
    assert 37 in {r["smdebug/step"] for r in rows_with(rows, "smdebug/reductions/max/_type")}


def test_over_its_cost_budget_the_sink_sends_each_bins_extremes_and_the_spike(tmp_path, wandb_dir):
    """Steps far shorter than a W&B row: the sink sends, of each bin of steps, those where the
    loss is at its minimum or maximum (real steps and values) and every layer's most extreme
    statistic of the bin, so a one-step spike of the loss and of a layer both reach W&B."""
    run = wandb.init()
    hook = make_hook(tmp_path)
    sink = smd.sinks.WandbSink(cost_budget=0.001)
    hook.add_sink(sink)
    rng = np.random.default_rng(5)
    losses = {}
    for step in range(200):
        hook.begin_step()
        for i in range(LAYERS):
            w = rng.standard_normal(6)
            if step == 123 and i == 2:
                w[0] = 1000.0
            hook.record(f"layer{i}.weight", w)
        losses[step] = 50.0 if step == 77 else 1.0 / (step + 1)
        hook.save_scalar("loss", losses[step])
    hook.close()
    run.finish()
    rows, _ = history(wandb_dir)
    sent = {r["smdebug/step"]: r["scalar/loss"] for r in rows_with(rows, "scalar/loss")}
    assert len(sent) < 200 and sink.counts["folded"] > 0 and sink.counts["every"] > 1
    assert all(losses[step] == value for step, value in sent.items())  # real steps, real values
    assert sent[77] == 50.0 and 199 in sent
    maxima = rows_with(rows, "smdebug/reductions/max/_type")
    assert 0 < len(maxima) < 200
    assert max(r["smdebug/reductions/max/bins"][-1] for r in maxima) == 1000.0
    assert sink.counts["dropped"] == 0


def test_a_cost_budget_outside_0_1_fails_at_construction(wandb_dir):
    with pytest.raises(ValueError, match=r"cost_budget must be a number in \(0, 1\).*got 5"):
        smd.sinks.WandbSink(cost_budget=5)
