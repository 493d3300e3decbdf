"""What a step session is made of, built once from the hook arguments and its adapter: the
construction, apart from the step driver (:class:`~.session.StepSession`), which runs it.

:class:`SessionParts` is the bundle: the run's identity and where it goes, the configuration
and the run's collections (:class:`RunCollections`), the plans, the step clock, the hand-over
(inbox, record maker, step pipeline), the writer, flight recorder and step sinks with the live
rules after them (:class:`StepFinisher`), the stop-request poller, the step counters kept
across restarts, and what failed on another thread (:class:`Failures`). Nothing here decides
what a step does; the driver calls these parts at step points.
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Dict, List, Optional, Tuple

from .. import config as cfg
from ..collections import Collection, CollectionKeys, CollectionManager, FrameworkProfile
from ..flight_recorder_config import FlightRecorder
from ..logger import get_logger
from ..reduction_config import ReductionConfig
from ..save_config import SaveConfig
from ..storage.run_files import StepCounters
from ..storage.stop_request import StopRequestPoller
from . import run_output
from .arguments import HookArguments
from .backend import NumpyBackend, TensorBackend
from .budget import OverheadBudget
from .clock import StepClock
from .contract import check_backend, check_worker
from .flight_recorder import Recorder
from .inbox import StepInbox
from .inclusion import InclusionCheck
from .pipeline import StepPipeline
from .plans import StepPlans
from .sinks import AddedSinks, DryRunSink, MetricLinesSink, RecorderSink, StepCountersSink, StepListeners, WriterSink
from .step_records import StepRecordMaker

logger = get_logger()


class RunCollections:
    """The run's collections: which are included, the checks that warn about an included one
    that would save nothing (:class:`~.inclusion.InclusionCheck`), and the collections file,
    written with the first saved step and again when collections change."""

    def __init__(self, profile: FrameworkProfile, framework: str, manager: CollectionManager):
        self.manager = manager
        self.included: List[str] = list(profile.default_included)
        self.inclusion = InclusionCheck(profile.collection_names(), framework)
        self.render: Callable[[], bytes] = lambda: b""  # the collections file, once the plans exist
        self._written_version = -1  # the collections' version last written; -1: none written
        manager.on_new_collection = self._on_new_collection

    def include(self, name: str, expect: bool = True) -> None:
        """Save collection ``name`` (created if new). ``expect``: the user asked for it by
        name, so one warning if it is never configured or matches nothing."""
        self.manager.get(name)
        if name not in self.included:
            self.included.append(name)
        if name == CollectionKeys.ALL:  # as in the original: "all" includes every collection
            for other in list(self.manager.collections):
                if other not in self.included:
                    self.included.append(other)
        if expect:
            self.inclusion.expect(name)

    def _on_new_collection(self, collection: Collection) -> None:
        if CollectionKeys.ALL in self.included:
            self.include(collection.name, expect=False)

    def nothing_to_save(self, collection: str, reason: str) -> None:
        """``collection`` cannot hold tensors in this training (no warning that it matched nothing)."""
        self.inclusion.not_applicable(collection, reason, logger)

    def seen_tensor_names(self) -> List[str]:
        """Every tensor name this hook was offered so far (saved or not), in order of first
        sight: the names to match when a collection's regex saves nothing."""
        return list(self.inclusion.seen)

    def check_at_step_end(self, saving: bool, saving_collections, step: int) -> None:
        """At the end of the first step (not its start: ``save_tensor`` calls in it define
        collections too), and of the first step that saves each included collection."""
        inclusion = self.inclusion
        if inclusion.pending and (saving or not inclusion.configured_checked):
            inclusion.check_configured(self.manager, logger)
            if saving:
                inclusion.check_matches(self.manager, saving_collections, step, logger)

    def json(self) -> bytes:
        """The collections file: every collection with its resolved configs (docs/format.md 4.3)."""
        return self.render()

    @property
    def written(self) -> bool:
        """Whether the collections file was written (the run's identity is settled then)."""
        return self._written_version >= 0

    def if_changed(self) -> Optional[bytes]:
        """The collections file when collections changed since it was last written (a tensor
        saved with ``save_tensor`` joins its collections), else None; counted as written."""
        if self.manager.version == self._written_version:
            return None
        self._written_version = self.manager.version
        return self.json()

    def write(self, writer) -> None:
        writer.write_collections(self.json())
        self._written_version = self.manager.version


class Failures:
    """What failed on another thread (a job on the step pipeline's worker, the writer), kept as
    ``(reason, already reported)`` until the training thread disables the hook at its next
    step boundary: only the training thread disables it."""

    def __init__(self):
        self.pending: Optional[Tuple[str, bool]] = None
        self.nonfinite_reported = False  # a non-finite value found with no recorder to fire: warned once

    def on_pipeline_error(self, what: str, exc: BaseException) -> None:
        if self.pending is None:
            self.pending = (f"{what}: {type(exc).__name__}: {exc}", False)

    def on_writer_failed(self, reason: str) -> None:
        self.pending = self.pending or (reason, True)


class StepFinisher:
    """On the step pipeline's worker: each step's records, made once (:class:`~.step_records.StepRecordMaker`),
    to each sink in order, then to the live rules."""

    def __init__(self, parts: "SessionParts", sinks: list):
        self._parts = parts
        self.sinks = sinks
        self.last_identity: Optional[tuple] = None  # the last step finished

    def finish(self, pending: dict, has_blocks: bool, scalars: list, identity: tuple,
               collections: Optional[bytes], flight: Optional[tuple] = None,
               placements: Optional[Dict[str, dict]] = None) -> None:
        """``flight``: ``(ring_only, probe)`` while the flight recorder keeps steps;
        ``placements``: name -> where a record sits in a sharded tensor (docs/format.md 3.3)."""
        parts = self._parts
        step = parts.records.make(pending, has_blocks, scalars, identity, parts.worker_name,
                                  check_nonfinite=flight is not None, observed=bool(parts.listeners),
                                  ring_only=flight is not None and flight[0], placements=placements,
                                  collections=collections, probe=flight[1] if flight is not None else None)
        values = step.values
        # A kept step is kept, checked and its scalars submitted under the recorder's lock: a
        # fire from another thread (a rule, an exception) comes before or after, never between.
        recorder = parts.recorder
        with recorder.lock if flight is not None and recorder is not None else contextlib.nullcontext():
            self.last_identity = identity
            for sink in self.sinks:
                step = sink.on_step(step) or step  # read-only: a sink returns what the next ones get
        # Outside the lock: a live rule's action may fire the recorder from the rules thread
        # while this thread waits for its verdict.
        parts.listeners.notify(values)


class _Located:
    """A probe (flight_recorder.py) whose location is already known."""

    def __init__(self, where: Optional[dict]):
        self.where = where

    def locate(self) -> Optional[dict]:
        return self.where


class SessionParts:
    """A session's parts, built from the hook arguments and its adapter (see the module).
    ``driver``: the session that runs them (its ``enabled``, ``disable`` and ``flight_recording``
    are what the plans and the inbox ask of it)."""

    def __init__(self, adapter, arguments: HookArguments, driver):
        a = arguments
        self.adapter = adapter
        self.framework: str = adapter.framework
        self.profile: FrameworkProfile = adapter.profile
        # A URL (s3://, any fsspec URL; smdebug_core/storage/remote.py): the run is written into a
        # local spool directory, which becomes out_dir once the worker is known, and uploaded.
        self.out_url: Optional[str] = a.out_url
        self.out_dir = os.path.abspath(os.path.expanduser(a.out_dir))
        self.dry_run = a.dry_run
        self.include_workers = a.include_workers
        self.reduction_config = a.reduction_config or ReductionConfig(save_raw_tensor=True)
        self.save_config = a.save_config or SaveConfig()
        self.save_all = a.save_all
        self.collection_manager = CollectionManager(self.profile)
        self.collection_manager.object_handler = adapter.collection_object
        self.collections = RunCollections(self.profile, self.framework, self.collection_manager)
        for name in a.include_collections:
            self.collections.include(name)
        if a.include_regex:
            self.collection_manager.get(CollectionKeys.DEFAULT).include(list(a.include_regex))
            self.collections.include(CollectionKeys.DEFAULT)
        if a.save_all:
            self.collection_manager.get(CollectionKeys.ALL).include(".*")
            self.collections.include(CollectionKeys.ALL, expect=False)
        #: The flight recorder's configuration (None: off). Its collections are included:
        #: saved as usual at their save config's steps, kept in memory at every other step.
        self.flight_recorder: Optional[FlightRecorder] = a.flight_recorder
        if a.flight_recorder is not None:
            for name in a.flight_recorder.collections:
                self.collections.include(name)

        self.rank, self.world_size, self.worker_name = check_worker(adapter, adapter.worker())
        self.is_chief = self.rank == 0
        self.writes_files = (self.include_workers == "all" or self.is_chief) and not self.dry_run
        self.out_dir, tensorboard_dir, export_tensorboard, remote_extra, prefix_check = run_output.locate(
            a, self.out_url, self.out_dir, self.worker_name, self.writes_files, self.is_chief, self.sibling_workers())
        self.tensorboard_dir = cfg.resolve_tensorboard_dir(self.out_dir, tensorboard_dir, export_tensorboard)

        self.listeners = StepListeners()  # live rules
        #: The overhead budget's controller (capture/budget.py), None without a budget.
        self.budget: Optional[OverheadBudget] = OverheadBudget(a.overhead_budget) if a.overhead_budget else None
        #: Configs -> plans, and what the open step saves (adapters: ``session.plans``).
        self.plans = StepPlans(self.collection_manager, self.collections.included, self.collections.inclusion,
                               self.profile, self.save_config, self.reduction_config, bool(self.tensorboard_dir),
                               a.flight_recorder, recording=lambda: driver.flight_recording,
                               consumes=lambda: self.writes_files or self.dry_run or bool(self.listeners),
                               budget=self.budget)
        self.collections.render = lambda: self.plans.collections_json(
            self.world_size if self.include_workers == "all" else 1)
        self.backend: TensorBackend = check_backend(adapter, adapter.make_backend())
        self.numpy_backend = NumpyBackend()
        # Step state (docs/format.md 8.1): global step and one counter per mode.
        self.clock = StepClock()
        self.failures = Failures()
        # Saved steps are finished (reductions, host copies, records) on this worker thread.
        self.pipeline = StepPipeline(on_error=self.failures.on_pipeline_error)
        self.records = StepRecordMaker(self.profile.strip_output_index_in_reduction_tags,
                                       lambda value: self.inbox.backend_for(value))
        #: What the adapter hands over during a step (adapters: ``session.inbox``).
        self.inbox = StepInbox(self.plans, self.pipeline, self.backend, self.numpy_backend, self.records.skipped,
                               self.records.skip_tensor, lambda: driver.enabled, driver.disable)

        checkpoint_dir = cfg.checkpoint_dir()
        self.step_counters = StepCounters(checkpoint_dir) if checkpoint_dir else None
        if self.step_counters is not None:  # continue the step numbering of a previous run of this job
            state = self.step_counters.load()
            if state is not None:
                self.clock.resume(*state)
                logger.info("smdebug: resuming after global step %d (state in %s)", state[0], self.step_counters.dir)

        self.writer = None
        self.recorder: Optional[Recorder] = None  # the flight recorder, made once the writer exists
        if self.writes_files:
            self.writer, self.recorder = run_output.open_writer(self, a.overwrite, self.sibling_workers(),
                                                                remote_extra, a.flight_recorder, prefix_check,
                                                                a.layout)
        self.finisher = StepFinisher(self, self._sinks())
        self.added_sinks = AddedSinks(self.finisher.sinks)  # hook.add_sink's (W&B, MLflow): after the run's own
        # Another process (a rule) may ask this run to stop through a file in out_dir.
        self.stop_poller = None if self.dry_run else StopRequestPoller(self.out_dir, clear_stale=self.is_chief)

    def account_budget(self, global_step: int) -> None:
        """At each step's beginning, with an overhead budget: the last step's costs; at a
        decision step, the level every rank agrees on, recorded as scalars in this step."""
        budget, plans = self.budget, self.plans
        budget.step_boundary(plans.saving_expensive)
        if not budget.decision_due(global_step):
            return
        intervals = plans.expensive_intervals()
        before = budget.level
        decision = budget.decide(global_step, min(intervals.values(), default=1))
        if decision is None:
            return
        if decision.level != before:
            logger.info("smdebug overhead budget %.3g: at step %d, expensive collections every %dx their interval "
                        "(measured %.3g of step time)", budget.setting.fraction, global_step, budget.factor,
                        decision.measured)
        for name, value in budget.scalars(decision, intervals):
            self.inbox.add_scalar(name, value, False, None)

    def fire_nonfinite(self, found: tuple) -> None:
        """An adapter's per-step check found non-finite values (``found``: the step's identity,
        the tensors' names, where): the flight recorder fires for that step, or one warning."""
        identity, names, where = found
        module = f" (module {where.get('module')})" if where else ""
        reason = f"{names[0]} holds NaN or Inf at step {identity[0]}{module}: the per-step non-finite check"
        recorder = self.recorder
        if recorder is not None and recorder.enabled and not self.pipeline.on_worker_thread:
            self.pipeline.drain(timeout=30)  # the step reaches the recorder's ring (and its own check) first
        if recorder is None or not recorder.enabled or recorder.fired is not None:
            if recorder is not None and where:
                recorder.add_location(identity[0], where)  # it fired for this step from the saved reductions
            if not self.failures.nonfinite_reported:
                self.failures.nonfinite_reported = True
                logger.warning("smdebug: %s", reason)
            return
        recorder.fire("nonfinite", reason, identity, names, _Located(where))

    def sibling_workers(self) -> List[str]:
        """The other workers of this job that write into the same run."""
        if self.include_workers != "all":
            return []
        return [f"worker_{r}" for r in range(self.world_size) if r != self.rank]

    def save_step_counters(self, identity: Optional[tuple] = None) -> None:
        """At the end of each saved step (``identity``, on the step pipeline's thread) and at
        close (the training thread's counters): a run killed later resumes after them."""
        self.step_counters.save(self.out_dir, *self.clock.counters(identity))

    def _sinks(self) -> list:
        """The consumers of finished steps, in the order they see each one (:mod:`.sinks`)."""
        sinks: list = []
        if self.recorder is not None:
            sinks.append(RecorderSink(self.recorder))
        sinks.append(MetricLinesSink(self.writer))
        if self.writer is not None:
            sinks.append(WriterSink(self.writer, self.failures.on_writer_failed))
        elif self.dry_run:
            sinks.append(DryRunSink())
        if self.step_counters is not None:
            sinks.append(StepCountersSink(self.save_step_counters))
        return sinks
