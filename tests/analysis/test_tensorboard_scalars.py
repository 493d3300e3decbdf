"""TensorBoard files of a real hooked run, read by TensorBoard's EventAccumulator: saved
reductions as scalars ``<tensor>/<reduction>``, every scalar at its mode's own step."""
import os

import pytest

from check_rows import read_tensorboard
from smdebug.trials import create_trial

pytest.importorskip("tensorboard")


def test_reductions_and_scalars_per_mode_at_the_mode_step(numpy_run):
    trial = create_trial(numpy_run)
    tb_dir = os.path.join(numpy_run, "tensorboard")
    for mode, count in (("TRAIN", 20), ("EVAL", 10)):
        scalars, _ = read_tensorboard(tb_dir, mode)
        assert sorted(scalars) == ["dense.weight/abs_max", "dense.weight/l2", "dense.weight/max",
                                   "dense.weight/mean", "dense.weight/min", "loss", "scalar/lr"]
        for tag, points in scalars.items():
            assert [s for s, _ in points] == list(range(count)), tag
        weight = trial.tensor("dense.weight")
        for step, value in scalars["dense.weight/l2"]:
            # TensorBoard keeps float32.
            assert value == pytest.approx(float(weight.reduction_value(step, "l2", mode=mode)), rel=1e-6)
        for step, value in scalars["dense.weight/abs_max"]:
            assert value == pytest.approx(float(weight.reduction_value(step, "max", mode=mode, abs=True)), rel=1e-6)
        for step, value in scalars["loss"]:
            assert value == pytest.approx(trial.tensor("loss").value(step, mode=mode).item(), rel=1e-6)
