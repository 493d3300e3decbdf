"""A run store read by Dask on a local cluster of processes, without smdebug in the workers'
code path (docs/format.md 10; README "How a run is stored"): what users do when one machine
is not enough. A 64-worker run, as a data-parallel job of 64 ranks writes it."""
import os

import numpy as np
import pytest

dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")

from smdebug.modes import ModeKeys  # noqa: E402
from smdebug.storage.step_data import ScalarRun, StepData  # noqa: E402
from smdebug.storage.writer import RunWriter  # noqa: E402

WORKERS, STEPS, TENSORS = 64, 30, 20
TAGS = tuple(f"smdebug/reductions/{r}/layer{t}.weight" for t in range(TENSORS) for r in ("l2", "max"))


def _write_run(run):
    rng = np.random.default_rng(0)
    expected = {}
    for rank in range(WORKERS):
        worker = f"worker_{rank}"
        writer = RunWriter(run, worker, run_layout="store", segment_steps=10)
        for step in range(STEPS):
            values = rng.standard_normal(len(TAGS))
            writer.submit(StepData(step, ModeKeys.TRAIN, step, worker, tensors=[
                ("loss", np.float32(1.0 / (1 + step + rank))), ScalarRun(TAGS, values)]))
            expected[worker] = expected.get(worker, 0.0) + float(np.float32(1.0 / (1 + step + rank))) + values.sum()
        assert writer.close(write_end_marker=False)
    return expected


def test_dask_reads_a_64_worker_store_on_a_process_cluster(tmp_path):
    run = str(tmp_path / "run")
    expected = _write_run(run)
    assert len(os.listdir(os.path.join(run, "store", "statistics"))) == WORKERS
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        frame = dd.read_parquet(os.path.join(run, "store", "statistics"), engine="pyarrow")
        assert {"step", "tensor", "reduction", "value", "worker"} <= set(frame.columns)
        sums = frame.groupby("worker", observed=True)["value"].sum().compute()
        rows = int(frame.shape[0].compute())
    assert rows == WORKERS * STEPS * (len(TAGS) + 1)
    assert len(sums) == WORKERS
    for worker, total in sums.items():
        assert total == pytest.approx(expected[str(worker)], rel=1e-12)
