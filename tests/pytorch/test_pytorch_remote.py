"""Two processes of one torch.distributed job write one run into one S3 prefix (moto's
server on loopback); the run reads back complete, every worker's steps present."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("moto.server", reason="needs moto[server]")
pytest.importorskip("boto3")
pytest.importorskip("s3fs")

from smdebug.trials import create_trial

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from s3_endpoint import free_port, serve

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_remote.py")


def test_two_ddp_workers_write_one_s3_prefix(tmp_path, monkeypatch):
    endpoint = serve(monkeypatch, tmp_path, "ddp")
    try:
        url = "s3://ddp/jobs/run1"
        done = subprocess.run([sys.executable, SCRIPT, url, str(free_port()), "4"], env=dict(os.environ),
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        objects = {o["Key"]: o for o in endpoint.client().list_objects_v2(Bucket="ddp")["Contents"]}
        # Rank 1 closed a second after the chief: the chief's end marker waited for its upload.
        end, done1 = objects["jobs/run1/training_job_end.ts"], objects["jobs/run1/.smdebug_workers/worker_1.done"]
        assert end["LastModified"] >= done1["LastModified"]
        trial = create_trial(url)
        assert trial.training_ended()
        assert trial.workers() == ["worker_0", "worker_1"]
        assert trial.steps() == [0, 1, 2, 3]
        weight = trial.tensor("gradient/Net_fc1.weight")
        assert weight.workers(3) == ["worker_0", "worker_1"]
        # DDP averages gradients: both workers saved the same values.
        assert (weight.value(3, worker="worker_0") == weight.value(3, worker="worker_1")).all()
        leftover = [f for d, _, fs in os.walk(tmp_path / "spools") for f in fs if not f.startswith(".smdebug")]
        assert leftover == []  # both spools fully uploaded
    finally:
        endpoint.stop()
