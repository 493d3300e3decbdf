"""The Trial reading the run store (docs/format.md 10; analysis/trials/store_index.py): real
runs written by RunWriter(run_layout="store"), compared with the same steps written in
smdebug 1.0.34's layout, read back by DuckDB and Polars from the Parquet files as they are,
and damaged on purpose."""
import logging
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from smdebug.collections import CollectionManager
from smdebug.exceptions import MixedRunLayouts, TensorUnavailableForStep
from smdebug.modes import ModeKeys
from smdebug.storage.format import store
from smdebug.storage.step_data import ScalarRun
from smdebug.storage.writer import RunWriter, StepData
from smdebug.trials import create_trial

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from bench_store_read import make_store_run  # noqa: E402

WORKERS = ("worker_0", "worker_1")


def modes(step):
    return (ModeKeys.TRAIN, step) if step < 9 else (ModeKeys.EVAL, step - 9)


def _pair(tmp_path, **kwargs):
    """The same steps written in both layouts: (store run, 1.0.34 run, what was written)."""
    runs = {}
    for layout in ("store", store.LAYOUT_1034):
        out = str(tmp_path / layout)
        runs[layout] = out
        written = make_store_run(out, layout=layout, **kwargs)[0]
    return runs["store"], runs[store.LAYOUT_1034], written


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two workers, 9 TRAIN then 5 EVAL steps, segments of 4 steps: a float32 loss, the five
    reductions of 3 tensors (a ScalarRun), and a 4x3 float32 tensor saved whole."""
    return _pair(tmp_path_factory.mktemp("pair"), steps=14, tensors=3, workers=WORKERS, segment_steps=4,
                 modes=modes, whole=("fc.weight",))


def frames_equal(a, b):
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))


def same_array(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), (a, b)


def test_the_run_store_is_read_and_every_value_is_what_was_written(pair):
    store_run, _, written = pair
    trial = create_trial(store_run)
    assert trial.layout == "store"
    assert sorted(os.listdir(os.path.join(store_run, "store"))) == ["_layout.json", "chunks", "statistics",
                                                                     "tensors"]
    assert trial.steps() == list(range(14))
    assert trial.steps(mode=ModeKeys.TRAIN) == list(range(9))
    assert trial.steps(mode=ModeKeys.EVAL) == list(range(5))
    assert trial.workers() == list(WORKERS)
    assert trial.tensor_names() == ["fc.weight", "layer000.weight", "layer001.weight", "layer002.weight", "loss"]
    for (worker, step), (loss, reductions, arrays) in written.items():
        same_array(trial.tensor("loss").value(step, worker=worker), np.asarray(loss))  # float32, shape ()
        same_array(trial.tensor("fc.weight").value(step, worker=worker), arrays["fc.weight"])
        tensor = trial.tensor("layer001.weight")
        for k, (op, is_abs) in enumerate((("min", False), ("max", False), ("mean", False), ("l2", False),
                                          ("max", True))):
            same_array(tensor.reduction_value(step, op, worker=worker, abs=is_abs),
                       np.asarray(reductions[5 + k]))  # float64, shape ()
    with pytest.raises(TensorUnavailableForStep):
        trial.tensor("layer000.weight").value(3)  # only reductions were saved


def test_the_store_reads_as_the_same_steps_in_the_1034_layout(pair):
    store_run, old_run, _ = pair
    new, old = create_trial(store_run), create_trial(old_run)
    frames_equal(new.to_dataframe(), old.to_dataframe())
    for select in (dict(mode="EVAL"), dict(mode="TRAIN", steps=[1, 2, 7]), dict(steps=[3, 12]),
                   dict(workers="worker_1"), dict(names="loss"), dict(regex="layer00[12]"),
                   dict(reductions=["l2", "abs_max"]), dict(names="fc.weight", reductions=["mean"])):
        frames_equal(new.to_dataframe(**select), old.to_dataframe(**select))
    for mode in (ModeKeys.GLOBAL, ModeKeys.TRAIN, ModeKeys.EVAL):
        assert new.steps(mode) == old.steps(mode)
        assert new.tensor_names(mode=mode) == old.tensor_names(mode=mode)
    assert new.tensor_names(step=5) == old.tensor_names(step=5)
    for name in old.tensor_names():
        a, b = new.tensor(name), old.tensor(name)
        assert a.steps() == b.steps() and a.steps(mode=ModeKeys.EVAL) == b.steps(mode=ModeKeys.EVAL)
        for step in b.steps():
            assert a.workers(step) == b.workers(step)
            assert a.has_reductions(step) == b.has_reductions(step)
            if b._locations.get(step):
                same_array(a.value(step, worker="worker_1"), b.value(step, worker="worker_1"))
                assert a.shape(step) == b.shape(step)
            got, expected = a.reduction_values(step), b.reduction_values(step)
            assert sorted(got) == sorted(expected)
            for key in expected:
                same_array(got[key], expected[key])
    assert new.tensor("loss").to_series().equals(old.tensor("loss").to_series())


def test_segments_that_differ_step_to_step_rewritten_steps_and_late_scalars(tmp_path):
    """Reductions every other step, a loss every step, a late scalar of an earlier step, and a
    step written again (the flight recorder): the general path, equal to the 1.0.34 layout,
    the later rows winning."""
    tags = ("smdebug/reductions/l2/w", "smdebug/reductions/abs_max/w")
    for layout in ("store", store.LAYOUT_1034):
        out = str(tmp_path / layout)
        writer = RunWriter(out, "worker_0", run_layout=layout, **({"segment_steps": 3} if layout == "store" else {}))
        writer.write_collections(CollectionManager().to_json_bytes(num_workers=1))
        for step in range(10):
            items = [("loss", np.float32(step / 10))]
            if step % 2 == 0:
                items.append(ScalarRun(tags, [step + 0.5, -step - 0.25]))
            writer.submit(StepData(step, ModeKeys.TRAIN, step, "worker_0", tensors=items))
            if step == 4:  # a late scalar of step 3
                writer.submit(StepData(3, ModeKeys.TRAIN, 3, "worker_0", tensors=[("late", np.int64(7))]))
        writer.submit(StepData(6, ModeKeys.TRAIN, 6, "worker_0", tensors=[("loss", np.float32(99)),
                                                                           ScalarRun(tags, [1.5, 2.5])],
                               replace=True))
        writer.close()
    new, old = create_trial(str(tmp_path / "store")), create_trial(str(tmp_path / store.LAYOUT_1034))
    df = new.to_dataframe()
    # The 1.0.34 writer drops data for a step it already published (with a warning); the run
    # store keeps it as rows of that step.
    frames_equal(_plain(df[df.tensor != "late"]), _plain(old.to_dataframe()))
    assert df[df.tensor == "late"][["step", "value"]].values.tolist() == [[3, 7.0]]
    assert df[(df.tensor == "loss") & (df.step == 6)].value.tolist() == [99.0]
    assert df[(df.tensor == "w") & (df.step == 6)].value.tolist() == [2.5, 1.5]  # abs_max, l2
    same_array(new.tensor("loss").value(6), np.asarray(np.float32(99)))
    same_array(new.tensor("w").reduction_value(6, "l2"), np.asarray(1.5))
    same_array(new.tensor("late").value(3), np.asarray(np.int64(7)))
    assert new.tensor("w").steps() == old.tensor("w").steps() == [0, 2, 4, 6, 8]


def test_tensors_saved_at_different_intervals_read_as_in_the_1034_layout(tmp_path):
    """A loss every step, reductions every other step, a learning rate every third: segments
    whose steps hold different sequences (placed by to_table without a sort), two workers."""
    from smdebug.analysis.trials import store_table

    tags = ("smdebug/reductions/l2/w", "smdebug/reductions/abs_max/w", "smdebug/reductions/mean/v")
    for layout in ("store", store.LAYOUT_1034):
        out = str(tmp_path / layout)
        for w, worker in enumerate(WORKERS):
            writer = RunWriter(out, worker, run_layout=layout, **({"segment_steps": 4} if layout == "store" else {}))
            writer.write_collections(CollectionManager().to_json_bytes(num_workers=len(WORKERS)))
            for step in range(15):
                mode, mode_step = modes(step)
                items = [("loss", np.float32(step / 10 + w))]
                if step % 2 == 0:
                    items.append(ScalarRun(tags, [step + 0.5, -step - 0.25, w * 1.5]))
                if step % 3 == 0:
                    items.append(("lr", np.float64(0.1 * step)))
                writer.submit(StepData(step, mode, mode_step, worker, tensors=items))
            writer.close()
    new, old = create_trial(str(tmp_path / "store")), create_trial(str(tmp_path / store.LAYOUT_1034))
    index = new._index
    parts = [p for p in index.loaded_parts() if len(p)]
    selection = store_table._Selection(index, sorted(index.tensors), None, None, False, None)
    assert store_table._uniform_table(index, parts, selection) is None
    assert store_table._block_table(index, parts, selection) is not None
    for select in (dict(), dict(mode="EVAL"), dict(mode="TRAIN", steps=[2, 3, 4]), dict(workers="worker_1"),
                   dict(names=["lr", "w"]), dict(reductions=["l2"])):
        frames_equal(new.to_dataframe(**select), old.to_dataframe(**select))
    assert new.tensor_names(step=6) == old.tensor_names(step=6) == ["loss", "lr", "v", "w"]
    assert new.tensor("lr").steps() == old.tensor("lr").steps() == [0, 3, 6, 9, 12]


def test_dtypes_and_ranks_of_scalars_read_back_as_saved(tmp_path):
    out = str(tmp_path / "run")
    writer = RunWriter(out, "worker_0", run_layout="store")
    writer.write_collections(CollectionManager().to_json_bytes(num_workers=1))
    values = {"f16": np.float16(1.5), "f32_1": np.array([0.1], np.float32), "f64": np.float64(np.pi),
              "i64": np.int64(-(2**53)), "u8": np.uint8(255), "b": np.bool_(True), "i32_1": np.array([7], np.int32),
              "big": np.uint64(2**63 + 1), "nan": np.float32("nan")}
    writer.submit(StepData(0, ModeKeys.TRAIN, 0, "worker_0", tensors=list(values.items())))
    writer.close()
    trial = create_trial(out)
    for name, value in values.items():
        same_array(trial.tensor(name).value(0), np.asarray(value))
    df = trial.to_dataframe()
    got = dict(zip(df.tensor.astype(str), df.value))
    assert got["big"] == float(2**63 + 1)  # a whole record (a float64 cannot hold it), read from its chunk
    assert got["b"] == 1.0 and got["u8"] == 255.0 and np.isnan(got["nan"])


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def test_a_live_segment_is_read_before_the_writer_closes_and_again_when_it_grows(tmp_path):
    out = str(tmp_path / "run")
    written, names, tags, (writer,) = make_store_run(out, steps=5, tensors=2, segment_steps=100, close=False)
    writer.flush()
    live = os.path.join(out, store.live_relpath("worker_0", 0))
    # The writer syncs its live file when its queue runs dry, just after flush() returns.
    _wait_for(lambda: os.path.exists(live) and create_trial(out).steps(show_incomplete_steps=True) == list(range(5)))
    trial = create_trial(out)
    assert not os.path.exists(os.path.join(out, store.statistics_relpath("worker_0", 0)))
    assert trial.steps() == list(range(5))
    same_array(trial.tensor("loss").value(2), np.asarray(written[("worker_0", 2)][0]))
    tensor = trial.tensor("layer001.weight")
    same_array(tensor.reduction_value(4, "l2"), np.asarray(written[("worker_0", 4)][1][8]))
    rng = np.random.default_rng(1)
    for step in range(5, 8):
        writer.submit(StepData(step, ModeKeys.TRAIN, step, "worker_0",
                               tensors=[("loss", np.float32(step)), ScalarRun(tags, rng.standard_normal(len(tags)))]))
    writer.flush()
    _wait_for(lambda: trial.steps(show_incomplete_steps=True) == list(range(8)))
    same_array(tensor.reduction_value(7, "min"), tensor.reduction_value(7, "min"))
    same_array(trial.tensor("loss").value(6), np.asarray(np.float32(6)))
    assert len(trial.to_dataframe(show_incomplete_steps=True)) == 8 * (1 + len(tags))
    before = trial.to_dataframe(show_incomplete_steps=True)
    writer.close()
    trial.refresh()
    assert not os.path.exists(live) and trial.training_ended()
    frames_equal(trial.to_dataframe(), before)
    frames_equal(create_trial(out).to_dataframe(), before)


def test_a_truncated_live_file_shows_its_complete_batches(tmp_path, caplog):
    out = str(tmp_path / "run")
    make_store_run(out, steps=6, tensors=2, segment_steps=100)
    # A live file as a killed writer leaves it: every step a batch, the last one cut short.
    trial = create_trial(out)
    stats = trial._index.ordered_parts()[0]
    sealed = pq.read_table(os.path.join(out, store.statistics_relpath("worker_0", 0)))
    live_schema = store.schemas()[2]
    relpath = store.live_relpath("worker_0", 1)
    os.makedirs(os.path.dirname(os.path.join(out, relpath)), exist_ok=True)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, live_schema) as ipc:
        for step in range(6):
            rows = sealed.filter(pa.compute.equal(sealed["step"], step))
            columns = {name: rows[name] for name in rows.column_names}
            columns["step"] = pa.chunked_array([pa.array(np.full(rows.num_rows, 100 + step), pa.int64())])
            columns["mode_step"] = columns["step"]
            columns["table"] = pa.chunked_array([pa.array(np.zeros(rows.num_rows, np.int8))])
            arrays = [columns[f.name].combine_chunks() if f.name in columns else pa.nulls(rows.num_rows, f.type)
                      for f in live_schema]
            ipc.write_batch(pa.RecordBatch.from_arrays(
                [a.cast(f.type) for a, f in zip(arrays, live_schema)], schema=live_schema))
    data = sink.getvalue().to_pybytes()
    with open(os.path.join(out, relpath), "wb") as f:
        f.write(data[:-40])
    os.remove(os.path.join(out, "training_job_end.ts"))
    with caplog.at_level(logging.WARNING):
        trial = create_trial(out)
        assert trial.steps(show_incomplete_steps=True) == list(range(6)) + [100, 101, 102, 103, 104]
        same_array(trial.tensor("loss").value(103), trial.tensor("loss").value(3))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(stats) == 6 * 11


def test_a_damaged_live_file_costs_its_segment_with_one_warning(tmp_path, caplog):
    out = str(tmp_path / "run")
    make_store_run(out, steps=6, tensors=2, segment_steps=3)
    relpath = store.live_relpath("worker_0", 2)
    os.makedirs(os.path.dirname(os.path.join(out, relpath)), exist_ok=True)
    with open(os.path.join(out, relpath), "wb") as f:
        f.write(b"\x00garbage, not an arrow stream" * 100)
    with caplog.at_level(logging.WARNING):
        trial = create_trial(out)
        assert trial.steps() == list(range(6))
        assert len(trial.to_dataframe()) == 6 * 11
        trial.refresh()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "000002.arrows" in warnings[0], warnings
    assert trial.corrupt_index_files == [relpath]


@pytest.mark.parametrize("damage", ["truncated footer", "footer claims too much", "garbage", "empty"])
def test_a_damaged_parquet_file_costs_its_segment_with_one_warning(tmp_path, caplog, damage):
    out = str(tmp_path / "run")
    make_store_run(out, steps=9, tensors=2, segment_steps=3)
    relpath = store.statistics_relpath("worker_0", 1)
    path = os.path.join(out, relpath)
    data = open(path, "rb").read()
    if damage == "truncated footer":
        data = data[:-20]
    elif damage == "footer claims too much":
        data = data[:-8] + (2**31 - 1).to_bytes(4, "little") + b"PAR1"
    elif damage == "garbage":
        data = data[:4] + bytes(len(data) - 8) + data[-4:]
    else:
        data = b""
    open(path, "wb").write(data)
    with caplog.at_level(logging.WARNING):
        trial = create_trial(out)
        assert trial.steps() == [0, 1, 2, 6, 7, 8]
        df = trial.to_dataframe()
        trial.refresh()
        trial.tensor("loss").value(7)
    assert sorted(set(df.step)) == [0, 1, 2, 6, 7, 8]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and path in warnings[0], warnings
    assert trial.corrupt_index_files == [relpath]


def test_oversized_metadata_is_refused(tmp_path, caplog):
    """A Parquet footer beyond MAX_PARQUET_FOOTER_BYTES is not parsed (docs/reader_safety.md)."""
    from smdebug.analysis.trials import store_index

    out = str(tmp_path / "run")
    make_store_run(out, steps=6, tensors=2, segment_steps=3)
    relpath = store.statistics_relpath("worker_0", 0)
    path = os.path.join(out, relpath)
    table = pq.read_table(path)
    # A real footer of more than the limit: a key-value metadata entry of 17 MiB.
    big = table.replace_schema_metadata({"padding": "x" * (store_index.MAX_PARQUET_FOOTER_BYTES + (1 << 20))})
    pq.write_table(big, path)
    with caplog.at_level(logging.WARNING):
        trial = create_trial(out)
        assert trial.steps() == [3, 4, 5]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "footer claims" in warnings[0], warnings


def test_a_fifo_in_place_of_a_segment_is_refused_without_waiting(tmp_path, caplog):
    out = str(tmp_path / "run")
    make_store_run(out, steps=6, tensors=2, segment_steps=3)
    path = os.path.join(out, store.statistics_relpath("worker_0", 0))
    os.remove(path)
    os.mkfifo(path)
    with caplog.at_level(logging.WARNING):
        assert create_trial(out).steps() == [3, 4, 5]
    assert any("part-000000.parquet" in r.getMessage() for r in caplog.records)


def test_a_run_with_both_layouts_is_refused(tmp_path):
    out = str(tmp_path / "run")
    make_store_run(out, steps=2, tensors=1)
    os.makedirs(os.path.join(out, "index", "000000000"))
    with pytest.raises(MixedRunLayouts, match="mixes two layouts.*store/.*index/"):
        create_trial(out)


def test_range_steps(pair):
    store_run, old_run, _ = pair
    new, old = create_trial(store_run, range_steps=(3, 10)), create_trial(old_run, range_steps=(3, 10))
    assert new.steps() == old.steps() == list(range(3, 10))
    frames_equal(new.to_dataframe(), old.to_dataframe())


def _read_without_smdebug(code, tmp_path):
    """Run ``code`` in a Python without smdebug imported; it writes the rows it read to the
    Parquet file ``OUT`` (exact values), read back here."""
    script = tmp_path / "read.py"
    result = tmp_path / "rows.parquet"
    script.write_text(f"import sys\nOUT = {str(result)!r}\n" + code + "\nassert 'smdebug' not in sys.modules\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return _plain(pq.read_table(result).to_pandas())


ORDER = "tensor, reduction, worker, step"


def _plain(df):
    return df.astype({c: str for c in ("mode", "worker", "tensor", "reduction")}).reset_index(drop=True)


def test_duckdb_reads_the_store_as_it_is_row_for_row(pair, tmp_path):
    pytest.importorskip("duckdb")
    store_run = pair[0]
    code = f"""
import duckdb
df = duckdb.sql("SELECT step, mode, mode_step, worker, tensor, reduction, value FROM read_parquet("
                "'{store_run}/store/statistics/**/*.parquet', hive_partitioning = true) ORDER BY {ORDER}").df()
df.to_parquet(OUT)
"""
    got = _read_without_smdebug(code, tmp_path)
    expected = _plain(create_trial(store_run).to_dataframe())
    pd.testing.assert_frame_equal(got, expected, check_dtype=False, check_exact=True)


def test_polars_reads_the_store_as_it_is_row_for_row(pair, tmp_path):
    pytest.importorskip("polars")
    store_run = pair[0]
    code = f"""
import polars as pl
df = (pl.scan_parquet("{store_run}/store/statistics/**/*.parquet", hive_partitioning=True)
      .select("step", "mode", "mode_step", "worker", "tensor", "reduction", "value")
      .sort({[c.strip() for c in ORDER.split(",")]}).collect())
df.write_parquet(OUT)
"""
    got = _read_without_smdebug(code, tmp_path)
    expected = _plain(create_trial(store_run).to_dataframe())
    pd.testing.assert_frame_equal(got, expected, check_dtype=False, check_exact=True)


def test_trial_sql(pair):
    pytest.importorskip("duckdb")
    store_run, old_run, _ = pair
    new = create_trial(store_run)
    expected = _plain(new.to_dataframe())
    got = new.sql(f"SELECT step, mode, mode_step, worker, tensor, reduction, value FROM statistics ORDER BY {ORDER}")
    pd.testing.assert_frame_equal(got.df(), expected, check_dtype=False, check_exact=True)
    tensors = new.sql('SELECT worker, tensor, count(*) AS n, min("offset") AS lo FROM tensors GROUP BY ALL '
                      "ORDER BY ALL").fetchall()
    assert tensors == [("worker_0", "fc.weight", 14, 0), ("worker_1", "fc.weight", 14, 0)]
    old = create_trial(old_run)
    got = old.sql(f"SELECT * FROM statistics ORDER BY {ORDER}").df()
    pd.testing.assert_frame_equal(got, expected, check_dtype=False, check_exact=True)


def test_trial_sql_sees_live_segments(tmp_path):
    pytest.importorskip("duckdb")
    out = str(tmp_path / "run")
    _, _, tags, (writer,) = make_store_run(out, steps=7, tensors=2, segment_steps=3, close=False)
    writer.flush()
    _wait_for(lambda: create_trial(out).steps(show_incomplete_steps=True) == list(range(7)))
    trial = create_trial(out)
    assert trial.sql("SELECT count(DISTINCT step), count(*) FROM statistics").fetchall() == [(7, 7 * 11)]
    writer.close()


def test_sql_without_duckdb_names_the_extra(pair, monkeypatch):
    monkeypatch.setitem(sys.modules, "duckdb", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"Trial.sql needs duckdb.*pip install duckdb.*'sql' extra"):
        create_trial(pair[0]).sql("SELECT 1")


def test_a_remote_run_reads_sealed_segments_only(tmp_path, monkeypatch):
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "support"))
    from s3_endpoint import serve

    endpoint = serve(monkeypatch, tmp_path, "bucket")
    try:
        out = str(tmp_path / "run")
        _, _, _, (writer,) = make_store_run(out, steps=7, tensors=2, segment_steps=3, close=False,
                                            whole=("fc.weight",))
        writer.flush()
        _wait_for(lambda: os.path.exists(os.path.join(out, store.live_relpath("worker_0", 2))))
        client = endpoint.client()
        for root, _, files in os.walk(out):
            for name in files:
                path = os.path.join(root, name)
                client.upload_file(path, "bucket", "run/" + os.path.relpath(path, out))
        local = create_trial(out)
        remote = create_trial("s3://bucket/run")
        assert local.steps(show_incomplete_steps=True) == list(range(7))
        assert remote.steps(show_incomplete_steps=True) == list(range(6))  # the live segment is not read
        frames_equal(remote.to_dataframe(show_incomplete_steps=True),
                     local.to_dataframe(steps=range(6), show_incomplete_steps=True))
        same_array(remote.tensor("fc.weight").value(4), local.tensor("fc.weight").value(4))
        writer.close()
    finally:
        endpoint.stop()


def test_a_damaged_chunk_costs_the_value_it_holds(tmp_path):
    from smdebug.exceptions import CorruptRecord

    out = str(tmp_path / "run")
    written = make_store_run(out, steps=4, tensors=1, segment_steps=10, whole=("fc.weight",))[0]
    chunk = os.path.join(out, store.chunk_relpath("worker_0", 0, 0))
    data = bytearray(open(chunk, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(chunk, "wb").write(bytes(data))
    trial = create_trial(out)
    values = {}
    for step in range(4):
        try:
            values[step] = trial.tensor("fc.weight").value(step)
        except CorruptRecord as exc:
            assert "000000-000.events" in str(exc)
    assert 0 < len(values) < 4
    for step, value in values.items():
        same_array(value, written[("worker_0", step)][2]["fc.weight"])
    assert len(trial.to_dataframe()) == 4 * 6  # numbers are not in the chunks


def test_a_live_run_of_two_workers_counts_a_step_complete_once_both_wrote_it(tmp_path):
    out = str(tmp_path / "run")
    writers = []
    for worker in WORKERS:
        writer = RunWriter(out, worker, run_layout="store", segment_steps=100)
        writer.write_collections(CollectionManager().to_json_bytes(num_workers=2))
        writers.append(writer)
    for step in range(6):
        for writer, worker in zip(writers, WORKERS):
            if worker == "worker_1" and step > 3:
                continue
            writer.submit(StepData(step, ModeKeys.TRAIN, step, worker,
                                   tensors=[("loss", np.float32(step)), (f"only_{worker}", np.float32(1))]))
            if step == 0:
                writer.flush()
    for writer in writers:
        writer.flush()
    _wait_for(lambda: create_trial(out).steps(show_incomplete_steps=True) == list(range(6)))
    trial = create_trial(out)
    assert trial.steps() == [0, 1, 2, 3]
    assert trial.tensor_names() == ["loss", "only_worker_0", "only_worker_1"]
    assert sorted(set(trial.to_dataframe().step)) == [0, 1, 2, 3]
    assert sorted(set(trial.to_dataframe(show_incomplete_steps=True).step)) == list(range(6))
    assert trial.tensor("loss").workers(2) == list(WORKERS)
    for writer in writers:
        writer.close()
    trial.refresh()
    assert trial.steps() == list(range(6)) and trial.training_ended()


def test_a_restarted_job_writing_steps_again_replaces_them(tmp_path):
    """A job started again from a checkpoint writes steps 3-5 anew, in later segments: they
    replace the first job's, in values and in the table."""
    out = str(tmp_path / "run")
    tags = ("smdebug/reductions/l2/w",)
    for first, last, offset in ((0, 6, 0.0), (3, 9, 100.0)):
        writer = RunWriter(out, "worker_0", run_layout="store", segment_steps=2)
        writer.write_collections(CollectionManager().to_json_bytes(num_workers=1))
        for step in range(first, last):
            writer.submit(StepData(step, ModeKeys.TRAIN, step, "worker_0", tensors=[
                ("loss", np.float32(step + offset)), ScalarRun(tags, [step + offset + 0.5])]))
        writer.close()
    trial = create_trial(out)
    assert trial.steps() == list(range(9))
    df = trial.to_dataframe()
    assert df[df.tensor == "loss"].value.tolist() == [0, 1, 2, 103, 104, 105, 106, 107, 108]
    assert df[df.tensor == "w"].value.tolist() == [0.5, 1.5, 2.5, 103.5, 104.5, 105.5, 106.5, 107.5, 108.5]
    same_array(trial.tensor("loss").value(4), np.asarray(np.float32(104)))
    same_array(trial.tensor("w").reduction_value(5, "l2"), np.asarray(105.5))


def test_range_steps_skips_segments_by_their_step_statistics(tmp_path):
    out = str(tmp_path / "run")
    make_store_run(out, steps=40, tensors=2, segment_steps=10)
    trial = create_trial(out, range_steps=(12, 18))
    assert trial.steps() == list(range(12, 18))
    assert sorted(set(trial.to_dataframe().step)) == list(range(12, 18))
    # The statistics files of the four segments opened (their footers), then of the one in range
    # its tensors file and its value columns: the others were left by their step statistics.
    assert trial.index_files_read == 4 + 1 + 1
