"""Trial.to_dataframe / to_table / Tensor.to_series on real runs written by the numpy hook
and the RunWriter: every row equals the one-value API, selection, damaged records."""
import logging
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from check_rows import assert_rows_equal_value_api
from smdebug.collections import CollectionManager
from smdebug.exceptions import CorruptRecord, TensorUnavailable
from smdebug.modes import ModeKeys
from smdebug.trials import create_trial
from smdebug.storage.writer import RunWriter, StepData

pd = pytest.importorskip("pandas")


def test_every_row_equals_value_and_reduction_value(numpy_run):
    trial = create_trial(numpy_run)
    df = trial.to_dataframe()
    # 30 steps: 5 reductions of the weight, the loss and the learning rate each step.
    assert len(df) == 30 * 7
    assert assert_rows_equal_value_api(trial, df) == len(df)
    assert set(df["reduction"]) == {"", "min", "max", "mean", "abs_max", "l2"}
    assert set(df["tensor"]) == {"dense.weight", "loss", "scalar/lr"}
    assert df.groupby("mode", observed=True).size().to_dict() == {"TRAIN": 20 * 7, "EVAL": 10 * 7}
    # Sorted by tensor, reduction, worker, step.
    first = df[(df.tensor == "dense.weight") & (df.reduction == "l2")]
    assert first["step"].tolist() == list(range(30))


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_records_of_this_projects_writers_are_decoded_in_bulk(numpy_run_1034):
    from smdebug.storage.format.codec import _cached_metadata, _metadata_message
    from smdebug.storage.format.wire import VALUE_METADATA, length_delimited, metadata_field

    trial = create_trial(numpy_run_1034)
    df = trial.to_dataframe()
    assert trial.stats["table_records_bulk"] == len(df)
    assert trial.stats["table_records_one_by_one"] == 0
    # The metadata the bulk walk compares whole is byte for byte the writer's, and protobuf's.
    for mode in ModeKeys:
        for step in (0, 9, 10, 127, 128, 123456, 10**11):
            assert metadata_field(mode.value, step) == _cached_metadata(mode, step, None)[1]
            for marker in (None, "int8", "bfloat16"):
                serialized = _metadata_message(mode, step, marker).SerializeToString()
                assert metadata_field(mode.value, step, marker) == length_delimited(VALUE_METADATA, serialized)


def test_selection_by_names_regex_collection_mode_steps(numpy_run):
    trial = create_trial(numpy_run)
    assert set(trial.to_dataframe("loss")["tensor"]) == {"loss"}
    assert set(trial.to_dataframe(regex="^scalar/")["tensor"]) == {"scalar/lr"}
    assert set(trial.to_dataframe(collection="weights")["tensor"]) == {"dense.weight"}
    assert set(trial.to_dataframe(["loss"], regex="lr$")["tensor"]) == {"loss", "scalar/lr"}
    ev = trial.to_dataframe("loss", mode="eval")
    assert set(ev["mode"]) == {"EVAL"} and ev["mode_step"].tolist() == list(range(10))
    some = trial.to_dataframe("loss", mode=ModeKeys.EVAL, steps=[0, 3])
    assert some["mode_step"].tolist() == [0, 3] and some["step"].tolist() == [20, 23]
    glob = trial.to_dataframe("loss", steps=range(5))
    assert glob["step"].tolist() == [0, 1, 2, 3, 4]
    assert assert_rows_equal_value_api(trial, some) == 2


def test_clear_errors_for_unknown_names_workers_and_modes(numpy_run):
    trial = create_trial(numpy_run)
    with pytest.raises(TensorUnavailable, match="did you mean 'loss'"):
        trial.to_dataframe("los")
    with pytest.raises(ValueError, match="unknown worker.*'worker_9'.*its workers: \\['worker_0'\\]"):
        trial.to_dataframe(workers="worker_9")
    with pytest.raises(ValueError, match="unknown mode"):
        trial.to_dataframe(mode="training")
    with pytest.raises(ValueError, match="on_error"):
        trial.to_dataframe(on_error="ignore")


def test_to_series(numpy_run):
    trial = create_trial(numpy_run)
    lr = trial.tensor("scalar/lr").to_series(mode="eval")
    assert lr.name == "scalar/lr" and lr.index.name == "step" and lr.dtype == np.float64
    assert lr.index.tolist() == list(range(10))
    assert lr.tolist() == [trial.tensor("scalar/lr").value(s, mode="eval").item() for s in range(10)]
    amax = trial.tensor("dense.weight").to_series("max", abs=True)
    assert amax.name == "dense.weight/abs_max" and len(amax) == 30
    assert amax[7] == float(trial.tensor("dense.weight").reduction_value(7, "max", abs=True))
    with pytest.raises(ValueError, match="no saved 'std' reduction.*reduction_value"):
        trial.tensor("dense.weight").to_series("std")
    with pytest.raises(ValueError, match="no scalar values.*pass reduction="):
        trial.tensor("dense.weight").to_series()


def test_to_table_needs_no_pandas_and_to_dataframe_says_how_to_install(numpy_run):
    code = (
        "import sys; sys.modules['pandas'] = None\n"
        "from smdebug.trials import create_trial\n"
        f"t = create_trial({numpy_run!r})\n"
        "table = t.to_table('loss')\n"
        "rows = list(table.rows())\n"
        "assert len(rows) == 30 and rows[0][4] == 'loss' and rows[0][6] == 1.0, rows[0]\n"
        "try:\n"
        "    t.to_dataframe()\n"
        "except ImportError as exc:\n"
        "    print('ERR', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "ERR Trial.to_dataframe needs pandas" in out and "pip install pandas (smdebug-core's 'analysis' extra)" in out


def _write(out_dir, steps, workers=("worker_0",), tensors=None):
    for worker in workers:
        writer = RunWriter(out_dir, worker)
        writer.write_collections(CollectionManager().to_json_bytes(num_workers=len(workers)))
        for step in range(steps):
            writer.submit(StepData(global_step=step, mode=ModeKeys.TRAIN, mode_step=step, worker=worker,
                                   tensors=tensors(step, worker)))
        writer.close()
    open(os.path.join(out_dir, "training_job_end.ts"), "w").close()


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_workers_dtypes_and_records_the_bulk_walk_leaves_to_the_decoder(tmp_path):
    """Two workers; int, bool, float16, bfloat16 (a dtype marker: decoded one by one), a
    (1,)-shaped value, (1,1) and a 3-element tensor (not a scalar: no row), a string."""
    out = str(tmp_path / "run")

    def tensors(step, worker):
        k = 1 if worker == "worker_0" else -1
        return [
            ("a_int", np.asarray(np.int64(step * k))),
            ("b_bool", np.asarray(step % 2 == 0)),
            ("c_half", np.asarray(np.float16(step / 3 * k))),
            ("d_bf16", np.asarray(step * 0.5 * k, dtype=ml_dtypes.bfloat16)),
            ("e_vec1", np.array([step * 2.0 * k])),
            ("f_unit", np.full((1, 1), step * 3.0 * k, np.float32)),
            ("g_vec3", np.arange(3.0) + step),
            ("h_text", np.array("hello")),
            ("smdebug/reductions/l2/g_vec3", np.asarray(np.float64(step * k + 0.25))),
        ]

    _write(out, 6, ("worker_0", "worker_1"), tensors)
    trial = create_trial(out)
    df = trial.to_dataframe()
    # bfloat16 carries a dtype marker: those 12 records are decoded one by one; the string is
    # too and gives no row; g_vec3 (3 elements) is recognised as no scalar without decoding.
    assert trial.stats["table_records_one_by_one"] == 24
    assert trial.stats["table_records_bulk"] == len(df) - 12
    assert set(df["tensor"]) == {"a_int", "b_bool", "c_half", "d_bf16", "e_vec1", "f_unit", "g_vec3"}
    assert set(df[df.tensor == "g_vec3"]["reduction"]) == {"l2"}
    assert len(df) == 6 * 2 * 7
    assert assert_rows_equal_value_api(trial, df) == len(df)
    w1 = trial.to_dataframe("a_int", workers="worker_1")
    assert set(w1["worker"]) == {"worker_1"} and w1["value"].tolist() == [-s for s in range(6)]
    # to_series takes the first worker, as value() does.
    assert trial.tensor("a_int").to_series().tolist() == [float(s) for s in range(6)]


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_a_damaged_record_costs_its_row_with_one_warning(numpy_run_1034, tmp_path, caplog):
    import shutil

    out = str(tmp_path / "copy")
    shutil.copytree(numpy_run_1034, out)
    event = os.path.join(out, "events", "000000000004", "000000000004_worker_0.tfevents")
    data = bytearray(open(event, "rb").read())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside a record of step 4
    open(event, "wb").write(bytes(data))
    trial = create_trial(out)
    with caplog.at_level(logging.WARNING, logger="smdebug.trials"):
        df = trial.to_dataframe()
    assert len(df) == 30 * 7 - 1
    assert "1 record(s) could not be read" in caplog.text and "000000000004" in caplog.text
    missing = set(trial.to_dataframe(on_error="warn")[lambda d: d.step == 4]["tensor"].astype(str) + "/"
                  + trial.to_dataframe(on_error="warn")[lambda d: d.step == 4]["reduction"].astype(str))
    assert len(missing) == 6
    with pytest.raises(CorruptRecord):
        trial.to_dataframe(on_error="raise")
    assert assert_rows_equal_value_api(trial, df) == len(df)


def test_values_come_back_with_their_stored_shape_as_in_1034(tmp_path):
    """The XGBoost adapter, save_scalar and the original writer store numbers as (1,) vectors:
    they read back so, as 1.0.34 reads them (scripts index [0]); a 0-d value stays 0-d."""
    out = str(tmp_path / "run")
    manager = CollectionManager()
    manager.get("metrics").include("^valid-")
    writer = RunWriter(out, "worker_0")
    writer.write_collections(manager.to_json_bytes(num_workers=1))
    writer.submit(StepData(global_step=0, mode=ModeKeys.TRAIN, mode_step=0, worker="worker_0",
                           tensors=[("valid-logloss", np.array([0.5])), ("scalar/x", np.array([2.0])),
                                    ("loss", np.array(3.0))]))
    writer.close()
    trial = create_trial(out)
    assert trial.tensor("valid-logloss").value(0).shape == (1,)
    assert trial.tensor("scalar/x").value(0).shape == (1,)
    assert trial.tensor("loss").value(0).shape == ()
    assert trial.tensor("valid-logloss").value(0)[0] == 0.5
    assert trial.to_dataframe(names=["valid-logloss"])["value"].tolist() == [0.5]


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_reader_safety_holds_for_bulk_reads(numpy_run_1034, tmp_path, caplog):
    """docs/reader_safety.md: a FIFO in place of an event file is refused at once (no
    wait for a writer), a link leaving the run is not followed; each costs its step's rows."""
    import shutil

    out = str(tmp_path / "copy")
    shutil.copytree(numpy_run_1034, out)
    fifo = os.path.join(out, "events", "000000000002", "000000000002_worker_0.tfevents")
    os.remove(fifo)
    os.mkfifo(fifo)
    outside = tmp_path / "outside.tfevents"
    outside.write_bytes(open(os.path.join(out, "events", "000000000005", "000000000005_worker_0.tfevents"),
                             "rb").read())
    link = os.path.join(out, "events", "000000000005", "000000000005_worker_0.tfevents")
    os.remove(link)
    os.symlink(str(outside), link)
    trial = create_trial(out)
    with caplog.at_level(logging.WARNING, logger="smdebug.trials"):
        df = trial.to_dataframe()
    assert sorted(set(range(30)) - set(df["step"])) == [2, 5]
    assert len(df) == 28 * 7
    assert "14 record(s) could not be read" in caplog.text
    assert "not a regular file" in caplog.text or "outside the run directory" in caplog.text
    with pytest.raises(CorruptRecord, match="FIFO|outside the run directory"):
        trial.to_dataframe(on_error="raise")


def test_a_run_still_training_shows_complete_steps_unless_asked(tmp_path):
    """Two workers, no end marker; worker_1 has not written step 2 yet: that step is
    incomplete and left out, as trial.steps() leaves it out."""
    out = str(tmp_path / "run")
    for worker, steps in (("worker_0", 3), ("worker_1", 2)):
        writer = RunWriter(out, worker)
        writer.write_collections(CollectionManager().to_json_bytes(num_workers=2))
        for step in range(steps):
            writer.submit(StepData(global_step=step, mode=ModeKeys.TRAIN, mode_step=step, worker=worker,
                                   tensors=[("scalar/x", np.asarray(float(step)))]))
        writer.close()
    os.remove(os.path.join(out, "training_job_end.ts"))  # the job has not ended
    trial = create_trial(out)
    assert not trial.training_ended() and trial.steps() == [0, 1]
    assert sorted(set(trial.to_dataframe()["step"])) == [0, 1]
    df = trial.to_dataframe(show_incomplete_steps=True)
    assert sorted(set(df["step"])) == [0, 1, 2]
    assert df[df.step == 2]["worker"].tolist() == ["worker_0"]


def test_workers_that_saved_different_steps(tmp_path):
    """worker_0 saved the even steps, worker_1 the odd ones: each row keeps its worker."""
    out = str(tmp_path / "run")
    for worker, steps in (("worker_0", range(0, 6, 2)), ("worker_1", range(1, 6, 2))):
        writer = RunWriter(out, worker)
        writer.write_collections(CollectionManager().to_json_bytes(num_workers=2))
        for step in steps:
            writer.submit(StepData(global_step=step, mode=ModeKeys.TRAIN, mode_step=step, worker=worker,
                                   tensors=[("smdebug/reductions/max/w", np.asarray(step * 1.5)),
                                            ("scalar/x", np.asarray(float(step)))]))
        writer.close()
    trial = create_trial(out, wait_timeout=0)
    df = trial.to_dataframe()
    for tensor in ("w", "scalar/x"):
        part = df[df.tensor == tensor]
        assert part["step"].tolist() == [0, 2, 4, 1, 3, 5]  # sorted by worker, then step
        assert part["worker"].tolist() == ["worker_0"] * 3 + ["worker_1"] * 3
    assert assert_rows_equal_value_api(trial, df) == 12


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
@pytest.mark.parametrize("check", [True, "none"])
def test_every_record_check_mode_gives_the_same_rows(numpy_run_1034, check):
    trial = create_trial(numpy_run_1034, check=check)
    df = trial.to_dataframe()
    assert len(df) == 30 * 7 and trial.stats["table_records_one_by_one"] == 0
    assert assert_rows_equal_value_api(trial, df) == len(df)


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_damaged_files_never_crash_the_bulk_walk(numpy_run_1034, tmp_path):
    """Flipped bytes, truncations and zeroed tails anywhere in the event files: the table
    still comes out, and every row it keeps equals what value() reads."""
    import random
    import shutil

    rng = random.Random(7)
    out = str(tmp_path / "copy")
    shutil.copytree(numpy_run_1034, out)
    events = sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(out, "events")) for f in fs)
    for path in events:
        data = bytearray(open(path, "rb").read())
        kind = rng.choice(["flip", "flip", "truncate", "zeros", "none"])
        if kind == "flip":
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == "truncate":
            del data[rng.randrange(len(data)):]
        elif kind == "zeros":
            start = rng.randrange(len(data))
            data[start:] = bytes(len(data) - start)
        open(path, "wb").write(bytes(data))
    trial = create_trial(out)
    df = trial.to_dataframe()
    assert 0 < len(df) < 30 * 7
    assert assert_rows_equal_value_api(trial, df) == len(df)


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_progress_bar_on_long_reads_only(tmp_path, capsys):
    out = str(tmp_path / "run")
    _write(out, 600, tensors=lambda step, worker: [("scalar/x", np.asarray(float(step)))])
    trial = create_trial(out, progress=False)
    capsys.readouterr()
    assert len(trial.to_table(progress=True)) == 600
    assert "reading event files" in capsys.readouterr().err  # 600 files: a bar
    assert len(trial.to_table(progress=False)) == 600
    assert capsys.readouterr().err == ""
    assert len(trial.to_table("scalar/x", steps=range(10), progress=True)) == 10
    assert capsys.readouterr().err == ""  # 10 files: quiet


def test_a_name_saved_twice_in_a_step_and_steps_added_after_a_first_read(tmp_path):
    """One index file naming a tensor twice gives one row, the value value() returns (the
    later record); steps written after a first to_dataframe() show up in the next one."""
    out = str(tmp_path / "run")
    writer = RunWriter(out, "worker_0")
    writer.write_collections(CollectionManager().to_json_bytes(num_workers=1))

    def write(steps):
        for step in steps:
            writer.submit(StepData(global_step=step, mode=ModeKeys.TRAIN, mode_step=step, worker="worker_0",
                                   tensors=[("scalar/x", np.asarray(float(step))),
                                            ("scalar/x", np.asarray(float(step) + 0.5))]))
        writer.flush()

    write(range(3))
    trial = create_trial(out)
    first = trial.to_dataframe(show_incomplete_steps=True)
    assert first["step"].tolist() == [0, 1, 2]
    assert first["value"].tolist() == [trial.tensor("scalar/x").value(s).item() for s in range(3)]
    write(range(3, 5))
    writer.close()
    trial.refresh()
    second = trial.to_dataframe()
    assert second["step"].tolist() == [0, 1, 2, 3, 4]
    assert assert_rows_equal_value_api(trial, second) == 5


def test_update_ratio_of_a_one_element_weight_uses_its_l2_not_its_value(tmp_path):
    # A 1-element tensor saved whole is also a scalar-value row; the ratio is of the L2 norms.
    import smdebug as smd

    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1))
    for name in ("params", "updates"):
        hook.get_collection(name).reduction_config = smd.ReductionConfig(norms=["l2"], save_raw_tensor=True)
    hook.begin_step()
    hook.save_tensor("b", np.array([-2.0]), "params")
    hook.save_tensor("update/b", np.array([0.5]), "updates")
    hook.close()
    ratios = create_trial(str(tmp_path / "run")).update_ratios()
    assert ratios[["tensor", "step", "value"]].values.tolist() == [["b", 0, 0.25]]
