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

import contextlib
import json
import math
import os
import threading
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

from .. import config as cfg
from ..environment import on_sagemaker
from .backend import NumpyBackend, TensorBackend
from ..collections import (
    Collection, CollectionKeys, CollectionManager, FrameworkProfile, as_name_list,
)
from .inclusion import InclusionCheck
from .arguments import HookArguments
from .contract import Worker, check_adapter, check_backend, check_worker
from ..exceptions import ConfigError
from ..flight_recorder_config import FlightRecorder
from .flight_recorder import Recorder
from ..logger import get_logger
from ..modes import ModeKeys
from .pipeline import StepPipeline
from .plans import StepPlans
from ..reduction_config import REDUCTION_TAG_PREFIX, ReductionConfig
from ..storage import open_runs
from ..storage.stop_request import StopRequestPoller
from ..storage.run_files import StepCounters
from ..save_config import SaveConfig
from .sinks import AddedSinks, DryRunSink, MetricLinesSink, RecorderSink, StepCountersSink, StepListeners, WriterSink
from .step_records import StepRecordMaker
from .inbox import StepInbox
from .clock import StepClock
from . import preemption, run_output
from .fail_open import Guard, never_raises

logger = get_logger()

#: Longest close() waits for the step pipeline to finish the last steps (seconds).
CLOSE_TIMEOUT_S = 300.0



class StepSession:
    """The core of one run: configuration, step state, plans, hand-over, records, writer,
    step pipeline, flight recorder, live rules' listeners, stop requests.

    Built by a hook with its adapter (``smdebug.capture.contract.Adapter``, checked here) and its
    :class:`~smdebug.capture.arguments.HookArguments`. Adapters call the surface declared in
    ``smdebug.capture.contract.SessionSurface``; the user calls the hook.
    """

    def __init__(self, adapter, arguments: HookArguments):
        check_adapter(adapter)  # an adapter that breaks the contract fails here, not at its first step
        self.adapter = adapter
        self.framework: str = adapter.framework
        self.profile: FrameworkProfile = adapter.profile
        a = arguments
        # A URL (s3://, any fsspec URL; smdebug_core/storage/remote.py): the run is written into a
        # local spool directory, which becomes out_dir once the worker is known, and uploaded.
        self.out_url: Optional[str] = a.out_url
        self.out_dir = os.path.abspath(os.path.expanduser(a.out_dir))
        tensorboard_dir, export_tensorboard = a.tensorboard_dir, a.export_tensorboard
        flight_recorder = a.flight_recorder

        self.dry_run = a.dry_run
        self.include_workers = a.include_workers
        self.reduction_config = a.reduction_config or ReductionConfig(save_raw_tensor=True)
        self.save_config = a.save_config or SaveConfig()
        self.save_all = a.save_all
        self.collection_manager = CollectionManager(self.profile)
        self.collection_manager.on_new_collection = self._on_new_collection
        self.collection_manager.object_handler = adapter.collection_object
        self.include_collections: List[str] = list(self.profile.default_included)
        self._inclusion = InclusionCheck(self.profile.collection_names(), self.framework)
        for name in a.include_collections:
            self.include(name)
        if a.include_regex:
            self.collection_manager.get(CollectionKeys.DEFAULT).include(list(a.include_regex))
            self.include(CollectionKeys.DEFAULT)
        if a.save_all:
            self.collection_manager.get(CollectionKeys.ALL).include(".*")
            self.include(CollectionKeys.ALL, expect=False)
        #: The flight recorder's configuration (None: off). Its collections are included:
        #: saved as usual at their save config's steps, kept in memory at every other step.
        self.flight_recorder: Optional[FlightRecorder] = flight_recorder
        if flight_recorder is not None:
            for name in flight_recorder.collections:
                self.include(name)

        self.rank, self.world_size, self.worker_name = check_worker(adapter, adapter.worker())
        self.is_chief = self.rank == 0
        self.writes_files = (self.include_workers == "all" or self.is_chief) and not self.dry_run
        self.out_dir, tensorboard_dir, export_tensorboard, remote_extra, prefix_check = run_output.locate(
            a, self.out_url, self.out_dir, self.worker_name, self.writes_files, self.is_chief, self._sibling_workers())
        self.tensorboard_dir = cfg.resolve_tensorboard_dir(self.out_dir, tensorboard_dir, export_tensorboard)
        #: Configs -> plans, and what the open step saves (adapters: ``session.plans``).
        self.plans = StepPlans(self.collection_manager, self.include_collections, self._inclusion, self.profile,
                               self.save_config, self.reduction_config, bool(self.tensorboard_dir), flight_recorder,
                               recording=lambda: self.flight_recording,
                               consumes=lambda: self.writes_files or self.dry_run or bool(self._listeners))
        self.backend: TensorBackend = check_backend(adapter, adapter.make_backend())
        self._numpy_backend = NumpyBackend()

        # Step state (docs/format.md 8.1): global step and one counter per mode.
        self.clock = StepClock()
        self.enabled = True
        # mode -> (from, until): its mode steps in [from, until) save nothing (reset with the plans)
        # name -> (plan, snapshot, backend); ReducedBlock -> (None, (block, values), None) for
        # reductions the adapter computed. Insertion order is recording order (a name recorded
        # again moves to the end): the last record wins.
        self._early_tensors: List[Tuple[str, object]] = []  # save_tensor before the first step
        self._collections_version = -1  # the collections' version last written; -1: none written
        self._closed = False
        self._lock = threading.RLock()
        self._listeners = StepListeners()  # live rules
        # Saved steps are finished (reductions, host copies, records) on this worker thread.
        self._pipeline = StepPipeline(on_error=self._on_pipeline_error)
        self._pipeline_failure: Optional[Tuple[str, bool]] = None  # (reason, already reported)
        self._records = StepRecordMaker(self.profile.strip_output_index_in_reduction_tags,
                                        lambda value: self.inbox.backend_for(value))
        #: What the adapter hands over during a step (adapters: ``session.inbox``).
        self.inbox = StepInbox(self.plans, self._pipeline, self.backend, self._numpy_backend, self._records.skipped,
                               self._records.skip_tensor, lambda: self.enabled, self.disable)
        #: Set by request_stop(); adapters end training at the next step boundary.
        self.stop_reason: Optional[str] = None
        # Flight recorder (smdebug_core/capture/flight_recorder.py): made once the writer exists.
        self._recorder: Optional[Recorder] = None
        self._step_probe = None  # the adapter's non-finite probe of the open step (set_step_probe)
        self._last_identity: Optional[tuple] = None  # the last step finished

        checkpoint_dir = cfg.checkpoint_dir()
        self._step_counters = StepCounters(checkpoint_dir) if checkpoint_dir else None
        if self._step_counters is not None:
            self._resume_step_counters()

        self.writer = None
        if self.writes_files:
            self.writer, self._recorder = run_output.open_writer(self, a.overwrite, self._sibling_workers(), remote_extra,
                                                                  flight_recorder, prefix_check, a.layout)
        if self.writer is not None:
            open_runs.register([self.out_dir, self.out_url], self.flush)  # a reader in this process flushes first
        self._sinks = self._make_sinks()
        self.added_sinks = AddedSinks(self._sinks)  # hook.add_sink's (W&B, MLflow): after the run's own
        if self.writer is not None:  # a SIGTERM writes the steps that have ended first (preemption.py)
            preemption.watch(self, a.flush_on_signals)
        # Another process (a rule) may ask this run to stop through a file in out_dir.
        self._stop_poller = None if self.dry_run else StopRequestPoller(self.out_dir, clear_stale=self.is_chief)
        where = "a dry run (nothing written)" if self.dry_run else (
            f"writing {self.out_url} (spooled in {self.out_dir})" if self.out_url else f"writing {self.out_dir}")
        if not self.writes_files and not self.dry_run:
            where = f"not writing ({self.worker_name} is not the chief; include_workers='one')"
        logger.info("smdebug %s hook: %s as %s; collections %s; %r", self.framework, where, self.worker_name,
                    ", ".join(self.include_collections) or "none", self.save_config)

    def _sibling_workers(self) -> List[str]:
        """The other workers of this job that write into the same run."""
        if self.include_workers != "all":
            return []
        return [f"worker_{r}" for r in range(self.world_size) if r != self.rank]

    # --- step counters kept across restarts (spot training): run_files.StepCounters ---------
    def _resume_step_counters(self) -> None:
        """Continue the step numbering of a previous run of this job, if it left its state."""
        state = self._step_counters.load()
        if state is not None:
            self.clock.resume(*state)
            logger.info("smdebug: resuming after global step %d (state in %s)", state[0], self._step_counters.dir)

    def _save_step_counters(self, identity: Optional[tuple] = None) -> None:
        """At the end of each saved step (``identity``, on the step pipeline's thread) and at
        close (the training thread's counters)."""
        self._step_counters.save(self.out_dir, *self.clock.counters(identity))

    def include(self, name: str, expect: bool = True) -> None:
        """Save collection ``name`` (created if new). ``expect``: the user asked for it by
        name, so one warning if it is never configured or matches nothing."""
        self.collection_manager.get(name)
        if name not in self.include_collections:
            self.include_collections.append(name)
        if name == CollectionKeys.ALL:  # as in the original: "all" includes every collection
            for other in list(self.collection_manager.collections):
                if other not in self.include_collections:
                    self.include_collections.append(other)
        if expect:
            self._inclusion.expect(name)

    def _on_new_collection(self, collection: Collection) -> None:
        if CollectionKeys.ALL in self.include_collections:
            self.include(collection.name, expect=False)

    def nothing_to_save(self, collection: str, reason: str) -> None:
        """``collection`` cannot hold tensors in this training (no warning that it matched nothing)."""
        self._inclusion.not_applicable(collection, reason, logger)

    def seen_tensor_names(self) -> List[str]:
        """Every tensor name this hook was offered so far (saved or not), in order of first
        sight: the names to match when a collection's regex saves nothing."""
        return list(self._inclusion.seen)

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
        if self._pipeline_failure is not None and not self._disable_after_pipeline_failure():
            return False
        try:
            _, mode, mode_step = self.clock.advance(step)
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

    # The step counters, as adapters read them (the clock owns them).
    @property
    def mode(self) -> ModeKeys:
        return self.clock.mode

    @property
    def global_step(self) -> int:
        return self.clock.global_step

    @property
    def mode_step(self) -> int:
        return self.clock.mode_step

    @property
    def saving_step(self) -> bool:
        """Whether the open step saves anything on this worker."""
        return self.plans.saving

    @property
    def flight_recording(self) -> bool:
        """Whether the flight recorder keeps steps now (on, not fired, not disabled): adapters
        install their non-finite probes only then."""
        recorder = self._recorder
        return recorder is not None and recorder.enabled and recorder.fired is None and self.enabled

    def set_step_probe(self, probe) -> None:
        """For adapters, before the step ends: an object whose ``locate()`` returns where the
        first non-finite value of the open step appeared (a dict: ``module``, ``phase``, ...)
        or None. It is called only if the flight recorder fires for that step, so it may
        hold device values and read them then."""
        self._step_probe = probe

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
            return self.inbox.hold(items, self._numpy_backend)
        if not (self.clock.open and (self.writes_files or self.dry_run or self._listeners)):
            return 0
        everything = frozenset(p.collection.name for p in self.plans.prepared)
        held = sum(self.inbox.hold(((name, value),), self._numpy_backend, plan)
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
        inclusion = self._inclusion
        if inclusion.pending and (self.saving_step or not inclusion.configured_checked):
            # At the end of the first step, not its start: save_tensor() calls in it define collections too.
            inclusion.check_configured(self.collection_manager, logger)
            if self.saving_step:
                inclusion.check_matches(self.collection_manager, self.plans.saving_collections, self.clock.identity[0], logger)
        pending, has_blocks, scalars, placements = self.inbox.take()
        if not pending and not scalars:
            return
        collections = None
        if self.writer is not None and self.collection_manager.version != self._collections_version:
            # Written with the first saved step, again when collections changed (a tensor saved
            # with save_tensor joins its collections): readers of a live run see them. Here:
            # the training thread changes collections.
            collections = self.collections_json()
            self._collections_version = self.collection_manager.version
        # On the worker while it still reduces this step's batches (steps stay in order);
        # else here: making the records costs less than waking the worker for them.
        # Live rules and dry runs see each step finished before the next begins.
        flight = None
        if self._recorder is not None and self.flight_recording:
            flight = (self.plans.ring_only, self._step_probe)
        self._step_probe = None
        args = (pending, has_blocks, scalars, self.clock.identity, collections, flight, placements)
        if self._pipeline.idle or self._listeners or self.writer is None:
            self._pipeline.drain()
            self._pipeline.run_here("finishing a step", self._finish_step, *args)
        else:
            self._pipeline.submit("finishing a step", self._finish_step, *args)
        if self._pipeline_failure is not None:
            self._disable_after_pipeline_failure()

    def _make_sinks(self) -> list:
        """The consumers of finished steps, in the order they see each one (:mod:`.sinks`)."""
        sinks: list = []
        if self._recorder is not None:
            sinks.append(RecorderSink(self._recorder))
        sinks.append(MetricLinesSink(self.writer))
        if self.writer is not None:
            sinks.append(WriterSink(self.writer, self._on_writer_failed))
        elif self.dry_run:
            sinks.append(DryRunSink())
        if self._step_counters is not None:
            sinks.append(StepCountersSink(self._save_step_counters))
        return sinks

    def _on_writer_failed(self, reason: str) -> None:
        self._pipeline_failure = self._pipeline_failure or (reason, True)

    def _finish_step(self, pending: dict, has_blocks: bool, scalars: list, identity: tuple,
                     collections: Optional[bytes], flight: Optional[tuple] = None,
                     placements: Optional[Dict[str, dict]] = None) -> None:
        """On the pipeline's worker: the step's records, made once, to each sink in order, then
        to the live rules. ``flight``: ``(ring_only, probe)`` while the flight recorder keeps
        steps; ``placements``: name -> where a record sits in a sharded tensor (docs/format.md 3.3)."""
        step = self._records.make(pending, has_blocks, scalars, identity, self.worker_name,
                                  check_nonfinite=flight is not None, observed=bool(self._listeners),
                                  ring_only=flight is not None and flight[0])
        step.placements, step.collections = placements or {}, collections
        if flight is not None:
            step.probe = flight[1]
        # A kept step is kept, checked and its scalars submitted under the recorder's lock: a
        # fire from another thread (a rule, an exception) comes before or after, never between.
        with self._recorder.lock if flight is not None else contextlib.nullcontext():
            self._last_identity = identity
            for sink in self._sinks:
                sink.on_step(step)
        # Outside the lock: a live rule's action may fire the recorder from the rules thread
        # while this thread waits for its verdict.
        self._listeners.notify(step.values)

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
        recorder = self._recorder
        if recorder is None or not self.flight_recording:
            return None
        if trigger == "exception":
            self.step_failed()  # before the step ends: no collectives the other workers may not reach
        with self.guard("flight recorder"):
            identity = self._last_identity
            if trigger == "exception" and self.clock.open and not self._pipeline.on_worker_thread:
                identity = self.clock.identity
                self.end_step()
            if not self._pipeline.on_worker_thread:
                self._pipeline.drain(timeout=30)  # steps ended so far reach the ring first
            return recorder.fire(trigger, reason, identity)
        return None

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every step ended so far is finished and on disk (its files published).

        Steps are finished on the step pipeline's thread and written by the writer thread in
        batches; call this before reading a run that is still training. Returns False if
        ``timeout`` (seconds) passed first or the hook failed.
        """
        done = self._pipeline.drain(timeout)
        if self._pipeline_failure is not None and self.enabled:
            self._disable_after_pipeline_failure()
        writer = self.writer
        if done and writer is not None:
            done = bool(writer.flush(timeout))
        return done and self.enabled

    def flush_ended_steps(self, timeout: float) -> bool:
        """Publish (and upload) the steps that have ended, within ``timeout`` seconds, from any
        thread: what a signal handler does before the process ends (preemption.py). The open
        step is not ended (never written half); nothing is disabled or closed."""
        deadline = time.monotonic() + timeout
        if not self._pipeline.drain(timeout):
            return False
        writer = self.writer
        return writer is None or bool(writer.flush(max(0.0, deadline - time.monotonic())))

    def _on_pipeline_error(self, what: str, exc: BaseException) -> None:
        if self._pipeline_failure is None:
            self._pipeline_failure = (f"{what}: {type(exc).__name__}: {exc}", False)

    def _disable_after_pipeline_failure(self) -> bool:
        reason, reported = self._pipeline_failure
        self.disable(reason, already_reported=reported)
        return False

    def collections_json(self) -> bytes:
        """The collections file: every collection with its resolved configs (docs/format.md 4.3)."""
        return self.plans.collections_json(self.world_size if self.include_workers == "all" else 1)

    def _write_collections(self) -> None:
        if self.writer is not None:
            self.writer.write_collections(self.collections_json())
            self._collections_version = self.collection_manager.version

    # --- live consumers of saved values (rules) and stopping ---------------------------
    def add_step_listener(self, listener) -> None:
        """Call ``listener(StepValues)`` after every saved step, on the training thread.

        Listeners must return quickly (hand the values to their own thread); an exception
        in a listener is logged once and the listener removed. Live rules use this.
        """
        self._listeners.add(listener)

    def remove_step_listener(self, listener) -> None:
        self._listeners.remove(listener)

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
    def _writer_failed(self) -> bool:
        """Whether the writer has failed; if so the hook is disabled (the writer logged why)."""
        writer = self.writer
        if writer is None or writer.failed is None:
            return False
        self.disable(f"writer failed: {writer.failed}", already_reported=True)
        return True

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
        self._sinks = []  # steps still in the pipeline go nowhere
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
            if self._closed:
                return
            self._closed = True
        preemption.unwatch(self)
        try:
            if (self.enabled and self.clock.open) or self.inbox:
                self.end_step()
            if not self._pipeline.close(timeout=CLOSE_TIMEOUT_S):
                logger.warning("smdebug: steps still being reduced after %.0f s at close; the run may miss its last "
                               "steps", CLOSE_TIMEOUT_S)
            if self._pipeline_failure is not None and self.enabled:
                self._disable_after_pipeline_failure()
            self._listeners.close()  # live rules finish their reports
            self.added_sinks.close()  # each waits boundedly (a tracker's server may hang)
            if self._recorder is not None:
                self._recorder.close()  # after a dump in flight on a rule's thread, before the writer closes
            if self.writer is not None:
                try:
                    self._write_collections()
                    marker = self.is_chief and not on_sagemaker()
                    self.writer.close(write_end_marker=marker)
                except Exception as exc:  # noqa: BLE001 - closing must not raise into training
                    logger.warning("smdebug: could not finish writing %s: %s", self.out_dir, exc)
                self._writer_failed()  # the writer works in batches: a disk error may surface only now
            if self._step_counters is not None and self.global_step >= 0:
                self._save_step_counters()
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

    # --- small public views for adapters -----------------------------------------------
    @property
    def step_open(self) -> bool:
        """Whether a step has begun and not ended."""
        return self.clock.open

    @property
    def step_mode(self) -> ModeKeys:
        """The mode the open (or last) step began in: ``mode`` is where the next step begins,
        and ``set_mode()`` changes it while a step is open."""
        return self.clock.identity[1]

    @property
    def closed(self) -> bool:
        """Whether close() was called."""
        return self._closed

    @property
    def recorder(self) -> Optional[Recorder]:
        """The flight recorder of this worker (None: not configured, or this worker writes nothing)."""
        return self._recorder

    def adopt_worker(self, worker: Worker, include_workers: Optional[str] = None) -> bool:
        """Write as ``worker`` from now on (a distribution strategy met after construction),
        and with ``include_workers`` if given; False, changing nothing, once something was
        written under the current name."""
        if self._collections_version >= 0 or self.global_step >= 0:
            return False
        self.rank, self.world_size, self.worker_name = worker
        if include_workers is not None:
            self.include_workers = include_workers
        self.is_chief = self.rank == 0
        if self.writer is not None:
            self.writer.worker = worker.name  # only names the collections file, not yet written
        return True

    def publish(self) -> None:
        """Make the steps written so far visible to readers now (end of an epoch or a
        session), instead of when the writer's next batch is published."""
        if self.enabled and self.writer is not None:
            self.writer.publish()
