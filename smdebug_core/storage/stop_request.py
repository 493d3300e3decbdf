"""Asking a training process to stop, from another process: a file in the run directory.

The protocol works wherever the rule process and the training process see the same
directory (one machine, NFS, EFS, Lustre, a FUSE mount of object storage):

* **Writer** (a rule running in another process, or a person): :func:`write_stop_request`
  creates ``<out_dir>/smdebug_stop_request.json`` atomically (a temporary file in the same
  directory, then a rename), so a reader never sees half a file.
* **Reader** (the training process's hook): :class:`StopRequestPoller` looks for the file at
  step boundaries, at most once every ``interval_s`` seconds (default 5, or
  ``SMDEBUG_STOP_CHECK_INTERVAL_S``): one ``os.stat`` when due, a clock read otherwise.
  When the file exists it calls ``hook.request_stop(reason)``, and the framework adapter ends
  training cleanly at its next step boundary.

The file's *existence* is the request; its content (JSON, at most 64 KiB, untrusted) only
supplies the reason. A request file left over from an earlier run in the same directory is
removed when the poller is created, so it cannot stop the new run.

Request file schema (version 1)::

    {"schema": 1, "reason": "ExplodingTensor fired at step 12", "rule": "ExplodingTensor",
     "step": 12, "time": 1700000000.0, "host": "node-1", "pid": 4242}

Only ``reason`` is needed; everything else is informational.

Multi-worker jobs: each worker polls on its own clock and could see the file at a different
step; frameworks whose workers must stop together (collectives) have to agree on the stop
(e.g. rank 0 polls and broadcasts), which is the adapter's part.
"""
from __future__ import annotations

import json
import os
import stat
import time
from typing import Optional

from ..environment import env_nonnegative_float
from ..logger import get_logger

logger = get_logger("smdebug.rules")

#: Name of the request file inside the run directory.
STOP_REQUEST_FILE = "smdebug_stop_request.json"
#: Environment variable overriding the default poll interval (seconds).
POLL_INTERVAL_ENV = "SMDEBUG_STOP_CHECK_INTERVAL_S"
DEFAULT_POLL_INTERVAL_S = 5.0
_MAX_REQUEST_BYTES = 64 * 1024
_MAX_REASON_CHARS = 2000


def stop_request_path(out_dir) -> str:
    """Where the stop request for the run in ``out_dir`` lives."""
    return os.path.join(os.fspath(out_dir), STOP_REQUEST_FILE)


def write_stop_request(out_dir, reason: str, rule: Optional[str] = None, step: Optional[int] = None) -> str:
    """Ask the training process writing ``out_dir`` to stop; returns the request file's path.

    Atomic: the file appears complete or not at all. Writing it again replaces the reason.
    Raises OSError if the directory cannot be written.
    """
    import socket
    import tempfile

    if not isinstance(reason, str) or not reason.strip():
        raise ValueError(f"a stop request needs a non-empty reason string, got {reason!r}")
    out_dir = os.fspath(out_dir)
    from .remote import is_url

    if is_url(out_dir):
        # The hook polls its local spool, not the store: a request object would cost training a
        # network round trip at every check.
        raise NotImplementedError(
            f"cannot request a stop through {out_dir}: stop requests are not read from object stores. On the "
            "training machine, write it into the hook's spool directory (write_stop_request(hook.out_dir, ...)), "
            "or evaluate the rule live with hook.add_rule(rule, actions=StopTraining())")
    if not os.path.isdir(out_dir):
        raise FileNotFoundError(f"cannot request a stop: run directory {out_dir} does not exist")
    doc = {"schema": 1, "reason": reason, "rule": rule, "step": step, "time": time.time(),
           "host": socket.gethostname(), "pid": os.getpid()}
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".smdebug_stop_request.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh)
            fh.flush()
            os.fsync(fh.fileno())  # shared file systems: the content must land before the name
        final = stop_request_path(out_dir)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    return final


def read_stop_request(out_dir) -> Optional[str]:
    """The reason of a pending stop request for ``out_dir``, or None when there is none.

    The file is untrusted: an unreadable or malformed one is still a request (its existence
    is the signal), with a reason saying so.
    """
    path = stop_request_path(out_dir)
    try:
        # Non-blocking, regular files only: this runs on the training thread, and a FIFO
        # put there would otherwise block training forever.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"stop requested through {path} (the file could not be read: {exc.strerror or exc})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return f"stop requested through {path} (not a regular file: no reason read)"
        data = os.read(fd, _MAX_REQUEST_BYTES + 1)
    except OSError as exc:
        return f"stop requested through {path} (the file could not be read: {exc.strerror or exc})"
    finally:
        os.close(fd)
    reason = None
    if len(data) <= _MAX_REQUEST_BYTES:
        try:
            doc = json.loads(data)
            if isinstance(doc, dict) and isinstance(doc.get("reason"), str) and doc["reason"].strip():
                reason = doc["reason"][:_MAX_REASON_CHARS]
        except (ValueError, UnicodeDecodeError, RecursionError):
            pass
    return reason if reason is not None else f"stop requested through {path} (no readable reason in the file)"


class StopRequestPoller:
    """Checks cheaply, at step boundaries, whether a stop was requested for ``out_dir``.

    Args:
        out_dir: the run directory the hook writes.
        interval_s: look at the file system at most this often (seconds); default
            ``$SMDEBUG_STOP_CHECK_INTERVAL_S`` or 5. The first call always looks.
        clear_stale: remove a request file that already exists now (left by an earlier
            run in the same directory).

    Call :meth:`check` (with the hook) or :meth:`poll` (returns the reason) once per step.
    """

    def __init__(self, out_dir, interval_s: Optional[float] = None, clear_stale: bool = True):
        self.path = stop_request_path(out_dir)
        self.out_dir = os.fspath(out_dir)
        if interval_s is None:
            interval_s = env_nonnegative_float(POLL_INTERVAL_ENV, DEFAULT_POLL_INTERVAL_S, " of seconds")
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not interval_s >= 0:
            raise ValueError(f"interval_s must be a number of seconds >= 0, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self._next_check = 0.0
        self.requested: Optional[str] = None
        if clear_stale and os.path.exists(self.path):
            try:
                os.remove(self.path)
                logger.warning("smdebug: removed a stop request left in %s by an earlier run", self.path)
            except OSError as exc:
                logger.warning("smdebug: a stale stop request %s exists and cannot be removed (%s); "
                               "it will stop this run", self.path, exc.strerror or exc)

    def poll(self) -> Optional[str]:
        """The stop reason once a request exists, else None. Touches the disk only when due."""
        if self.requested is not None:
            return self.requested
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + self.interval_s
        if not os.path.exists(self.path):
            return None
        self.requested = read_stop_request(self.out_dir)
        return self.requested

    def check(self, hook) -> bool:
        """Poll, and call ``hook.request_stop(reason)`` when a request appeared. Never raises."""
        if getattr(hook, "stop_reason", None) is not None:
            return True
        try:
            reason = self.poll()
        except Exception as exc:  # noqa: BLE001 - polling must never break training
            logger.debug("smdebug: stop request poll failed: %s", exc)
            return False
        if reason is None:
            return False
        hook.request_stop(reason)
        return True
