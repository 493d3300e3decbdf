"""RunWriter: layout, publication order, crash safety, failure handling, back-pressure."""
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from smdebug.storage.format import codec, index, layout, records
from smdebug.modes import ModeKeys
from smdebug.storage.step_data import ScalarRun
from smdebug.storage.writer import RunWriter, StepData
from smdebug.storage.writer import run_writer as run_writer_module
from smdebug.storage.writer import step_sink as step_sink_module

#: These tests are about smdebug 1.0.34's files (docs/format.md 1-3); the run store has its own.
pytestmark = pytest.mark.usefixtures("layout_1034")

# The writer's modules log under their own names, all below this one.
WRITER_LOGGER = "smdebug.storage.writer"
COLLECTIONS = b'{"collections": {}, "_meta": {"num_workers": 1}}'


def _files(root):
    found = set()
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            found.add(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
    return found


def read_published_steps(out_dir):
    """Check every published index against its event file; return {index relpath: [DecodedTensor]}."""
    result = {}
    for relpath in sorted(f for f in _files(out_dir) if f.startswith("index/") and f.endswith(".json")):
        with open(os.path.join(out_dir, relpath), "rb") as handle:
            parsed = index.parse_index_json(handle.read(), relpath)
        step, worker = layout.parse_step_and_worker(relpath)
        decoded = []
        if parsed.tensors:
            assert parsed.event_file_name == layout.event_file_relpath(step, worker)
            with open(layout.join_under(out_dir, parsed.event_file_name), "rb") as handle:
                data = handle.read()
            assert [bytes(p) for p in records.iter_records(data)]  # whole file is well framed
            assert sum(entry.length for entry in parsed.tensors) == len(data)
            for entry in parsed.tensors:
                payload, end = records.read_record(data, entry.start_idx)
                assert end == entry.start_idx + entry.length
                records.verify_payload_crc(payload, entry.crc32c, relpath)
                tensor = codec.decode_tensor_event(payload)
                assert tensor.tag == entry.name and tensor.global_step == step
                assert (tensor.mode, tensor.mode_step) == (parsed.mode, parsed.mode_step)
                decoded.append(tensor)
        result[relpath] = (parsed, decoded)
    return result


def _step(global_step, mode, mode_step, worker="worker_0", **kwargs):
    return StepData(global_step, mode, mode_step, worker, **kwargs)


def test_layout_matches_format_1_1(tmp_path):
    out = tmp_path / "run"
    writer = RunWriter(out, "worker_0")
    writer.write_collections(COLLECTIONS)
    # save_interval 2: TRAIN 0..3 = global 0..3, EVAL 0..2 = global 4..6, TRAIN 4..5 = global 7..8.
    saved = [(0, ModeKeys.TRAIN, 0), (2, ModeKeys.TRAIN, 2), (4, ModeKeys.EVAL, 0), (6, ModeKeys.EVAL, 2), (7, ModeKeys.TRAIN, 4)]
    weight = np.arange(12, dtype=np.float32).reshape(3, 4)
    for global_step, mode, mode_step in saved:
        writer.submit(_step(global_step, mode, mode_step, tensors=[
            ("Net_fc1.weight", weight + global_step),
            ("smdebug/reductions/abs_l1/gradient/Net_fc1.weight", np.float32(global_step)),
        ]))
    assert writer.flush(timeout=30)
    assert not (out / layout.END_OF_JOB_FILE).exists()
    assert writer.close(timeout=30) and writer.failed is None

    expected = {"collections/000000000/worker_0_collections.json", "training_job_end.ts"}
    for global_step, _, _ in saved:
        expected.add(layout.event_file_relpath(global_step, "worker_0"))
        expected.add(layout.index_file_relpath(global_step, "worker_0"))
    assert _files(out) == expected
    assert (out / "training_job_end.ts").stat().st_size == 0
    assert (out / "collections/000000000/worker_0_collections.json").read_bytes() == COLLECTIONS

    steps = read_published_steps(out)
    for global_step, mode, mode_step in saved:
        parsed, tensors = steps[layout.index_file_relpath(global_step, "worker_0")]
        assert (parsed.mode, parsed.mode_step) == (mode, mode_step)
        assert [t.tag for t in tensors] == ["Net_fc1.weight", "smdebug/reductions/abs_l1/gradient/Net_fc1.weight"]
        assert np.array_equal(tensors[0].value, weight + global_step)
        assert tensors[1].value.shape == () and tensors[1].value == global_step
    meta = json.loads((out / layout.index_file_relpath(7, "worker_0")).read_bytes())["meta"]
    assert meta == {"mode": "TRAIN", "mode_step": 4, "event_file_name": "events/000000000007/000000000007_worker_0.tfevents"}


def test_pieces_of_one_step_share_one_index(tmp_path):
    writer = RunWriter(tmp_path, "worker_0")
    writer.submit(_step(3, ModeKeys.TRAIN, 3, tensors=[("w", np.ones(2))], shapes=[("w", (2,)), ("gradient/w", (2,))]))
    writer.submit(_step(3, ModeKeys.TRAIN, 3, tensors=[("scalar/lr", 0.1)]))
    writer.submit(_step(5, ModeKeys.TRAIN, 5, shapes=[("only_shape", (4, 5)), ("renamed", "tf/native:0", [2])]))
    writer.close(timeout=30)
    steps = read_published_steps(tmp_path)
    parsed, tensors = steps[layout.index_file_relpath(3, "worker_0")]
    assert [t.tag for t in tensors] == ["w", "scalar/lr"]
    # A shape entry would hide the raw value of "w" from the original reader (docs/format.md 3.2).
    assert parsed.shapes == [("gradient/w", (2,))]
    parsed, tensors = steps[layout.index_file_relpath(5, "worker_0")]
    assert parsed.event_file_name is None and tensors == []
    assert parsed.shapes == [("only_shape", (4, 5)), ("renamed", (2,))]
    assert parsed.shape_original_names == ["only_shape", "tf/native:0"]
    assert not (tmp_path / layout.event_file_relpath(5, "worker_0")).exists()


def _write_run(out, steps, one_record_at_a_time, monkeypatch):
    """Write ``steps`` [(global step, mode, mode step, [tensor lists submitted for it])]."""
    if one_record_at_a_time:
        monkeypatch.setattr(step_sink_module, "_LAYOUT_MIN_RECORDS", 10**9)
    writer = RunWriter(out, "worker_0", run_layout="smdebug-1.0.34")  # undo() below drops the module's pin
    for global_step, mode, mode_step, pieces in steps:
        for tensors in pieces:
            writer.submit(_step(global_step, mode, mode_step, tensors=tensors, wall_time=1.5 + global_step))
    assert writer.close(timeout=30) and writer.failed is None
    monkeypatch.undo()
    return {rel: (out / rel).read_bytes() for rel in _files(out)}, len(writer._sink._layouts)


def test_steps_like_the_previous_one_are_written_from_a_template_byte_for_byte(tmp_path, monkeypatch):
    """Steps repeating the tags, dtypes and shapes of an earlier one are joined from a cached
    layout: the files must be exactly those the one-record-at-a-time path writes."""
    reductions = [f"smdebug/reductions/{op}/layer{i}.weight" for i in range(4) for op in ("min", "max", "l2")]

    def small(step, dtype=np.float64):
        return [(tag, np.asarray(step * 10 + k, dtype=dtype)) for k, tag in enumerate(reductions)]

    def scalars(step, dtype=np.float64):  # numpy scalars, as reductions computed in a graph come
        return [(tag, dtype(step * 10 + k)) for k, tag in enumerate(reductions)]

    strided = np.arange(20, dtype=np.float32)[::2]  # not contiguous: that list goes one record at a time
    steps = []
    for global_step in [0, 1, 2, 127, 128, 129, 20000]:  # step and mode-step varints change length
        mode = ModeKeys.EVAL if global_step == 2 else ModeKeys.TRAIN
        steps.append((global_step, mode, global_step, [small(global_step)]))
    steps += [
        (20001, ModeKeys.TRAIN, 20001, [small(1, np.float32)]),  # same tags, other dtype
        (20002, ModeKeys.TRAIN, 20002, [small(2), small(3)[:9]]),  # a second list in the step: other offsets
        (20003, ModeKeys.TRAIN, 20003, [small(4)[:5] + [("strided", strided)] + small(4)[5:]]),
        (20004, ModeKeys.TRAIN, 20004, [small(5)[:3] + [("big", np.ones(70000, np.uint8))] + small(5)[3:]]),
        (20005, ModeKeys.TRAIN, 20005, [small(6)[:-1] + [("a_float", 2.5)]]),  # not an ndarray
        (20006, ModeKeys.TRAIN, 20006, [small(7)]),
        (20007, ModeKeys.TRAIN, 20007, [scalars(8)]),
        (20008, ModeKeys.TRAIN, 20008, [scalars(9, np.float32)]),  # same tags, scalars of another type
        (20009, ModeKeys.TRAIN, 20009, [scalars(10)]),
        (20010, ModeKeys.TRAIN, 20010, [small(11)]),  # 0-d arrays again
    ]
    templated, layouts = _write_run(tmp_path / "templated", steps, False, monkeypatch)
    one_by_one, no_layouts = _write_run(tmp_path / "one_by_one", steps, True, monkeypatch)
    assert templated == one_by_one
    # One layout per length of the step head and metadata (steps 0; 1-9; 127; 128-129; 20000-20010), one
    # for the 9-record list; the others were not all small contiguous arrays.
    assert (layouts, no_layouts) == (6, 0)
    published = read_published_steps(tmp_path / "templated")  # framing, offsets and CRCs check out
    _, tensors = published[layout.index_file_relpath(20006, "worker_0")]
    assert [t.tag for t in tensors] == reductions and [float(t.value) for t in tensors] == list(range(70, 82))
    _, tensors = published[layout.index_file_relpath(20008, "worker_0")]
    assert [t.value.dtype for t in tensors] == [np.float32] * 12 and [float(t.value) for t in tensors] == \
        list(range(90, 102))
    _, tensors = published[layout.index_file_relpath(20002, "worker_0")]
    assert [float(t.value) for t in tensors] == list(range(20, 32)) + list(range(30, 39))


def test_scalar_runs_are_written_byte_for_byte_as_their_pairs(tmp_path):
    """A ScalarRun (a batch's reductions in one array) is written from a template with
    vectorized CRCs: the files must be exactly those of the same (tag, float64) pairs, among
    other records, across step and mode-step varint lengths, NaN and infinities included."""
    tags = tuple(f"smdebug/reductions/{'abs_' if i % 3 == 0 else ''}{op}/{'x' * (i % 11)}layer{i}"
                 for i in range(60) for op in ("min", "max", "l2"))
    rng = np.random.default_rng(0)
    steps = []
    for global_step in [0, 1, 127, 128, 20000, 10 ** 11]:
        values = rng.standard_normal(len(tags))
        values[[3, 5, 7]] = [np.nan, np.inf, -np.inf]
        steps.append((global_step, values))
    written = []
    for name, as_run in (("pairs", False), ("runs", True)):
        out_dir = tmp_path / name
        writer = RunWriter(str(out_dir), "worker_0")
        for global_step, values in steps:
            mode = ModeKeys.EVAL if global_step == 1 else ModeKeys.TRAIN
            body = [ScalarRun(tags, values)] if as_run else list(zip(tags, values))
            few = [ScalarRun(tags[:3], values[:3])] if as_run else list(zip(tags[:3], values[:3]))
            tensors = [("scalar/loss", np.asarray(1.5, np.float32))] + body + few + [("x", np.arange(5.0))]
            writer.submit(_step(global_step, mode, global_step * 3, tensors=tensors, wall_time=1000.25 + global_step),
                          publish=True)
        writer.close()
        written.append({f: (out_dir / f).read_bytes() for f in _files(out_dir)})
    assert written[0] == written[1] and len(written[0]) > 2 * len(steps)
    published = read_published_steps(tmp_path / "runs")  # framing, offsets and CRCs check out
    _, tensors = published[layout.index_file_relpath(128, "worker_0")]
    values = steps[3][1]
    assert [t.tag for t in tensors[1:1 + len(tags)]] == list(tags)
    np.testing.assert_array_equal([float(t.value) for t in tensors[1:1 + len(tags)]], values)


def test_scalar_run_needs_one_value_per_tag():
    with pytest.raises(ValueError, match="2 tags, 3 values"):
        ScalarRun(("a", "b"), [1.0, 2.0, 3.0])


def test_crc_of_a_field_from_its_bytes_shares():
    """CRC32C is affine: the CRC of a payload whose field holds x is that of the payload with
    zeros there, XOR x's bytes' shares (which depend only on what follows the field)."""
    rng = np.random.default_rng(1)
    for _ in range(100):
        before, width, after = (int(v) for v in rng.integers([0, 1, 0], [40, 16, 40]))
        payload = rng.integers(0, 256, before + width + after).astype(np.uint8)
        fields = rng.integers(0, 256, (4, width)).astype(np.uint8)
        zeroed = payload.copy()
        zeroed[before:before + width] = 0
        shares = records.crc32c_field_shares(fields, after)
        for field, share in zip(fields, shares):
            payload[before:before + width] = field
            assert records.crc32c(payload.tobytes()) == records.crc32c(zeroed.tobytes()) ^ int(share)


def test_publish_makes_a_step_visible_at_once(tmp_path):
    writer = RunWriter(tmp_path, "worker_0")
    writer.submit(_step(0, ModeKeys.TRAIN, 0, tensors=[("a", np.ones(2))]))
    writer.submit(_step(1, ModeKeys.TRAIN, 1, tensors=[("a", np.ones(2))]), publish=True)
    writer.submit(_step(2, ModeKeys.TRAIN, 2, tensors=[("a", np.ones(2))]))
    writer.publish()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (tmp_path / layout.index_file_relpath(2, "worker_0")).exists():
        time.sleep(0.01)
    assert len(read_published_steps(tmp_path)) == 3  # without flush or close
    assert writer.close(timeout=30)


def test_several_workers_in_one_process(tmp_path):
    devices = [layout.serialize_worker_name(f"/job:worker/replica:0/task:0/device:GPU:{i}") for i in range(2)]
    writer = RunWriter(tmp_path, devices[0])
    for step in range(3):
        for device in devices:
            writer.submit(_step(step, ModeKeys.TRAIN, step, worker=device, tensors=[("x", np.full(3, step))]))
    writer.close(timeout=30)
    steps = read_published_steps(tmp_path)
    assert sorted(steps) == sorted(layout.index_file_relpath(s, d) for s in range(3) for d in devices)
    assert all(tensors[0].value[0] == layout.parse_step_and_worker(rel)[0] for rel, (_, tensors) in steps.items())


def _wait_for(path, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not path.exists():
        time.sleep(0.01)
    return path.exists()


def test_writer_wakes_for_a_batch_or_after_max_delay(tmp_path):
    # With a delay longer than the test, only a full batch wakes the writer.
    writer = RunWriter(tmp_path / "batched", "worker_0", max_delay=3000)
    first = tmp_path / "batched" / layout.index_file_relpath(0, "worker_0")
    writer.submit(_step(0, ModeKeys.TRAIN, 0, tensors=[("a", np.ones(2))]), publish=True)
    time.sleep(0.3)
    assert not first.exists(), "one queued step should not wake the writer"
    for step in range(1, run_writer_module.WAKE_AFTER_ITEMS):
        writer.submit(_step(step, ModeKeys.TRAIN, step, tensors=[("a", np.ones(2))]), publish=True)
    assert _wait_for(first)  # no flush, no close
    assert writer.close(timeout=30)
    assert len(read_published_steps(tmp_path / "batched")) == run_writer_module.WAKE_AFTER_ITEMS

    # A lone step is written once max_delay has passed, also by a writer idle long
    # enough to sleep until the next item.
    writer = RunWriter(tmp_path / "lone", "worker_0", max_delay=0.05)
    writer.submit(_step(0, ModeKeys.TRAIN, 0, tensors=[("a", np.ones(2))]), publish=True)
    assert _wait_for(tmp_path / "lone" / layout.index_file_relpath(0, "worker_0"))
    deadline = time.monotonic() + 30
    while not writer._sleeping and time.monotonic() < deadline:
        time.sleep(0.05)
    assert writer._sleeping, "an idle writer should stop looking at its empty queue"
    writer.submit(_step(1, ModeKeys.TRAIN, 1, tensors=[("a", np.ones(2))]), publish=True)
    assert _wait_for(tmp_path / "lone" / layout.index_file_relpath(1, "worker_0"))
    assert writer.close(timeout=30)


@pytest.mark.parametrize("bad", [0, -1, 1e9, "1", True, None])
def test_bad_max_delay_is_rejected(tmp_path, bad):
    with pytest.raises(ValueError, match="max_delay"):
        RunWriter(tmp_path, "worker_0", max_delay=bad)


def test_late_data_for_a_published_step_is_dropped_loudly(tmp_path, caplog):
    writer = RunWriter(tmp_path, "worker_0")
    writer.submit(_step(1, ModeKeys.TRAIN, 1, tensors=[("a", np.ones(1))]))
    writer.submit(_step(2, ModeKeys.TRAIN, 2, tensors=[("a", np.ones(1))]))
    with caplog.at_level(logging.WARNING, logger=WRITER_LOGGER):
        writer.submit(_step(1, ModeKeys.TRAIN, 1, tensors=[("late", np.ones(1))]))
        writer.close(timeout=30)
    assert any("already published" in r.getMessage() and "late" in r.getMessage() for r in caplog.records)
    _, tensors = read_published_steps(tmp_path)[layout.index_file_relpath(1, "worker_0")]
    assert [t.tag for t in tensors] == ["a"]


def test_late_data_for_the_last_published_step_joins_it(tmp_path, caplog):
    # A scalar saved after training ended, in the step it ended on (as 1.0.34 wrote it).
    writer = RunWriter(tmp_path, "worker_0")
    writer.submit(_step(1, ModeKeys.TRAIN, 1, tensors=[("a", np.ones(1))]), publish=True)
    assert writer.flush(timeout=30)
    before = read_published_steps(tmp_path)[layout.index_file_relpath(1, "worker_0")]
    with caplog.at_level(logging.WARNING, logger=WRITER_LOGGER):
        writer.submit(_step(1, ModeKeys.TRAIN, 1, tensors=[("scalar/final", np.array([0.5]))]), publish=True)
        writer.close(timeout=30)
    assert not [r for r in caplog.records if "already published" in r.getMessage()]
    _, tensors = read_published_steps(tmp_path)[layout.index_file_relpath(1, "worker_0")]
    assert [t.tag for t in tensors] == ["a", "scalar/final"]
    assert [t.tag for t in before[1]] == ["a"]


def test_unsupported_tensor_is_skipped_with_one_warning(tmp_path, caplog):
    writer = RunWriter(tmp_path, "worker_0")
    bad = np.array(["2020-01-01"], dtype="datetime64[D]")
    with caplog.at_level(logging.WARNING, logger=WRITER_LOGGER):
        for step in range(3):
            writer.submit(_step(step, ModeKeys.TRAIN, step, tensors=[("when", bad), ("ok", np.ones(2))]))
        writer.close(timeout=30)
    assert sum("cannot save tensor 'when'" in r.getMessage() for r in caplog.records) == 1
    assert writer.failed is None
    assert all([t.tag for t in tensors] == ["ok"] for _, tensors in read_published_steps(tmp_path).values())


def test_bad_step_data_fails_fast_on_the_callers_thread(tmp_path):
    writer = RunWriter(tmp_path, "worker_0")
    with pytest.raises(ValueError, match="global_step"):
        writer.submit(_step(-1, ModeKeys.TRAIN, 0))
    with pytest.raises(ValueError, match="worker"):
        writer.submit(_step(0, ModeKeys.TRAIN, 0, worker="../evil"))
    with pytest.raises(TypeError, match="StepData"):
        writer.submit({"global_step": 0})
    with pytest.raises(ValueError, match="max_pending_bytes"):
        RunWriter(tmp_path, "worker_0", max_pending_bytes=0)
    assert writer.close(timeout=30)


def test_deleted_out_dir_fails_once_and_never_blocks_training(tmp_path, caplog):
    out = tmp_path / "run"
    writer = RunWriter(out, "worker_0", max_pending_bytes=1 << 20)
    writer.submit(_step(0, ModeKeys.TRAIN, 0, tensors=[("w", np.ones(4))]))
    assert writer.flush(timeout=30)
    shutil.rmtree(out)
    big = np.ones(1 << 18)  # 2 MiB: above max_pending_bytes, would block a writer that is behind
    with caplog.at_level(logging.WARNING, logger=WRITER_LOGGER):
        for step in range(1, 4):
            writer.submit(_step(step, ModeKeys.TRAIN, step, tensors=[("w", big)]))
        assert writer.flush(timeout=30) is False
        started = time.monotonic()
        for step in range(4, 50):
            writer.submit(_step(step, ModeKeys.TRAIN, step, tensors=[("w", big)]))
            writer.write_collections(COLLECTIONS)
        assert time.monotonic() - started < 1.0
        assert writer.close(timeout=30) is False
        writer.close()
    assert isinstance(writer.failed, FileNotFoundError)
    failures = [r for r in caplog.records if "writer failed" in r.getMessage()]
    assert len(failures) == 1 and "FileNotFoundError" in failures[0].getMessage()
    assert not out.exists()  # not silently recreated


def test_unusable_out_dir_fails_at_start(tmp_path, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, logger=WRITER_LOGGER):
        writer = RunWriter(blocker / "run", "worker_0")
        writer.submit(_step(0, ModeKeys.TRAIN, 0, tensors=[("w", np.ones(4))]))
        assert writer.flush(timeout=30) is False
        writer.close(timeout=30)
    assert writer.failed is not None
    assert sum("writer failed" in r.getMessage() for r in caplog.records) == 1


def test_submit_blocks_when_behind_and_drops_nothing(tmp_path, caplog):
    writer = RunWriter(tmp_path, "worker_0", max_pending_bytes=100_000)
    gate = threading.Event()
    handle = writer._handle

    def slow_handle(kind, payload):  # a disk that stalls until the gate opens
        gate.wait(30)
        handle(kind, payload)

    writer._handle = slow_handle
    chunk = np.ones(10_000)  # 80 kB
    writer.submit(_step(0, ModeKeys.TRAIN, 0, tensors=[("x", chunk)]))
    with caplog.at_level(logging.WARNING, logger=WRITER_LOGGER):
        second = threading.Thread(target=writer.submit, args=(_step(1, ModeKeys.TRAIN, 1, tensors=[("x", chunk)]),))
        second.start()
        second.join(0.3)
        assert second.is_alive(), "submit should wait while the writer is over its memory budget"
        assert any("writer is behind" in r.getMessage() for r in caplog.records)
        gate.set()
        second.join(30)
    assert not second.is_alive()
    for step in range(2, 6):
        writer.submit(_step(step, ModeKeys.TRAIN, step, tensors=[("x", chunk)]))
    assert writer.close(timeout=30)
    assert len(read_published_steps(tmp_path)) == 6


def test_close_is_idempotent_and_end_marker_optional(tmp_path, caplog):
    writer = RunWriter(tmp_path, "worker_0")
    writer.submit(_step(0, ModeKeys.TRAIN, 0, tensors=[("x", np.ones(1))]))
    assert writer.close(write_end_marker=False, timeout=30)
    assert writer.close(timeout=30)
    assert not (tmp_path / layout.END_OF_JOB_FILE).exists()
    with caplog.at_level(logging.WARNING, logger=WRITER_LOGGER):
        writer.submit(_step(1, ModeKeys.TRAIN, 1, tensors=[("x", np.ones(1))]))
        writer.submit(_step(2, ModeKeys.TRAIN, 2, tensors=[("x", np.ones(1))]))
    assert sum("closed" in r.getMessage() for r in caplog.records) == 1
    assert writer.flush(timeout=1)
    assert len(read_published_steps(tmp_path)) == 1


def test_metric_lines(tmp_path):
    writer = RunWriter(tmp_path / "run", "worker_0")
    metrics = tmp_path / "metrics.jsonl"
    writer.write_metric_line(metrics, '{"loss": 1}')
    writer.write_metric_line(metrics, '{"loss": 0.5}')
    writer.write_metric_line(tmp_path / "new_dir" / "m.jsonl", "made")  # its directory is made
    (tmp_path / "a_file").write_text("")
    writer.write_metric_line(tmp_path / "a_file" / "m.jsonl", "lost")  # cannot be: costs the line only
    writer.submit(_step(0, ModeKeys.TRAIN, 0, tensors=[("x", np.ones(1))]))
    assert writer.close(timeout=30) and writer.failed is None
    assert metrics.read_text() == '{"loss": 1}\n{"loss": 0.5}\n'
    assert (tmp_path / "new_dir" / "m.jsonl").read_text() == "made\n"
    assert len(read_published_steps(tmp_path / "run")) == 1


_CHILD_PREAMBLE = """
import atexit, os, sys, numpy as np
from smdebug.storage.writer import RunWriter, StepData
from smdebug.storage.writer import run_writer as run_writer_module
from smdebug.modes import ModeKeys
writer = RunWriter(sys.argv[1], "worker_0")
writer.write_collections(b'{"collections": {}, "_meta": {"num_workers": 1}}')
rng = np.random.default_rng(0)
"""


def _run_child(body, *args, **kwargs):
    code = textwrap.dedent(_CHILD_PREAMBLE) + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], **kwargs)


def test_atexit_close_publishes_everything(tmp_path):
    child = _run_child("""
        atexit.register(writer.close)
        atexit.register(writer.close)  # a second registration (hook and user) is harmless
        for step in range(5):
            writer.submit(StepData(step, ModeKeys.TRAIN, step, "worker_0", tensors=[("x", np.full(100, step))]))
        # no explicit close: the interpreter exits
        """, tmp_path)
    assert child.wait(60) == 0
    assert (tmp_path / layout.END_OF_JOB_FILE).exists()
    assert len(read_published_steps(tmp_path)) == 5


@pytest.mark.parametrize("published_before_kill", [1, 7])
def test_kill_9_leaves_every_published_step_readable(tmp_path, published_before_kill):
    child = _run_child("""
        step = 0
        while True:
            tensors = [(f"t{i}", rng.standard_normal(int(rng.integers(1, 40_000))).astype(np.float32)) for i in range(8)]
            writer.submit(StepData(step, ModeKeys.TRAIN, step, "worker_0", tensors=tensors))
            writer.submit(StepData(step, ModeKeys.TRAIN, step, "worker_0", tensors=[("scalar/lr", 0.1)]))
            step += 1
        """, tmp_path, stderr=subprocess.PIPE)
    index_dir = tmp_path / "index"  # os.walk of a missing directory yields nothing
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            assert child.poll() is None, child.stderr.read().decode()
            published = sum(name.endswith(".json") for _, _, files in os.walk(index_dir) for name in files)
            if published >= published_before_kill:
                break
            time.sleep(0.005)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        child.stderr.close()
    steps = read_published_steps(tmp_path)
    assert len(steps) >= published_before_kill
    for parsed, tensors in steps.values():
        assert [t.tag for t in tensors] == [f"t{i}" for i in range(8)] + ["scalar/lr"]
    assert not (tmp_path / layout.END_OF_JOB_FILE).exists()
    # Nothing under a final name is partial: every event file is a whole number of records.
    for relpath in _files(tmp_path):
        if relpath.endswith(".tfevents"):
            list(records.iter_records((tmp_path / relpath).read_bytes()))
