"""The run store's writer (docs/format.md 10): what it puts on disk, what a crash leaves, and
conversion both ways. Read back with pyarrow and DuckDB-free helpers of the storage layer
(the Trial's reader has tests of its own in tests/analysis)."""
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from smdebug.modes import ModeKeys  # noqa: E402
from smdebug.storage import store_rows  # noqa: E402
from smdebug.storage.convert import convert  # noqa: E402
from smdebug.storage.step_data import ScalarRun, StepData  # noqa: E402
from smdebug.storage.writer import RunWriter  # noqa: E402

TAGS = [f"smdebug/reductions/{r}/layer{i}.weight" for i in range(4) for r in ("min", "max", "abs_l2")]


def _step(step, worker="worker_0", mode=ModeKeys.TRAIN):
    return StepData(step, mode, step, worker, wall_time=1000.0 + step, tensors=[
        ("loss", np.float32(1.0 / (step + 1))),
        ScalarRun(TAGS, np.arange(len(TAGS)) + step / 7.0),
        ("layer0.weight", np.full((3, 4), step, np.float32)),
        ("count", np.array([step], np.int64)),
    ])


def _rows(run_dir, worker="worker_0"):
    return store_rows.local_segments(run_dir, worker).all_rows()


def test_files_and_columns_of_a_closed_run(tmp_path):
    w = RunWriter(str(tmp_path), "worker_0", run_layout="store", segment_steps=4)
    for step in range(10):
        w.submit(_step(step))
    assert w.close()
    names = sorted(os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs)
    part = "worker=worker_0"
    assert names == sorted(
        ["store/_layout.json", "training_job_end.ts"]
        + [f"store/statistics/{part}/part-{s:06d}.parquet" for s in range(3)]
        + [f"store/tensors/{part}/part-{s:06d}.parquet" for s in range(3)]
        + [f"store/chunks/{part}/{s:06d}-000.events" for s in range(3)])
    assert json.loads((tmp_path / "store/_layout.json").read_text()) == {"layout": "store", "version": 1}
    stats, tensors = _rows(str(tmp_path))
    assert stats.schema.names == ["step", "mode", "mode_step", "tensor", "reduction", "value", "dtype", "ndim",
                                  "wall_time"]
    rows = stats.to_pylist()
    assert len(rows) == 10 * (len(TAGS) + 2)
    loss = [r for r in rows if r["tensor"] == "loss"]
    assert [r["value"] for r in loss] == [float(np.float32(1.0 / (s + 1))) for s in range(10)]
    assert {(r["dtype"], r["ndim"], r["reduction"]) for r in loss} == {("float32", 0, "")}
    count = [r for r in rows if r["tensor"] == "count"]
    assert {(r["dtype"], r["ndim"]) for r in count} == {("int64", 1)}
    l2 = [r["value"] for r in rows if r["tensor"] == "layer2.weight" and r["reduction"] == "abs_l2"]
    assert l2 == [8 + s / 7.0 for s in range(10)]
    whole = tensors.to_pylist()
    assert [r["step"] for r in whole] == list(range(10))
    first = whole[3]
    with open(tmp_path / first["file"], "rb") as fh:
        fh.seek(first["offset"])
        data = fh.read(first["length"])
    from smdebug.storage.format.codec import decode_tensor_event
    from smdebug.storage.format.records import read_record

    payload, _ = read_record(memoryview(data), 0, "full")
    decoded = decode_tensor_event(payload)
    assert decoded.tag == "layer0.weight" and decoded.global_step == 3
    assert np.array_equal(decoded.value, np.full((3, 4), 3, np.float32))
    assert first["shape"] == [3, 4] and first["dtype"] == "float32"


def test_duckdb_reads_the_store_with_hive_partitions(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    for worker in ("worker_0", "worker_1"):
        w = RunWriter(str(tmp_path), worker, run_layout="store", segment_steps=3)
        for step in range(5):
            w.submit(_step(step, worker))
        w.close()
    got = duckdb.sql(f"SELECT worker, count(*) AS n, sum(value) AS s FROM read_parquet("
                     f"'{tmp_path}/store/statistics/*/*.parquet', hive_partitioning=true) "
                     "GROUP BY worker ORDER BY worker").fetchall()
    expected = 0.0
    for r in _rows(str(tmp_path))[0].to_pylist():
        expected += r["value"]
    assert [(w, n) for w, n, _ in got] == [("worker_0", 5 * (len(TAGS) + 2)), ("worker_1", 5 * (len(TAGS) + 2))]
    assert sum(s for _, _, s in got) == pytest.approx(2 * expected)


def test_a_live_segment_is_readable_before_it_is_sealed(tmp_path):
    w = RunWriter(str(tmp_path), "worker_0", run_layout="store", segment_steps=1000)
    for step in range(5):
        w.submit(_step(step), publish=True)
    deadline = time.monotonic() + 10
    steps = []
    while time.monotonic() < deadline:
        steps = sorted(set(_rows(str(tmp_path))[0].column("step").to_pylist()))
        if steps == list(range(5)):
            break
        time.sleep(0.05)
    assert steps == list(range(5))  # visible within the writer's max_delay, nothing sealed yet
    assert not os.path.exists(tmp_path / "store/statistics")
    w.close()
    assert not os.path.exists(tmp_path / "store/live/worker=worker_0/000000.arrows")
    assert sorted(set(_rows(str(tmp_path))[0].column("step").to_pylist())) == list(range(5))


def test_a_live_file_cut_anywhere_gives_whole_steps(tmp_path):
    w = RunWriter(str(tmp_path), "worker_0", run_layout="store", segment_steps=1000)
    for step in range(6):
        w.submit(_step(step), publish=True)
        assert w.flush()
    live = tmp_path / "store/live/worker=worker_0/000000.arrows"
    data = live.read_bytes()
    w._sink.abandon()  # as if killed: nothing sealed
    per_step = len(TAGS) + 2
    seen = []
    for cut in list(range(0, len(data), 97)) + [len(data)]:
        stats, tensors = store_rows.split_live(store_rows.read_live(data[:cut]))
        steps = stats.column("step").to_pylist()
        n = len(set(steps))
        assert steps == [s for s in range(n) for _ in range(per_step)]
        assert tensors.column("step").to_pylist() == list(range(n))
        seen.append(n)
    assert seen[0] == 0 and seen[-1] == 6 and seen == sorted(seen)


def test_a_damaged_sealed_segment_costs_that_segment_with_one_warning(tmp_path, caplog):
    w = RunWriter(str(tmp_path), "worker_0", run_layout="store", segment_steps=2)
    for step in range(6):
        w.submit(_step(step))
    w.close()
    bad = tmp_path / "store/statistics/worker=worker_0/part-000001.parquet"
    bad.write_bytes(bad.read_bytes()[:-20])  # the footer cut off
    with caplog.at_level(logging.WARNING, logger="smdebug.trials"):
        stats, _ = _rows(str(tmp_path))
    assert sorted(set(stats.column("step").to_pylist())) == [0, 1, 4, 5]
    assert [r.getMessage() for r in caplog.records if "part-000001" in r.getMessage()]


_KILLED_WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    sys.path.insert(0, {tests!r})
    from test_store_writer import _step
    from smdebug.storage.writer import RunWriter
    w = RunWriter(sys.argv[1], "worker_0", run_layout="store", segment_steps=7, max_delay=0.01)
    step = 0
    while True:
        w.submit(_step(step), publish=True)
        step += 1
        if step % 5 == 0:
            print(step, flush=True)
        time.sleep(0.002)
""")


@pytest.mark.parametrize("delay", [0.3, 0.55, 0.8, 1.1])
def test_kill_9_at_any_instant_leaves_whole_steps(tmp_path, delay):
    script = tmp_path / "writer.py"
    script.write_text(_KILLED_WRITER.format(tests=os.path.dirname(__file__)))
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(script), str(run)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline()  # it writes
    deadline = time.monotonic() + 30
    while not os.path.exists(run / "store/live") and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stats, tensors = _rows(str(run))
    steps = stats.column("step").to_pylist()
    n = len(set(steps))
    assert n > 5
    per_step = len(TAGS) + 2
    assert steps == [s for s in range(n) for _ in range(per_step)]  # every step whole, in order, none missing
    assert tensors.column("step").to_pylist() == list(range(n))
    for row in tensors.to_pylist():  # every record a row points to is on disk
        assert os.path.getsize(run / row["file"]) >= row["offset"] + row["length"]


def test_a_restarted_worker_continues_after_the_segments_it_left(tmp_path):
    for start in (0, 10):
        w = RunWriter(str(tmp_path), "worker_0", run_layout="store", segment_steps=4)
        for step in range(start, start + 6):
            w.submit(_step(step))
        w.close()
    names = sorted(os.listdir(tmp_path / "store/statistics/worker=worker_0"))
    assert names == [f"part-{s:06d}.parquet" for s in range(4)]
    steps = sorted(set(_rows(str(tmp_path))[0].column("step").to_pylist()))
    assert steps == list(range(6)) + list(range(10, 16))


def test_layout_is_refused_by_name():
    with pytest.raises(ValueError, match="smdebug-1.0.34"):
        RunWriter("/tmp/never", "worker_0", run_layout="1.0.34")


def test_convert_both_ways_keeps_every_value(tmp_path):
    src = str(tmp_path / "store")
    w = RunWriter(src, "worker_0", run_layout="store", segment_steps=4)
    for step in range(9):
        data = _step(step, mode=ModeKeys.TRAIN if step < 6 else ModeKeys.EVAL)
        data.shapes = [("layer1.bias", (7,))]
        w.submit(data)
    w.close()
    os.makedirs(os.path.join(src, "collections/000000000"))
    with open(os.path.join(src, "collections/000000000/worker_0_collections.json"), "w") as fh:
        fh.write('{"collections": {}}')
    old, back = str(tmp_path / "old"), str(tmp_path / "back")
    assert convert(src, old, "1.0.34") == 9
    assert sorted(os.listdir(old)) == ["collections", "events", "index", "training_job_end.ts"]
    assert convert(old, back, "store") == 9
    a, b = _rows(src), _rows(back)
    for x, y in zip(a, b):
        keep = [c for c in x.column_names if c not in ("file", "offset")]

        def key(row):
            return row["step"], row["tensor"], row.get("reduction") or ""

        assert sorted(x.select(keep).to_pylist(), key=key) == sorted(y.select(keep).to_pylist(), key=key)
    with pytest.raises(Exception, match="already in the 'store' layout"):
        convert(back, str(tmp_path / "again"), "store")


def test_workers_writing_one_run_at_once_and_flush_makes_steps_readable(tmp_path):
    writers = [RunWriter(str(tmp_path), f"worker_{r}", run_layout="store") for r in range(4)]
    for step in range(3):
        for r, w in enumerate(writers):
            w.submit(_step(step, f"worker_{r}"), publish=True)
    for r, w in enumerate(writers):
        assert w.flush() and w.failed is None
        # flush() returns once what it flushed is readable: no polling
        assert sorted(set(_rows(str(tmp_path), f"worker_{r}")[0].column("step").to_pylist())) == [0, 1, 2]
    assert all(w.close() for w in writers)
    assert store_rows.local_workers(str(tmp_path)) == [f"worker_{r}" for r in range(4)]


def test_a_sibling_workers_close_removing_the_shared_live_folder_loses_nothing(tmp_path, monkeypatch):
    """A worker's close removes ``store/live`` once it is empty. Two DDP workers hit the race:
    worker 1 had just made (found) ``store/live`` when worker 0's close removed it, so making
    ``store/live/worker=worker_1`` failed and worker 1's writer stopped. It makes them again."""
    sibling = RunWriter(str(tmp_path), "worker_0", run_layout="store")
    sibling.submit(_step(0, "worker_0"))
    assert sibling.flush()
    real_mkdir, closed = os.mkdir, []

    def mkdir_then_the_sibling_closes(path, *args, **kwargs):
        try:
            real_mkdir(path, *args, **kwargs)
        finally:
            if path.endswith("store/live") and not closed:
                closed.append(sibling.close())  # seals worker 0, removes the empty shared folder

    monkeypatch.setattr(os, "mkdir", mkdir_then_the_sibling_closes)
    writer = RunWriter(str(tmp_path), "worker_1", run_layout="store")
    for step in range(3):
        writer.submit(_step(step, "worker_1"), publish=True)
    assert writer.flush() and writer.failed is None
    assert closed == [True]
    assert writer.close()
    for worker, steps in (("worker_0", [0]), ("worker_1", [0, 1, 2])):
        assert sorted(set(_rows(str(tmp_path), worker)[0].column("step").to_pylist())) == steps


@pytest.mark.parametrize("folder", ["live/worker=worker_1", "chunks/worker=worker_1", "statistics/worker=worker_1"])
def test_a_folder_swept_by_a_sibling_before_the_file_in_it_is_opened_is_made_again(tmp_path, monkeypatch, folder):
    """Between making a folder and opening a file in it, a sibling worker may remove the
    folder while it is empty (its close, or an overwrite's sweep of the last run): the file
    still gets written."""
    real_mkdir, swept = os.mkdir, []

    def mkdir_then_swept(path, *args, **kwargs):
        real_mkdir(path, *args, **kwargs)
        if path.endswith(f"store/{folder}") and not swept:
            swept.append(path)
            os.rmdir(path)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swept)
    writer = RunWriter(str(tmp_path), "worker_1", run_layout="store", segment_steps=2)
    for step in range(3):
        writer.submit(_step(step, "worker_1"), publish=True)
    assert writer.close() and writer.failed is None and swept
    assert sorted(set(_rows(str(tmp_path), "worker_1")[0].column("step").to_pylist())) == [0, 1, 2]


_FULL_DISK_TRAINING = textwrap.dedent("""
    import resource, signal, sys
    import numpy as np
    import smdebug as smd
    # A disk that fills up: no file of this process may grow past 256 KiB (EFBIG, as ENOSPC would).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))
    hook = smd.Hook(out_dir=sys.argv[1], save_config=smd.SaveConfig(save_interval=1), layout="store")
    flushed = 0
    for step in range(400):
        hook.begin_step()
        hook.save_tensor("w", np.full(1000, step, np.float32), "weights")
        hook.save_scalar("loss", float(step))
        hook.end_step()
        if hook.flush(timeout=10):
            flushed = step + 1
    hook.close()
    print(flushed)
""")


def test_a_full_disk_costs_only_what_was_never_flushed(tmp_path):
    """docs/faults.md on the run store: the writer fails once, with one warning; training goes
    on; every step flushed before the disk filled is readable, whole."""
    script = tmp_path / "train.py"
    script.write_text(_FULL_DISK_TRAINING)
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    flushed = int(proc.stdout.split()[-1])
    assert 0 < flushed < 400  # the disk filled during the run
    assert proc.stderr.count("smdebug writer failed and stops saving data") == 1, proc.stderr[-3000:]
    stats, tensors = _rows(str(run))
    steps = sorted(set(stats.column("step").to_pylist()))
    assert steps[:flushed] == list(range(flushed))
    assert tensors.column("step").to_pylist()[:len(steps)] == steps  # each step's tensor with its scalar
    for row in tensors.to_pylist():
        assert os.path.getsize(run / row["file"]) >= row["offset"] + row["length"]


def test_a_killed_writers_live_segment_is_sealed_by_the_next_process_and_by_smdebug_sync(tmp_path):
    from smdebug.storage.uploader import spool_files

    run = tmp_path / "run"
    w = RunWriter(str(run), "worker_0", run_layout="store")
    for step in range(5):
        w.submit(_step(step), publish=True)
    assert w.flush()
    w._sink.abandon()  # as if killed: the segment is left live
    live = run / "store/live/worker=worker_0/000000.arrows"
    assert live.exists()
    assert not [rel for rel, _ in spool_files(str(run)) if "/live/" in rel]  # never uploaded as it is
    written = store_rows.seal_left_live_segments(str(run))
    assert written == ["store/tensors/worker=worker_0/part-000000.parquet",
                       "store/statistics/worker=worker_0/part-000000.parquet"] and not live.exists()
    order = [rel for rel, _ in spool_files(str(run)) if rel.startswith("store/") and "_layout" not in rel]
    assert [rel.split("/")[1] for rel in order] == ["chunks", "tensors", "statistics"]  # the seal goes up last
    # and a new process of the worker seals what it finds live, then goes on after it
    w = RunWriter(str(run), "worker_0", run_layout="store")
    for step in range(5):
        w.submit(_step(step), publish=True)
    assert w.flush()
    w._sink.abandon()
    run = tmp_path / "run2"
    os.rename(tmp_path / "run", run)
    w2 = RunWriter(str(run), "worker_0", run_layout="store")
    w2.submit(_step(5), publish=True)
    w2.close()
    assert sorted(set(_rows(str(run))[0].column("step").to_pylist())) == list(range(6))
    assert not (run / "store/live").exists()
    assert sorted(os.listdir(run / "store/statistics/worker=worker_0")) == [f"part-{s:06d}.parquet" for s in range(3)]
