"""The reader treats every file of a run directory as untrusted (docs/reader_safety.md).

Each test builds a real run with the real writer, then puts a real FIFO, symbolic link,
oversized file or crafted record in it. A test that could hang before the fix runs the
read in a thread and fails when it does not finish in time.
"""
import json
import os
import shutil
import threading
import time

import numpy as np
import pytest

from smdebug.collections import Collection, CollectionManager
from smdebug.exceptions import CorruptCollectionsFile, CorruptRecord
from smdebug.format import proto
from smdebug.format.layout import COLLECTIONS_DIR, event_file_relpath, index_file_relpath
from smdebug.format.records import crc32c, frame_record
from smdebug.modes import ModeKeys
from smdebug.trials import create_trial
from smdebug.writer import RunWriter, StepData

TRAIN = ModeKeys.TRAIN
pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs and symbolic links")


@pytest.fixture(autouse=True, params=["fast", "portable"])
def open_path(request, monkeypatch):
    """Every test runs twice: with Linux's openat2 and /proc/self/fd where the kernel has
    them, and with the portable path (realpath) used elsewhere."""
    from smdebug.trials import storage

    if request.param == "portable":
        monkeypatch.setattr(storage, "_openat2", None)
        monkeypatch.setattr(storage, "_HAVE_PROC_FD", False)
    return request.param


def value_of(step):
    return np.arange(6, dtype=np.float32).reshape(2, 3) + step


def write_run(run, steps=(0, 1, 2), names=("fc.weight",), collections=None, end=True):
    writer = RunWriter(str(run), "worker_0")
    if collections is None:
        manager = CollectionManager()
        manager.add(Collection("weights", include_regex=["weight"]))
        collections = manager.to_json_bytes(num_workers=1)
    writer.write_collections(collections)
    for step in steps:
        writer.submit(StepData(global_step=step, mode=TRAIN, mode_step=step, worker="worker_0",
                               tensors=[(name, value_of(step)) for name in names]))
    assert writer.close(write_end_marker=end, timeout=30)
    return str(run)


def path_of(run, relpath):
    return os.path.join(run, *relpath.split("/"))


def bounded(fn, seconds=20.0):
    """``fn()``'s result, or its exception; fails the test if it has not returned in time
    (a daemon thread: a read blocked forever does not keep the test process alive)."""
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: B902 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the read did not return within {seconds} s (blocked or runaway)"
    if "error" in box:
        raise box["error"]
    return box["result"], time.monotonic() - started


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


# ----------------------------------------------------------------------------- FIFOs
def test_fifo_in_place_of_an_index_file_does_not_block_and_skips_that_step(tmp_path, caplog):
    run = write_run(tmp_path / "run")
    index = path_of(run, index_file_relpath(1, "worker_0"))
    os.remove(index)
    os.mkfifo(index)
    trial, took = bounded(lambda: create_trial(run, wait_timeout=1))
    assert took < 10
    assert trial.steps() == [0, 2]
    (warning,) = warnings_of(caplog)
    assert "000000000001_worker_0.json is a FIFO" in warning


def test_fifo_in_place_of_the_collections_file_does_not_block(tmp_path):
    run = write_run(tmp_path / "run")
    coll = path_of(run, f"{COLLECTIONS_DIR}/worker_0_collections.json")
    os.remove(coll)
    os.mkfifo(coll)
    with pytest.raises(CorruptCollectionsFile, match="worker_0_collections.json is a FIFO"):
        bounded(lambda: create_trial(run, wait_timeout=1))


def test_fifo_in_place_of_an_event_file_does_not_block_value(tmp_path):
    run = write_run(tmp_path / "run")
    event = path_of(run, event_file_relpath(1, "worker_0"))
    os.remove(event)
    os.mkfifo(event)
    trial = create_trial(run, wait_timeout=1)
    with pytest.raises(CorruptRecord, match="is a FIFO, not a regular file"):
        bounded(lambda: trial.tensor("fc.weight").value(1))
    np.testing.assert_array_equal(trial.tensor("fc.weight").value(2), value_of(2))


# ----------------------------------------------------------------------------- sizes
def test_dev_zero_as_index_or_collections_file_is_refused_unread(tmp_path, caplog):
    run = write_run(tmp_path / "run")
    index = path_of(run, index_file_relpath(1, "worker_0"))
    os.remove(index)
    os.symlink("/dev/zero", index)
    trial, _ = bounded(lambda: create_trial(run, wait_timeout=1))
    assert trial.steps() == [0, 2]
    (warning,) = warnings_of(caplog)
    assert "000000000001_worker_0.json leads to /dev/zero, outside the run directory" in warning

    coll = path_of(run, f"{COLLECTIONS_DIR}/worker_0_collections.json")
    os.remove(coll)
    os.symlink("/dev/zero", coll)
    with pytest.raises(CorruptCollectionsFile, match="outside the run directory"):
        bounded(lambda: create_trial(run, wait_timeout=1))


def test_index_file_larger_than_the_format_allows_is_not_read(tmp_path, caplog):
    from smdebug.format.layout import MAX_INDEX_FILE_BYTES

    run = write_run(tmp_path / "run")
    index = path_of(run, index_file_relpath(1, "worker_0"))
    with open(index, "r+b") as f:  # sparse: 8 GiB that take no disk space
        f.truncate(8 << 30)
    assert MAX_INDEX_FILE_BYTES < 8 << 30
    trial, _ = bounded(lambda: create_trial(run, wait_timeout=1))
    assert trial.steps() == [0, 2]
    (warning,) = warnings_of(caplog)
    assert f"holds {8 << 30} bytes, more than the {MAX_INDEX_FILE_BYTES}" in warning


# ----------------------------------------------------------------------------- records
def set_index_entry(run, step, **fields):
    path = path_of(run, index_file_relpath(step, "worker_0"))
    with open(path) as f:
        doc = json.load(f)
    doc["tensor_payload"][0].update(fields)
    with open(path, "w") as f:
        json.dump(doc, f)


def test_index_entry_with_a_huge_length_raises_corrupt_record_without_allocating(tmp_path):
    run = write_run(tmp_path / "run")
    set_index_entry(run, 1, length=10**12)
    trial = create_trial(run)
    with pytest.raises(CorruptRecord, match="ends 99999999.* bytes before the end of the record"):
        bounded(lambda: trial.tensor("fc.weight").value(1))
    with pytest.raises(CorruptRecord):  # the batch path (several records of one file)
        trial.tensor("fc.weight").values()


def replace_record(run, step, tensor_proto):
    """Make ``step``'s event file hold one record: an Event around ``tensor_proto``."""
    event = proto.Event(wall_time=1.0, step=step)
    value = event.summary.value.add(tag="fc.weight")
    value.tensor.CopyFrom(tensor_proto)
    payload = event.SerializeToString()
    with open(path_of(run, event_file_relpath(step, "worker_0")), "wb") as f:
        f.write(frame_record(payload, False))
    set_index_entry(run, step, start_idx=0, length=len(payload) + 16, crc32c=crc32c(payload))
    return len(payload)


def test_record_that_expands_past_the_element_limit_is_corrupt(tmp_path, monkeypatch):
    run = write_run(tmp_path / "run")
    tensor = proto.TensorProto(dtype=proto.DT_FLOAT)
    tensor.tensor_shape.dim.add(size=300_000_000)
    tensor.float_val.append(1.5)
    assert replace_record(run, 1, tensor) < 60  # a 50-byte record standing for 1.2 GB of float32
    trial = create_trial(run)
    with pytest.raises(CorruptRecord, match=r"fill 300000000 elements exceeds the limit of 16777216"):
        bounded(lambda: trial.tensor("fc.weight").value(1))

    small = proto.TensorProto(dtype=proto.DT_FLOAT)
    small.tensor_shape.dim.add(size=1000)
    small.float_val.append(2.5)
    replace_record(run, 2, small)
    np.testing.assert_array_equal(create_trial(run).tensor("fc.weight").value(2), np.full(1000, 2.5, np.float32))
    with pytest.raises(CorruptRecord, match="limit of 999"):
        create_trial(run, max_expanded_elements=999).tensor("fc.weight").value(2)
    monkeypatch.setenv("SMDEBUG_MAX_EXPANDED_ELEMENTS", "10")
    with pytest.raises(CorruptRecord, match="limit of 10 "):
        create_trial(run).tensor("fc.weight").value(2)


# ----------------------------------------------------------------------------- symbolic links
def test_event_file_linked_outside_the_run_is_refused(tmp_path):
    run = write_run(tmp_path / "run")
    event = path_of(run, event_file_relpath(1, "worker_0"))
    outside = str(tmp_path / "elsewhere.tfevents")
    shutil.move(event, outside)  # the same bytes, outside the run
    os.symlink(outside, event)
    trial = create_trial(run)
    with pytest.raises(CorruptRecord, match="outside the run directory"):
        trial.tensor("fc.weight").value(1)
    with pytest.raises(CorruptRecord, match="outside the run directory"):
        trial.tensor("fc.weight").values()


def test_links_that_stay_inside_the_run_are_followed(tmp_path):
    run = write_run(tmp_path / "run")
    event = path_of(run, event_file_relpath(1, "worker_0"))
    kept = os.path.join(run, "kept.tfevents")
    shutil.move(event, kept)
    os.symlink("../../kept.tfevents", event)
    index = path_of(run, index_file_relpath(2, "worker_0"))
    shutil.move(index, os.path.join(run, "kept.json"))
    os.symlink(os.path.join(run, "kept.json"), index)  # absolute, still inside
    trial = create_trial(run)
    assert trial.steps() == [0, 1, 2]
    np.testing.assert_array_equal(trial.tensor("fc.weight").value(1), value_of(1))
    np.testing.assert_array_equal(trial.tensor("fc.weight").value(2), value_of(2))

    linked = tmp_path / "linked_run"  # the run directory itself may be reached through a link
    os.symlink(run, linked)
    assert create_trial(str(linked)).tensor("fc.weight").values()[1].tolist() == value_of(1).tolist()


def test_index_bucket_linked_outside_the_run_is_skipped_with_one_warning(tmp_path, caplog):
    run = write_run(tmp_path / "run", steps=(0, 1, 1000, 1001))
    bucket = os.path.dirname(path_of(run, index_file_relpath(1000, "worker_0")))
    outside = str(tmp_path / "bucket_elsewhere")
    shutil.move(bucket, outside)
    os.symlink(outside, bucket)
    trial = create_trial(run)
    assert trial.steps() == [0, 1]
    (warning,) = warnings_of(caplog)
    assert "000000001 leads to" in warning and "outside the run directory" in warning


def test_symlink_loops_raise_the_named_errors(tmp_path, caplog):
    run = write_run(tmp_path / "run")
    index = path_of(run, index_file_relpath(1, "worker_0"))
    os.remove(index)
    os.symlink(os.path.basename(index), index)  # points at itself
    event = path_of(run, event_file_relpath(2, "worker_0"))
    os.remove(event)
    os.symlink(os.path.basename(event), event)
    trial = create_trial(run)
    assert trial.steps() == [0, 2]
    (warning,) = warnings_of(caplog)
    assert "000000000001_worker_0.json is a symbolic link loop" in warning
    with pytest.raises(CorruptRecord, match="tfevents is a symbolic link loop"):
        trial.tensor("fc.weight").value(2)

    coll = path_of(run, f"{COLLECTIONS_DIR}/worker_0_collections.json")
    os.remove(coll)
    os.symlink("worker_0_collections.json", coll)
    with pytest.raises(CorruptCollectionsFile, match="symbolic link loop"):
        create_trial(run, wait_timeout=1)


# ----------------------------------------------------------------------------- collections files
def test_deeply_nested_collections_file_is_a_corrupt_collections_file(tmp_path):
    depth = 100_000
    run = write_run(tmp_path / "run", collections=b'{"collections": ' + b"[" * depth + b"]" * depth + b"}")
    with pytest.raises(CorruptCollectionsFile, match="nested too deeply"):
        create_trial(run)


def test_catastrophic_regex_from_a_collections_file_is_refused_naming_the_collection(tmp_path):
    manager = CollectionManager()
    manager.add(Collection("weights", include_regex=["weight"]))
    manager.add(Collection("evil", include_regex=["^(a+)+$"]))
    manager.add(Collection("backref", include_regex=[r"(\w+)_\1"]))
    run = write_run(tmp_path / "run", names=("fc.weight", "a" * 40 + "!"),
                    collections=manager.to_json_bytes(num_workers=1))
    trial = create_trial(run)
    with pytest.raises(CorruptCollectionsFile, match=r"collection 'evil': regex '\^\(a\+\)\+\$' .*nested quantifiers"):
        bounded(lambda: trial.tensor_names(collection="evil"), seconds=10)
    with pytest.raises(CorruptCollectionsFile, match="collection 'backref'.*backreference"):
        trial.tensor_names(collection="backref")
    assert trial.collection("evil").include_regex == ("^(a+)+$",)  # shown as the file has it
    assert trial.tensor_names(collection="weights") == ["fc.weight"]  # the rest still works
    assert trial.tensor_names(regex="^a+!$") == ["a" * 40 + "!"]  # the user's own regexes run as given
