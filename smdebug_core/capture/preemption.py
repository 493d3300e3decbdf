"""Flush the steps that have ended when the job is told to stop (SIGTERM), then let the signal
do what it would have done.

Schedulers, Kubernetes and spot preemption stop a job with SIGTERM and kill it a grace period
later; Python runs no ``atexit`` for a process a signal ends. So each hook that writes files
registers its session here, and the first one installs one handler per signal (from the main
thread only: Python allows nothing else). On the signal the handler waits, at most
``$SMDEBUG_SIGNAL_FLUSH_TIMEOUT`` seconds (10), until every registered session's ended steps
are published (and, for a URL out_dir, uploaded); the step still open is not written (never
half). Then it calls the handler that was installed before (the program's, Lightning's,
torchrun's...), or, if there was none, restores the default action and raises the signal
again, so the process ends as it would have without smdebug.

Which signals: the hook argument ``flush_on_signals``, else ``$SMDEBUG_FLUSH_ON_SIGNALS``
(``TERM`` by default; ``TERM,USR1`` for SLURM's ``--signal=USR1@60``; ``0`` for none).
A signal the program ignores (SIG_IGN) is left alone. A handler the program installs after the
hook replaces this one (Python keeps one per signal): call ``hook.flush(timeout)`` in it, or
call the handler it replaced (Lightning does): this one then flushes and returns, leaving
the signal's outcome to the caller.

The flush runs on a thread of its own while the main thread waits: a lock the training thread
held when the signal came costs the deadline, never a hang.
"""
from __future__ import annotations

import os
import signal
import threading
import time
import weakref
from typing import Dict, Tuple

from ..environment import env_nonnegative_float
from ..exceptions import ConfigError
from ..logger import get_logger

logger = get_logger()

FLUSH_SIGNALS_ENV = "SMDEBUG_FLUSH_ON_SIGNALS"
FLUSH_TIMEOUT_ENV = "SMDEBUG_SIGNAL_FLUSH_TIMEOUT"
#: Seconds the handler waits for the flush: well inside the usual 30 s grace period before SIGKILL.
DEFAULT_FLUSH_TIMEOUT_S = 10.0
#: The signals a hook may flush on (SIGINT already reaches the program as KeyboardInterrupt).
ALLOWED = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP")
_OFF = {"", "0", "false", "no", "off", "none"}

# session -> the process that registered it: a forked child (a DataLoader worker, which its
# parent stops with SIGTERM) inherits the handler and this table, not the sessions' threads.
_sessions: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_previous: Dict[int, object] = {}  # signal -> the handler installed before ours
_lock = threading.Lock()


def flush_signals(value=None) -> Tuple[int, ...]:
    """The signal numbers of the hook argument ``flush_on_signals`` (None: the environment's,
    else SIGTERM; False: none; True: SIGTERM; names or numbers). ConfigError for anything else."""
    if value is None:
        raw = os.environ.get(FLUSH_SIGNALS_ENV)
        value = "TERM" if raw is None else raw
        where = f"environment variable {FLUSH_SIGNALS_ENV}={raw!r}"
    else:
        where = f"flush_on_signals={value!r}"
    if value is False or (isinstance(value, str) and value.strip().lower() in _OFF):
        return ()
    if value is True:
        value = ("SIGTERM",)
    items = value.replace(",", " ").split() if isinstance(value, str) else value
    try:
        items = list(items)
    except TypeError:
        items = [value]
    found = []
    for item in items:
        name = signal.Signals(item).name if isinstance(item, int) and item in set(signal.Signals) else (
            f"SIG{str(item).upper().strip()}" if not str(item).upper().strip().startswith("SIG")
            else str(item).upper().strip())
        if name not in ALLOWED or not hasattr(signal, name):
            raise ConfigError(f"{where}: {item!r} is not a signal smdebug flushes on; give some of "
                              f"{', '.join(n for n in ALLOWED if hasattr(signal, n))}, or False (0) for none")
        if getattr(signal, name) not in found:
            found.append(getattr(signal, name))
    return tuple(found)


def flush_timeout() -> float:
    return env_nonnegative_float(FLUSH_TIMEOUT_ENV, DEFAULT_FLUSH_TIMEOUT_S, " of seconds")


def watch(session, signals: Tuple[int, ...]) -> None:
    """Flush ``session`` on each of ``signals`` until :func:`unwatch` (its close)."""
    if not signals:
        return
    with _lock:
        _sessions[session] = os.getpid()
    if threading.current_thread() is not threading.main_thread():
        if not all(s in _previous for s in signals):
            logger.info("smdebug: the hook was made outside the main thread, where Python cannot install signal "
                        "handlers: its ended steps are not flushed on %s (call hook.flush() in your own handler)",
                        ", ".join(signal.Signals(s).name for s in signals))
        return
    for signum in signals:
        _install(signum)


def unwatch(session) -> None:
    """``session`` closed: no longer flushed. With no session left, the handlers go (where they
    are still ours and this is the main thread), and the program's own are back."""
    with _lock:
        _sessions.pop(session, None)
        if len(_sessions) or threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in list(_previous.items()):
            if signal.getsignal(signum) is _on_signal:
                signal.signal(signum, previous)
                del _previous[signum]


def _install(signum: int) -> None:
    with _lock:
        current = signal.getsignal(signum)
        if current is _on_signal:
            return
        name = signal.Signals(signum).name
        if current is signal.SIG_IGN or current is None:  # ignored, or a handler not set from Python
            logger.info("smdebug: %s is %s in this process; the hook leaves it so (no flush on it)", name,
                        "ignored" if current is signal.SIG_IGN else "handled outside Python")
            return
        signal.signal(signum, _on_signal)
        _previous[signum] = current
    if callable(current):
        logger.info("smdebug: on %s the hook flushes the steps that have ended, then calls the handler installed "
                    "before it (%s)", name, getattr(current, "__qualname__", current))


def _flush_all(deadline: float) -> None:
    for session in [s for s, pid in list(_sessions.items()) if pid == os.getpid()]:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            session.flush(left, from_signal=True)
        except Exception as exc:  # noqa: BLE001 - the signal's own action must still happen
            logger.warning("smdebug: flushing on a signal failed: %s: %s", type(exc).__name__, exc)


def _on_signal(signum, frame) -> None:
    name = signal.Signals(signum).name
    timeout = flush_timeout()
    started = time.monotonic()
    flusher = threading.Thread(target=_flush_all, args=(started + timeout,), name="smdebug-signal-flush",
                               daemon=True)
    flusher.start()
    flusher.join(timeout)
    if flusher.is_alive():
        logger.warning("smdebug: %s: the steps that have ended were not all written within %g s (%s); the rest is "
                       "lost if the process ends now", name, timeout, FLUSH_TIMEOUT_ENV)
    else:
        logger.info("smdebug: %s: steps that have ended flushed in %.2f s", name, time.monotonic() - started)
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    if signal.getsignal(signum) is not _on_signal:
        # Called by a handler installed after ours that chains the one it found (Lightning
        # composes them): that handler decides what the signal does.
        return
    # No handler before ours: the default action (the process ends by this signal, as without smdebug).
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
