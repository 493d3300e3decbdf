"""Trial.to_dataframe on a real PyTorch run: every row equals value()/reduction_value()."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pandas")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "analysis"))
from check_rows import assert_rows_equal_value_api  # noqa: E402
from pt_helpers import batches, evaluate, make_model, train  # noqa: E402

import smdebug.pytorch as smd  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402


def test_pytorch_run_dataframe_matches_value_api(run_dir):
    model = make_model()
    loss_fn = torch.nn.CrossEntropyLoss()
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=2),
                    include_collections=["weights", "gradients", "losses"],
                    reduction_config=smd.ReductionConfig(reductions=["mean", "max"], norms=["l2"]))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    train(model, loss_fn, batches(8))
    hook.set_mode(smd.modes.EVAL)
    evaluate(model, loss_fn, batches(4, seed=1))
    hook.close()

    trial = create_trial(run_dir)
    df = trial.to_dataframe()
    assert trial.stats.get("table_records_one_by_one", 0) == 0  # 1.0.34 layout: all decoded by the bulk walk
    assert set(df["mode"]) == {"TRAIN", "EVAL"}
    assert {"mean", "max", "l2"} <= set(df["reduction"])
    losses = df[df.reduction == ""]
    assert len(losses) and all("loss" in t.lower() for t in set(losses["tensor"]))
    assert any(t.startswith("gradient/") for t in set(df["tensor"]))
    # Scalars of PyTorch runs are 0-d.
    name = losses["tensor"].iloc[0]
    assert trial.tensor(name).value(int(losses["step"].iloc[0])).shape == ()
    assert assert_rows_equal_value_api(trial, df) == len(df)


def test_pytorch_tensorboard_reductions_and_short_histogram_tags(run_dir):
    pytest.importorskip("tensorboard")
    from check_rows import read_tensorboard

    model = make_model()
    loss_fn = torch.nn.CrossEntropyLoss()
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=1), export_tensorboard=True,
                    include_collections=["weights", "gradients", "losses"],
                    reduction_config=smd.ReductionConfig(norms=["l2"], save_raw_tensor=True))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    train(model, loss_fn, batches(3))
    hook.close()
    scalars, histograms = read_tensorboard(os.path.join(run_dir, "tensorboard"), "TRAIN")
    trial = create_trial(run_dir)
    assert "gradient/Net_fc1.weight/l2" in scalars and "Net_fc1.weight/l2" in scalars
    for step, value in scalars["gradient/Net_fc1.weight/l2"]:
        want = float(trial.tensor("gradient/Net_fc1.weight").reduction_value(step, "l2", mode="train"))
        assert value == pytest.approx(want, rel=1e-6)
    # Histograms: weights/<name>, and gradients without a doubled prefix.
    assert "weights/Net_fc1.weight" in histograms
    assert "gradient/Net_fc1.weight" in histograms and not any(h.startswith("gradients/") for h in histograms)
