"""The step session: the core's state and machinery for one run, owned by a hook.

A :class:`StepSession` is built by a user-facing hook (``smd.Hook`` or a framework's) from
the hook arguments and the adapter that owns it (``smdebug.capture.contract.Adapter``: the hook
itself). It knows no framework; it calls its adapter only through the declared callbacks.
The adapter calls, from the framework's own hooks (docs/architecture.md):

* :meth:`StepSession.begin_step` when an iteration starts (it ends the previous step);
* ``session.plans`` (:class:`~.plans.StepPlans`): what this step saves of which tensor;
* ``session.inbox`` (:class:`~.inbox.StepInbox`) to hand tensors over: ``plans.selection``
  + ``inbox.start_batch`` + ``inbox.record_batch`` for a batch (the hot path: references only; the
  backend reduces them on the step pipeline's worker, or at once for small batches), and
  ``batch.wait()`` before anything may change them (the adapter's fence); ``record`` for a
  tensor on its own; ``reduced_block`` + ``record_reduced`` for reductions the adapter
  computed itself (TensorFlow's compiled step);
* :meth:`StepSession.end_step` (optional: the next ``begin_step`` or ``close`` does it).

A saved step's records are made once, in recording order (step_records.py), and handed to
the session's step sinks (sinks.py): the flight recorder, metric lines, the writer thread
(which encodes and writes them), step counters; then to live rules. Training
waits for neither, except at fences and for live rules. A failure inside the session never
reaches training: it logs one warning and disables capture (:meth:`StepSession.guard`,
:func:`never_raises`); one tensor the backend cannot handle costs that tensor.
"""
from __future__ import annotations

import json
import math
import operator
import os
import threading
import time
from typing import Optional

import numpy as np

from ..environment import on_sagemaker
from ..collections import as_name_list
from .arguments import HookArguments
from .contract import Worker, check_adapter
from ..exceptions import ConfigError
from ..logger import get_logger
from ..modes import ModeKeys
from ..reduction_config import REDUCTION_TAG_PREFIX
from ..storage import open_runs
from . import preemption
from .fail_open import Guard, never_raises
from .session_parts import SessionParts

logger = get_logger()

#: Longest close() waits for the step pipeline to finish the last steps (seconds).
CLOSE_TIMEOUT_S = 300.0



def _view(part: str, name: str, doc: str) -> property:
    """A read-only view of attribute ``name`` of the session's part ``part`` (an attrgetter:
    no Python frame, read on the path of every captured module call)."""
    return property(operator.attrgetter(f"{part}.{name}"), doc=doc)


class StepSession:
    """The step driver of one run: step boundaries, modes, the end of each step, stopping,
    the fail-open policy and the lifecycle, over the parts it is built from
    (:class:`~.session_parts.SessionParts`: configuration, collections, plans, hand-over,
    records, writer, step pipeline, flight recorder, sinks, live rules' listeners).

    Built by a hook with its adapter (``smdebug.capture.contract.Adapter``, checked here) and its
    :class:`~smdebug.capture.arguments.HookArguments`. Adapters call the surface declared in
    ``smdebug.capture.contract.SessionSurface``; the user calls the hook.
    """

    # The run's identity: settled when the session is built, or by adopt_worker before anything is written.
    rank = _view("parts", "rank", "This worker's rank.")
    world_size = _view("parts", "world_size", "The number of workers.")
    worker_name = _view("parts", "worker_name", "This worker's name in the run's files.")
    is_chief = _view("parts", "is_chief", "Whether this is worker 0.")
    include_workers = _view("parts", "include_workers", "``'one'`` or ``'all'``: which workers write.")
    # The step counters, as adapters read them (the clock owns them).
    mode = _view("clock", "mode", "The mode the next step begins in.")
    global_step = _view("clock", "global_step", "The current global step (-1 before the first).")
    mode_step = _view("clock", "mode_step", "The current step of the current mode.")
    step_open = _view("clock", "open", "Whether a step has begun and not ended.")
    step_mode = _view("clock", "step_mode", "The mode the open (or last) step began in: ``mode`` is where the next "
                      "step begins, and ``set_mode()`` changes it while a step is open.")
    saving_step = _view("plans", "saving", "Whether the open step saves anything on this worker.")

    def __init__(self, adapter, arguments: HookArguments):
        check_adapter(adapter)  # an adapter that breaks the contract fails here, not at its first step
        self.enabled = True
        #: Set by request_stop(); adapters end training at the next step boundary.
        self.stop_reason: Optional[str] = None
        self.closed = False
        self._lock = threading.RLock()
        self._early_tensors: list = []  # (name, value) given to save_tensor before the first step
        self._step_probe = None  # the adapter's non-finite probe of the open step (set_step_probe)
        self._nonfinite: Optional[tuple] = None  # what report_nonfinite found, fired once its step is finished
        self.parts = parts = SessionParts(adapter, arguments, self)
        # What adapters and the hook read, the parts the driver runs: the same objects as the parts'.
        self.adapter, self.framework, self.profile = parts.adapter, parts.framework, parts.profile
        self.out_url, self.out_dir, self.tensorboard_dir = parts.out_url, parts.out_dir, parts.tensorboard_dir
        self.dry_run, self.writes_files, self.save_all = parts.dry_run, parts.writes_files, parts.save_all
        self.save_config, self.reduction_config = parts.save_config, parts.reduction_config
        self.collection_manager, self.include_collections = parts.collection_manager, parts.collections.included
        self.collections, self.flight_recorder, self.recorder = parts.collections, parts.flight_recorder, parts.recorder
        self.plans, self.clock, self.inbox, self.backend = parts.plans, parts.clock, parts.inbox, parts.backend
        self.listeners, self.writer, self.added_sinks = parts.listeners, parts.writer, parts.added_sinks
        #: The overhead budget's controller (capture/budget.py); None without a budget.
        self.budget = parts.budget
        self._pipeline, self._records, self._stop_poller = parts.pipeline, parts.records, parts.stop_poller
        if self.writer is not None:
            open_runs.register([self.out_dir, self.out_url], self.flush)  # a reader in this process flushes first
            preemption.watch(self, arguments.flush_on_signals)  # a SIGTERM writes the steps that have ended first
        where = "a dry run (nothing written)" if self.dry_run else (
            f"writing {self.out_url} (spooled in {self.out_dir})" if self.out_url else f"writing {self.out_dir}")
        if not self.writes_files and not self.dry_run:
            where = f"not writing ({self.worker_name} is not the chief; include_workers='one')"
        logger.info("smdebug %s hook: %s as %s; collections %s; %r", self.framework, where, self.worker_name,
                    ", ".join(self.include_collections) or "none", self.save_config)

    def include(self, name: str, expect: bool = True) -> None:
        """Save collection ``name`` (created if new). ``expect``: the user asked for it by
        name, so one warning if it is never configured or matches nothing."""
        self.collections.include(name, expect)

    def nothing_to_save(self, collection: str, reason: str) -> None:
        """``collection`` cannot hold tensors in this training (no warning that it matched nothing)."""
        self.collections.nothing_to_save(collection, reason)

    # --- modes and steps --------------------------------------------------------------
    def set_mode(self, mode, by_user: bool = True) -> None:
        """Switch to TRAIN, EVAL, PREDICT or GLOBAL; each mode counts its own steps from 0.
        ``by_user=False``: the adapter's own choice (from the framework's state), of which
        it is not told back (``on_mode_change``)."""
        mode = ModeKeys.parse(mode)
        if by_user:
            self.adapter.on_mode_change(mode)
        self.clock.set_mode(mode)

    def continue_mode_steps(self, mode, next_step: int) -> None:
        """Number the next step of ``mode`` ``next_step`` (a trainer that resumed from a
        checkpoint numbers its steps on from there); the global step counts on as usual."""
        self.clock.continue_mode_steps(ModeKeys.parse(mode), next_step)

    def begin_step(self, step: Optional[int] = None) -> bool:
        """Start the next step (or step ``step``); returns whether anything is saved in it."""
        if not self.enabled:
            return False
        # Scalars saved after the last step ended (after model.fit) belong to that step, as in 1.0.34.
        if self.clock.open or (self.inbox and self.global_step >= 0):
            self.end_step()
        if self.parts.failures.pending is not None and not self._disable_after_failure():
            return False
        try:
            global_step, mode, mode_step = self.clock.advance(step)
            if self.parts.budget is not None:
                self.parts.account_budget(global_step)
            self.plans.begin(mode, mode_step)
            if self._early_tensors:
                early, self._early_tensors = self._early_tensors, []
                for name, value in early:
                    self.inbox.record(name, value)
            if self._stop_poller is not None and self.stop_reason is None:
                self._stop_poller.check(self)
            self.adapter.on_step_begin(self.saving_step)
        except Exception as exc:  # noqa: BLE001 - fail-open: training goes on without capture
            self.disable(f"begin_step: {type(exc).__name__}: {exc}")
        return self.saving_step

    @property
    def flight_recording(self) -> bool:
        """Whether the flight recorder keeps steps now (on, not fired, not disabled): adapters
        install their non-finite probes only then."""
        recorder = self.recorder
        return recorder is not None and recorder.enabled and recorder.fired is None and self.enabled

    def set_step_probe(self, probe) -> None:
        """For adapters, before the step ends: an object whose ``locate()`` returns where the
        first non-finite value of the open step appeared (a dict: ``module``, ``phase``, ...)
        or None. It is called only if the flight recorder fires for that step, so it may
        hold device values and read them then."""
        self._step_probe = probe

    def report_nonfinite(self, identity: tuple, tensors: list, where: Optional[dict] = None) -> None:
        """For adapters whose per-step check (with an overhead budget) found NaN or Inf in
        ``tensors`` (names) at the step ``identity`` (global step, mode, mode step); ``where``:
        the module, as a probe's ``locate()`` names it. The flight recorder fires for that step
        once the step is finished (at once for a step already finished); without one, one warning."""
        found = (tuple(identity), list(tensors), where)
        if self.clock.open and identity[0] == self.global_step:
            self._nonfinite = self._nonfinite or found
        else:
            with self.guard("flight recorder"):
                self.parts.fire_nonfinite(found)

    @property
    def saving_collections(self) -> frozenset:
        """Names of the collections saved at this step; empty when the step saves nothing.

        Adapters that prepare per-step work (a compiled function per kind of saved step)
        key it by this set: two steps with the same set and configuration save the same way.
        """
        return self.plans.saving_collections if self.saving_step else frozenset()

    def submit_work(self, what: str, fn, *args):
        """Run ``fn(*args)`` on the step pipeline's worker, in order with the step's other jobs,
        on every worker whether or not it writes, and return its ``Ticket`` (``wait()`` is the
        adapter's fence; it gives ``fn``'s result, None if it raised). For adapter work that
        every rank must do (sharded tensors' partial statistics before their collective);
        ``fn`` should catch its own errors: one that escapes disables the hook."""
        return self._pipeline.submit(what, fn, *args)

    def discard(self, *refs) -> None:
        """Let the step pipeline's worker drop ``refs`` (tensors the adapter is done with)
        after its next job, instead of the calling thread: freeing a tensor releases the GIL,
        and taking it back from the worker costs the training thread a wait (pipeline.py)."""
        self._pipeline.discard(*refs)

    @property
    def step_saves_somewhere(self) -> bool:
        """Whether some worker saves something at this step: the same answer on every worker
        (it follows the save configuration, the step counters and whether a flight recorder
        is configured, never a worker's own state), including those that write nothing
        (``include_workers="one"``). Adapters whose capture needs every worker's part
        (collectives over sharded tensors) take part whenever it is True."""
        return bool(self.plans.everywhere) and self.enabled

    @never_raises("record")
    def record_whatever_the_config(self, items) -> int:
        """Save host ``(name, value)`` items in the open step even where the save config
        skips it, as their included collections would save them (1.0.34's ``force_save``:
        what a trainer reports once an epoch, such as Keras' ``val_*`` logs, would otherwise
        be lost on most steps). Returns how many will be saved."""
        if self.saving_step:
            return self.inbox.hold(items, self.parts.numpy_backend)
        if not (self.clock.open and (self.writes_files or self.dry_run or self.listeners)):
            return 0
        everything = frozenset(p.collection.name for p in self.plans.prepared)
        held = sum(self.inbox.hold(((name, value),), self.parts.numpy_backend, plan)
                   for name, value in items if (plan := self.plans.plan_in(name, everything)) is not None)
        if held:
            self.plans.ring_only = False  # written with its step, not kept for the flight recorder only
        return held

    def save_tensor(self, tensor_name: str, tensor_value, collections_to_write="default") -> None:
        """Save a tensor you computed yourself, in the given collection(s) (they become included)."""
        if not isinstance(tensor_name, str) or not tensor_name:
            raise ConfigError(f"tensor_name must be a non-empty string, got {tensor_name!r}")
        for coll_name in as_name_list(collections_to_write, "collections_to_write"):
            self.collection_manager.get(coll_name).add_tensor_name(tensor_name)
            self.include(coll_name, expect=False)
        if not self.clock.open and self.global_step < 0 and self.enabled:
            # Before the first step (as 1.0.34 allows): kept, and saved in the first step.
            self._early_tensors.append((tensor_name, tensor_value))
            return
        self.inbox.record(tensor_name, tensor_value)

    def save_scalar(self, name: str, value, sm_metric: bool = False, timestamp: Optional[float] = None) -> None:
        """Save a scalar as ``scalar/<name>`` in the current step, whatever the save config.

        With ``sm_metric=True`` it is also written to SageMaker Metrics when
        ``SAGEMAKER_METRICS_DIRECTORY`` is set. ``timestamp`` (seconds since the epoch) is
        stored as the record's ``wall_time`` in the event file and in TensorBoard, as in
        1.0.34; by default the time the step is written.
        """
        if not isinstance(name, str) or not name:
            raise ConfigError(f"scalar name must be a non-empty string, got {name!r}")
        if REDUCTION_TAG_PREFIX in name:
            raise ConfigError(f"scalar name {name!r}: names containing {REDUCTION_TAG_PREFIX!r} are reserved for "
                              "reductions (the reader would take it for one); rename it")
        if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, (int, float, np.number))
                                      or not math.isfinite(timestamp)):
            raise ConfigError(f"save_scalar timestamp must be seconds since the epoch (a finite number, e.g. "
                              f"time.time()) or None, got {timestamp!r}")
        if not self.enabled:
            return
        self.inbox.add_scalar(name, value, bool(sm_metric), timestamp)

    # --- end of step: hand-off to the step pipeline, then to the writer ----------------------
    @never_raises("end_step")
    def end_step(self) -> None:
        """Finish the current step: its reductions, host copies and records are made on the
        step pipeline's worker thread, then handed to the writer. Training does not wait,
        except for live rules (a stop they request lands at the next step boundary) and
        dry runs (their log lines come in step order)."""
        if self.clock.open:
            self.adapter.on_step_end()
        self.clock.open = False
        found, self._nonfinite = self._nonfinite, None  # what the adapter's per-step check found
        try:
            self.collections.check_at_step_end(self.saving_step, self.plans.saving_collections, self.clock.identity[0])
            pending, has_blocks, scalars, placements = self.inbox.take()
            if not pending and not scalars:
                return
            # Written with the first saved step, again when collections changed: readers of a live
            # run see them. Here: the training thread changes collections.
            collections = self.collections.if_changed() if self.writer is not None else None
            # On the worker while it still reduces this step's batches (steps stay in order);
            # else here: making the records costs less than waking the worker for them.
            # Live rules and dry runs see each step finished before the next begins.
            flight = None
            if self.recorder is not None and self.flight_recording:
                flight = (self.plans.ring_only, self._step_probe)
            self._step_probe = None
            args = (pending, has_blocks, scalars, self.clock.identity, collections, flight, placements)
            finish = self.parts.finisher.finish
            if self._pipeline.idle or self.listeners or self.writer is None:
                self._pipeline.drain()
                self._pipeline.run_here("finishing a step", finish, *args)
            else:
                self._pipeline.submit("finishing a step", finish, *args)
            if self.parts.failures.pending is not None:
                self._disable_after_failure()
        finally:
            if found is not None:  # after the step was handed over: it reaches the recorder's ring first
                with self.guard("flight recorder"):
                    self.parts.fire_nonfinite(found)

    def abandon_step(self) -> None:
        """Drop the open step without writing it: its adapter found it cut short (an interrupt
        or an error left its work half done), and a step is written whole or not at all. The
        steps ended before it are written as usual."""
        if self.clock.open:
            self.clock.open = False
            self.inbox.take()
            self._step_probe = None

    def dump_flight_recorder(self, reason: str = "requested", trigger: str = "manual") -> Optional[dict]:
        """Write the flight recorder's kept steps and its marker now; returns the marker (a
        dict), or None when there is no recorder or it already fired.

        ``trigger`` names why in the marker (``"manual"``, ``"rule"``, ``"exception"``).
        Rules' :class:`~smdebug.rules.DumpFlightRecorder` action calls it. Safe from any
        thread; from the training thread with ``trigger="exception"`` the open step is
        ended first, so that the step that failed is written too.
        """
        recorder = self.recorder
        if recorder is None or not self.flight_recording:
            return None
        if trigger == "exception":
            self.step_failed()  # before the step ends: no collectives the other workers may not reach
        with self.guard("flight recorder"):
            identity = self.parts.finisher.last_identity
            if trigger == "exception" and self.clock.open and not self._pipeline.on_worker_thread:
                identity = self.clock.identity
                self.end_step()
            if not self._pipeline.on_worker_thread:
                self._pipeline.drain(timeout=30)  # steps ended so far reach the ring first
            return recorder.fire(trigger, reason, identity)
        return None

    def flush(self, timeout: Optional[float] = None, from_signal: bool = False) -> bool:
        """Wait until every step ended so far is finished and on disk (its files published).

        Steps are finished on the step pipeline's thread and written by the writer thread in
        batches; call this before reading a run that is still training. Returns False if
        ``timeout`` (seconds, for the whole flush) passed first or the hook failed.
        ``from_signal``: from any thread, what a signal handler does before the process ends
        (preemption.py): the open step is not ended (never written half), nothing is disabled.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        done = self._pipeline.drain(timeout)
        if not from_signal and self.parts.failures.pending is not None and self.enabled:
            self._disable_after_failure()
        writer = self.writer
        if done and writer is not None:
            done = bool(writer.flush(None if deadline is None else max(0.0, deadline - time.monotonic())))
        return done and (from_signal or self.enabled)

    def _disable_after_failure(self) -> bool:
        """A failure on another thread (:class:`~.session_parts.Failures`) disables the hook here."""
        reason, reported = self.parts.failures.pending
        self.disable(reason, already_reported=reported)
        return False

    # --- live consumers of saved values (rules) and stopping ---------------------------
    def request_stop(self, reason: str) -> None:
        """Ask the adapter to end training at the next step boundary (rules' StopTraining)."""
        if self.stop_reason is None:
            self.stop_reason = reason
            logger.warning("smdebug: stopping training: %s", reason)
            if self.writes_files and self.is_chief:
                try:
                    with open(os.path.join(self.out_dir, "training_stop_reason.json"), "w") as fh:
                        json.dump({"reason": reason, "global_step": self.global_step, "time": time.time()}, fh)
                except OSError as exc:
                    logger.warning("smdebug: could not record the stop reason in %s: %s", self.out_dir, exc)

    @property
    def stop_requested(self) -> bool:
        return self.stop_reason is not None

    # --- lifecycle -------------------------------------------------------------------
    def guard(self, where: str) -> Guard:
        """The one fail-open policy, for a block: ``with hook.guard("on_epoch_end"): ...``.

        An exception inside disables the hook with one warning naming ``where`` and is not
        raised into training (``never_raises`` does the same for a whole method)."""
        return Guard(self, where)

    def disable(self, reason: str, already_reported: bool = False) -> None:
        """Stop capturing for the rest of the run (training goes on). Logs once."""
        if not self.enabled:
            return
        self.enabled = False
        self.plans.saving = False
        if not already_reported:
            logger.warning("smdebug: hook disabled after an internal error (%s); training continues without "
                           "tensor capture. Steps written before this are intact.", reason)
        if not self._pipeline.on_worker_thread:
            self._pipeline.close(timeout=10)  # steps finished before the failure still reach the writer
        writer, self.writer = self.writer, None
        self.parts.finisher.sinks = []  # steps still in the pipeline go nowhere
        if writer is not None:
            try:
                writer.close(write_end_marker=False, timeout=10)
            except Exception:  # noqa: BLE001 - already failing open: the writer's own failure is logged
                pass
        try:
            self.adapter.on_disabled(reason)
        except Exception as exc:  # noqa: BLE001 - already failing open: nothing more to disable
            logger.debug("smdebug: %s.on_disabled failed: %s", type(self.adapter).__name__, exc)

    def close(self) -> None:
        """Flush the last step, write the collections file and the end-of-training marker."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        preemption.unwatch(self)
        try:
            if (self.enabled and self.clock.open) or self.inbox:
                self.end_step()
            if not self._pipeline.close(timeout=CLOSE_TIMEOUT_S):
                logger.warning("smdebug: steps still being reduced after %.0f s at close; the run may miss its last "
                               "steps", CLOSE_TIMEOUT_S)
            if self.parts.failures.pending is not None and self.enabled:
                self._disable_after_failure()
            self.listeners.close()  # live rules finish their reports
            self.added_sinks.close()  # each waits boundedly (a tracker's server may hang)
            if self.recorder is not None:
                self.recorder.close()  # after a dump in flight on a rule's thread, before the writer closes
            writer = self.writer
            if writer is not None:
                try:
                    self.collections.write(writer)
                    writer.close(write_end_marker=self.is_chief and not on_sagemaker())
                except Exception as exc:  # noqa: BLE001 - closing must not raise into training
                    logger.warning("smdebug: could not finish writing %s: %s", self.out_dir, exc)
                if writer.failed is not None:  # the writer works in batches: a disk error may surface only now
                    self.disable(f"writer failed: {writer.failed}", already_reported=True)
            if self.parts.step_counters is not None and self.global_step >= 0:
                self.parts.save_step_counters()
        finally:
            open_runs.unregister(self.flush)
            try:
                self.adapter.on_close()  # the framework's hooks go, whatever happened above
            except Exception as exc:  # noqa: BLE001 - closing must not raise into training
                logger.warning("smdebug: %s.on_close failed: %s", type(self.adapter).__name__, exc)

    def step_failed(self) -> None:
        """An exception left the training step on this worker: the adapter starts no more
        work for it that needs every worker's part (``Adapter.on_step_failed``)."""
        if not self._pipeline.on_worker_thread:
            with self.guard("step_failed"):
                self.adapter.on_step_failed()

    def adopt_worker(self, worker: Worker, include_workers: Optional[str] = None) -> bool:
        """Write as ``worker`` from now on (a distribution strategy met after construction),
        and with ``include_workers`` if given; False, changing nothing, once something was
        written under the current name."""
        parts = self.parts
        if self.collections.written or self.global_step >= 0:
            return False
        parts.rank, parts.world_size, parts.worker_name = worker
        if include_workers is not None:
            parts.include_workers = include_workers
        parts.is_chief = parts.rank == 0
        if self.writer is not None:
            self.writer.worker = worker.name  # only names the collections file, not yet written
        return True

    def publish(self) -> None:
        """Make the steps written so far visible to readers now (end of an epoch or a
        session), instead of when the writer's next batch is published."""
        if self.enabled and self.writer is not None:
            self.writer.publish()
