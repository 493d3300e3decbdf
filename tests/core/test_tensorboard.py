"""TensorBoard output, checked with TensorBoard's own (CRC-verifying) readers."""
import json
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

from smdebug.storage.format import layout
from smdebug.modes import ModeKeys
from smdebug.storage.writer import RunWriter, StepData
from smdebug.storage.writer.tensorboard import DEFAULT_BUCKET_EDGES, TensorBoardWriter, clean_tag, make_histogram

pywrap = pytest.importorskip("tensorboard.compat.tensorflow_stub.pywrap_tensorflow")
errors = pytest.importorskip("tensorboard.compat.tensorflow_stub.errors")
event_pb2 = pytest.importorskip("tensorboard.compat.proto.event_pb2")


def read_with_tensorboard(path):
    """All events of a file through TensorBoard's record reader, which verifies both CRCs."""
    reader = pywrap.PyRecordReader_New(os.fspath(path))
    events = []
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return events
        event = event_pb2.Event()
        event.ParseFromString(reader.record())
        events.append(event)


def _tb_files(tb_dir, mode):
    folder = tb_dir / mode
    return sorted(folder / name for name in os.listdir(folder))


@pytest.fixture
def run(tmp_path):
    out, tb_dir = tmp_path / "run", tmp_path / "tb"
    writer = RunWriter(out, "worker_0", tensorboard_dir=tb_dir)
    rng = np.random.default_rng(0)
    plan = [(0, ModeKeys.TRAIN, 0), (2, ModeKeys.TRAIN, 2), (4, ModeKeys.EVAL, 0), (7, ModeKeys.TRAIN, 4)]
    for global_step, mode, mode_step in plan:
        writer.submit(StepData(
            global_step, mode, mode_step, "worker_0",
            tensors=[("Net_fc1.weight", np.ones(3, np.float32)),
                     ("smdebug/reductions/l2/Net_fc1.weight", np.asarray(np.float32(global_step + 0.5))),
                     ("smdebug/reductions/abs_max/Net_fc1.weight", np.asarray(np.float64(global_step * 2.0)))],
            tb_scalars=[("CrossEntropyLoss_output_0", 1.0 / (global_step + 1)), ("scalar/my lr:0", 0.25)],
            tb_histograms=[
                ("weights/Net_fc1.weight", rng.standard_normal(1000)),
                ("weights/ints", np.arange(-5, 6)),
                ("weights/bf16", np.array([0.5, 1.5], ml_dtypes.bfloat16)),
                ("weights/mask", np.array([True, False])),
                ("weights/empty", np.zeros(0)),
                ("weights/diverged", np.array([1.0, np.nan])),
            ],
        ))
    assert writer.close(timeout=30)
    return out, tb_dir, plan


def test_tensorboard_files_are_valid_and_complete(run):
    out, tb_dir, plan = run
    assert sorted(os.listdir(tb_dir)) == ["EVAL", "TRAIN"]
    for mode in ("TRAIN", "EVAL"):
        files = _tb_files(tb_dir, mode)
        assert len(files) == 1
        first_step = min(g for g, m, _ in plan if m.name == mode)
        assert files[0].name == os.path.basename(layout.tensorboard_file_relpath(mode, first_step, os.getpid(), os.uname().nodename))
        events = read_with_tensorboard(files[0])
        assert events[0].file_version == "brain.Event:2"
        # Each mode's file is stepped by the mode step (a TensorBoard run per mode).
        steps = [e.step for e in events[1:]]
        assert steps == [ms for _, m, ms in plan if m.name == mode]
        global_of = {ms: g for g, m, ms in plan if m.name == mode}
        for event in events[1:]:
            values = {v.tag: v for v in event.summary.value}
            # scalars with cleaned tags, saved reductions as scalars; non-showable histograms skipped
            assert sorted(values) == ["CrossEntropyLoss_output_0", "Net_fc1.weight/abs_max", "Net_fc1.weight/l2",
                                      "scalar/my_lr_0", "weights/Net_fc1.weight", "weights/bf16", "weights/ints"]
            g = global_of[event.step]
            assert values["CrossEntropyLoss_output_0"].simple_value == pytest.approx(1.0 / (g + 1))
            assert values["Net_fc1.weight/l2"].simple_value == g + 0.5
            assert values["Net_fc1.weight/abs_max"].simple_value == g * 2.0
            histo = values["weights/Net_fc1.weight"].histo
            assert histo.num == 1000 and sum(histo.bucket) == 1000
            ints = values["weights/ints"].histo
            assert (ints.min, ints.max, ints.num, ints.sum, ints.sum_squares) == (-5, 5, 11, 0, 110)
            assert values["weights/bf16"].histo.sum == 2.0


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_event_files_fail_tensorboards_crc_check_and_tb_files_pass(run):
    # docs/format.md 2.1: TensorBoard's reader is the footer oracle. events/ files carry smdebug's constant footer.
    out, tb_dir, _ = run
    with pytest.raises(errors.DataLossError, match="crc"):
        read_with_tensorboard(out / layout.event_file_relpath(0, "worker_0"))
    assert read_with_tensorboard(_tb_files(tb_dir, "TRAIN")[0])


def test_event_accumulator_reads_scalars_and_histograms(run):
    _, tb_dir, _ = run
    # In a child without TensorFlow (blocked), so TensorBoard uses its own reader and the test stays fast.
    script = textwrap.dedent("""
        import json, sys
        sys.modules["tensorflow"] = None
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        result = {}
        for mode in ("TRAIN", "EVAL"):
            acc = EventAccumulator(sys.argv[1] + "/" + mode, size_guidance={"histograms": 0})  # keep all
            acc.Reload()
            result[mode] = {
                "loss": [(s.step, s.value) for s in acc.Scalars("CrossEntropyLoss_output_0")],
                "histo_steps": [h.step for h in acc.Histograms("weights/Net_fc1.weight")],
                "l2": [(s.step, s.value) for s in acc.Scalars("Net_fc1.weight/l2")],
                "tags": sorted(acc.Tags()["scalars"]),
            }
        print(json.dumps(result))
    """)
    output = subprocess.run([sys.executable, "-c", script, str(tb_dir)], capture_output=True, text=True, timeout=120)
    assert output.returncode == 0, output.stderr
    result = json.loads(output.stdout.strip().splitlines()[-1])
    # Mode steps: TRAIN 0, 2, 4 (global 0, 2, 7), EVAL 0 (global 4).
    assert [s for s, _ in result["TRAIN"]["loss"]] == [0, 2, 4]
    assert result["TRAIN"]["loss"][1][1] == pytest.approx(1 / 3)
    assert result["EVAL"]["loss"] == [[0, pytest.approx(0.2)]]
    assert result["TRAIN"]["histo_steps"] == [0, 2, 4]
    # Saved reductions are scalars <tensor>/<reduction>.
    assert result["TRAIN"]["l2"] == [[0, 0.5], [2, 2.5], [4, 7.5]]
    assert result["EVAL"]["l2"] == [[0, 4.5]]
    assert result["TRAIN"]["tags"] == ["CrossEntropyLoss_output_0", "Net_fc1.weight/abs_max", "Net_fc1.weight/l2",
                                       "scalar/my_lr_0"]


def test_default_edges_are_tensorflows():
    assert len(DEFAULT_BUCKET_EDGES) == 1549
    assert DEFAULT_BUCKET_EDGES[774] == 0.0 and DEFAULT_BUCKET_EDGES[775] == 1e-12
    assert np.all(np.diff(DEFAULT_BUCKET_EDGES) > 0)
    assert DEFAULT_BUCKET_EDGES[-1] < 1e20 <= DEFAULT_BUCKET_EDGES[-1] * 1.1


def test_histogram_trimming_keeps_one_empty_bucket_on_the_left():
    histo = make_histogram(np.array([1.0, 1.0, 2.0, 50.0]))
    counts = np.array(histo.bucket)
    limits = np.array(histo.bucket_limit)
    assert counts[0] == 0 and counts[1] > 0 and counts[-1] > 0
    assert counts.sum() == histo.num == 4
    assert np.isin(limits, DEFAULT_BUCKET_EDGES).all()
    assert limits[0] <= 1.0 < limits[1] and limits[-2] <= 50.0 < limits[-1]
    assert (histo.min, histo.max, histo.sum, histo.sum_squares) == (1.0, 50.0, 54.0, 2506.0)


def test_histogram_edge_cases():
    assert make_histogram(np.array([True])) is None
    assert make_histogram(np.zeros((0, 2))) is None
    assert make_histogram(np.array([np.inf])) is None
    assert make_histogram(np.array([1 + 1j])) is None
    extreme = make_histogram(np.array([-1e30, 1e30]))  # beyond the edges: still counted
    assert sum(extreme.bucket) == extreme.num == 2
    assert extreme.bucket[0] == 0 and extreme.bucket_limit[0] == DEFAULT_BUCKET_EDGES[0]
    zeros = make_histogram(np.zeros(5, np.float16))
    assert sum(zeros.bucket) == 5 and zeros.min == zeros.max == 0


def test_short_histogram_tags():
    from smdebug.storage.writer.tensorboard import short_tag

    assert short_tag("weights/hidden/weights/planes/hidden/kernel") == "hidden/weights/planes/hidden/kernel"
    assert short_tag("gradients/gradients/planes/hidden/kernelGrad") == "gradients/planes/hidden/kernelGrad"
    assert short_tag("gradients/gradient/Net_fc1.weight") == "gradient/Net_fc1.weight"
    assert short_tag("weights/Net_fc1.weight") == "weights/Net_fc1.weight"
    assert short_tag("weights") == "weights"


def test_clean_tag():
    assert clean_tag("/a b:0/c-d.e") == "a_b_0/c-d.e"
    assert clean_tag("//x") == "x"


def test_tensorboard_writer_directly(tmp_path):
    writer = TensorBoardWriter(tmp_path)
    assert writer.write_summaries(ModeKeys.PREDICT, 3, scalars=[("a", np.float32(2)), ("vector", np.ones(2))]) == 1
    assert writer.write_summaries("predict", 4, scalars=[("a", 3)], wall_time=10.0) == 1
    assert writer.write_summaries(ModeKeys.PREDICT, 5) == 0
    writer.close()
    (path,) = _tb_files(tmp_path, "PREDICT")
    events = read_with_tensorboard(path)
    assert [(e.step, e.summary.value[0].simple_value) for e in events[1:]] == [(3, 2.0), (4, 3.0)]
    assert events[2].wall_time == 10.0
