"""The Trial reader on real run directories written by the project's RunWriter."""
import json
import os
import threading
import time

import numpy as np
import pytest

from smdebug.collections import Collection, CollectionManager
from smdebug.exceptions import (
    CorruptCollectionsFile,
    CorruptRecord,
    InvalidWorker,
    MissingCollectionFiles,
    MissingEventFile,
    NoMoreData,
    ReductionUnavailableForStep,
    RunNotFound,
    ShapeUnavailableForStep,
    StepNotYetAvailable,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from smdebug.storage.format.layout import END_OF_JOB_FILE, event_file_relpath, index_file_relpath
from smdebug.modes import ModeKeys
from smdebug.trials import StepState, create_trial
from smdebug.storage.writer import RunWriter, StepData

TRAIN, EVAL, GLOBAL = ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.GLOBAL


# ----------------------------------------------------------------------------- helpers
def collections_json(num_workers=1, extra=()):
    manager = CollectionManager()
    manager.add(Collection("weights", include_regex=["weight"]))
    manager.add(Collection("biases", include_regex=["^(?!gradient).*bias"]))
    manager.add(Collection("gradients", include_regex=["^gradient"]))
    manager.add(Collection("losses", tensor_names=["loss_output_0"]))
    for coll in extra:
        manager.add(coll)
    return manager.to_json_bytes(num_workers=num_workers)


def fill(step, shape=(2, 3), offset=0.0):
    """A recognisable value for a step."""
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + step + offset


def write_run(out_dir, schedule, worker="worker_0", num_workers=1, end=True, tensors=None, collections=None):
    """Write one worker's steps with the real writer.

    ``schedule``: list of ``(global_step, mode, mode_step)``; ``tensors(step)`` gives the
    StepData keyword arguments of a step (default: a weight, a bias and a loss).
    """
    if tensors is None:

        def tensors(step):
            return {
                "tensors": [
                    ("fc.weight", fill(step)),
                    ("fc.bias", fill(step, (3,), 0.5)),
                    ("loss_output_0", np.array(float(step), dtype=np.float64)),
                ]
            }

    writer = RunWriter(str(out_dir), worker)
    writer.write_collections(collections if collections is not None else collections_json(num_workers))
    for step, mode, mode_step in schedule:
        writer.submit(StepData(global_step=step, mode=mode, mode_step=mode_step, worker=worker, **tensors(step)))
    assert writer.close(write_end_marker=end, timeout=30)


def train_steps(steps):
    return [(s, TRAIN, s) for s in steps]


def rewrite_index(run, step, worker, edit):
    """Load an index file as JSON, let ``edit`` change it, write it back."""
    path = os.path.join(run, *index_file_relpath(step, worker).split("/"))
    with open(path) as f:
        doc = json.load(f)
    edit(doc)
    with open(path, "w") as f:
        json.dump(doc, f)


def touch(run, relpath):
    path = os.path.join(run, *relpath.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb"):
        pass


# docs/format.md 1.1: TRAIN 0-3, EVAL 4-6, TRAIN 7-8, saved when the mode step is a multiple of 2.
FORMAT_EXAMPLE = [
    (g, mode, mode_step)
    for g, (mode, mode_step) in enumerate(
        [(TRAIN, 0), (TRAIN, 1), (TRAIN, 2), (TRAIN, 3), (EVAL, 0), (EVAL, 1), (EVAL, 2), (TRAIN, 4), (TRAIN, 5)]
    )
    if mode_step % 2 == 0
]


@pytest.fixture
def example_run(tmp_path):
    run = tmp_path / "run"
    write_run(run, FORMAT_EXAMPLE)
    return str(run)


# ----------------------------------------------------------------------------- steps and modes
def test_format_example_steps_modes_and_conversions(example_run):
    trial = create_trial(example_run)
    assert trial.steps() == [0, 2, 4, 6, 7]
    assert trial.steps(TRAIN) == [0, 2, 4]
    assert trial.steps(mode=EVAL) == [0, 2]
    assert trial.steps(ModeKeys.PREDICT) == []
    assert trial.modes() == [TRAIN, EVAL]
    assert trial.mode_modestep(7) == (TRAIN, 4)
    assert trial.mode(4) is EVAL and trial.mode_step(4) == 0
    assert trial.global_step(EVAL, 2) == 6
    assert trial.global_step(TRAIN, 4) == 7
    assert trial.global_step(GLOBAL, 123) == 123
    assert trial.workers() == ["worker_0"] and trial.num_workers == 1
    assert trial.training_ended() and trial.loaded_all_steps and trial.last_complete_step == 7

    weight = trial.tensor("fc.weight")
    assert weight.steps() == [0, 2, 4, 6, 7]
    assert weight.steps(EVAL) == [0, 2]
    np.testing.assert_array_equal(weight.value(2, mode=EVAL), fill(6))
    np.testing.assert_array_equal(weight.value(6), fill(6))
    np.testing.assert_array_equal(weight.value(4, mode="train"), fill(7))
    assert weight.workers(7) == ["worker_0"]
    assert weight.prev_steps(6, n=2) == [4, 6]


def test_unknown_steps_raise_the_right_exception(example_run):
    trial = create_trial(example_run)
    weight = trial.tensor("fc.weight")
    with pytest.raises(StepUnavailable):  # skipped: between saved steps
        weight.value(3)
    with pytest.raises(NoMoreData):  # past the end of a finished run
        weight.value(100)
    with pytest.raises(NoMoreData):
        trial.mode_modestep(100)
    with pytest.raises(StepUnavailable):
        trial.global_step(EVAL, 1)
    assert trial.has_passed_step(3) is StepState.UNAVAILABLE
    assert trial.has_passed_step(2, EVAL) is StepState.AVAILABLE
    with pytest.raises(TensorUnavailable):
        trial.tensor("no_such_tensor")
    assert not trial.has_tensor("no_such_tensor")
    with pytest.raises(ValueError, match="unknown mode"):
        trial.steps(mode="TRAINING")
    with pytest.raises(ValueError, match="step"):
        weight.value(-1)
    with pytest.raises(InvalidWorker, match="worker_9"):
        weight.value(0, worker="worker_9")


def test_global_mode_data_is_keyed_by_global_step(tmp_path):
    run = tmp_path / "run"
    write_run(run, [(s, GLOBAL, s) for s in (0, 5, 10)])
    trial = create_trial(str(run))
    assert trial.steps() == [0, 5, 10]
    assert trial.modes() == []
    assert trial.mode_modestep(5) == (GLOBAL, 5)
    assert trial.steps(GLOBAL) == [0, 5, 10]
    np.testing.assert_array_equal(trial.tensor("fc.weight").value(10), fill(10))
    np.testing.assert_array_equal(trial.tensor("fc.weight").value(10, mode=GLOBAL), fill(10))


# ----------------------------------------------------------------------------- values
@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_values_read_each_event_file_once(example_run):
    trial = create_trial(example_run)
    weight = trial.tensor("fc.weight")
    opens_before = trial.stats["event_file_opens"]
    values = weight.values()
    assert sorted(values) == [0, 2, 4, 6, 7]
    for step, value in values.items():
        np.testing.assert_array_equal(value, fill(step))
    assert trial.stats["event_file_opens"] - opens_before == 5  # one per step file
    assert sorted(weight.values(mode=EVAL)) == [0, 2]
    np.testing.assert_array_equal(weight.values(mode=EVAL)[2], fill(6))
    loss = trial.tensor("loss_output_0").value(7)
    assert loss.shape == () and loss.dtype == np.float64 and float(loss) == 7.0


def test_cache_keeps_values(tmp_path):
    run = tmp_path / "run"
    write_run(run, train_steps(range(3)))
    trial = create_trial(str(run), cache=True)
    trial.tensor("fc.weight").values()
    opens = trial.stats["event_file_opens"]
    reads = trial.stats["event_reads"]
    trial.tensor("fc.weight").values()
    trial.tensor("fc.weight").value(1)
    assert (trial.stats["event_file_opens"], trial.stats["event_reads"]) == (opens, reads)


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_values_of_many_records_in_one_file_use_one_read(tmp_path):
    run = tmp_path / "run"
    write_run(
        run,
        train_steps([0]),
        tensors=lambda step: {"tensors": [(f"smdebug/reductions/{op}/w", np.array([float(i)])) for i, op in
                                          enumerate(["min", "max", "mean", "std"])]},
    )
    trial = create_trial(str(run))
    reads, opens = trial.stats["event_reads"], trial.stats["event_file_opens"]
    got = trial.tensor("w").reduction_values(0)
    assert got == {("min", False): [0.0], ("max", False): [1.0], ("mean", False): [2.0], ("std", False): [3.0]}
    assert trial.stats["event_reads"] - reads == 1
    assert trial.stats["event_file_opens"] - opens == 1


# ----------------------------------------------------------------------------- workers and completeness
def test_two_workers_incomplete_steps_then_training_end(tmp_path):
    """docs/format.md 5.3: worker_1 stopped after step 2, no end marker yet."""
    run = tmp_path / "run"
    write_run(run, train_steps(range(5)), worker="worker_0", num_workers=2, end=False)
    write_run(run, train_steps(range(3)), worker="worker_1", num_workers=2, end=False)
    trial = create_trial(str(run))
    assert trial.workers() == ["worker_0", "worker_1"] and trial.num_workers == 2
    assert trial.steps() == [0, 1, 2]
    assert trial.steps(show_incomplete_steps=True) == [0, 1, 2, 3, 4]
    assert trial.steps(TRAIN) == [0, 1, 2]
    assert trial.last_complete_step == 2
    assert trial.has_passed_step(2) is StepState.AVAILABLE
    assert trial.has_passed_step(3) is StepState.NOT_YET_AVAILABLE
    assert trial.has_passed_step(9) is StepState.NOT_YET_AVAILABLE
    assert not trial.training_ended()

    weight = trial.tensor("fc.weight")
    assert weight.steps() == [0, 1, 2]
    assert weight.steps(show_incomplete_steps=True) == [0, 1, 2, 3, 4]
    assert weight.workers(1) == ["worker_0", "worker_1"]
    np.testing.assert_array_equal(weight.value(1, worker="worker_1"), fill(1))
    np.testing.assert_array_equal(weight.value(3), fill(3))  # present, though incomplete
    with pytest.raises(StepNotYetAvailable):
        trial.tensor_names(step=3)
    assert "fc.weight" in trial.tensor_names(step=3, show_incomplete_steps=True)
    with pytest.raises(StepNotYetAvailable):
        weight.value(7)
    with pytest.raises(StepNotYetAvailable):
        trial.wait_for_steps([3], timeout=0.2)

    touch(str(run), END_OF_JOB_FILE)
    assert trial.training_ended()
    assert trial.steps() == [0, 1, 2, 3, 4]
    assert trial.last_complete_step == 4
    assert trial.has_passed_step(3) is StepState.AVAILABLE
    assert trial.has_passed_step(9) is StepState.UNAVAILABLE
    trial.wait_for_steps([3, 4], timeout=1)
    with pytest.raises(NoMoreData):
        trial.wait_for_steps([9])


def test_skipped_step_of_a_running_job_is_unavailable(tmp_path):
    run = tmp_path / "run"
    write_run(run, train_steps([0, 2, 4]), end=False)
    trial = create_trial(str(run))
    assert trial.has_passed_step(1) is StepState.UNAVAILABLE  # a later step is complete
    assert trial.has_passed_step(5) is StepState.NOT_YET_AVAILABLE
    assert trial.has_passed_step(1, TRAIN) is StepState.UNAVAILABLE
    assert trial.has_passed_step(6, TRAIN) is StepState.NOT_YET_AVAILABLE
    with pytest.raises(StepUnavailable):
        trial.wait_for_steps([1], timeout=1)
    with pytest.raises(StepUnavailable):
        trial.tensor("fc.weight").value(1)


@pytest.mark.parametrize("variable", ["SMDEBUG_INCOMPLETE_STEP_WAIT_WINDOW", "INCOMPLETE_STEP_WAIT_WINDOW"])
def test_incomplete_step_window_gives_up_on_stragglers(tmp_path, monkeypatch, variable):
    monkeypatch.setenv(variable, "4")
    run = tmp_path / "run"
    write_run(run, train_steps(range(10)), worker="worker_0", num_workers=2, end=False)
    write_run(run, train_steps([0]), worker="worker_1", num_workers=2, end=False)
    trial = create_trial(str(run))
    # Nine steps wait for worker_1; the window allows four: the oldest are given up in
    # halves of the window until at most four wait.
    assert trial.last_complete_step == 6
    assert trial.steps() == list(range(7))
    assert trial.has_passed_step(7) is StepState.NOT_YET_AVAILABLE


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_incremental_refresh_reads_only_new_index_files(tmp_path):
    run = tmp_path / "run"
    writer = RunWriter(str(run), "worker_0")
    writer.write_collections(collections_json())
    for step in range(3):
        writer.submit(StepData(step, TRAIN, step, "worker_0", tensors=[("fc.weight", fill(step))]))
    assert writer.flush(timeout=30)
    trial = create_trial(str(run))
    assert trial.steps() == [0, 1, 2] and trial.index_files_read == 3
    assert trial.steps() == [0, 1, 2] and trial.index_files_read == 3  # nothing new: nothing read

    for step in range(3, 1500):  # crosses into the second index bucket
        writer.submit(StepData(step, TRAIN, step, "worker_0", tensors=[("fc.weight", fill(step))]))
    assert writer.flush(timeout=60)
    assert trial.steps() == list(range(1500))
    assert trial.index_files_read == 1500
    assert not trial.training_ended()
    np.testing.assert_array_equal(trial.tensor("fc.weight").value(1499), fill(1499))
    writer.close()
    assert trial.training_ended()
    assert trial.index_files_read == 1500


def test_tensorflow_device_worker_names_are_deserialized(tmp_path):
    run = tmp_path / "my__run"  # a "__" in the path must not mangle anything
    device = "_job-worker_replica-0_task-0_device-GPU-0"
    write_run(run, train_steps([0, 1]), worker=device)
    trial = create_trial(str(run))
    assert trial.workers() == ["/job:worker/replica:0/task:0/device:GPU:0"]
    assert trial.tensor("fc.weight").workers(1) == ["/job:worker/replica:0/task:0/device:GPU:0"]
    np.testing.assert_array_equal(
        trial.tensor("fc.weight").value(1, worker="/job:worker/replica:0/task:0/device:GPU:0"), fill(1)
    )
    other = tmp_path / "other__run"
    write_run(other, train_steps([0]))
    assert create_trial(str(other)).tensor("fc.weight").workers(0) == ["worker_0"]


# ----------------------------------------------------------------------------- opening
def test_create_trial_arguments(example_run, tmp_path, monkeypatch):
    assert create_trial(out_dir=example_run).steps() == [0, 2, 4, 6, 7]
    assert create_trial(f"  {example_run}\n").name == "run"
    assert create_trial(example_run, name="mine").name == "mine"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert create_trial("~/run").path == example_run
    try:
        import fsspec  # noqa: F401 - URLs need it (the s3 extra)
    except ImportError:
        with pytest.raises(ImportError, match="needs fsspec.*install"):
            create_trial("memory://no/such/run")
    else:
        with pytest.raises(RunNotFound, match="holds no objects"):
            create_trial("memory://no/such/run")
        with pytest.raises(ValueError, match="nosuchscheme://x"):
            create_trial("nosuchscheme://x/run")
    assert create_trial("file://" + example_run).steps() == [0, 2, 4, 6, 7]
    with pytest.raises(NotImplementedError, match="index"):
        create_trial(example_run, index_mode=False)
    with pytest.raises(ValueError, match="range_steps"):
        create_trial(example_run, range_steps=(5, 2))
    with pytest.raises(ValueError, match="out_dir"):
        create_trial(example_run, out_dir=str(tmp_path))
    with pytest.raises(ValueError, match="check"):
        create_trial(example_run, check="paranoid")
    with pytest.raises(ValueError):
        create_trial()


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_range_steps_limits_what_is_loaded(example_run):
    trial = create_trial(example_run, range_steps=(2, 7))
    assert trial.steps() == [2, 4, 6]
    assert trial.index_files_read == 3
    assert create_trial(example_run, range_steps=(None, 3)).steps() == [0, 2]


def test_empty_directory_wait_is_bounded(tmp_path):
    started = time.monotonic()
    with pytest.raises(MissingCollectionFiles) as info:
        create_trial(str(tmp_path), wait_timeout=0.3)
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert "collections" in message and str(tmp_path) in message and "index files: 0" in message


def test_missing_directory_and_end_marker_without_collections(tmp_path):
    with pytest.raises(MissingCollectionFiles, match="nowhere does not exist"):  # RunNotFound is one
        create_trial(str(tmp_path / "nowhere"), wait_timeout=0)
    touch(str(tmp_path), END_OF_JOB_FILE)
    started = time.monotonic()
    with pytest.raises(MissingCollectionFiles, match="training has ended"):
        create_trial(str(tmp_path), wait_timeout=60)
    assert time.monotonic() - started < 5  # no waiting once the run is over


def test_env_sets_the_default_wait(tmp_path, monkeypatch):
    monkeypatch.setenv("SMDEBUG_TRIAL_WAIT_TIMEOUT", "0.1")
    started = time.monotonic()
    with pytest.raises(MissingCollectionFiles, match="0.1 s"):
        create_trial(str(tmp_path))
    assert time.monotonic() - started < 5


def test_trial_waits_for_collections_written_meanwhile(tmp_path):
    run = tmp_path / "run"

    def write_later():
        time.sleep(0.3)
        write_run(run, train_steps([0, 1]))

    thread = threading.Thread(target=write_later)
    thread.start()
    try:
        trial = create_trial(str(run), wait_timeout=30)
        trial.wait_for_steps([1], timeout=30)
        assert trial.steps() == [0, 1]
    finally:
        thread.join()


def test_wait_for_every_workers_collections_file_is_bounded(tmp_path):
    run = tmp_path / "run"
    write_run(run, train_steps([0]), num_workers=2, end=False)
    with pytest.raises(MissingCollectionFiles, match="2 workers, but only 1"):
        create_trial(str(run), wait_timeout=0.3)
    touch(str(run), END_OF_JOB_FILE)  # a finished run is read with what it has
    trial = create_trial(str(run), wait_timeout=0.3)
    assert trial.workers() == ["worker_0"] and trial.steps() == [0]


def test_corrupt_collections_file(tmp_path):
    run = tmp_path / "run"
    write_run(run, train_steps([0]), collections=b"{not json")
    with pytest.raises(CorruptCollectionsFile, match="worker_0_collections.json"):
        create_trial(str(run))


# ----------------------------------------------------------------------------- corrupt data
@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_corrupt_index_file_is_skipped_with_one_warning_naming_it(example_run, caplog):
    path = os.path.join(example_run, *index_file_relpath(4, "worker_0").split("/"))
    with open(path, "wb") as f:
        f.write(b'{"meta": {"mode": "TRAIN", "mode_')
    trial = create_trial(example_run)  # one bad step does not cost the run
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "000000000004_worker_0.json" in warnings[0]
    assert trial.corrupt_index_files == ["index/000000000/000000000004_worker_0.json"]
    assert trial.steps() == [0, 2, 6, 7]
    np.testing.assert_array_equal(trial.tensor("fc.weight").value(7), fill(7))
    trial.refresh()
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 1


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_corrupt_index_file_during_a_live_run_is_reported_once(tmp_path, caplog):
    run = tmp_path / "run"
    write_run(run, train_steps([0, 1]), end=False)
    trial = create_trial(str(run))
    touch(str(run), index_file_relpath(2, "worker_0"))  # an empty file: not an index
    write_run(run, train_steps([3]), end=False)
    assert trial.refresh() == 2
    assert trial.corrupt_index_files == ["index/000000000/000000000002_worker_0.json"]
    assert trial.steps() == [0, 1, 3]  # the readable files were registered
    assert trial.refresh() == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "000000000002_worker_0.json" in warnings[0]


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_corrupt_event_payload_is_caught_by_the_index_crc(example_run):
    trial = create_trial(example_run)
    location = trial.tensor("fc.bias")._locations[6]["worker_0"]
    path = os.path.join(example_run, *event_file_relpath(6, "worker_0").split("/"))
    with open(path, "r+b") as f:
        # A bit flip in the last payload byte: the float data, not the framing.
        f.seek(location.start + location.length - 5)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(CorruptRecord) as info:
        create_trial(example_run).tensor("fc.bias").value(6)
    message = str(info.value)
    assert "000000000006_worker_0.tfevents" in message and "'fc.bias'" in message and "step 6" in message
    assert "CRC32C" in message
    # The other records of that file are intact.
    np.testing.assert_array_equal(create_trial(example_run).tensor("fc.weight").value(6), fill(6))


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_truncated_event_file(example_run):
    path = os.path.join(example_run, *event_file_relpath(2, "worker_0").split("/"))
    with open(path, "r+b") as f:
        f.truncate(20)
    trial = create_trial(example_run)
    with pytest.raises(CorruptRecord, match="000000000002_worker_0.tfevents"):
        trial.tensor("fc.weight").value(2)
    with pytest.raises(CorruptRecord):
        trial.tensor("fc.weight").values()


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_index_pointing_at_another_record_is_detected(example_run):
    def swap(doc):
        a, b = doc["tensor_payload"][0], doc["tensor_payload"][1]
        for key in ("start_idx", "length", "crc32c"):
            a[key], b[key] = b[key], a[key]

    rewrite_index(example_run, 0, "worker_0", swap)
    with pytest.raises(CorruptRecord, match="points at the wrong bytes"):
        create_trial(example_run).tensor("fc.weight").value(0)


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_index_without_crcs_reads_like_the_original_format(example_run):
    def drop_crcs(doc):
        for entry in doc["tensor_payload"]:
            del entry["crc32c"]

    rewrite_index(example_run, 2, "worker_0", drop_crcs)
    np.testing.assert_array_equal(create_trial(example_run).tensor("fc.weight").value(2), fill(2))


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_missing_event_file_after_training_end(example_run):
    os.remove(os.path.join(example_run, *event_file_relpath(4, "worker_0").split("/")))
    trial = create_trial(example_run)
    started = time.monotonic()
    with pytest.raises(MissingEventFile, match="000000000004_worker_0.tfevents"):
        trial.tensor("fc.weight").value(4)
    assert time.monotonic() - started < 5
    with pytest.raises(TensorUnavailableForStep):  # the base class rules catch
        trial.tensor("fc.weight").value(4)


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_missing_event_file_of_a_running_job_waits_boundedly(tmp_path):
    run = tmp_path / "run"
    write_run(run, train_steps([0, 1]), end=False)
    os.remove(os.path.join(str(run), *event_file_relpath(1, "worker_0").split("/")))
    trial = create_trial(str(run), wait_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(MissingEventFile):
        trial.tensor("fc.weight").value(1)
    assert 0.25 < time.monotonic() - started < 5


# ----------------------------------------------------------------------------- names and collections
def test_tensor_names_filters(tmp_path):
    run = tmp_path / "run"
    schedule = [(0, TRAIN, 0), (1, EVAL, 0)]

    def tensors(step):
        names = ["fc.weight", "fc.bias", "loss_output_0"] + (["gradient/fc.weight"] if step == 0 else [])
        out = [(n, fill(step)) for n in names]
        out.append(("smdebug/reductions/abs_l2/gradient/fc.weight" if step == 0 else "smdebug/reductions/max/fc.bias",
                    np.array([1.0])))
        return {"tensors": out, "shapes": [("conv.kernel", (3, 3))]}

    write_run(run, schedule, tensors=tensors)
    trial = create_trial(str(run))
    everything = ["conv.kernel", "fc.bias", "fc.weight", "gradient/fc.weight", "loss_output_0"]
    assert trial.tensor_names() == everything  # reductions are no names of their own
    assert not any("reductions" in n for n in trial.tensor_names())
    assert trial.tensor_names(collection="weights") == ["fc.weight", "gradient/fc.weight"]
    assert trial.tensor_names(collection="gradients") == ["gradient/fc.weight"]
    assert trial.tensor_names(collection="biases") == ["fc.bias"]
    assert trial.tensor_names(collection="losses") == ["loss_output_0"]
    assert trial.tensor_names(collection=["losses", "biases"]) == ["fc.bias", "loss_output_0"]
    assert trial.tensor_names(collection=trial.collection("losses")) == ["loss_output_0"]
    assert trial.tensor_names(regex="^fc") == ["fc.bias", "fc.weight"]
    assert trial.tensor_names(regex=["kernel", "loss"]) == ["conv.kernel", "loss_output_0"]
    with pytest.raises(ValueError, match="not both"):  # as 1.0.34
        trial.tensor_names(regex="kernel", collection="losses")
    assert trial.tensor_names(step=1) == ["conv.kernel", "fc.bias", "fc.weight", "loss_output_0"]
    assert trial.tensor_names(step=0, mode=EVAL) == ["conv.kernel", "fc.bias", "fc.weight", "loss_output_0"]
    assert trial.tensor_names(mode=EVAL, collection="weights") == ["fc.weight"]
    assert trial.tensor_names(mode=TRAIN, collection="gradients") == ["gradient/fc.weight"]
    with pytest.raises(KeyError, match="no collection named 'activations'.*known: biases"):
        trial.tensor_names(collection="activations")
    with pytest.raises(ValueError, match="invalid regex"):
        trial.tensor_names(regex="(")
    with pytest.raises(NoMoreData):
        trial.tensor_names(step=5, mode=TRAIN)

    assert sorted(trial.collections()) == ["biases", "gradients", "losses", "weights"]
    assert trial.collection("weights").include_regex == ("weight",)
    assert trial.collection("losses").tensor_names == frozenset({"loss_output_0"})


# ----------------------------------------------------------------------------- reductions and shapes
REDUCED = np.array([[1.0, -2.0], [3.0, -4.0]], dtype=np.float32)


def test_reductions_saved_and_computed(tmp_path):
    run = tmp_path / "run"

    def tensors(step):
        return {
            "tensors": [
                ("w", REDUCED),
                # Deliberately not the true value: proves the saved one is returned.
                ("smdebug/reductions/max/w", np.array([99.0], dtype=np.float32)),
                ("smdebug/reductions/abs_l1/w", np.array([10.0], dtype=np.float32)),
                ("smdebug/reductions/mean/only_reduced", np.array([0.5], dtype=np.float32)),
            ]
        }

    write_run(run, train_steps([0]), tensors=tensors)
    trial = create_trial(str(run))
    w = trial.tensor("w")
    assert w.reduction_value(0, "max") == pytest.approx(99.0)
    assert w.reduction_value(0, "l1", abs=True) == pytest.approx(10.0)
    assert w.reduction_values(0) == {("max", False): pytest.approx([99.0]), ("l1", True): pytest.approx([10.0])}
    assert w.has_reductions(0)

    flat = REDUCED.astype(np.float64).ravel()
    expected = {
        ("min", False): -4.0, ("min", True): 1.0, ("mean", False): -0.5, ("mean", True): 2.5,
        ("sum", False): -2.0, ("prod", False): 24.0, ("median", False): np.median(flat),
        ("std", False): np.std(flat), ("variance", False): np.var(flat), ("variance", True): np.var(np.abs(flat)),
        # Flattened norms (not the matrix norms of the original reader: those would be 6 and 5.46).
        ("l1", False): 10.0, ("l2", False): np.sqrt(30.0), ("l2", True): np.sqrt(30.0),
    }
    for (name, is_abs), want in expected.items():
        assert float(w.reduction_value(0, name, abs=is_abs)) == pytest.approx(want), (name, is_abs)
    assert float(w.reduction_value(0, "max", abs=True)) == pytest.approx(4.0)  # not saved: computed

    reduced_only = trial.tensor("only_reduced")
    assert "only_reduced" in trial.tensor_names()
    assert reduced_only.reduction_value(0, "mean") == pytest.approx(0.5)
    with pytest.raises(TensorUnavailableForStep, match="only reductions were saved"):
        reduced_only.value(0)
    with pytest.raises(ReductionUnavailableForStep, match="saved reductions: mean"):
        reduced_only.reduction_value(0, "min")
    with pytest.raises(ShapeUnavailableForStep):
        reduced_only.shape(0)
    with pytest.raises(ValueError, match="unknown reduction 'l3'"):
        w.reduction_value(0, "l3")
    assert reduced_only.values() == {}


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_shape_only_entries_and_shape_next_to_a_value(tmp_path):
    run = tmp_path / "run"

    def tensors(step):
        return {"tensors": [("fc.weight", fill(step, (2, 3)))], "shapes": [("gradient/fc.weight", (3, 4))]}

    write_run(run, train_steps([0, 1]), tensors=tensors)

    def add_shape_for_the_value(doc):  # what the original hook writes with save_shape=True
        doc["shape_payload"].append({"tensorname": "fc.weight", "originalname": "fc.weight", "shape": [2, 3]})

    rewrite_index(str(run), 1, "worker_0", add_shape_for_the_value)
    trial = create_trial(str(run))
    grad = trial.tensor("gradient/fc.weight")
    assert grad.shape(0) == (3, 4)
    assert grad.shapes() == {0: (3, 4), 1: (3, 4)}
    with pytest.raises(TensorUnavailableForStep):
        grad.value(0)
    assert grad.values() == {}

    weight = trial.tensor("fc.weight")
    # The original reader lost the value here (the shape entry replaced it); we keep both.
    np.testing.assert_array_equal(weight.value(1), fill(1))
    assert weight.shape(1) == (2, 3)
    assert weight.shape(0) == (2, 3)  # from the value
    assert weight.shapes() == {0: (2, 3), 1: (2, 3)}


def test_progress_bar_when_asked(example_run, capsys, monkeypatch):
    import smdebug.analysis.trials.tensor as tensor_module

    monkeypatch.setattr(tensor_module, "_PROGRESS_MIN_FILES", 1)
    trial = create_trial(example_run, progress=True)
    trial.tensor("fc.weight").values()
    assert "reading fc.weight" in capsys.readouterr().err
    trial.tensor("fc.bias").values(progress=False)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("variable", ["SMDEBUG_TRAINING_END_DELAY_REFRESH", "TRAINING_END_DELAY_REFRESH"])
def test_training_end_delay_is_honoured_when_set(example_run, monkeypatch, variable):
    started = time.monotonic()
    create_trial(example_run)
    assert time.monotonic() - started < 0.5  # no fixed sleep by default
    monkeypatch.setenv(variable, "0.3")
    started = time.monotonic()
    trial = create_trial(example_run)
    assert time.monotonic() - started >= 0.3
    assert trial.loaded_all_steps
    monkeypatch.setenv(variable, "soon")
    with pytest.raises(ValueError, match=variable):
        create_trial(example_run)


def test_full_record_check_reads_our_files(example_run):
    trial = create_trial(example_run, check=True)
    np.testing.assert_array_equal(trial.tensor("fc.weight").value(7), fill(7))


def test_workers_that_number_steps_differently_keep_their_own_numbering(tmp_path, caplog):
    # worker_0 ran an EVAL step (global step 1) that worker_1 did not: their global step 1
    # and 2 are different mode steps. Nothing is read under another step's numbering.
    run = tmp_path / "run"
    marker = {"worker_0": 0.0, "worker_1": 100.0}

    def tensors_of(worker):
        return lambda step: {"tensors": [("loss_output_0", np.array(marker[worker] + step))]}

    write_run(run, [(0, TRAIN, 0), (1, EVAL, 0), (2, TRAIN, 1)], worker="worker_0", num_workers=2, end=False,
              tensors=tensors_of("worker_0"))
    write_run(run, [(0, TRAIN, 0), (1, TRAIN, 1)], worker="worker_1", num_workers=2,
              tensors=tensors_of("worker_1"))
    trial = create_trial(str(run))
    warnings = [r.getMessage() for r in caplog.records if "number global step" in r.getMessage()]
    assert len(warnings) == 1 and "worker_1 saved it as TRAIN step 1, another worker as EVAL step 0" in warnings[0]
    assert trial.worker_step_conflicts == {1: {"worker_1": (TRAIN, 1)}}
    loss = trial.tensor("loss_output_0")
    assert loss.value(1, mode=TRAIN, worker="worker_0").item() == 2.0  # worker_0's own TRAIN step 1
    with pytest.raises(TensorUnavailableForStep, match=r"its global step 1 is its TRAIN step 1\): read it by global "
                                                         r"step, value\(1, worker='worker_1'\)"):
        loss.value(0, mode=EVAL, worker="worker_1")
    assert loss.value(1, worker="worker_1").item() == 101.0  # by global step: always its own
    table = trial.to_table(["loss_output_0"])
    rows = sorted((w, s, m, ms) for w, s, m, ms in zip(table.column("worker"), table.column("step").tolist(),
                                                       table.column("mode"), table.column("mode_step").tolist()))
    assert rows == [("worker_0", 0, "TRAIN", 0), ("worker_0", 1, "EVAL", 0), ("worker_0", 2, "TRAIN", 1),
                    ("worker_1", 0, "TRAIN", 0), ("worker_1", 1, "TRAIN", 1)]
