"""Comparing runs written by the run writer (no framework): two ranks of one run, runs whose
global steps differ, NaN, full tensors of different shapes. PyTorch runs:
tests/pytorch/test_pytorch_compare.py."""
import os

import numpy as np
import pytest

from smdebug.analysis import compare
from smdebug.analysis.cli import main
from smdebug.collections import CollectionManager
from smdebug.modes import ModeKeys
from smdebug.storage.writer import RunWriter, StepData

pytest.importorskip("pandas")

TRAIN, EVAL = ModeKeys.TRAIN, ModeKeys.EVAL


def write(out_dir, steps, tensors, workers=("worker_0",)):
    """``steps``: (global step, mode, mode step) in order; ``tensors(step, worker)`` -> records."""
    for worker in workers:
        writer = RunWriter(out_dir, worker)
        writer.write_collections(CollectionManager().to_json_bytes(num_workers=len(workers)))
        for g, mode, ms in steps:
            writer.submit(StepData(global_step=g, mode=mode, mode_step=ms, worker=worker, tensors=tensors(g, worker)))
        writer.close()
    open(os.path.join(out_dir, "training_job_end.ts"), "w").close()
    return out_dir


def cli(capsys, *argv):
    status = main(["compare", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_two_ranks_of_one_run(tmp_path, capsys):
    # Rank 1's loss leaves rank 0's at step 3; the weight (synchronised) never does.
    def tensors(g, worker):
        loss = 1.0 / (g + 1) + (0.5 if worker == "worker_1" and g >= 3 else 0.0)
        return [("w", np.arange(3, dtype=np.float32) * g), ("loss", np.asarray(np.float32(loss))),
                ("smdebug/reductions/l2/grad", np.asarray(np.float64(g)))]

    run = write(str(tmp_path / "ddp"), [(g, TRAIN, g) for g in range(6)], tensors, ("worker_0", "worker_1"))
    result = compare([run, run], workers=["worker_0", "worker_1"])
    assert result.runs == ["ddp:worker_0", "ddp:worker_1"]
    div = result.divergence
    assert (div.step, div.tensor, div.reduction, div.worker) == (3, "loss", "", "worker_0")
    assert div.values == {"ddp:worker_0": 0.25, "ddp:worker_1": 0.75}
    assert div.relative_difference == pytest.approx(0.5 / 0.75)
    # Full tensors up to the divergence: w at steps 0 to 3 (written before the loss).
    assert result.compared == {"values": 12, "tensors": 4, "unmatched": 0}
    # Matched by worker name, the same run agrees with itself.
    assert compare([run, run]).divergence is None

    status, out, _ = cli(capsys, run, run, "--worker", "worker_0", "--worker", "worker_1", "--diverge")
    assert status == 1 and out.startswith("first divergence: step 3, tensor loss [TRAIN step 3, worker_0]: "
                                          "ddp:worker_0 0.25, ddp:worker_1 0.75; relative difference 0.666666667")
    status, _, err = cli(capsys, run, run, "--worker", "a", "--worker", "b", "--worker", "c")
    assert status == 2 and "once per run (2)" in err
    status, _, err = cli(capsys, run, run, "--worker", "worker_7")
    assert status == 3 and "no worker 'worker_7'" in err and "worker_0, worker_1" in err


def test_runs_numbered_differently_line_up_by_mode_step(tmp_path, capsys):
    # a evaluates after TRAIN step 3; b never does: their global steps differ from step 4 on.
    def tensors(g, worker):
        return [("loss", np.asarray(np.float32(0.0)))]

    a_steps = [(0, TRAIN, 0), (1, TRAIN, 1), (2, TRAIN, 2), (3, TRAIN, 3), (4, EVAL, 0), (5, EVAL, 1),
               (6, TRAIN, 4), (7, TRAIN, 5)]
    a = write(str(tmp_path / "a"), a_steps, tensors)
    b = write(str(tmp_path / "b"), [(g, TRAIN, g) for g in range(6)], tensors)
    result = compare([a, b])
    assert result.only_in == {"a": {"tensors": [], "steps": [("EVAL", 0), ("EVAL", 1)]}}
    train = result.frame[result.frame["mode"] == "TRAIN"]
    assert train["step"].tolist() == [0, 1, 2, 3, 6, 7]  # the first run's global steps
    assert train["mode_step"].tolist() == list(range(6)) and not train["differs"].any()
    status, out, _ = cli(capsys, a, b, "--diverge")
    assert status == 0 and out.splitlines() == [
        "only in a: 2 steps: EVAL 0, EVAL 1",
        "no divergence: 6 scalar values and 0 full tensors of a, b agree within rtol=1e-05, atol=1e-08"]


def test_nan_and_shapes(tmp_path):
    def tensors_of(nan_at, size):
        def tensors(g, worker):
            return [("w", np.ones(size, np.float32)),
                    ("loss", np.asarray(np.float32(np.nan if g >= nan_at else 1.0)))]
        return tensors

    steps = [(g, TRAIN, g) for g in range(4)]
    a = write(str(tmp_path / "a"), steps, tensors_of(1, 3))
    b = write(str(tmp_path / "b"), steps, tensors_of(2, 3))
    c = write(str(tmp_path / "c"), steps, tensors_of(1, 4))
    # NaN in both runs agrees; a number against NaN does not (infinitely far apart).
    div = compare([a, b]).divergence
    assert (div.step, div.tensor) == (1, "loss") and np.isnan(div.values["a"]) and div.values["b"] == 1.0
    assert div.relative_difference == float("inf")
    # Full tensors of different shapes: the first step, with a note.
    div = compare([a, c]).divergence
    assert (div.step, div.tensor) == (0, "w") and div.note == "shapes differ: (3,), (4,)"
    assert "shapes differ" in div.line() and div.line().startswith("first divergence: step 0, tensor w ")
    with pytest.raises(ValueError, match="two or more runs"):
        compare([a])


def test_runs_with_nothing_in_common_do_not_agree(tmp_path, capsys):
    a = write(str(tmp_path / "a"), [(0, TRAIN, 0)], lambda g, w: [("loss", np.asarray(np.float32(1.0)))])
    b = write(str(tmp_path / "b"), [(0, TRAIN, 0)], lambda g, w: [("acc", np.asarray(np.float32(1.0)))])
    status, out, _ = cli(capsys, a, b, "--diverge")
    assert status == 1 and out.splitlines() == [
        "only in a: 1 tensor: loss", "only in b: 1 tensor: acc",
        "nothing to compare: a, b have no value in common (the 'only in' lines list theirs)"]


def test_without_pandas_compare_says_how_to_install_it(tmp_path):
    import subprocess
    import sys

    run = write(str(tmp_path / "a"), [(0, TRAIN, 0)], lambda g, w: [("loss", np.asarray(np.float32(1.0)))])
    code = ("import sys; sys.modules['pandas'] = None\n"
            "from smdebug.analysis.cli import main\n"
            f"print('STATUS', main(['compare', {run!r}, {run!r}, '--diverge']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "STATUS 2" in proc.stdout
    assert "smdebug compare needs pandas, which is not installed: pip install pandas" in proc.stderr


def test_selection_by_collection_and_runs_named_like_columns(tmp_path, capsys):
    def tensors(g, worker):
        return [("loss", np.asarray(np.float32(1.0))), ("acc", np.asarray(np.float32(0.5)))]

    step = write(str(tmp_path / "step"), [(0, TRAIN, 0)], tensors)
    other = write(str(tmp_path / "other"), [(0, TRAIN, 0)], tensors)
    result = compare([step, other], regex="^loss$")
    assert result.runs == ["step (run)", "other"] and result.frame["tensor"].tolist() == ["loss"]
    assert result.frame[["step (run)", "other"]].values.tolist() == [[1.0, 1.0]]
    status, _, err = cli(capsys, step, other, "--collection", "no_such", "--diverge")
    assert status == 3 and "no collection named 'no_such' in any of the runs" in err


def test_values_saved_at_other_intervals_are_counted_and_named(tmp_path, capsys):
    # Both runs save the loss every step; b saves the weight's norm every other step only.
    def tensors_of(every):
        def tensors(g, worker):
            out = [("loss", np.asarray(np.float32(1.0)))]
            if g % every == 0:
                out.append(("smdebug/reductions/l2/w", np.asarray(np.float64(g))))
            return out
        return tensors

    steps = [(g, TRAIN, g) for g in range(4)]
    a = write(str(tmp_path / "a"), steps, tensors_of(1))
    b = write(str(tmp_path / "b"), steps, tensors_of(2))
    result = compare([a, b])
    assert result.only_in == {} and result.compared["unmatched"] == 2 and result.compared["values"] == 6
    status, out, _ = cli(capsys, a, b, "--diverge")
    assert status == 0 and out.splitlines()[0] == (
        "not compared: 2 values that only some runs saved at steps they share, as w at step 1 "
        "(saved at other intervals, or other reductions)")
