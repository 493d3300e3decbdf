"""Faults the hook survives (docs/faults.md, issue 37): a SIGTERM mid-run, a store that hangs,
a store that stops between a step's uploads, close() on a dead store. Real processes, real
signals, a real S3 endpoint on loopback (moto's server) or a socket that never answers."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from smdebug.trials import create_trial

TENSORS = ("a", "b", "c", "d")

# A training loop with the numpy hook that says on stdout each step it has ended, and never stops.
_TRAINER = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import smdebug as smd

    out_dir, own_handler = sys.argv[1], sys.argv[2]
    if own_handler == "1":
        def handler(signum, frame):  # a framework's handler that ends the process its own way
            with open(os.path.join(out_dir + ".handled"), "w") as fh:
                fh.write(signal.Signals(signum).name)
            os._exit(3)
        signal.signal(signal.SIGTERM, handler)
    hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1))
    if own_handler == "after":  # installed after the hook, calling the handler it found (as Lightning does)
        found = signal.getsignal(signal.SIGTERM)
        def composed(signum, frame):
            found(signum, frame)
            with open(os.path.join(out_dir + ".handled"), "w") as fh:
                fh.write("after")
            os._exit(4)
        signal.signal(signal.SIGTERM, composed)
    step = 0
    while True:
        hook.begin_step()
        for i, name in enumerate({tensors!r}):
            hook.save_tensor(name, np.full(64, step * 10 + i, dtype=np.float32), "weights")
        hook.end_step()
        print("ended", step, flush=True)
        step += 1
        time.sleep(0.003)
""").format(tensors=TENSORS)


def _run_and_terminate(tmp_path, own_handler=False, after_steps=30, env=None, signum=signal.SIGTERM,
                       out_dir=None, whole_group=False):
    """Start the trainer, send it ``signum`` (SIGTERM) once it reported ``after_steps`` ended
    steps (to its whole process group with ``whole_group``, as ``scancel`` or ``kill -TERM -PGID``
    do); returns (return code, the steps it reported ended, out_dir)."""
    out_dir = out_dir or str(tmp_path / "run")
    child = subprocess.Popen([sys.executable, "-c", _TRAINER, out_dir,
                              own_handler if isinstance(own_handler, str) else "1" if own_handler else "0"],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
                             start_new_session=whole_group)
    ended = []
    try:
        for line in child.stdout:
            ended.append(int(line.split()[1]))
            if len(ended) == after_steps:
                if whole_group:
                    os.killpg(child.pid, signum)
                else:
                    child.send_signal(signum)
                break
        ended += [int(line.split()[1]) for line in child.stdout]  # steps that ended before the signal landed
        code = child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    return code, ended, out_dir


def _assert_whole(out_dir, ended):
    """Every step in ``ended`` is readable with all its tensors, and every step the run holds is whole."""
    trial = create_trial(out_dir)
    steps = trial.steps()
    missing = sorted(set(ended) - set(steps))
    assert not missing, f"{len(missing)} ended steps lost: {missing}"
    for name in TENSORS:
        assert trial.tensor(name).steps() == steps, f"{name} is missing from some steps: a step written half"
    for step in steps:
        for i, name in enumerate(TENSORS):
            np.testing.assert_array_equal(trial.tensor(name).value(step), np.full(64, step * 10 + i, np.float32))


def test_sigterm_flushes_ended_steps_then_ends_by_the_signal(tmp_path):
    code, ended, out_dir = _run_and_terminate(tmp_path)
    assert code == -signal.SIGTERM  # the default action: the process ends by the signal, as without smdebug
    _assert_whole(out_dir, ended)


def test_a_handler_installed_after_the_hook_that_calls_it_decides_the_outcome(tmp_path):
    code, ended, out_dir = _run_and_terminate(tmp_path, own_handler="after")
    assert code == 4  # the hook flushed and returned: the composed handler ended the process its own way
    with open(out_dir + ".handled") as fh:
        assert fh.read() == "after"
    _assert_whole(out_dir, ended)


def test_sigusr1_flushes_when_the_job_asks_for_it(tmp_path):
    """SLURM's --signal=USR1@60: with SMDEBUG_FLUSH_ON_SIGNALS naming it, the same flush, then the
    signal's default action (the process ends by it, as it would have)."""
    code, ended, out_dir = _run_and_terminate(tmp_path, signum=signal.SIGUSR1,
                                              env={"SMDEBUG_FLUSH_ON_SIGNALS": "TERM,USR1"})
    assert code == -signal.SIGUSR1
    _assert_whole(out_dir, ended)


def test_sigterm_to_the_whole_job_with_a_url_out_dir_puts_every_ended_step_on_the_store(tmp_path, monkeypatch):
    """Preemption of a job writing to S3, the signal sent to the process group (the upload
    process gets it too): the training process flushes into the spool and the upload, and ends
    by the signal; the upload process ignores it and finishes. Every ended step on the store."""
    import time

    pytest.importorskip("moto.server", reason="needs moto[server] (tox core env)")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
    from s3_endpoint import Endpoint

    store = Endpoint()
    try:
        for key, value in store.environment.items():
            monkeypatch.setenv(key, value)
        store.client().create_bucket(Bucket="bucket")
        env = {"SMDEBUG_SPOOL_DIR": str(tmp_path / "spools")}
        code, ended, url = _run_and_terminate(tmp_path, env=env, out_dir="s3://bucket/preempted", whole_group=True)
        assert code == -signal.SIGTERM
        deadline = time.monotonic() + 30  # what the upload process still had to send
        while time.monotonic() < deadline and not set(ended) <= set(create_trial(url).steps()):
            time.sleep(0.2)
        _assert_whole(url, ended)
    finally:
        store.stop()


def test_sigterm_without_the_flush_loses_steps(tmp_path):
    """What the flush is for (and the opt-out works): without it, the steps the writer held are lost."""
    code, ended, out_dir = _run_and_terminate(tmp_path, env={"SMDEBUG_FLUSH_ON_SIGNALS": "0"})
    assert code == -signal.SIGTERM
    steps = create_trial(out_dir).steps() if os.path.isdir(os.path.join(out_dir, "index")) else []
    assert set(ended) - set(steps)


def test_sigterm_runs_the_programs_own_handler_after_the_flush(tmp_path):
    code, ended, out_dir = _run_and_terminate(tmp_path, own_handler=True)
    assert code == 3  # the program's handler ended the process, its own way (os._exit: no atexit)
    with open(out_dir + ".handled") as fh:
        assert fh.read() == "SIGTERM"
    _assert_whole(out_dir, ended)


def test_flush_on_signals_is_checked_at_construction(tmp_path):
    import smdebug as smd
    from smdebug.exceptions import ConfigError

    with pytest.raises(ConfigError, match="SIGKILL.*SIGTERM, SIGUSR1"):
        smd.Hook(str(tmp_path / "run"), flush_on_signals=["SIGKILL"])
    hook = smd.Hook(str(tmp_path / "run"), flush_on_signals=("TERM", "usr1", signal.SIGUSR2))
    assert hook.session.writer is not None
    assert signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL
    hook.close()  # the last hook closed: the handlers that were there before are back
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_hook_made_off_the_main_thread_installs_nothing(tmp_path, caplog):
    import threading

    import smdebug as smd

    caplog.set_level("INFO")
    made = []
    thread = threading.Thread(target=lambda: made.append(smd.Hook(str(tmp_path / "run"))))
    thread.start()
    thread.join()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert "outside the main thread" in caplog.text
    made[0].close()


# --- a store that accepts connections and never answers ---------------------------------------
class HungEndpoint:
    """A loopback socket that accepts every connection and never answers (a hung store)."""

    def __init__(self):
        import socket
        import threading

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._held = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        while True:
            try:
                self._held.append(self._sock.accept()[0])
            except OSError:
                return

    def close(self):
        self._sock.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def hung_store(monkeypatch, tmp_path):
    pytest.importorskip("s3fs")
    endpoint = HungEndpoint()
    for key, value in {"AWS_ENDPOINT_URL": endpoint.url, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                       "SMDEBUG_SPOOL_DIR": str(tmp_path / "spools")}.items():
        monkeypatch.setenv(key, value)
    yield endpoint
    endpoint.close()


@pytest.mark.timeout(120)
def test_hook_construction_against_a_hung_store_returns_at_once(hung_store, tmp_path, smdebug_warnings, monkeypatch):
    import time

    import smdebug as smd

    monkeypatch.setenv("SMDEBUG_UPLOAD_CLOSE_TIMEOUT", "1")
    monkeypatch.setenv("SMDEBUG_PREFIX_CHECK_TIMEOUT", "0.5")  # the default is 1 s: margin for a loaded machine
    started = time.monotonic()
    hook = smd.Hook("s3://bucket/run", save_config=smd.SaveConfig(save_interval=1))
    constructed = time.monotonic() - started
    assert constructed < 2.0, f"hook construction took {constructed:.1f} s against a hung store"
    warnings = " ".join(smdebug_warnings(messages=True))
    assert "did not answer" in warnings and hook.out_dir in warnings  # says so, and where the run goes
    started = time.monotonic()
    for step in range(20):  # no step boundary waits on the store either
        hook.begin_step()
        hook.save_tensor("a", np.full(8, step, np.float32), "weights")
        hook.end_step()
    assert time.monotonic() - started < 1.0
    hook.close()
    # Everything is in the spool, readable there.
    trial = create_trial(hook.out_dir)
    assert trial.steps() == list(range(20))


# --- a store that stops between a step's event and index uploads ------------------------------
class TrippingProxy:
    """A TCP proxy on loopback in front of a real endpoint that stops (closes every connection,
    accepts none) when the ``trip_at``-th request that PUTs an ``index/`` object arrives, before
    forwarding it: the store vanishes after a step's event object is up and before its index
    object is. :meth:`restart` brings it back."""

    def __init__(self, target_port, trip_at):
        import re
        import socket
        import threading

        self._target = target_port
        self._pattern = re.compile(rb"PUT [^ ]*/index/")
        self._left = trip_at
        self.down = False
        self.delay = 0.0  # seconds each request waits before it is forwarded (a slow store)
        self._lock = threading.Lock()
        self._conns = []
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading

        while True:
            try:
                client = self._sock.accept()[0]
            except OSError:
                return
            if self.down:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self._target))
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src, dst, requests):
        try:
            while not self.down:
                data = src.recv(65536)
                if not data:
                    break
                if requests and self.delay:
                    time.sleep(self.delay)
                if requests and self._pattern.search(data):
                    with self._lock:
                        self._left -= 1
                        if self._left == 0:
                            self._stop()
                            return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.close()
                except OSError:
                    pass

    def _stop(self):
        self.down = True
        for conn in self._conns:
            try:
                conn.close()
            except OSError:
                pass
        self._conns = []

    def restart(self):
        self.down = False

    def close(self):
        self._sock.close()
        with self._lock:
            self._stop()


@pytest.mark.usefixtures("layout_1034")  # about smdebug 1.0.34's files
def test_a_store_stopped_between_a_steps_event_and_index_keeps_every_step_whole(tmp_path, monkeypatch,
                                                                                 smdebug_warnings):
    pytest.importorskip("moto.server", reason="needs moto[server] (tox core env)")
    import smdebug as smd
    from smdebug.storage.format import layout
    from smdebug.storage.uploader import main as sync_main, spool_files

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support"))
    from s3_endpoint import Endpoint

    store = Endpoint()
    proxy = TrippingProxy(store.port, trip_at=4)
    try:
        for key, value in {**store.environment, "AWS_ENDPOINT_URL": proxy.url,
                           "SMDEBUG_SPOOL_DIR": str(tmp_path / "spools"), "SMDEBUG_UPLOAD_RETRY_BUDGET": "1",
                           "SMDEBUG_UPLOAD_CLOSE_TIMEOUT": "10", "SMDEBUG_PREFIX_CHECK_TIMEOUT": "10"}.items():
            monkeypatch.setenv(key, value)
        store.client().create_bucket(Bucket="bucket")
        url = "s3://bucket/split"
        hook = smd.Hook(url, save_config=smd.SaveConfig(save_interval=1))
        for step in range(10):
            hook.begin_step()
            for i, name in enumerate(TENSORS):
                hook.save_tensor(name, np.full(64, step * 10 + i, dtype=np.float32), "weights")
            hook.end_step()
            hook.flush(timeout=5)  # a step at a time: the store stops within the run, not at its end
        hook.close()
        assert proxy.down, "the store never stopped: the test tested nothing"
        spool = hook.out_dir
        left = [rel for rel, _ in spool_files(spool)]
        in_spool = {layout.parse_step_and_worker(rel.rsplit("/", 1)[1])[0]: [] for rel in left
                    if rel.startswith(("index/", "events/"))}
        for rel in left:
            if rel.startswith(("index/", "events/")):
                in_spool[layout.parse_step_and_worker(rel.rsplit("/", 1)[1])[0]].append(rel.split("/")[0])
        split = {step: kinds for step, kinds in in_spool.items() if sorted(kinds) != ["events", "index"]}
        assert not split, f"steps held in the spool only in part: {split}"
        # Each step is whole on the store or whole in the spool.
        monkeypatch.setenv("AWS_ENDPOINT_URL", store.url)
        on_store = set(create_trial(url).steps())
        assert on_store | set(in_spool) == set(range(10)) and in_spool
        # ... and the reader reads the spool's steps there, whole (what smdebug-sync will send).
        spool_trial = create_trial(spool)
        assert set(spool_trial.steps()) == set(in_spool)
        for step in in_spool:
            for i, name in enumerate(TENSORS):
                np.testing.assert_array_equal(spool_trial.tensor(name).value(step),
                                              np.full(64, step * 10 + i, np.float32))
        warnings = " ".join(smdebug_warnings(messages=True))
        assert spool in warnings and "smdebug-sync" in warnings
        # The command the warning names finishes the upload, every step whole.
        proxy.restart()
        proxy.delay = 0.4  # a slow store: the sync takes longer than close()'s first notice (2 s)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        started = time.monotonic()
        assert sync_main([spool, url]) == 0
        assert time.monotonic() - started > 2.0, "the store was not slow: the test tested nothing"
        monkeypatch.setenv("AWS_ENDPOINT_URL", store.url)
        trial = create_trial(url)
        _assert_whole_trial(trial, range(10))
        assert trial.training_ended()
    finally:
        proxy.close()
        store.stop()


def _assert_whole_trial(trial, steps):
    assert trial.steps() == list(steps)
    for step in steps:
        for i, name in enumerate(TENSORS):
            np.testing.assert_array_equal(trial.tensor(name).value(step), np.full(64, step * 10 + i, np.float32))


@pytest.mark.timeout(120)
def test_close_on_a_dead_store_says_what_it_waits_for_and_gives_up_within_its_bound(hung_store, monkeypatch,
                                                                                     caplog):
    import logging
    import time

    import smdebug as smd
    from smdebug.storage.uploader import spool_files

    bound = 4.0
    monkeypatch.setenv("SMDEBUG_UPLOAD_CLOSE_TIMEOUT", str(bound))
    monkeypatch.setenv("SMDEBUG_PREFIX_CHECK_TIMEOUT", "0.5")
    caplog.set_level(logging.INFO, logger="smdebug")
    hook = smd.Hook("s3://bucket/dead", save_config=smd.SaveConfig(save_interval=1))
    for step in range(5):
        hook.begin_step()
        for i, name in enumerate(TENSORS):
            hook.save_tensor(name, np.full(64, step * 10 + i, dtype=np.float32), "weights")
        hook.end_step()
    started = time.time()
    hook.close()
    took = time.time() - started
    assert took < bound + 6, f"close() took {took:.1f} s against its bound of {bound} s"  # + the child's grace
    spool = hook.out_dir
    waiting = [r for r in caplog.records if "close() is waiting for" in r.getMessage()]
    assert waiting and waiting[0].created - started < 3, "close() did not say within seconds what it waits for"
    assert waiting[0].levelno == logging.WARNING  # nothing goes up: the user must hear of it
    assert "s3://bucket/dead" in waiting[0].getMessage() and spool in waiting[0].getMessage()
    left_behind = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
                   and f"smdebug-sync {spool} s3://bucket/dead" in r.getMessage()]
    assert left_behind and "in the spool" in left_behind[-1]
    # Everything is kept in the spool, and readable there.
    assert "training_job_end.ts" in [rel for rel, _ in spool_files(spool)]
    _assert_whole_trial(create_trial(spool), range(5))


# --- the numpy hook's worker ---------------------------------------------------------------------
_WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    import smdebug as smd

    out_dir, how = sys.argv[1], sys.argv[2]
    kwargs = dict(rank=int(sys.argv[3]), world_size=2) if how == "arguments" else {}
    hook = smd.Hook(out_dir, include_workers="all", save_config=smd.SaveConfig(save_interval=1), **kwargs)
    for step in range(3):
        hook.begin_step()
        hook.save_tensor("w", np.full(4, 100 * hook.rank + step, np.float32), "weights")
        hook.end_step()
    hook.close()
""")


@pytest.mark.parametrize("how", ["arguments", "environment"])
def test_the_numpy_hooks_of_a_job_write_one_run_as_several_workers(tmp_path, how):
    out_dir = str(tmp_path / "run")
    children = [subprocess.Popen([sys.executable, "-c", _WORKER, out_dir, how, str(rank)],
                                 env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "2"} if how == "environment"
                                 else {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")})
                for rank in (1, 0)]
    assert [child.wait(timeout=120) for child in children] == [0, 0]
    trial = create_trial(out_dir)
    assert trial.workers() == ["worker_0", "worker_1"] and trial.steps() == [0, 1, 2]
    for rank in (0, 1):
        for step in range(3):
            assert trial.tensor("w").value(step, worker=f"worker_{rank}")[0] == 100 * rank + step


def test_a_worker_that_cannot_be_is_refused_at_construction(tmp_path, monkeypatch):
    import smdebug as smd
    from smdebug.exceptions import ConfigError

    with pytest.raises(ConfigError, match=r"rank=2, world_size=2.*0 <= rank < world_size"):
        smd.Hook(str(tmp_path / "a"), rank=2, world_size=2)
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(ConfigError, match="RANK='one'.*integers"):
        smd.Hook(str(tmp_path / "b"))
    hook = smd.Hook(str(tmp_path / "c"), rank=3, world_size=4)  # the arguments win over the environment
    assert (hook.rank, hook.world_size, hook.worker_name) == (3, 4, "worker_3") and not hook.writes_files
    hook.close()


def test_a_forked_worker_stopped_by_sigterm_ends_at_once(tmp_path):
    """A DataLoader worker (forked after the hook was made) inherits the handler; its parent stops
    it with SIGTERM: it flushes nothing of its parent's and ends by the signal at once."""
    script = textwrap.dedent("""
        import multiprocessing, sys, time
        import numpy as np
        import smdebug as smd

        hook = smd.Hook(sys.argv[1], save_config=smd.SaveConfig(save_interval=1))
        for step in range(5):
            hook.begin_step()
            hook.save_tensor("a", np.ones(4), "weights")
            hook.end_step()
        worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
        worker.start()
        time.sleep(0.3)
        started = time.monotonic()
        worker.terminate()
        worker.join(30)
        print(worker.exitcode, round(time.monotonic() - started, 2))
        hook.close()
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    code, took = done.stdout.split()
    assert int(code) == -signal.SIGTERM and float(took) < 2.0
    assert create_trial(str(tmp_path / "run")).steps() == [0, 1, 2, 3, 4]
