"""Parquet export partitioned by worker and mode (Trial.to_parquet, smdebug export --format
parquet), read back with DuckDB and checked row for row against to_dataframe."""
import os
import subprocess
import sys

import numpy as np
import pytest

from smdebug.analysis.cli import main
from smdebug.collections import CollectionManager
from smdebug.modes import ModeKeys
from smdebug.storage.format.layout import serialize_worker_name
from smdebug.storage.writer import RunWriter, StepData
from smdebug.trials import create_trial

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")
duckdb = pytest.importorskip("duckdb")

WORKERS = ("worker_0", "worker_1", "worker_2")


@pytest.fixture(scope="module")
def three_workers(tmp_path_factory):
    """Three workers, 8 TRAIN steps then 4 EVAL steps; a loss, an int and a weight saved as norms."""
    out = str(tmp_path_factory.mktemp("parquet") / "run")
    for w, worker in enumerate(WORKERS):
        writer = RunWriter(out, worker)
        writer.write_collections(CollectionManager().to_json_bytes(num_workers=len(WORKERS)))
        for step in range(12):
            mode, mode_step = (ModeKeys.TRAIN, step) if step < 8 else (ModeKeys.EVAL, step - 8)
            writer.submit(StepData(global_step=step, mode=mode, mode_step=mode_step, worker=worker, tensors=[
                ("loss", np.asarray(np.float32(1.0 / (step + 1) + w))),
                ("count", np.asarray(np.int64(step * 10 + w))),
                ("smdebug/reductions/l2/fc.weight", np.asarray(np.float64(step + w / 3))),
                ("smdebug/reductions/max/fc.weight", np.asarray(np.float64(-step - w / 7))),
            ]))
        writer.close()
    open(os.path.join(out, "training_job_end.ts"), "w").close()
    return out


def read_back(directory):
    """Every row of the export, by DuckDB, in to_dataframe's order and column order."""
    query = (f"SELECT step, mode, mode_step, worker, tensor, reduction, value FROM "
             f"read_parquet('{directory}/**/*.parquet', hive_partitioning = true) "
             "ORDER BY tensor, reduction, worker, step")
    return duckdb.sql(query).df()


def as_plain(df):
    return df.astype({c: str for c in ("mode", "worker", "tensor", "reduction")}).reset_index(drop=True)


def test_to_parquet_partitions_by_worker_and_mode_and_duckdb_reads_the_same_rows(three_workers, tmp_path):
    trial = create_trial(three_workers)
    out = tmp_path / "export"
    files = trial.to_parquet(str(out))
    relative = sorted(os.path.relpath(f, out) for f in files)
    assert relative == sorted(os.path.join(f"worker={w}", f"mode={m}", "part-0.parquet")
                              for w in WORKERS for m in ("TRAIN", "EVAL"))
    want = as_plain(trial.to_dataframe())
    got = as_plain(read_back(out))
    assert len(want) == 3 * 12 * 4
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert got["step"].dtype == np.int64 and got["value"].dtype == np.float64
    # One partition holds only its worker's and mode's rows.
    import pyarrow.parquet as pq

    part = pq.read_table(out / "worker=worker_1" / "mode=EVAL" / "part-0.parquet")
    assert part.column_names == ["step", "mode_step", "tensor", "reduction", "value"]  # the rest is in the path
    assert sorted(set(part.column("step").to_pylist())) == [8, 9, 10, 11] and part.num_rows == 4 * 4


def test_to_parquet_selects_as_to_dataframe_and_refuses_a_used_directory(three_workers, tmp_path):
    trial = create_trial(three_workers)
    out = str(tmp_path / "some")
    files = trial.to_parquet(out, "fc.weight", mode="eval", workers=["worker_2"])
    assert [os.path.relpath(f, out) for f in files] == [os.path.join("worker=worker_2", "mode=EVAL", "part-0.parquet")]
    want = as_plain(trial.to_dataframe("fc.weight", mode="eval", workers="worker_2"))
    pd.testing.assert_frame_equal(as_plain(read_back(out)), want, check_dtype=False)
    with pytest.raises(FileExistsError, match="is not empty"):
        trial.to_parquet(out)


def test_smdebug_export_format_parquet(capsys, three_workers, numpy_run, tmp_path):
    out = str(tmp_path / "cli")
    status = main(["export", three_workers, "--format", "parquet", "-o", out, "--mode", "train"])
    text, err = capsys.readouterr()
    assert status == 0 and err == ""
    assert text.strip() == f"wrote {3 * 8 * 4} rows to {out} in 3 files (worker=W/mode=M/part-0.parquet)"
    want = as_plain(create_trial(three_workers).to_dataframe(mode="train"))
    pd.testing.assert_frame_equal(as_plain(read_back(out)), want, check_dtype=False)
    # Again into the same directory: refused before reading the run.
    status = main(["export", three_workers, "--format", "parquet", "-o", out])
    _, err = capsys.readouterr()
    assert status == 2 and "give a new or empty directory" in err
    # Nothing selected: no directory left behind.
    empty = str(tmp_path / "none")
    status = main(["export", numpy_run, "--format", "parquet", "-o", empty, "--tensor", "dense.weight",
                   "--mode", "predict"])
    _, err = capsys.readouterr()
    assert status == 2 and "nothing to export" in err and "in mode PREDICT" in err and not os.path.exists(empty)
    # Without --format, the suffix decides; an unknown suffix names both ways.
    status = main(["export", numpy_run, "-o", str(tmp_path / "values.txt")])
    _, err = capsys.readouterr()
    assert status == 2 and "--format parquet for a directory" in err


def test_without_pyarrow_the_messages_name_the_extra(three_workers, tmp_path):
    from smdebug.storage.convert import convert

    # A run store needs pyarrow to be read at all: the 1.0.34 layout's copy of the run.
    convert(three_workers, str(tmp_path / "run_1034"), "1.0.34")
    three_workers = str(tmp_path / "run_1034")
    code = (
        "import sys; sys.modules['pyarrow'] = None\n"
        "from smdebug.trials import create_trial\n"
        "from smdebug.analysis.cli import main\n"
        f"t = create_trial({three_workers!r})\n"
        "try:\n"
        f"    t.to_parquet({str(tmp_path / 'x')!r})\n"
        "except ImportError as exc:\n"
        "    print('ERR', exc)\n"
        f"print('STATUS', main(['export', {three_workers!r}, '--format', 'parquet', '-o', {str(tmp_path / 'y')!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "ERR Trial.to_parquet needs pyarrow, which is not installed: pip install \".[parquet]\"" in proc.stdout
    assert "STATUS 2" in proc.stdout and "parquet export needs pyarrow" in proc.stderr
    assert 'pip install ".[parquet]"' in proc.stderr
    assert not os.path.exists(tmp_path / "x") and not os.path.exists(tmp_path / "y")


def test_a_device_name_worker_is_quoted_in_its_folder_and_read_back(tmp_path):
    """TensorFlow MirroredStrategy workers are device names with '/' and ':'."""
    out = str(tmp_path / "run")
    worker = "/job:worker/replica:0/task:0/device:CPU:0"
    writer = RunWriter(out, serialize_worker_name(worker))
    writer.write_collections(CollectionManager().to_json_bytes(num_workers=1))
    for step in range(3):
        writer.submit(StepData(global_step=step, mode=ModeKeys.TRAIN, mode_step=step,
                               worker=serialize_worker_name(worker), tensors=[("loss", np.asarray(np.float32(step)))]))
    writer.close()
    open(os.path.join(out, "training_job_end.ts"), "w").close()
    trial = create_trial(out)
    assert trial.workers() == [worker]
    files = trial.to_parquet(str(tmp_path / "export"))
    assert [os.path.basename(os.path.dirname(os.path.dirname(f))) for f in files] == \
        ["worker=%2Fjob%3Aworker%2Freplica%3A0%2Ftask%3A0%2Fdevice%3ACPU%3A0"]
    got = read_back(tmp_path / "export")
    assert got["worker"].tolist() == [worker] * 3 and got["value"].tolist() == [0.0, 1.0, 2.0]


def test_to_parquet_on_s3(three_workers, tmp_path, monkeypatch, capsys):
    """To an S3 prefix (moto's server on loopback), through fsspec as runs are read."""
    pytest.importorskip("moto.server", reason="needs moto[server] (tox core env)")
    pytest.importorskip("s3fs")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
    from s3_endpoint import serve

    endpoint = serve(monkeypatch, tmp_path, "exports")
    try:
        trial = create_trial(three_workers)
        files = trial.to_parquet("s3://exports/run1", mode="eval")
        assert files == [f"s3://exports/run1/worker={w}/mode=EVAL/part-0.parquet" for w in WORKERS]
        assert endpoint.keys("exports") == [f[len("s3://exports/"):] for f in files]
        from smdebug.storage.remote import filesystem

        fs, root = filesystem("s3://exports/run1")
        fs.get(root, str(tmp_path / "copy"), recursive=True)
        want = as_plain(trial.to_dataframe(mode="eval"))
        pd.testing.assert_frame_equal(as_plain(read_back(tmp_path / "copy")), want, check_dtype=False)
        with pytest.raises(FileExistsError, match="s3://exports/run1 is not empty"):
            trial.to_parquet("s3://exports/run1")
        status = main(["export", three_workers, "--format", "parquet", "-o", "s3://exports/run2", "--tensor", "loss"])
        out, err = capsys.readouterr()
        assert status == 0 and out.strip() == ("wrote 36 rows to s3://exports/run2 in 6 files "
                                               "(worker=W/mode=M/part-0.parquet)")
    finally:
        endpoint.stop()


@pytest.mark.parametrize("chunk_records", [1, 100, 10**9])
def test_workers_read_in_groups_give_the_same_files(three_workers, tmp_path, chunk_records):
    """One worker a read (1), two then one (100: each worker has 48 records), all at once."""
    from smdebug.analysis.trials.parquet import _worker_chunks, write_partitioned

    trial = create_trial(three_workers)
    expected = {1: [["worker_0"], ["worker_1"], ["worker_2"]], 100: [["worker_0", "worker_1"], ["worker_2"]],
                10**9: [list(WORKERS)]}[chunk_records]
    assert _worker_chunks(trial, list(WORKERS), chunk_records) == expected
    out = tmp_path / "export"
    written = write_partitioned(trial, str(out), chunk_records=chunk_records, mode=None)
    assert [count for _, count in written] == [32, 16] * 3  # TRAIN 8 steps, EVAL 4, 4 rows each
    pd.testing.assert_frame_equal(as_plain(read_back(out)), as_plain(trial.to_dataframe()), check_dtype=False)
