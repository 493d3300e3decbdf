"""The ORIGINAL smdebug 1.0.34 reads a run our hook uploaded to S3 (moto's server on loopback).

Its S3 trial uses boto3, which its wheel does not require: an original environment
without boto3 cannot read S3 at all, and this test skips saying so. The endpoint reaches
its ``boto3.client("s3")`` through ``AWS_ENDPOINT_URL`` (boto3 1.28+).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("moto.server", reason="needs moto[server]")
pytest.importorskip("s3fs")

import smdebug as smd
from compat_runner import HERE, original_env

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from s3_endpoint import serve

READ_SCRIPT = """
import json, sys
from smdebug.trials import create_trial
t = create_trial(sys.argv[1])
w = t.tensor("w")
print(json.dumps({"steps": t.steps(), "w": {str(s): w.value(s).tolist() for s in w.steps()}}))
"""


def test_original_reads_our_s3_run(original_python, tmp_path, monkeypatch):
    probe = subprocess.run([original_python, "-c", "import boto3"], env=original_env(), capture_output=True,
                           text=True, timeout=60, cwd=HERE)
    if probe.returncode != 0:
        pytest.skip(f"the original smdebug's interpreter {original_python} has no boto3, which its S3 trial "
                    "needs (install boto3 there to run this test)")
    endpoint = serve(monkeypatch, tmp_path, "compat")
    aws = endpoint.environment
    try:
        url = "s3://compat/run"
        hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=2))
        for step in range(6):
            hook.begin_step()
            hook.save_tensor("w", np.arange(3.0) * step, "weights")
            hook.end_step()
        hook.close()
        done = subprocess.run([original_python, "-c", READ_SCRIPT, url], env={**original_env(), **aws},
                              capture_output=True, text=True, timeout=180, cwd=str(tmp_path))
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen["w"] == {str(s): [0.0, float(s), 2.0 * s] for s in (0, 2, 4)}
    finally:
        endpoint.stop()
