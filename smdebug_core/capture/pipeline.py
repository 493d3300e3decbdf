"""The step pipeline: one worker thread per hook that finishes saved steps off the training thread.

The training thread hands over references to tensors (:meth:`StepPipeline.submit`) and goes
on; the worker computes their reductions and host copies, in order, and passes each
finished step to the writer thread. numpy and torch release the GIL inside their kernels,
so on a machine with a spare core the reductions cost the training thread almost nothing.

A job that must be finished before something changes its tensors (weights before
``optimizer.step()``) returns a :class:`Ticket`; the adapter waits on it at that point (a
*fence*), and only there. Jobs run in submission order, so a ticket also fences every job
submitted before it.

References to tensors the training thread is done with are dropped here too
(:meth:`StepPipeline.discard`): torch releases the GIL to free a tensor, and taking it back
from a worker that is running Python costs the training thread up to the interpreter's
switch interval (5 ms) each time. Measured: freeing a step's 134 gradients on the training
thread of a 402-tensor step cost it 2.2 ms of waiting (0.17 ms of CPU).

Bounded: at most ``max_pending`` jobs wait (each may hold references to a step's tensors);
a training thread that submits more waits for the worker, as it would have done the work
itself. Fork-safe: a child process starts its own worker. Failures never reach the training
thread from here: a job's exception is kept on its ticket and reported through
``on_error`` (the hook disables itself at its next step boundary).
"""
from __future__ import annotations

import os
import threading
from collections import deque
from typing import Callable, Deque, Optional, Tuple

#: Jobs queued at most before submit() waits (a job holds one step's tensor references).
DEFAULT_MAX_PENDING = 16


class Ticket:
    """The completion of one job: :meth:`wait` returns its result (or None if it failed)."""

    __slots__ = ("_done", "result", "error")

    def __init__(self):
        self._done = threading.Event()
        self.result = None
        self.error: Optional[BaseException] = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: Optional[float] = None):
        """Block until the job ran (or ``timeout`` passed); its result, None on failure/timeout."""
        self._done.wait(timeout)
        return self.result

    def _finish(self, result=None, error: Optional[BaseException] = None) -> None:
        self.result, self.error = result, error
        self._done.set()


class StepPipeline:
    """A FIFO of jobs run by one daemon thread, started at the first job."""

    def __init__(self, name: str = "smdebug-steps", on_error: Optional[Callable[[str, BaseException], None]] = None,
                 max_pending: int = DEFAULT_MAX_PENDING):
        self.name = name
        self._on_error = on_error
        self._max_pending = max_pending
        self._cond = threading.Condition()
        self._jobs: Deque[Tuple[Ticket, str, Callable, tuple]] = deque()
        self._thread: Optional[threading.Thread] = None
        self._pid = os.getpid()
        self._running = False  # a job is being run
        self._closed = False
        self._discarded: list = []  # references the worker drops after its next job (discard)

    # --- the training thread's side ------------------------------------------------------------
    def submit(self, what: str, fn: Callable, *args) -> Ticket:
        """Queue ``fn(*args)``; ``what`` names the job in error reports."""
        ticket = Ticket()
        if self._closed:
            ticket._finish(error=RuntimeError("the step pipeline is closed"))
            return ticket
        with self._cond:
            self._ensure_thread()
            while len(self._jobs) >= self._max_pending and self._thread.is_alive():
                self._cond.wait(1.0)
            self._jobs.append((ticket, what, fn, args))
            self._cond.notify_all()
        return ticket

    def discard(self, *refs) -> None:
        """Have the worker drop ``refs`` (tensors, or containers of them) after its next job,
        instead of the calling thread now: no wake-up, no wait for the GIL. Without a running
        worker they are dropped at once."""
        if self._thread is not None and self._thread.is_alive() and not self._closed:
            self._discarded.append(refs)

    def run_here(self, what: str, fn: Callable, *args) -> Ticket:
        """Run ``fn(*args)`` now, on the calling thread, with a job's error handling: for
        work smaller than what handing it to the worker costs (each GIL hand-off between
        two threads that both run Python costs the training thread a thread wake-up)."""
        ticket = Ticket()
        self._execute(ticket, what, fn, args)
        return ticket

    @property
    def idle(self) -> bool:
        """Whether no job is queued or running (work run here keeps the order of steps)."""
        return not (self._jobs or self._running)

    def drain(self, timeout: Optional[float] = None) -> bool:
        """Wait until every job submitted so far ran; False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._jobs or self._running) or self._thread is None
                                       or not self._thread.is_alive(), timeout)

    def close(self, timeout: Optional[float] = None) -> bool:
        """Run what is queued, then stop the thread. Returns whether the queue was emptied."""
        drained = self.drain(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._discarded = []  # nothing runs after close to drop them: the caller does, now
        return drained

    @property
    def on_worker_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def _ensure_thread(self) -> None:
        if self._pid != os.getpid():  # a forked child: the parent's thread does not exist here
            self._pid, self._thread, self._running = os.getpid(), None, False
            self._jobs.clear()
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    # --- the worker ---------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if not self._jobs:
                    return
                ticket, what, fn, args = self._jobs.popleft()
                self._running = True
                self._cond.notify_all()  # room for a waiting submitter
            try:
                self._execute(ticket, what, fn, args)
                ticket = fn = args = None  # the job's tensors are freed here, on this thread
                if self._discarded:
                    self._discarded = []  # swapped whole: the training thread may be appending
            finally:
                with self._cond:
                    self._running = False
                    self._cond.notify_all()

    def _execute(self, ticket: Ticket, what: str, fn: Callable, args: tuple) -> None:
        try:
            ticket._finish(fn(*args))
        except Exception as exc:  # noqa: BLE001 - reported, never raised into training
            ticket._finish(error=exc)
            if self._on_error is not None:
                try:
                    self._on_error(what, exc)
                except Exception:  # noqa: BLE001 - the error handler's own failure must not kill the worker
                    pass
