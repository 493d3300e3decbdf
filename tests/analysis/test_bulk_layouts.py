"""Trial.to_table's reading of many event files of one layout side by side
(smdebug.analysis.trials.layouts.read_layouts): the same rows, the same errors, as the record by
record walk, on clean and on damaged runs."""
import logging
import os
import random
import shutil

import google_crc32c
import numpy as np
import pytest

from check_rows import assert_rows_equal_value_api
from smdebug.collections import CollectionManager
from smdebug.modes import ModeKeys
from smdebug.analysis.trials import create_trial, layouts
from smdebug.analysis.trials.table import COLUMNS
from smdebug.storage.writer import RunWriter, StepData


#: These tests are about smdebug 1.0.34's files (docs/format.md 1-3); the run store has its own.
pytestmark = pytest.mark.usefixtures("layout_1034")


def _tensors(step):
    return [
        ("scalar/loss", np.asarray(1.0 / (step + 1))),
        ("f32", np.asarray(np.float32(step * 0.5))),
        ("i64", np.asarray(np.int64(-step))),
        ("flag", np.asarray(step % 3 == 0)),
        ("vec3", np.arange(3.0) + step),  # several elements: no row
        ("smdebug/reductions/l2/vec3", np.asarray(np.float64(step + 0.25))),
        ("smdebug/reductions/abs_max/vec3", np.asarray(np.float32(step + 2.0))),
    ]


def _write_run(out, train=40, evals=15):
    writer = RunWriter(out, "worker_0")
    writer.write_collections(CollectionManager().to_json_bytes(num_workers=1))
    for step in range(train + evals):
        mode, mode_step = (ModeKeys.TRAIN, step) if step < train else (ModeKeys.EVAL, step - train)
        writer.submit(StepData(global_step=step, mode=mode, mode_step=mode_step, worker="worker_0",
                               tensors=_tensors(step)))
    writer.close()
    open(os.path.join(out, "training_job_end.ts"), "w").close()
    return out


@pytest.fixture(scope="module")
def layout_run(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SMDEBUG_LAYOUT", "smdebug-1.0.34")
        return _write_run(str(tmp_path_factory.mktemp("layouts") / "run"))


def _table(path, monkeypatch, by_layout, caplog):
    """(rows, warning text, trial) of to_table with or without the side-by-side reading."""
    monkeypatch.setattr(layouts, "_LAYOUT_MIN_FILES", 8 if by_layout else 10**9)
    trial = create_trial(path, wait_timeout=0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="smdebug.trials"):
        rows = list(trial.to_table().rows())
    return rows, caplog.text, trial


def test_most_files_are_read_side_by_side_and_give_the_same_rows(layout_run, monkeypatch, caplog):
    rows, text, trial = _table(layout_run, monkeypatch, True, caplog)
    general, general_text, general_trial = _table(layout_run, monkeypatch, False, caplog)
    assert rows == general and text == general_text == ""
    # Groups: TRAIN steps 1-9 and 10-39, EVAL mode steps 0-9 (steps 40-49). Step 0 (no
    # Event.step field) and EVAL mode steps 10-14 (5 files: too few) take the general walk.
    assert trial.stats["table_files_by_layout"] == 9 + 30 + 10
    assert general_trial.stats.get("table_files_by_layout", 0) == 0
    assert len(rows) == 55 * 6
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    assert assert_rows_equal_value_api(trial, df) == len(rows)


def test_a_runs_crc32c_follows_from_its_payloads_crc32cs():
    """The side-by-side CRC check: a run of records differing from the model only inside
    payloads has the model's CRC XOR each payload's CRC change advanced to the run's end."""
    rng = np.random.default_rng(3)
    for payloads in ([1], [7, 80], [80, 300, 5]):
        spans, at = [], 0
        for n in payloads:
            spans.append((at + 12, at + 12 + n))
            at += n + 16
        model = rng.integers(0, 256, at, dtype=np.uint8)
        for _ in range(10):
            other = model.copy()
            for a, b in spans:
                if rng.random() < 0.7:
                    where = rng.integers(a, b, size=3)
                    other[where] = rng.integers(0, 256, 3, dtype=np.uint8)
            delta = np.array([[google_crc32c.value(model[a:b].tobytes()) ^ google_crc32c.value(other[a:b].tobytes())
                               for a, b in spans]], np.uint32)
            shifted = layouts._shifted_xor(delta, tuple(at - b for _, b in spans))
            expected = google_crc32c.value(model.tobytes()) ^ int(shifted[0])
            assert expected == google_crc32c.value(other.tobytes())


def _damage(path, rng, kind):
    data = bytearray(open(path, "rb").read())
    if kind == "flip":
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == "digit":  # a mode step digit that is no digit
        at = data.find(b"mode_step\x12")
        data[at + 11] = ord("x")
    elif kind == "value":  # one byte of a value: only the payload CRC tells
        at = data.find(b"\x22\x08")
        data[at + 2 + rng.randrange(8)] ^= 0x10
    elif kind == "wall":
        data[13 + rng.randrange(8)] ^= 0x01
    elif kind == "truncate":
        del data[rng.randrange(len(data)):]
    elif kind == "missing":
        os.remove(path)
        return
    elif kind == "fifo":
        os.remove(path)
        os.mkfifo(path)
        return
    open(path, "wb").write(bytes(data))


@pytest.mark.parametrize("seed", range(6))
def test_damaged_files_give_the_same_rows_and_errors_as_the_general_walk(layout_run, tmp_path, monkeypatch,
                                                                        caplog, seed):
    rng = random.Random(seed)
    out = str(tmp_path / "copy")
    shutil.copytree(layout_run, out)
    events = sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(out, "events")) for f in fs)
    kinds = ["flip", "digit", "value", "wall", "truncate", "missing", "fifo"]
    # Always damage the first file of a group (a model candidate), and a few others.
    for path in [events[1], events[10]] + rng.sample(events, 6):
        if os.path.isfile(path) and not os.path.islink(path):
            _damage(path, rng, rng.choice(kinds))
    rows, text, trial = _table(out, monkeypatch, True, caplog)
    general, general_text, _ = _table(out, monkeypatch, False, caplog)
    assert rows == general
    assert text == general_text and "could not be read" in text
    assert trial.stats["table_files_by_layout"] > 0
    pd = pytest.importorskip("pandas")
    assert assert_rows_equal_value_api(trial, pd.DataFrame(rows, columns=list(COLUMNS))) == len(rows)


def test_every_file_damaged_the_same_way_still_reads(layout_run, tmp_path, monkeypatch, caplog):
    """A wrong payload CRC in every file (the model's too): every row is an error."""
    out = str(tmp_path / "copy")
    shutil.copytree(layout_run, out)
    for d, _, fs in os.walk(os.path.join(out, "events")):
        for f in fs:
            _damage(os.path.join(d, f), random.Random(0), "value")
    rows, text, _ = _table(out, monkeypatch, True, caplog)
    general, general_text, _ = _table(out, monkeypatch, False, caplog)
    assert rows == general and text == general_text


def test_runs_on_object_stores_give_the_same_rows(layout_run, monkeypatch, caplog):
    """fsspec storage has no read into a buffer: the same side-by-side checks on the bytes
    its ranged reads return."""
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for d, _, fs_names in os.walk(layout_run):
        for name in fs_names:
            path = os.path.join(d, name)
            fs.pipe_file("/bulk-layouts/run/" + os.path.relpath(path, layout_run), open(path, "rb").read())
    try:
        local, _, _ = _table(layout_run, monkeypatch, True, caplog)
        remote, text, trial = _table("memory://bulk-layouts/run", monkeypatch, True, caplog)
        assert remote == local and text == ""
        assert trial.stats["table_files_by_layout"] >= 40
    finally:
        fs.rm("/bulk-layouts", recursive=True)


def test_a_selection_reads_part_of_each_file_side_by_side(layout_run, monkeypatch):
    """Some tensors only: each file's wanted records are a subset (runs of adjacent records
    with gaps between them), grouped by their own offsets and names."""
    selections = [dict(names=["f32", "vec3"]), dict(regex="^(i64|scalar/loss)$", mode="eval"),
                  dict(names=["flag"], steps=range(3, 30, 2))]
    for selection in selections:
        got = {}
        for by_layout in (True, False):
            monkeypatch.setattr(layouts, "_LAYOUT_MIN_FILES", 8 if by_layout else 10**9)
            trial = create_trial(layout_run)
            got[by_layout] = list(trial.to_table(**selection).rows())
            if by_layout and "steps" not in selection:
                assert trial.stats["table_files_by_layout"] >= 8, selection
        assert got[True] == got[False] and got[True], selection


def test_damaged_first_files_do_not_spoil_their_group(layout_run, tmp_path, monkeypatch, caplog):
    """The first files of a group (steps 10-12) damaged in a record's structure: the model
    is taken from another file, and only the damaged files take the general walk."""
    out = str(tmp_path / "copy")
    shutil.copytree(layout_run, out)
    for step in (10, 11, 12):
        _damage(os.path.join(out, "events", f"{step:012d}", f"{step:012d}_worker_0.tfevents"), random.Random(step),
                "digit")
    rows, text, trial = _table(out, monkeypatch, True, caplog)
    general, general_text, _ = _table(out, monkeypatch, False, caplog)
    assert rows == general and text == general_text
    _, _, clean = _table(layout_run, monkeypatch, True, caplog)
    assert trial.stats["table_files_by_layout"] == clean.stats["table_files_by_layout"] - 3


def test_index_files_claiming_long_records_cost_their_rows_only(layout_run, tmp_path, monkeypatch, caplog):
    """Index files of steps 10-39 claim records of 60,000 bytes (a span of 420,000 bytes per
    file, inside the side-by-side limits) that the event files do not hold: short reads,
    so those files take the general walk, which reports them; the buffers stay 2 MiB."""
    import json

    out = str(tmp_path / "copy")
    shutil.copytree(layout_run, out)
    for step in range(10, 40):
        path = os.path.join(out, "index", "000000000", f"{step:012d}_worker_0.json")
        index = json.load(open(path))
        for k, entry in enumerate(index["tensor_payload"]):
            entry["start_idx"], entry["length"] = k * 60_000, 60_000
        open(path, "w").write(json.dumps(index))
    rows, text, trial = _table(out, monkeypatch, True, caplog)
    general, general_text, _ = _table(out, monkeypatch, False, caplog)
    assert rows == general and text == general_text
    assert "could not be read" in text
    assert sorted({r[0] for r in rows} & set(range(10, 40))) == []


def test_without_threads_the_reads_are_made_on_the_calling_thread(layout_run, monkeypatch, caplog):
    """Where no thread can be started (an interpreter shutting down), the same rows."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    expected, _, _ = _table(layout_run, monkeypatch, True, caplog)

    def refuse(*args, **kwargs):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(layouts, "_LAYOUT_BATCH_BYTES", 4096)  # several batches: the threaded reader
    monkeypatch.setattr(ThreadPoolExecutor, "submit", refuse)
    monkeypatch.setattr(threading.Thread, "start", refuse)
    rows, text, trial = _table(layout_run, monkeypatch, True, caplog)
    assert rows == expected and text == "" and trial.stats["table_files_by_layout"] >= 40
