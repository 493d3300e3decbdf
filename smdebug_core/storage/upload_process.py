"""The spool's uploader in a process of its own: what hooks with an ``s3://`` (or any network
fsspec) out_dir use by default (:func:`make_uploader`).

Why a process: an object-store client is Python (botocore signs each request, aiohttp and
fsspec's event loop run it) and holds the GIL for most of the ~2 ms each PUT costs, and a
training loop needs the GIL between every two framework calls. Measured in one process
(``benchmarks/bench_s3.py --only b --work-ms 20``, 2-core VM): saving 4 small tensors a step
to S3 made a 20 ms step 1.3x as long as saving them locally, almost all of it the training
thread waiting for the GIL; a smaller interpreter switch interval made it worse, not better.
In its own process the uploader costs the training process nothing but a pipe write per
published file.

Protocol (JSON lines). Parent to child, on the child's stdin: ``["config", {...}]`` once,
``["n", relpath, nbytes]`` per published file, ``["close", timeout]``. Child to parent, on a
copy of the child's stdout taken before anything can print there: ``["r", nbytes]`` (a file
uploaded), ``["log", level, message]`` (the uploader's log records, re-logged here under the
same logger so that they look as if uploaded in process), ``["gave_up", reason]``,
``["closed", ok, stats]``. The parent keeps its own account of what is pending (spool
limit, ``flush``), so the writer never waits for the child. If the training process dies,
the child sees its stdin close, uploads what was published and exits: the steps on the
store are complete, the end marker is not (the run did not end).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Optional, Sequence, Tuple

from ..environment import env_nonnegative_float
from .format import layout
from . import uploader as _uploader

logger = _uploader.logger  # the same logger as in-process uploads: one place to configure or capture

#: Seconds close() waits for the child beyond the upload timeout it gave it (the child
#: gives up at that timeout and replies at once; this is for a child that hangs).
_CLOSE_GRACE_S = 5.0
#: Seconds the child may take to start (import the store's client, build its uploader).
_START_TIMEOUT_S = 60.0


def make_uploader(spool: str, url: str, before_start: Optional[Callable[[], object]] = None, **kwargs):
    """The uploader of a hook's spool: in a process of its own (:class:`UploaderProcess`) unless
    the store lives in this process (``memory://``) or ``$SMDEBUG_UPLOAD_IN_PROCESS`` is set;
    then (or if the process cannot start) a thread of this one. Same interface either way.
    ``before_start()`` runs before the uploader reads the spool (while the process starts);
    what it raises propagates, the process stopped. It may run twice (the process failed to
    start after it ran): it must say the same the second time."""
    from . import remote

    url = remote.normalize_url(url)
    if url.split("://", 1)[0] != "memory" and os.environ.get(_uploader.IN_PROCESS_ENV, "") in ("", "0"):
        try:
            return UploaderProcess(spool, url, before_start=before_start, **kwargs)
        except OSError as exc:  # no fork/exec here (a sandbox): upload from a thread instead
            logger.info("smdebug: uploading from this process (could not start an upload process: %s)", exc)
    if before_start is not None:
        before_start()
    return _uploader.Uploader(spool, url, **kwargs)


class UploaderProcess(_uploader.SpoolAccount):
    """Same interface as :class:`~smdebug.storage.uploader.Uploader` (notify, spool_full,
    gave_up, pending_bytes, wait_idle, close, stats), the uploads done by a child process."""

    def __init__(self, spool: str, url: str, *, concurrency: Optional[int] = None,
                 retry_budget_s: Optional[float] = None, max_spool_bytes: Optional[int] = None,
                 extra_dirs: Sequence[Tuple[str, str]] = (), worker: Optional[str] = None,
                 wait_for_workers: Sequence[str] = (), before_start: Optional[Callable[[], object]] = None):
        self._init_account(spool, url, max_spool_bytes)
        #: The child's counters (as Uploader.stats), filled in when it has closed.
        self.stats = {}
        self._send_lock = threading.Lock()
        self._closed: Optional[bool] = None  # the child's close() result once it replied
        self._warned_left = False
        self._store_failing = False  # the child warned of a failed upload
        # The child finds this package as the parent did: the parent's sys.path entries come
        # after its own (never ahead of them: a script's folder could shadow a library).
        bootstrap = (f"import json, sys; sys.path += [p for p in json.loads(sys.argv[1]) if p not in sys.path]; "
                     f"from {__name__} import main; raise SystemExit(main())")
        self._proc = subprocess.Popen([sys.executable, "-c", bootstrap, json.dumps(sys.path)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        if before_start is not None:  # while the child imports the store's client
            try:
                before_start()
            except BaseException:
                self._proc.stdin.close()  # no config: the child exits
                self._proc.wait(10)
                raise
        self._send(["config", {"spool": self.spool, "url": self.url, "concurrency": concurrency,
                               "retry_budget_s": retry_budget_s, "max_spool_bytes": self.max_spool_bytes,
                               "extra_dirs": [list(pair) for pair in extra_dirs], "worker": worker,
                               "wait_for_workers": list(wait_for_workers)}])
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read_reports, name="smdebug-upload-reports", daemon=True)
        self._reader.start()
        # Wait until the child runs (an interpreter that cannot run it, an embedded Python
        # whose sys.executable is not one): else OSError, and make_uploader uses a thread.
        if not self._ready.wait(_START_TIMEOUT_S) or self._closed is not None or self._gave_up is not None:
            self._proc.kill()
            raise OSError(f"the upload process did not start (status {self._proc.poll()})")

    # ------------------------------------------------------------ writer-thread API
    def notify(self, relpath: str, nbytes: int = 0) -> None:
        """``relpath`` was published in the spool: one line down the pipe, never the network."""
        with self._cond:
            self._outstanding += 1
            self._backlog_bytes += nbytes
            if relpath == layout.END_OF_JOB_FILE:
                self._end_held = True  # the child holds it until close, as Uploader does
        self._send(["n", relpath, nbytes])

    def close(self, timeout: Optional[float] = None) -> bool:
        """Have the child upload what is left and exit; wait for it (see Uploader.close)."""
        if timeout is None:
            timeout = env_nonnegative_float(_uploader.CLOSE_TIMEOUT_ENV, _uploader.DEFAULT_CLOSE_TIMEOUT_S)
        self._send(["close", timeout])
        try:
            self._proc.stdin.close()
        except OSError:
            pass

        def child_replied(seconds: float) -> bool:
            with self._cond:
                return self._cond.wait_for(lambda: self._closed is not None or not self._reader.is_alive(), seconds)

        self._wait_for_close(child_replied, timeout, lambda: self._store_failing, grace=_CLOSE_GRACE_S)
        if self._closed is None:  # the child hung or died without replying
            self._proc.kill()
            self._give_up(f"the upload process did not finish within close()'s {timeout:g} s")
        self._reader.join(5)
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        return bool(self._closed) and self._gave_up is None

    # ------------------------------------------------------------ the pipe
    def _send(self, message) -> None:
        line = (json.dumps(message) + "\n").encode()
        with self._send_lock:
            try:
                self._proc.stdin.write(line)
                self._proc.stdin.flush()
            except (OSError, ValueError):  # the child is gone: its end of the story comes from the reader
                pass

    def _read_reports(self) -> None:
        for raw in self._proc.stdout:
            try:
                kind, *args = json.loads(raw)
            except ValueError:
                continue
            if kind == "ready":
                self._ready.set()
            elif kind == "r":
                with self._cond:
                    self._last_progress = time.monotonic()
                    self._backlog_bytes -= args[0]
                    self._outstanding -= 1
                    self._cond.notify_all()
            elif kind == "log":
                logger.log(args[0], "%s", args[1])
                if args[0] >= logging.WARNING:
                    self._store_failing = True
                if args[0] >= logging.WARNING and "smdebug-sync" in args[1]:
                    self._warned_left = True  # the child named the spool and the command already
            elif kind == "gave_up":
                with self._cond:
                    self._gave_up = self._gave_up or args[0]
                    self._cond.notify_all()
            elif kind == "closed":
                with self._cond:
                    self.stats.update(args[1])
                    self._closed = bool(args[0])
                    self._cond.notify_all()
        if not self._ready.is_set():  # never started: the constructor says so (no warning here)
            self._gave_up = "the upload process did not start"
            self._ready.set()
            return
        if self._closed is None:
            self._give_up(f"the upload process exited (status {self._proc.wait()}) before the upload finished")
        with self._cond:
            self._cond.notify_all()

    def _give_up(self, reason: str) -> None:
        with self._cond:
            self._gave_up = self._gave_up or reason
            warn, self._warned_left = not self._warned_left, True
            self._cond.notify_all()
        if warn:
            _uploader.warn_left_behind(self._gave_up, self.spool, self.url)


# ------------------------------------------------------------------------ the child process
class _Forward(logging.Handler):
    def __init__(self, emit_report):
        super().__init__(logging.INFO)
        self._emit_report = emit_report

    def emit(self, record):
        self._emit_report(["log", record.levelno, record.getMessage()])


def main() -> int:
    # A SIGTERM or Ctrl-C sent to the whole job (process group) is the training process's to
    # handle: this one ends when that one does (its stdin closes), after uploading what was published.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # the store's client, imported while the parent settles its check of the prefix
        import fsspec  # noqa: F401 - imported early on purpose (see above)
        import s3fs  # noqa: F401 - imported early on purpose (see above)
    except ImportError:
        pass
    reports = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol channel, line-buffered
    os.dup2(2, 1)  # anything else printed goes to stderr, not into the protocol
    sys.stdout = sys.stderr
    lock = threading.Lock()

    def report(message) -> None:
        with lock:
            try:
                reports.write(json.dumps(message) + "\n")
            except (OSError, ValueError):  # the training process is gone: the uploads go on
                pass

    upload_logger = _uploader.logger
    upload_logger.handlers[:] = [_Forward(report)]
    upload_logger.propagate = False
    upload_logger.setLevel(logging.INFO)

    class Reporting(_uploader.Uploader):
        def _release(self, nbytes: int) -> None:
            super()._release(nbytes)
            report(["r", nbytes])

        def _warn_left_behind(self) -> None:
            report(["gave_up", self._gave_up])
            super()._warn_left_behind()

        def _say_what_close_waits_for(self, timeout: float, failing: bool) -> None:
            pass  # the training process says it, counting what it notified

    uploader = None
    timeout = None
    for raw in sys.stdin:
        kind, *args = json.loads(raw)
        if kind == "config":
            config = args[0]
            uploader = Reporting(config["spool"], config["url"], concurrency=config["concurrency"],
                                 retry_budget_s=config["retry_budget_s"],
                                 max_spool_bytes=config["max_spool_bytes"],
                                 extra_dirs=[tuple(pair) for pair in config["extra_dirs"]],
                                 worker=config["worker"], wait_for_workers=config["wait_for_workers"])
            report(["ready"])
        elif kind == "n" and uploader is not None:
            uploader.notify(args[0], args[1])
        elif kind == "close":
            timeout = args[0]
            break
    if uploader is None:
        return 1
    # Closed by the parent, or the training process died (stdin ended): upload what was published.
    ok = uploader.close(timeout)
    report(["closed", ok, uploader.stats])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
