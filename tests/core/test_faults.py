"""Faults the hook survives (docs/faults.md, issue 37): a SIGTERM mid-run, a store that hangs,
a store that stops between a step's uploads, close() on a dead store. Real processes, real
signals, a real S3 endpoint on loopback (moto's server) or a socket that never answers."""
import os
import signal
import subprocess
import sys
import textwrap

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


def _run_and_terminate(tmp_path, own_handler=False, after_steps=30, env=None):
    """Start the trainer, SIGTERM it once it reported ``after_steps`` ended steps; returns
    (return code, the steps it reported ended, out_dir)."""
    out_dir = str(tmp_path / "run")
    child = subprocess.Popen([sys.executable, "-c", _TRAINER, out_dir, "1" if own_handler else "0"],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    ended = []
    try:
        for line in child.stdout:
            ended.append(int(line.split()[1]))
            if len(ended) == after_steps:
                child.send_signal(signal.SIGTERM)
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
