"""The step session: the core's state and machinery for one run, owned by a hook.

A :class:`StepSession` is built by a user-facing hook (``smd.Hook`` or a framework's) from
the hook arguments and the adapter that owns it (``smdebug.capture.contract.Adapter``: the hook
itself). It knows no framework; it calls its adapter only through the declared callbacks.
The adapter calls, from the framework's own hooks (docs/architecture.md):

* :meth:`StepSession.begin_step` when an iteration starts (it ends the previous step);
* :meth:`StepSession.selection` + :meth:`StepSession.start_batch` +
  :meth:`StepSession.record_batch` to hand over a batch of tensors (the hot path:
  references only; the backend reduces them on the step pipeline's worker, or at once for
  small batches), and ``batch.wait()`` before anything may change them (the adapter's fence);
* :meth:`StepSession.record` for a tensor on its own (copied if it may change before the step ends);
* :meth:`StepSession.reduced_block` + :meth:`StepSession.record_reduced` for reductions the
  adapter computed itself (TensorFlow's compiled step);
* :meth:`StepSession.end_step` (optional: the next ``begin_step`` or ``close`` does it).

A saved step's records are made in recording order (:meth:`StepSession._finish_step`, in
step_records.py) and handed to the writer thread, which encodes and writes them. Training
waits for neither, except at fences and for live rules. A failure inside the session never
reaches training: it logs one warning and disables capture (:meth:`StepSession.guard`,
:func:`never_raises`); one tensor the backend cannot handle costs that tensor.
"""
from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import config as cfg
from ..environment import on_sagemaker
from ..storage import remote
from .backend import NumpyBackend, TensorBackend
from ..collections import (
    RAW_ONLY_COLLECTIONS, TRAIN_ONLY_COLLECTIONS,
    Collection, CollectionKeys, CollectionManager, FrameworkProfile, InclusionCheck, as_name_list,
)
from .arguments import HookArguments
from .contract import Worker, check_adapter, check_backend, check_worker
from ..exceptions import ConfigError
from ..flight_recorder_config import FlightRecorder
from ..storage.format.layout import MARKER_DIR
from .flight_recorder import Recorder, step_nbytes
from ..logger import get_logger
from ..modes import ModeKeys
from .pipeline import StepPipeline
from .plans import PreparedCollection, StepPlans
from ..reduction_config import REDUCTION_TAG_PREFIX, ReductionConfig
from ..storage.stop_request import STOP_REQUEST_FILE, StopRequestPoller
from ..storage.run_files import StepCounters, prepare_out_dir
from ..save_config import SaveConfig
from .step import ReducedBlock, Selection, StepValues, TensorBatch, TensorPlan
from .step_records import StepRecords
from .fail_open import Guard, never_raises

logger = get_logger()

# Left by rules in a run directory; removed with the run on overwrite.
_RUN_SIDE_FILES = ("rule_reports", "training_stop_reason.json", STOP_REQUEST_FILE, MARKER_DIR)
#: Longest close() waits for the step pipeline to finish the last steps (seconds).
CLOSE_TIMEOUT_S = 300.0



class StepSession(StepPlans, StepRecords):
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
        remote_extra: list = []
        if self.out_url is not None and self.writes_files:
            # As for a local out_dir, only the chief checks for (and may remove) an earlier run.
            self.out_dir, tb_local, remote_extra = remote.start_remote_writer(
                self.out_url, self.worker_name, tensorboard_dir, export_tensorboard, a.overwrite,
                check=self.is_chief, siblings=self._sibling_workers())
            tensorboard_dir, export_tensorboard = tb_local, False
        elif self.out_url is not None:  # writes nothing: no spool (out_dir names where one would be)
            self.out_dir = os.path.join(remote.default_spool_root(), "unwritten")
            tensorboard_dir, export_tensorboard = None, False
        elif tensorboard_dir is not None and remote.is_url(os.fspath(tensorboard_dir)):
            raise ConfigError(f"tensorboard_dir {tensorboard_dir!r} is a URL but out_dir {a.out_dir!r} is local; "
                              "give a local tensorboard_dir, or a URL out_dir (its spool uploads both)")
        self.tensorboard_dir = cfg.resolve_tensorboard_dir(self.out_dir, tensorboard_dir, export_tensorboard)
        self.backend: TensorBackend = check_backend(adapter, adapter.make_backend())
        self._numpy_backend = NumpyBackend()

        # Step state (docs/format.md 8.1): global step and one counter per mode.
        self.mode = ModeKeys.GLOBAL
        self.global_step = -1
        self.mode_steps: Dict[ModeKeys, int] = {ModeKeys.GLOBAL: -1}
        self.saving_step = False
        self.enabled = True
        self._step_open = False
        # (global step, mode, mode step) of the open step; scalars before any step go to step 0.
        self._step_identity = (0, ModeKeys.GLOBAL, 0)
        self._prepared_key = None
        self._prepared: List[PreparedCollection] = []
        # mode -> (from, until): its mode steps in [from, until) save nothing (reset with the plans)
        self._quiet: Dict[ModeKeys, Tuple[int, float]] = {}
        self._recorder_by_mode: Dict[ModeKeys, frozenset] = {}  # _recorder_collections
        self._saves_somewhere = False  # step_saves_somewhere
        self._everywhere_colls: frozenset = frozenset()  # saved at this step by some worker (select_everywhere)
        self._saving_colls: frozenset = frozenset()
        self._plan_caches: Dict[frozenset, Dict[str, Optional[TensorPlan]]] = {}
        self._selection_caches: Dict[frozenset, Dict[tuple, List[Tuple[int, TensorPlan]]]] = {}
        # name -> (plan, snapshot, backend); ReducedBlock -> (None, (block, values), None) for
        # reductions the adapter computed. Insertion order is recording order (a name recorded
        # again moves to the end): the last record wins.
        self._pending: Dict[object, Tuple[Optional[TensorPlan], object, Optional[TensorBackend]]] = {}
        self._blocks_pending = False  # whether _pending holds a ReducedBlock
        self._pending_scalars: List[Tuple[str, object, bool, Optional[float]]] = []
        self._pending_placements: Dict[str, dict] = {}  # name -> where its saved piece lies (note_placement)
        self._early_tensors: List[Tuple[str, object]] = []  # save_tensor before the first step
        self._collections_written = False
        self._closed = False
        self._lock = threading.RLock()
        self._step_listeners: List = []
        # Saved steps are finished (reductions, host copies, records) on this worker thread.
        self._pipeline = StepPipeline(on_error=self._on_pipeline_error)
        self._pipeline_failure: Optional[Tuple[str, bool]] = None  # (reason, already reported)
        self._selections: Dict[frozenset, Dict[tuple, Selection]] = {}
        self._plans_epoch = 0  # counts the times plans were made again (plans_version)
        self._metrics_failed = False
        self._warned_lost: set = set()
        self._skipped_tensors: set = set()  # tensors the backend could not handle: never recorded again
        #: Set by request_stop(); adapters end training at the next step boundary.
        self.stop_reason: Optional[str] = None
        # Flight recorder (smdebug_core/capture/flight_recorder.py): made once the writer exists.
        self._recorder: Optional[Recorder] = None
        self._ring_only = False  # the open step is captured for the recorder only (not saved)
        self._warned_steps_back: set = set()  # modes whose trainer step count went back (warned once)
        self._step_probe = None  # the adapter's non-finite probe of the open step (set_step_probe)
        self._last_identity: Optional[tuple] = None  # the last step finished

        checkpoint_dir = cfg.checkpoint_dir()
        self._step_counters = StepCounters(checkpoint_dir) if checkpoint_dir else None
        if self._step_counters is not None:
            self._resume_step_counters()

        self.writer = None
        if self.writes_files:
            # As for a URL (remote.py), only the chief checks for (and may remove) an earlier run.
            prepare_out_dir(self.out_dir, check=self.is_chief and self.out_url is None, overwrite=a.overwrite,
                            siblings=self._sibling_workers(), world_size=self.world_size,
                            side_files=_RUN_SIDE_FILES)
            from ..storage.writer import RunWriter  # the writer thread starts only for hooks that write

            uploader = None
            if self.out_url is not None:
                from ..storage.upload_process import make_uploader

                # Several workers into one prefix: the chief's end marker waits for the others' uploads.
                multi = self.include_workers == "all" and self.world_size > 1
                others = ([f"worker_{r}" for r in range(self.world_size) if r != self.rank]
                          if multi and self.is_chief and self.worker_name == f"worker_{self.rank}" else [])
                uploader = make_uploader(self.out_dir, self.out_url, extra_dirs=remote_extra,
                                         worker=self.worker_name if multi else None, wait_for_workers=others)
            self.writer = RunWriter(self.out_dir, self.worker_name, tensorboard_dir=self.tensorboard_dir,
                                    uploader=uploader)
            if flight_recorder is not None:
                writer = self.writer
                self._recorder = Recorder(flight_recorder, self.worker_name, submit=lambda d: writer.submit(d, True),
                                          write_file=writer.write_file)
        # Another process (a rule) may ask this run to stop through a file in out_dir.
        self._stop_poller = None if self.dry_run else StopRequestPoller(self.out_dir, clear_stale=self.is_chief)
        logger.debug("smdebug session writing to %s as %s (dry_run=%s)", self.out_dir, self.worker_name,
                     self.dry_run)

    def _sibling_workers(self) -> List[str]:
        """The other workers of this job that write into the same run."""
        if self.include_workers != "all":
            return []
        return [f"worker_{r}" for r in range(self.world_size) if r != self.rank]

    # --- step counters kept across restarts (spot training): run_files.StepCounters ---------
    def _resume_step_counters(self) -> None:
        """Continue the step numbering of a previous run of this job, if it left its state."""
        state = self._step_counters.load()
        if state is None:
            return
        seen, mode_steps = state
        self.global_step = seen
        self.mode_steps.update(mode_steps)
        self.mode_steps[ModeKeys.GLOBAL] = seen
        logger.info("smdebug: resuming after global step %d (state in %s)", seen, self._step_counters.dir)

    def _save_step_counters(self, identity: Optional[tuple] = None) -> None:
        """At the end of each saved step (``identity``, on the step pipeline's thread) and at
        close (the training thread's counters)."""
        if identity is None:
            step, mode_steps = self.global_step, dict(self.mode_steps)
        else:
            step, mode, mode_step = identity
            try:
                mode_steps = dict(self.mode_steps)  # other modes' counters, as the training thread has them
            except RuntimeError:  # changed while copied: this mode's counter is the one that matters
                mode_steps = {}
            mode_steps[mode] = mode_step
            mode_steps[ModeKeys.GLOBAL] = step
        self._step_counters.save(self.out_dir, step, mode_steps)

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
    def set_mode(self, mode) -> None:
        """Switch to TRAIN, EVAL, PREDICT or GLOBAL; each mode counts its own steps from 0."""
        mode = ModeKeys.parse(mode)
        self.mode_steps.setdefault(mode, -1)
        self.mode = mode

    @property
    def mode_step(self) -> int:
        return self.mode_steps.get(self.mode, -1)

    def continue_mode_steps(self, mode, next_step: int) -> None:
        """Number the next step of ``mode`` ``next_step`` (a trainer that resumed from a
        checkpoint numbers its steps on from there); the global step counts on as usual."""
        mode = ModeKeys.parse(mode)
        current = self.mode_steps.get(mode, -1)
        if current + 1 < next_step:
            self.mode_steps[mode] = next_step - 1
        elif current + 1 > next_step and mode not in self._warned_steps_back:
            # A second fit()/train() with the same hook starts its count over: numbering it so
            # would save mode steps twice, and reads by mode step would find the first run's.
            self._warned_steps_back.add(mode)
            logger.warning("smdebug: the trainer numbers its next %s step %d, but %s step %d is already saved (a "
                           "second training with the same callback?): its %s steps go on from %d instead, so "
                           "none is saved twice; give each training its own out_dir to keep the trainer's "
                           "numbers", mode.name, next_step, mode.name, current, mode.name, current + 1)

    def begin_step(self, step: Optional[int] = None) -> bool:
        """Start the next step (or step ``step``); returns whether anything is saved in it."""
        if not self.enabled:
            return False
        if self._step_open:
            self.end_step()
        if self._pipeline_failure is not None and not self._disable_after_pipeline_failure():
            return False
        try:
            if step is None:
                self.global_step += 1
                self.mode_steps[self.mode] = self.mode_steps.get(self.mode, -1) + 1
            else:
                if step < 0:
                    raise ValueError(f"step must be >= 0, got {step}")
                self.global_step = step
                self.mode_steps[self.mode] = step if self.mode == ModeKeys.GLOBAL else self.mode_step + 1
            self.mode_steps[ModeKeys.GLOBAL] = self.global_step
            # The step keeps the mode it began in, even if set_mode() is called before it ends.
            self._step_identity = (self.global_step, self.mode, self.mode_step)
            self._step_open = True
            self._update_saving()
            if self._early_tensors:
                early, self._early_tensors = self._early_tensors, []
                for name, value in early:
                    self.record(name, value)
            if self._stop_poller is not None and self.stop_reason is None:
                self._stop_poller.check(self)
        except Exception as exc:  # noqa: BLE001
            self.disable(f"begin_step: {type(exc).__name__}: {exc}")
        return self.saving_step

    def _update_saving(self) -> None:
        self._prepare_if_changed()
        _, mode, step = self._step_identity  # the open step's mode, even after set_mode()
        self._ring_only = False
        recording = self.flight_recording
        # The recorder's collections in this mode whenever one is configured, whether it still
        # records here or not (fired, disabled, no writer on this rank): what every rank agrees on.
        configured_keep = self._recorder_collections(mode)
        quiet = self._quiet.get(mode)
        if quiet is not None and quiet[0] <= step < quiet[1] and not recording:  # between two saves: one comparison
            self._saving_colls = frozenset()
            self._everywhere_colls = configured_keep
            self._saves_somewhere = bool(configured_keep)
            self.saving_step = False
            return
        relevant = [p for p in self._prepared
                    if mode in (ModeKeys.TRAIN, ModeKeys.GLOBAL) or p.collection.name not in TRAIN_ONLY_COLLECTIONS]
        self._saving_colls = frozenset(p.collection.name for p in relevant if p.by_mode[mode].should_save_step(step))
        self._everywhere_colls = self._saving_colls | configured_keep
        self._saves_somewhere = bool(self._everywhere_colls)
        if recording:
            # Every step captures the recorder's collections; one that saves nothing else
            # goes to the recorder's ring instead of the writer. A step that saves anyway
            # writes them with it (they are on disk: the recorder never writes it again).
            kept = frozenset(p.collection.name for p in relevant if p.collection.name in self.flight_recorder.collections)
            self._ring_only = not self._saving_colls and bool(kept)
            self._saving_colls = self._saving_colls | kept
        elif not self._saving_colls:
            upcoming = [n for n in (p.by_mode[mode].next_save_step(step) for p in relevant) if n is not None]
            self._quiet[mode] = (step, min(upcoming, default=math.inf))
        # A worker that writes nothing (include_workers="one", not the chief) touches no
        # tensor, unless a dry run or a live rule wants the values.
        consumes = self.writes_files or self.dry_run or bool(self._step_listeners)
        self.saving_step = bool(self._saving_colls) and consumes

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
        return self._saving_colls if self.saving_step else frozenset()

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

    def note_placement(self, name: str, placement: dict) -> None:
        """Say that the value recorded as ``name`` in this step is one piece of a larger tensor
        (a shard of a sharded parameter): ``placement`` (``global_shape``, ``local_shape`` and
        ``offsets`` of the block, or ``flat_offset`` in the flattened tensor) is written into the
        step's index file (docs/format.md 3.3), where our Trial finds it to reassemble the full
        tensor from every worker's piece and readers of the original format do not look."""
        if self.saving_step:
            with self._lock:
                self._pending_placements[name] = placement

    @property
    def step_saves_somewhere(self) -> bool:
        """Whether some worker saves something at this step: the same answer on every worker
        (it follows the save configuration, the step counters and whether a flight recorder
        is configured, never a worker's own state), including those that write nothing
        (``include_workers="one"``). Adapters whose capture needs every worker's part
        (collectives over sharded tensors) take part whenever it is True."""
        return self._saves_somewhere and self.enabled

    def _recorder_collections(self, mode: ModeKeys) -> frozenset:
        """The configured flight recorder's collections saved in ``mode`` (cached per mode)."""
        if self.flight_recorder is None:
            return frozenset()
        kept = self._recorder_by_mode.get(mode)
        if kept is None:
            kept = self._recorder_by_mode[mode] = frozenset(
                p.collection.name for p in self._prepared
                if p.collection.name in self.flight_recorder.collections
                and (mode in (ModeKeys.TRAIN, ModeKeys.GLOBAL) or p.collection.name not in TRAIN_ONLY_COLLECTIONS))
        return kept

    @never_raises("handing over tensors")
    def start_batch(self, selection: Selection, tensors: Sequence, backend: TensorBackend) -> Optional[TensorBatch]:
        """Hand over ``tensors`` (one per ``selection.plans``, in order) without waiting:
        ``backend.start_batch`` runs now, ``backend.finish_batch`` on the step pipeline's
        worker. The tensors must not change until ``batch.wait()`` returns (the adapter's
        fence). File the batch into the step with :meth:`record_batch` (where it is filed
        decides its records' place in the step's files). None when nothing is saved.
        """
        if not (self.saving_step and self.enabled and selection.plans):
            return None
        tickets = []
        for positions, keys, raw, _ in selection.groups:
            members = tensors if len(selection.groups) == 1 else [tensors[p] for p in positions]
            started = backend.start_batch(members, keys, raw)
            run = self._pipeline.run_here if backend.finish_here(started) else self._pipeline.submit
            tickets.append(run("reducing tensors", backend.finish_batch, started))
        return TensorBatch(selection, tickets)

    def record_batch(self, batch: Optional[TensorBatch]) -> None:
        """File a :class:`TensorBatch` into the current step (the last record of a name wins)."""
        if batch is None or not self.saving_step:
            return
        with self._lock:
            self._pending[batch] = (None, batch, None)
            self._blocks_pending = True

    # --- recording ---------------------------------------------------------------------
    @never_raises("record")
    def record(self, name: str, value, backend: Optional[TensorBackend] = None) -> bool:
        """Offer a tensor for the current step; returns whether it will be saved."""
        if not self.saving_step:
            return False
        return self._hold(((name, value),), backend or self._backend_for(value)) == 1

    @never_raises("record")
    def record_planned(self, plan: TensorPlan, value, backend: TensorBackend) -> bool:
        """Offer a tensor under ``plan``: this step's plan of its name, narrowed by the adapter
        (``dataclasses.replace``) to what it can save faithfully (a shard of a sharded tensor:
        the reductions exact from its shards' partials, which its snapshot carries)."""
        if not self.saving_step:
            return False
        return self._hold(((plan.name, value),), backend, plan) == 1

    @never_raises("record")
    def record_many(self, items, backend: Optional[TensorBackend] = None) -> int:
        """Offer several ``(name, value)`` of one backend (None: host values, numpy) at once;
        returns how many will be saved.

        The same as :meth:`record` for each, with one lock for all: adapters use it for
        tensors they gathered (parameters before an optimizer step, a forward's outputs).
        """
        if not self.saving_step:
            return 0
        return self._hold(items, backend or self._numpy_backend)

    @never_raises("record")
    def record_whatever_the_config(self, items) -> int:
        """Save host ``(name, value)`` items in the open step even where the save config
        skips it, as their included collections would save them (1.0.34's ``force_save``:
        what a trainer reports once an epoch, such as Keras' ``val_*`` logs, would otherwise
        be lost on most steps). Returns how many will be saved."""
        if self.saving_step:
            return self._hold(items, self._numpy_backend)
        if not (self._step_open and (self.writes_files or self.dry_run or self._step_listeners)):
            return 0
        everything = frozenset(p.collection.name for p in self._prepared)
        held = sum(self._hold(((name, value),), self._numpy_backend, plan)
                   for name, value in items if (plan := self._plan_in(name, everything)) is not None)
        if held:
            self._ring_only = False  # written with its step, not kept for the flight recorder only
        return held

    def _hold(self, items, backend: TensorBackend, given: Optional[TensorPlan] = None) -> int:
        """Snapshot the wanted ``(name, value)`` items and keep them for the end of the step."""
        held = []
        for name, value in items:
            plan = given or self.plan_for(name)
            if plan is not None and name not in self._skipped_tensors:
                try:
                    held.append((name, plan, backend.snapshot(value, plan.needs_value)))
                except Exception as exc:  # noqa: BLE001 - one bad tensor costs that tensor only
                    self._skip_tensor(name, exc)
        with self._lock:
            pending = self._pending
            for name, plan, snap in held:
                if pending.pop(name, None) is not None:
                    logger.debug("tensor %s recorded twice in step %d; keeping the last value", name,
                                 self.global_step)
                pending[name] = (plan, snap, backend)
        return len(held)

    def reduced_block(self, entries: Sequence[Tuple[TensorPlan, Optional[tuple]]]) -> ReducedBlock:
        """Lay out tensors whose reductions the adapter computes itself, for
        :meth:`record_reduced`: ``entries`` are ``(plan, shape)``, ``plan`` this step's plan of
        the tensor (from :meth:`select` or :meth:`plan_for`) asking for reductions only,
        ``shape`` the tensor's shape (for a shape record) or None. Build it once and keep it
        while :meth:`select` returns the same plans."""
        return ReducedBlock(entries)

    @never_raises("record")
    def record_reduced(self, block: ReducedBlock, values: Sequence) -> int:
        """Offer this step's reductions of the tensors of ``block`` (:meth:`reduced_block`):
        every reduction of every tensor, tensor after tensor, each in its plan's order, as
        numpy float64 scalars (written as they are). Returns how many tensors were taken.
        Skips the per-tensor backend round trip and per-tensor Python: an adapter that
        reduces in its own graph hands a step over at the cost of one call.
        """
        if not self.saving_step:
            return 0
        if len(values) != len(block.tags):
            raise ValueError(f"record_reduced: {len(values)} values for a block of {len(block.tags)} reductions")
        with self._lock:
            pending = self._pending
            pending.pop(block, None)
            pending[block] = (None, (block, values), None)
            self._blocks_pending = True
        return len(block.entries)

    def _backend_for(self, value) -> TensorBackend:
        return self.backend if self.backend.accepts(value) else self._numpy_backend

    def save_tensor(self, tensor_name: str, tensor_value, collections_to_write="default") -> None:
        """Save a tensor you computed yourself, in the given collection(s) (they become included)."""
        if not isinstance(tensor_name, str) or not tensor_name:
            raise ConfigError(f"tensor_name must be a non-empty string, got {tensor_name!r}")
        for coll_name in as_name_list(collections_to_write, "collections_to_write"):
            self.collection_manager.get(coll_name).add_tensor_name(tensor_name)
            self.include(coll_name, expect=False)
        if not self._step_open and self.global_step < 0 and self.enabled:
            # Before the first step (as 1.0.34 allows): kept, and saved in the first step.
            self._early_tensors.append((tensor_name, tensor_value))
            return
        self.record(tensor_name, tensor_value)

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
        self._pending_scalars.append((name, value, bool(sm_metric), timestamp))

    # --- end of step: hand-off to the step pipeline, then to the writer ----------------------
    @never_raises("end_step")
    def end_step(self) -> None:
        """Finish the current step: its reductions, host copies and records are made on the
        step pipeline's worker thread, then handed to the writer. Training does not wait,
        except for live rules (a stop they request lands at the next step boundary) and
        dry runs (their log lines come in step order)."""
        if self._step_open:
            self.adapter.on_step_end()
        self._step_open = False
        inclusion = self._inclusion
        if inclusion.pending and (self.saving_step or not inclusion.configured_checked):
            # At the end of the first step, not its start: save_tensor() calls in it define collections too.
            inclusion.check_configured(self.collection_manager, logger)
            if self.saving_step:
                inclusion.check_matches(self.collection_manager, self._saving_colls, self._step_identity[0], logger)
        with self._lock:
            pending, self._pending = self._pending, {}
            placements, self._pending_placements = self._pending_placements, {}
            has_blocks, self._blocks_pending = self._blocks_pending, False
            scalars, self._pending_scalars = self._pending_scalars, []
        if not pending and not scalars:
            return
        collections = None
        if not self._collections_written and self.writer is not None:
            collections = self.collections_json()  # here: the training thread changes collections
            self._collections_written = True
        # On the worker while it still reduces this step's batches (steps stay in order);
        # else here: making the records costs less than waking the worker for them.
        # Live rules and dry runs see each step finished before the next begins.
        flight = None
        if self._recorder is not None and self.flight_recording:
            flight = (self._ring_only, self._step_probe)
        self._step_probe = None
        args = (pending, has_blocks, scalars, self._step_identity, collections, flight, placements)
        if self._pipeline.idle or self._step_listeners or self.writer is None:
            self._pipeline.drain()
            self._pipeline.run_here("finishing a step", self._finish_step, *args)
        else:
            self._pipeline.submit("finishing a step", self._finish_step, *args)
        if self._pipeline_failure is not None:
            self._disable_after_pipeline_failure()

    def _recorder_keep(self, identity: tuple, tensors: list, shapes: list, probe,
                       placements: Optional[Dict[str, dict]] = None) -> None:
        from ..storage.step_data import StepData

        step, mode, mode_step = identity
        # Placements too: a kept piece of a sharded tensor is reassembled like a saved one.
        data = StepData(global_step=step, mode=mode, mode_step=mode_step, worker=self.worker_name,
                        tensors=tensors, shapes=shapes, wall_time=time.time(), placements=placements or {})
        self._recorder.keep(identity, data, step_nbytes(tensors, shapes), probe)

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
            if trigger == "exception" and self._step_open and not self._pipeline.on_worker_thread:
                identity = self._step_identity
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

    def _on_pipeline_error(self, what: str, exc: BaseException) -> None:
        if self._pipeline_failure is None:
            self._pipeline_failure = (f"{what}: {type(exc).__name__}: {exc}", False)

    def _disable_after_pipeline_failure(self) -> bool:
        reason, reported = self._pipeline_failure
        self.disable(reason, already_reported=reported)
        return False

    def collections_json(self) -> bytes:
        """The collections file: every collection with its resolved configs (docs/format.md 4.3)."""
        self._prepare_if_changed()
        # Names matched by an included collection's regexes are listed under it, as 1.0.34
        # did: its readers take a collection's tensors from these lists.
        matched: Dict[str, set] = {}
        for tensor in self.seen_tensor_names():
            for coll in self.collection_manager.collections_for(tensor):
                if coll.name in self._by_name:
                    matched.setdefault(coll.name, set()).add(tensor)
        doc = {}
        for name, coll in sorted(self.collection_manager.collections.items()):
            entry = coll.to_json_dict()
            if name in matched:
                entry["tensor_names"] = sorted(matched[name].union(entry["tensor_names"]))
            prepared = self._by_name.get(name)
            save_config = prepared.save_config if prepared else coll.save_config.resolved(
                self.save_config, self.profile.default_save_interval)
            reduction_config = prepared.reduction_config if prepared else (coll.reduction_config or
                                                                           self.reduction_config)
            entry["save_config"] = save_config.to_json_dict()
            entry["reduction_config"] = reduction_config.to_json_dict()
            if name in RAW_ONLY_COLLECTIONS:
                entry["save_histogram"] = False
            doc[name] = entry
        num_workers = self.world_size if self.include_workers == "all" else 1
        return json.dumps({"collections": doc, "_meta": {"num_workers": num_workers}}).encode()

    def _write_collections(self) -> None:
        if self.writer is not None:
            self.writer.write_collections(self.collections_json())
            self._collections_written = True

    # --- live consumers of saved values (rules) and stopping ---------------------------
    def add_step_listener(self, listener) -> None:
        """Call ``listener(StepValues)`` after every saved step, on the training thread.

        Listeners must return quickly (hand the values to their own thread); an exception
        in a listener is logged once and the listener removed. Live rules use this.
        """
        self._step_listeners.append(listener)

    def remove_step_listener(self, listener) -> None:
        if listener in self._step_listeners:
            self._step_listeners.remove(listener)

    def _notify_listeners(self, values: StepValues) -> None:
        for listener in list(self._step_listeners):
            try:
                listener(values)
            except Exception as exc:  # noqa: BLE001
                logger.warning("smdebug: step listener %r failed and was removed: %s", listener, exc)
                self.remove_step_listener(listener)

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
        self.saving_step = False
        if not already_reported:
            logger.warning("smdebug: hook disabled after an internal error (%s); training continues without "
                           "tensor capture. Steps written before this are intact.", reason)
        if not self._pipeline.on_worker_thread:
            self._pipeline.close(timeout=10)  # steps finished before the failure still reach the writer
        writer, self.writer = self.writer, None
        if writer is not None:
            try:
                writer.close(write_end_marker=False, timeout=10)
            except Exception:  # noqa: BLE001
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
        if (self.enabled and self._step_open) or self._pending or self._pending_scalars:
            self.end_step()
        if not self._pipeline.close(timeout=CLOSE_TIMEOUT_S):
            logger.warning("smdebug: steps still being reduced after %.0f s at close; the run may miss its last "
                           "steps", CLOSE_TIMEOUT_S)
        if self._pipeline_failure is not None and self.enabled:
            self._disable_after_pipeline_failure()
        for listener in list(self._step_listeners):  # live rules finish their reports
            try:
                close = getattr(listener, "close", None)
                if callable(close):
                    close()
            except Exception as exc:  # noqa: BLE001
                logger.warning("smdebug: step listener %r failed to close: %s", listener, exc)
        if self._recorder is not None:
            self._recorder.close()  # after a dump in flight on a rule's thread, before the writer closes
        if self.writer is not None:
            try:
                self._write_collections()
                marker = self.is_chief and not on_sagemaker()
                self.writer.close(write_end_marker=marker)
            except Exception as exc:  # noqa: BLE001
                logger.warning("smdebug: could not finish writing %s: %s", self.out_dir, exc)
            self._writer_failed()  # the writer works in batches: a disk error may surface only now
        if self._step_counters is not None and self.global_step >= 0:
            self._save_step_counters()

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
        return self._step_open

    @property
    def step_mode(self) -> ModeKeys:
        """The mode the open (or last) step began in: ``mode`` is where the next step begins,
        and ``set_mode()`` changes it while a step is open."""
        return self._step_identity[1]

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
        if self._collections_written or self.global_step >= 0:
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
