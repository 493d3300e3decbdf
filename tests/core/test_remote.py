"""Runs on object storage (issue 19): the hook's out_dir and create_trial on URLs.

Against a real S3 endpoint on loopback (moto's server, a separate HTTP server in this
process) and fsspec's in-memory filesystem; no mocks. The endpoint is stopped and started
again to test outages.
"""
import json
import logging
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

moto_server = pytest.importorskip("moto.server", reason="needs moto[server] (tox core env)")
boto3 = pytest.importorskip("boto3")
pytest.importorskip("s3fs")

import smdebug as smd  # noqa: E402
from smdebug.exceptions import CorruptRecord, OutDirError, RunNotFound  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402
from smdebug.storage.uploader import main as sync_main  # noqa: E402
from smdebug.storage.uploader import spool_files  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
from s3_endpoint import Endpoint  # noqa: E402

UPLOAD_LOGGER = "smdebug.storage.uploader"


@pytest.fixture(scope="module")
def endpoint():
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                            "AWS_DEFAULT_REGION")}
    ep = Endpoint()
    os.environ.update(ep.environment)
    yield ep
    ep.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


_buckets = iter(range(10**6))


@pytest.fixture
def bucket(endpoint, tmp_path, monkeypatch):
    name = f"run-bucket-{next(_buckets)}"
    endpoint.client().create_bucket(Bucket=name)
    monkeypatch.setenv("SMDEBUG_SPOOL_DIR", str(tmp_path / "spools"))
    return name


def _train(hook, steps, start=0, size=4):
    """Saves one small tensor (and a scalar) per step; returns the per-step wall times."""
    times = []
    for step in range(start, start + steps):
        t0 = time.perf_counter()
        hook.begin_step()
        hook.save_tensor("w", np.arange(size, dtype=np.float32) * step, "weights")
        hook.save_scalar("loss", float(step))
        hook.end_step()
        times.append(time.perf_counter() - t0)
    return times


def _spool_left(tmp_path):
    """(spool, files left in it); (None, []) once a complete upload has removed the spool."""
    spools = list((tmp_path / "spools").iterdir())
    assert len(spools) <= 1
    if not spools:
        return None, []
    return str(spools[0]), [rel for rel, _ in spool_files(str(spools[0]))]


# ----------------------------------------------------------------------------- writing and reading
def test_s3_run_has_the_local_layout_and_reads_back(endpoint, bucket, tmp_path):
    url = f"s3://{bucket}/jobs/exp1/"
    local = str(tmp_path / "local")
    for out_dir in (url, local):
        hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=2))
        _train(hook, 9)
        hook.close()
    local_files = sorted(os.path.relpath(os.path.join(d, f), local)
                         for d, _, fs in os.walk(local) for f in fs)
    assert endpoint.keys(bucket) == [f"jobs/exp1/{rel}" for rel in local_files]
    trial = create_trial(url)
    assert trial.steps() == create_trial(local).steps()
    assert trial.tensor("w").steps() == [0, 2, 4, 6, 8]
    assert trial.training_ended()
    np.testing.assert_array_equal(trial.tensor("w").value(6), np.arange(4, dtype=np.float32) * 6)
    assert trial.tensor("scalar/loss").values() == {s: pytest.approx(float(s)) for s in trial.steps()}
    assert _spool_left(tmp_path) == (None, [])  # everything uploaded: the spool is removed


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_each_object_is_uploaded_once_bytes_up_equal_bytes_written(endpoint, bucket):
    hook = smd.Hook(out_dir=f"s3://{bucket}/once", save_config=smd.SaveConfig(save_interval=1))
    _train(hook, 12)
    uploader = hook.session.writer.uploader
    hook.close()
    stats = uploader.stats
    stored = sum(obj["Size"] for obj in endpoint.client().list_objects_v2(Bucket=bucket)["Contents"])
    assert stats["bytes"] == stored
    # The collections file is rewritten at close with the same bytes: not sent again.
    assert stats["bytes"] + stats["bytes_not_resent"] == stats["bytes_published"]
    assert stats["objects"] == stats["put_requests"] == 12 * 2 + 2  # per step event + index; collections; marker
    assert stats["failed_attempts"] == 0


def test_memory_url_and_json_config_local_path(tmp_path, monkeypatch):
    monkeypatch.setenv("SMDEBUG_SPOOL_DIR", str(tmp_path / "spools"))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"LocalPath": "memory://cfg/run1",
                                  "HookParameters": {"save_interval": "3"}}))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(config))
    hook = smd.Hook.create_from_json_file()
    assert hook.out_url == "memory://cfg/run1"
    _train(hook, 7)
    hook.close()
    trial = create_trial("memory://cfg/run1")
    assert trial.tensor("w").steps() == [0, 3, 6]
    assert trial.training_ended()


def test_live_run_refreshes_by_listing_after_the_last_step(endpoint, bucket):
    url = f"s3://{bucket}/live"
    hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1))
    _train(hook, 3)
    assert hook.flush(timeout=30)  # on the store, not only in the spool
    trial = create_trial(url)
    assert trial.steps() == [0, 1, 2] and not trial.training_ended()
    parsed = trial.stats["index_files_parsed"]
    _train(hook, 2, start=3)
    assert hook.flush(timeout=30)
    assert trial.steps() == [0, 1, 2, 3, 4]
    assert trial.stats["index_files_parsed"] == parsed + 2  # only the new index objects were read
    hook.close()
    assert trial.training_ended()
    np.testing.assert_array_equal(trial.tensor("w").value(4), np.arange(4, dtype=np.float32) * 4)


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_reading_one_tensor_fetches_a_range_not_the_event_object(endpoint, bucket):
    url = f"s3://{bucket}/ranged"
    hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1))
    hook.begin_step()
    hook.save_tensor("big", np.ones(250_000, dtype=np.float32), "weights")  # 1 MB in the same event object
    hook.save_tensor("small", np.arange(3.0), "weights")
    hook.end_step()
    hook.close()
    trial = create_trial(url)
    storage = trial._storage
    before = storage.stats["bytes_fetched"]
    np.testing.assert_array_equal(trial.tensor("small").value(0), np.arange(3.0))
    assert storage.stats["bytes_fetched"] - before < 1000


def test_hook_refuses_a_prefix_holding_a_run_unless_overwrite(endpoint, bucket, monkeypatch, tmp_path):
    # What is tested is the refusal: on a loaded machine the check's 1 s default can pass
    # first (training then starts, and the uploader refuses instead: test_a_prefix_holding_a_run_is_checked_before_the_first_upload_when_the_store_was_down).
    monkeypatch.setenv("SMDEBUG_PREFIX_CHECK_TIMEOUT", "30")
    url = f"s3://{bucket}/taken"
    hook = smd.Hook(out_dir=url)
    _train(hook, 1)
    hook.close()
    with pytest.raises(OutDirError, match="already holds a run.*overwrite=True"):
        smd.Hook(out_dir=url)

    # Also where no upload process can start (the hook uploads from a thread of its own).
    with monkeypatch.context() as patched:
        patched.setattr(sys, "executable", str(tmp_path / "no-python-here"))
        with pytest.raises(OutDirError, match="already holds a run"):
            smd.Hook(out_dir=url)
    hook = smd.Hook(out_dir=url, overwrite=True, save_config=smd.SaveConfig(save_interval=1))
    _train(hook, 2, start=100)
    hook.close()
    trial = create_trial(url)
    assert trial.steps() == [0, 1] and trial.tensor("w").value(0)[1] == 100.0  # the new run's values


def test_tensorboard_files_are_uploaded_once_at_close(endpoint, bucket):
    url = f"s3://{bucket}/tb"
    hook = smd.Hook(out_dir=url, export_tensorboard=True, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights"])
    _train(hook, 3)
    hook.close()
    objects = {o["Key"]: o for o in endpoint.client().list_objects_v2(Bucket=bucket, Prefix="tb/")["Contents"]}
    tb = [k for k in objects if k.startswith("tb/tensorboard/")]
    assert tb and all(k.endswith(".tfevents") and objects[k]["Size"] > 0 for k in tb)
    # Uploaded at close, before the end marker.
    end = objects["tb/training_job_end.ts"]["LastModified"]
    assert all(objects[k]["LastModified"] <= end for k in tb)
    assert create_trial(url).training_ended()


# ----------------------------------------------------------------------------- outages
def test_endpoint_stopped_mid_run_and_started_again(endpoint, bucket, tmp_path, caplog):
    url = f"s3://{bucket}/outage"
    hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1))
    _train(hook, 3)
    assert hook.flush(timeout=30)
    endpoint.stop()
    try:
        with caplog.at_level(logging.WARNING, logger=UPLOAD_LOGGER):
            times = _train(hook, 20, start=3)
            hook.session.writer.flush(timeout=0.5)  # the writer publishes into the spool; the upload fails
            time.sleep(1.0)
    finally:
        endpoint.start()
    assert max(times) < 0.5, "training waited for the network"
    hook.close()
    warnings = [r for r in caplog.records if r.name == UPLOAD_LOGGER and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "spool" in warnings[0].getMessage()
    trial = create_trial(url)
    assert trial.steps() == list(range(23)) and trial.training_ended()
    assert trial.tensor("w").values()[22][1] == 22.0
    assert _spool_left(tmp_path)[1] == []


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_endpoint_gone_for_good_leaves_the_spool_and_the_sync_command(endpoint, bucket, tmp_path, caplog,
                                                                    monkeypatch, capsys):
    monkeypatch.setenv("SMDEBUG_UPLOAD_RETRY_BUDGET", "1")
    url = f"s3://{bucket}/gone"
    hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1))
    endpoint.stop()
    try:
        with caplog.at_level(logging.WARNING, logger=UPLOAD_LOGGER):
            times = _train(hook, 10)
            started = time.monotonic()
            hook.close()
            closing = time.monotonic() - started
        assert max(times) < 0.5 and closing < 30
        spool, left = _spool_left(tmp_path)
        messages = [r.getMessage() for r in caplog.records if r.name == UPLOAD_LOGGER]
        assert any(f"smdebug-sync {spool} {url}" in m for m in messages)
        assert "training_job_end.ts" in left and len([r for r in left if r.startswith("index/")]) == 10
    finally:
        endpoint.start()
    # The command from the warning finishes the upload.
    assert sync_main([spool, url]) == 0
    assert "files uploaded" in capsys.readouterr().out
    trial = create_trial(url)
    assert trial.steps() == list(range(10)) and trial.training_ended()
    assert _spool_left(tmp_path)[1] == []


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_a_prefix_holding_a_run_is_checked_before_the_first_upload_when_the_store_was_down(
        endpoint, bucket, tmp_path, caplog, monkeypatch):
    # Run A ends in the prefix; run B starts there while the store is down, so the hook
    # cannot refuse it: the uploader checks before it sends anything, and B never mixes into A.
    monkeypatch.setenv("SMDEBUG_UPLOAD_IN_PROCESS", "1")
    url = f"s3://{bucket}/twice"
    hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1))
    _train(hook, 5)
    hook.close()
    endpoint.stop()
    try:
        with caplog.at_level(logging.WARNING):
            hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1))
            assert any("could not check" in r.getMessage() for r in caplog.records)
            _train(hook, 3, start=0, size=4)
    finally:
        endpoint.start()
    with caplog.at_level(logging.WARNING, logger=UPLOAD_LOGGER):
        hook.close()
    messages = [r.getMessage() for r in caplog.records if r.name == UPLOAD_LOGGER]
    assert any("nothing was uploaded" in m and "already holds a run" in m for m in messages), messages
    trial = create_trial(url)  # run A, untouched
    assert trial.steps() == list(range(5)) and [trial.tensor("scalar/loss").value(s).item() for s in range(5)] == \
        [0.0, 1.0, 2.0, 3.0, 4.0]
    spool, left = _spool_left(tmp_path)
    assert len([r for r in left if r.startswith("index/")]) == 3  # run B waits in the spool
    assert sync_main([spool, f"s3://{bucket}/elsewhere"]) == 0  # ... for a prefix of its own
    assert create_trial(f"s3://{bucket}/elsewhere").steps() == [0, 1, 2]


def test_sync_command_is_installed_and_reads_the_url_from_the_spool(endpoint, bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("SMDEBUG_UPLOAD_RETRY_BUDGET", "0.5")
    url = f"s3://{bucket}/cli"
    hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1))
    endpoint.stop()
    try:
        _train(hook, 2)
        hook.close()
    finally:
        endpoint.start()
    spool, left = _spool_left(tmp_path)
    assert left
    exe = os.path.join(os.path.dirname(sys.executable), "smdebug-sync")
    done = subprocess.run([exe, spool], capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert done.returncode == 0, done.stderr
    assert create_trial(url).steps() == [0, 1]
    bad = subprocess.run([exe, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "not an smdebug spool" in bad.stderr


# ----------------------------------------------------------------------------- reading mistakes and hostile objects
def test_opening_urls_that_hold_no_run(endpoint, bucket):
    with pytest.raises(RunNotFound, match="holds no objects"):
        create_trial(f"s3://{bucket}/nothing-here")
    pytest.importorskip("fsspec")
    for use in (create_trial, lambda url: smd.Hook(out_dir=url)):
        try:
            import gcsfs  # noqa: F401
        except ImportError:
            with pytest.raises(ImportError, match="'gs://bucket/run' needs fsspec.*install"):
                use("gs://bucket/run")
        with pytest.raises(ValueError, match="'nosuchscheme://b/run'.*installed fsspec filesystem"):
            use("nosuchscheme://b/run")


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_hostile_objects_get_the_named_errors(endpoint, bucket, monkeypatch, caplog):
    url = f"s3://{bucket}/hostile"
    hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1))
    _train(hook, 4)
    hook.close()
    client = endpoint.client()
    prefix = "hostile/index/000000000/"
    client.put_object(Bucket=bucket, Key=prefix + "000000000001_worker_0.json", Body=b"{not json")
    entry = json.loads(client.get_object(Bucket=bucket, Key=prefix + "000000000002_worker_0.json")["Body"].read())
    entry["meta"]["event_file_name"] = "../../outside/x.tfevents"
    client.put_object(Bucket=bucket, Key=prefix + "000000000002_worker_0.json", Body=json.dumps(entry).encode())
    entry = json.loads(client.get_object(Bucket=bucket, Key=prefix + "000000000003_worker_0.json")["Body"].read())
    for item in entry["tensor_payload"]:
        item["length"] = 1 << 40  # a terabyte-long record: never fetched
    client.put_object(Bucket=bucket, Key=prefix + "000000000003_worker_0.json", Body=json.dumps(entry).encode())
    with caplog.at_level(logging.WARNING):
        trial = create_trial(url)
    assert trial.steps() == [0, 3]  # as for local files: a corrupt index costs its step, named once
    assert trial.corrupt_index_files == ["index/000000000/000000000001_worker_0.json",
                                         "index/000000000/000000000002_worker_0.json"]
    assert "event_file_name '../../outside/x.tfevents' must be a relative path" in caplog.text
    with pytest.raises(CorruptRecord, match=r"holds \d+ of the record.s \d+ bytes there"):
        trial.tensor("w").value(3)
    # An index object larger than the format allows is refused without being downloaded.
    import smdebug.analysis.trials.run_index as run_index_module

    monkeypatch.setattr(run_index_module, "MAX_INDEX_FILE_BYTES", 64)
    trial = create_trial(url)
    assert trial.steps() == [] and len(trial.corrupt_index_files) == 4
    assert trial._storage.stats["bytes_fetched"] < 4 * 65 + 20_000  # the collections file and 65 bytes each


def test_rules_cli_reads_a_run_on_s3(endpoint, bucket, capsys):
    from smdebug.analysis.rules.cli import main as rules_main

    url = f"s3://{bucket}/rules"
    hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1))
    _train(hook, 6)
    hook.close()
    code = rules_main([url])
    out = capsys.readouterr()
    assert code in (0, 1), out.err
    assert "Loss" in out.out or "loss" in out.out  # the loss rules had something to read
    assert rules_main(["nosuchscheme://b/run"]) == 2
    assert "nosuchscheme" in capsys.readouterr().err


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_reading_every_tensor_costs_one_get_per_event_object(endpoint, bucket):
    url = f"s3://{bucket}/every"
    hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1))
    for step in range(5):
        hook.begin_step()
        for name in ("a", "b", "c"):
            hook.save_tensor(name, np.full(10, step, dtype=np.float64), "weights")
        hook.end_step()
    hook.close()
    trial = create_trial(url)
    before = trial.stats["get_requests"]
    values = {name: trial.tensor(name).values() for name in ("a", "b", "c")}
    assert all(v[4][0] == 4.0 for v in values.values())
    assert trial.stats["get_requests"] - before == 5  # read-ahead: the step's other records come along


def test_stop_requests_for_a_remote_run_go_through_the_spool(endpoint, bucket):
    from smdebug.rules import write_stop_request

    url = f"s3://{bucket}/stop"
    hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1))
    _train(hook, 1)
    with pytest.raises(NotImplementedError, match="spool directory"):
        write_stop_request(url, "loss exploded")
    write_stop_request(hook.out_dir, "loss exploded")  # hook.out_dir is the spool
    hook.session._stop_poller._next_check = 0.0
    _train(hook, 1)
    assert hook.stop_requested and "loss exploded" in hook.stop_reason
    hook.close()
    assert create_trial(url).training_ended()
    reason = endpoint.client().get_object(Bucket=bucket, Key="stop/training_stop_reason.json")["Body"].read()
    assert b"loss exploded" in reason
    assert "stop/smdebug_stop_request.json" not in endpoint.keys(bucket)


def test_a_hook_that_writes_nothing_makes_no_spool_and_contacts_no_store(tmp_path, monkeypatch):
    monkeypatch.setenv("SMDEBUG_SPOOL_DIR", str(tmp_path / "spools"))
    hook = smd.Hook(out_dir="s3://no-such-bucket-anywhere/run", dry_run=True)
    _train(hook, 2)
    hook.close()
    assert hook.session.writer is None and not (tmp_path / "spools").exists()


class SlowProxy:
    """A TCP proxy to the endpoint that holds every chunk from the client for ``delay`` s:
    a slow (far away, congested) S3."""

    def __init__(self, target_port, delay):
        import threading

        self.delay = delay
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._threading = threading
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._threading.Thread(target=self._pipe, args=(client, upstream, self.delay), daemon=True).start()
            self._threading.Thread(target=self._pipe, args=(upstream, client, 0), daemon=True).start()

    @staticmethod
    def _pipe(src, dst, delay):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if delay:
                    time.sleep(delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.listener.close()


def test_slow_endpoint_training_does_not_wait(endpoint, bucket, monkeypatch, caplog):
    proxy = SlowProxy(endpoint.port, delay=0.15)  # every request takes >= 0.15 s
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    try:
        url = f"s3://{bucket}/slow"
        hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1))
        with caplog.at_level(logging.WARNING, logger=UPLOAD_LOGGER):
            times = _train(hook, 20)
            hook.close()  # waits for the upload, which is slow but works
        assert max(times) < 0.1, "a training step waited for the slow endpoint"
        assert not [r for r in caplog.records if r.name == UPLOAD_LOGGER and r.levelno >= logging.WARNING]
    finally:
        proxy.close()
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint.url)
    trial = create_trial(url)
    assert trial.steps() == list(range(20)) and trial.training_ended()


def test_endpoint_and_credentials_from_an_aws_profile(endpoint, bucket, tmp_path, monkeypatch):
    """No AWS_* keys or endpoint in the environment: a named profile in the AWS config files
    gives them, as it does to boto3."""
    (tmp_path / "config").write_text(f"[profile moto-test]\nregion = us-east-1\nendpoint_url = {endpoint.url}\n")
    (tmp_path / "credentials").write_text("[moto-test]\naws_access_key_id = testing\n"
                                          "aws_secret_access_key = testing\n")
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_PROFILE", "moto-test")
    url = f"s3://{bucket}/profile"
    hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1))
    _train(hook, 3)
    hook.close()
    assert hook.session.writer is None or hook.session.writer.uploader.gave_up is None
    assert create_trial(url).steps() == [0, 1, 2]


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_uploads_run_in_a_process_of_their_own_and_outlive_a_killed_training_process(endpoint, bucket, tmp_path):
    """The uploader is a child process (the training process keeps its GIL). A training
    process killed without close(): the child sees its pipe close and uploads every step
    that was published; the end marker is not there (the run did not end)."""
    from smdebug.storage.upload_process import UploaderProcess

    url = f"s3://{bucket}/killed"
    hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1))
    assert isinstance(hook.session.writer.uploader, UploaderProcess)
    hook.close()

    script = tmp_path / "train_and_die.py"
    script.write_text(
        "import os, time, numpy as np, smdebug as smd\n"
        f"hook = smd.Hook(out_dir={url + '2'!r}, save_config=smd.SaveConfig(save_interval=1))\n"
        "for step in range(5):\n"
        "    hook.begin_step()\n"
        "    hook.save_tensor('w', np.full(3, step, dtype=np.float32), 'weights')\n"
        "    hook.end_step()\n"
        "hook.session.writer.publish()\n"
        "time.sleep(1.0)  # the steps are in the spool; the slow store has not taken them all\n"
        "print('pending', hook.session.writer.uploader.pending_bytes, flush=True)\n"
        "os._exit(3)  # killed: no close(), no atexit\n")
    proxy = SlowProxy(endpoint.port, delay=0.3)  # every request takes >= 0.3 s
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "AWS_ENDPOINT_URL": proxy.url}
        done = subprocess.run([sys.executable, str(script)], env=env, timeout=120, capture_output=True, text=True)
        assert done.returncode == 3, done.stderr
        assert int(done.stdout.split("pending")[1]) > 0  # the process died with uploads to do
        deadline = time.monotonic() + 60
        while True:
            found = endpoint.client().list_objects_v2(Bucket=bucket, Prefix="killed2/").get("Contents", [])
            if len([o for o in found if "/index/" in o["Key"]]) == 5 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        proxy.close()
    trial = create_trial(url + "2")
    assert trial.steps() == [0, 1, 2, 3, 4] and trial.tensor("w").value(4).tolist() == [4.0, 4.0, 4.0]
    assert not trial.training_ended()


def test_in_process_uploads_on_request(endpoint, bucket, monkeypatch):
    from smdebug.storage.uploader import Uploader

    monkeypatch.setenv("SMDEBUG_UPLOAD_IN_PROCESS", "1")
    hook = smd.Hook(out_dir=f"s3://{bucket}/thread", save_config=smd.SaveConfig(save_interval=1))
    assert type(hook.session.writer.uploader) is Uploader
    _train(hook, 3)
    hook.close()
    assert create_trial(f"s3://{bucket}/thread").steps() == [0, 1, 2]


def test_an_interpreter_that_cannot_run_the_upload_process_falls_back_to_a_thread(endpoint, bucket, monkeypatch,
                                                                                   caplog):
    # An embedded Python whose sys.executable is something else: the child never starts.
    from smdebug.storage.uploader import Uploader

    monkeypatch.setattr(sys, "executable", "/bin/false")
    with caplog.at_level(logging.INFO, logger=UPLOAD_LOGGER):
        hook = smd.Hook(out_dir=f"s3://{bucket}/fallback", save_config=smd.SaveConfig(save_interval=1))
    assert type(hook.session.writer.uploader) is Uploader
    assert "could not start an upload process" in caplog.text
    _train(hook, 2)
    hook.close()
    assert create_trial(f"s3://{bucket}/fallback").steps() == [0, 1]


def test_a_run_store_goes_up_one_put_per_file_per_segment(endpoint, bucket, tmp_path):
    """docs/format.md 10.5: sealed segments only (chunks, tensors, statistics), one PUT each."""
    from smdebug.storage.format import store

    url = f"s3://{bucket}/store"
    hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1), layout="store")
    uploader = hook.session.writer.uploader
    hook.session.writer._sink.segment_steps = 100  # three segments in a short test
    _train(hook, 250)
    hook.close()
    keys = endpoint.keys(bucket)
    segments = [k for k in keys if k.startswith(f"store/{store.STATISTICS_DIR}/")]
    assert len(segments) == 3
    assert not [k for k in keys if "/live/" in k or k.endswith(".tmp")]
    # collections, the layout file, 3 files a segment, the end marker
    assert uploader.stats["put_requests"] == len(keys) == 2 + 3 * 3 + 1
    trial = create_trial(url)
    assert trial.steps() == list(range(250))
    np.testing.assert_array_equal(trial.tensor("w").value(249), np.arange(4, dtype=np.float32) * 249)
    assert trial.tensor("scalar/loss").value(7) == 7.0
