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
from smdebug.storage.format import proto
from smdebug.storage.format.layout import COLLECTIONS_DIR, event_file_relpath, index_file_relpath
from smdebug.storage.format.records import crc32c, frame_record
from smdebug.modes import ModeKeys
from smdebug.trials import create_trial
from smdebug.storage.writer import RunWriter, StepData

TRAIN = ModeKeys.TRAIN
# About smdebug 1.0.34's files (the run store's limits: tests/analysis/test_store_reader.py).
pytestmark = [pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs and symbolic links"),
              pytest.mark.usefixtures("layout_1034")]


@pytest.fixture(autouse=True, params=["fast", "portable"])
def open_path(request, monkeypatch):
    """Every test runs twice: with Linux's openat2 and /proc/self/fd where the kernel has
    them, and with the portable path (realpath) used elsewhere."""
    from smdebug.analysis.trials import local_storage

    if request.param == "portable":
        monkeypatch.setattr(local_storage, "_openat2", None)
        monkeypatch.setattr(local_storage, "_HAVE_PROC_FD", False)
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
        except BaseException as exc:  # noqa: BLE001 - handed to the test
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
    from smdebug.storage.format.layout import MAX_INDEX_FILE_BYTES

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
    with pytest.raises(CorruptRecord, match=r"holds \d+ of the record.s 1000000000000 bytes there"):
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
    assert "index directory skipped, its 2 steps are left out" in warning


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


# ----------------------------------------------------------------------------- unreadable files
def run_bound_by_permissions(code):
    """``code`` in a child interpreter that file permissions bind (as root: without the
    capabilities that override them), its stdout."""
    import subprocess
    import sys

    cmd = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: file permissions do not bind here")
        caps = "-dac_override,-dac_read_search"
        cmd = [setpriv, "--bounding-set", caps, "--inh-caps", caps] + cmd
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def test_unreadable_index_and_event_files_cost_their_step_with_named_errors(tmp_path):
    run = write_run(tmp_path / "run", steps=(0, 1, 2))
    os.chmod(path_of(run, index_file_relpath(1, "worker_0")), 0)
    os.chmod(path_of(run, event_file_relpath(2, "worker_0")), 0)
    out, err = run_bound_by_permissions(f"""
from smdebug.exceptions import CorruptRecord
from smdebug.trials import create_trial
trial = create_trial({run!r}, wait_timeout=1)
print(trial.steps())
print(trial.tensor("fc.weight").value(0).sum())
try:
    trial.tensor("fc.weight").value(2)
except CorruptRecord as exc:
    print("CorruptRecord", exc)
""")
    steps, total, error = out.strip().splitlines()
    assert steps == "[0, 2]" and float(total) == value_of(0).sum()
    assert error.startswith("CorruptRecord") and "cannot be read: Permission denied" in error
    assert "000000000001_worker_0.json cannot be read: Permission denied" in err  # the one warning


# ----------------------------------------------------------------------------- sharded pieces
def write_pieces(run, placements):
    """A step-0 tensor 'w' of three elements from each of two workers, with these placements."""
    for worker, base in (("worker_0", 0.0), ("worker_1", 100.0)):
        manager = CollectionManager()
        manager.add(Collection("weights", include_regex=["w"]))
        writer = RunWriter(str(run), worker)
        writer.write_collections(manager.to_json_bytes(num_workers=2))
        writer.submit(StepData(global_step=0, mode=TRAIN, mode_step=0, worker=worker,
                               tensors=[("w", np.full(3, base))], placements={"w": placements[worker]}))
        assert writer.close(write_end_marker=worker == "worker_1", timeout=30)
    return str(run)


def test_pieces_that_overlap_or_claim_more_than_was_read_are_refused_before_allocating(tmp_path):
    from smdebug.exceptions import TensorUnavailableForStep

    exact = write_pieces(tmp_path / "exact", {"worker_0": {"global_shape": [6], "local_shape": [3], "offsets": [0]},
                                              "worker_1": {"global_shape": [6], "local_shape": [3], "offsets": [3]}})
    assert create_trial(exact).tensor("w").value(0).tolist() == [0, 0, 0, 100, 100, 100]
    overlap = write_pieces(tmp_path / "overlap",
                           {"worker_0": {"global_shape": [6], "local_shape": [3], "offsets": [0]},
                            "worker_1": {"global_shape": [6], "local_shape": [3], "offsets": [1]}})
    with pytest.raises(TensorUnavailableForStep, match="overlaps another worker's"):
        create_trial(overlap).tensor("w").value(0)
    half = 1 << 39  # 2 x 4 TiB of float64 claimed, 48 bytes saved
    huge = write_pieces(tmp_path / "huge",
                        {"worker_0": {"global_shape": [2 * half], "local_shape": [half], "offsets": [0]},
                         "worker_1": {"global_shape": [2 * half], "local_shape": [half], "offsets": [half]}})
    with pytest.raises(TensorUnavailableForStep, match="its placement says"):
        bounded(lambda: create_trial(huge).tensor("w").value(0), seconds=20)
    wide = 1 << 32  # the element count overflows int64
    square = write_pieces(tmp_path / "square",
                          {"worker_0": {"global_shape": [wide, wide], "local_shape": [wide // 2, wide], "offsets": [0, 0]},
                           "worker_1": {"global_shape": [wide, wide], "local_shape": [wide // 2, wide],
                                        "offsets": [wide // 2, 0]}})
    with pytest.raises(TensorUnavailableForStep, match="its placement says"):
        create_trial(square).tensor("w").value(0)
