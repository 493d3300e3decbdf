"""Two processes of one torch.distributed job write one run into one S3 prefix (moto's
server on loopback); the run reads back complete, every worker's steps present."""
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch")
moto_server = pytest.importorskip("moto.server", reason="needs moto[server]")
boto3 = pytest.importorskip("boto3")
pytest.importorskip("s3fs")

from smdebug.trials import create_trial  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_remote.py")


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_ddp_workers_write_one_s3_prefix(tmp_path, monkeypatch):
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        env = dict(os.environ, AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="testing",
                   AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
                   SMDEBUG_SPOOL_DIR=str(tmp_path / "spools"))
        for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
            monkeypatch.setenv(key, env[key])
        boto3.client("s3").create_bucket(Bucket="ddp")
        url = "s3://ddp/jobs/run1"
        done = subprocess.run([sys.executable, SCRIPT, url, str(_free_port()), "4"], env=env,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
        objects = {o["Key"]: o for o in boto3.client("s3").list_objects_v2(Bucket="ddp")["Contents"]}
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
        server.stop()
