"""A real S3 endpoint on loopback for the tests: moto's server, started in this process on
a free port, with the AWS environment pointing boto3, s3fs and our hook at it.

Test modules import it after ``sys.path.insert(0, <tests/support>)`` (not the tests folder:
its subfolders are named like the frameworks and would shadow them); they skip themselves
first (``pytest.importorskip("moto.server")``) where moto is not installed.
"""
import logging
import socket

import boto3
from moto import server as moto_server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Endpoint:
    """moto's S3 server on 127.0.0.1; it can be stopped and started again on its port
    (moto keeps its objects in this process across restarts)."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = None
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.start()

    def start(self):
        self.server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self):
        self.server.stop()

    @property
    def environment(self):
        """The variables a boto3 user sets for this endpoint."""
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1"}

    def client(self):
        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1")

    def keys(self, bucket, prefix=""):
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", ()))


def serve(monkeypatch, tmp_path, bucket):
    """Start an endpoint, point the environment at it (and the hook's spools into
    ``tmp_path``), create ``bucket``; the caller stops the endpoint."""
    endpoint = Endpoint()
    for key, value in endpoint.environment.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SMDEBUG_SPOOL_DIR", str(tmp_path / "spools"))
    endpoint.client().create_bucket(Bucket=bucket)
    return endpoint
