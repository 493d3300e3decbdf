"""What to save of each tensor at the open step: the plans the step session holds.

:class:`StepPlans` owns the configs-to-plans state. When collections or configs change,
each included collection's save and reduction configs are resolved against the hook's
(``PreparedCollection``) and the plans' version moves on. :meth:`StepPlans.begin` decides,
for a step, which collections it saves (and, with a flight recorder, which it keeps in
memory only). From those, :meth:`StepPlans.plan_for` makes a tensor's
:class:`~smdebug.capture.step.TensorPlan` (raw value, reductions, histogram, TensorBoard
scalar, SageMaker metric), cached per name; :meth:`StepPlans.select` and
:meth:`StepPlans.selection` do it for a fixed tuple of names at once (an adapter's
parameters), and :attr:`StepPlans.version` tells adapters when what they derived from plans
must be derived again. Adapters reach it as ``session.plans``
(:class:`~smdebug.capture.contract.PlanSurface`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from ..collections import (
    RAW_ONLY_COLLECTIONS, SCALAR_COLLECTIONS, TRAIN_ONLY_COLLECTIONS, Collection, CollectionKeys, CollectionManager,
    FrameworkProfile,
)
from .budget import CHEAP_COLLECTIONS
from .inclusion import InclusionCheck
from ..flight_recorder_config import FlightRecorder
from ..logger import get_logger
from ..modes import ALL_MODES, ModeKeys
from .. import save_config as _save_config
from ..reduction_config import REDUCTION_TAG_PREFIX, ReductionConfig, reduction_tag
from ..save_config import SaveConfig, SaveConfigMode
from .step import Selection, TensorPlan

logger = get_logger()

_SM_METRIC_COLLECTIONS = frozenset({CollectionKeys.LOSSES, CollectionKeys.METRICS, CollectionKeys.SM_METRICS})


@dataclass
class PreparedCollection:
    """A collection's configs resolved against the hook's, computed when configs change."""

    collection: Collection
    save_config: SaveConfig
    reduction_config: ReductionConfig
    histogram: bool
    #: ``save_config`` of each mode, looked up once: checked for every collection at every step.
    by_mode: Dict[ModeKeys, SaveConfigMode]


class StepPlans:
    """Configs -> per-name plans, versioned; and what the open step saves (module docstring).

    ``include_collections`` is the session's list (it grows as collections are included);
    ``recording()`` says whether the flight recorder keeps steps now, ``consumes()`` whether
    anything takes this worker's values (a writer, a dry run, live rules)."""

    def __init__(self, manager: CollectionManager, include_collections: List[str], inclusion: InclusionCheck,
                 profile: FrameworkProfile, save_config: SaveConfig, reduction_config: ReductionConfig,
                 histograms: bool, flight_recorder: Optional[FlightRecorder],
                 recording: Callable[[], bool], consumes: Callable[[], bool], budget=None):
        #: The overhead budget's controller (capture/budget.py), or None: save configs are exact.
        self.budget = budget
        self.manager, self.include_collections, self.inclusion = manager, include_collections, inclusion
        self.profile, self.save_config, self.reduction_config = profile, save_config, reduction_config
        self.histograms, self.flight_recorder = histograms, flight_recorder
        self._recording, self._consumes = recording, consumes
        #: Whether the open step saves anything on this worker (the session's ``saving_step``).
        self.saving = False
        #: The open step is captured for the flight recorder only (the save config skips it).
        self.ring_only = False
        self.saving_collections: frozenset = frozenset()
        #: Saved at this step by *some* worker (select_everywhere, step_saves_somewhere).
        self.everywhere: frozenset = frozenset()
        self.prepared: List[PreparedCollection] = []
        self.by_name: Dict[str, PreparedCollection] = {}
        self._step: Tuple[ModeKeys, int] = (ModeKeys.GLOBAL, 0)
        self._prepared_key: Optional[tuple] = None
        self._epoch = 0  # counts the times plans were made again (version)
        # mode -> (from, until): its mode steps in [from, until) save nothing (reset with the plans)
        self._quiet: Dict[ModeKeys, Tuple[int, float]] = {}
        self._recorder_by_mode: Dict[ModeKeys, frozenset] = {}
        self._plan_caches: Dict[frozenset, Dict[str, Optional[TensorPlan]]] = {}
        self._selection_caches: Dict[object, Dict[tuple, List[Tuple[int, TensorPlan]]]] = {}
        self._selections: Dict[frozenset, Dict[tuple, Selection]] = {}

    def _configs_key(self) -> tuple:
        """What the prepared collections depend on: their set, their definitions, their save configs."""
        return self.manager.version, tuple(self.include_collections), _save_config.edits()

    def prepare_if_changed(self) -> None:
        key = self._configs_key()
        if key == self._prepared_key:
            return
        prepared = []
        for name in self.include_collections:
            coll = self.manager.get(name)
            save_config = coll.save_config.resolved(self.save_config, self.profile.default_save_interval)
            if name in RAW_ONLY_COLLECTIONS:
                reduction_config = ReductionConfig(save_raw_tensor=True)
            else:
                reduction_config = coll.reduction_config or self.reduction_config
            histogram = self.histograms and coll.save_histogram and name not in RAW_ONLY_COLLECTIONS
            by_mode = {mode: save_config.get_save_config(mode) for mode in ALL_MODES}
            prepared.append(PreparedCollection(coll, save_config, reduction_config, histogram, by_mode))
        self.prepared = prepared
        self.by_name = {p.collection.name: p for p in prepared}
        self._plan_caches.clear()
        self._selection_caches.clear()
        self._selections.clear()
        self._epoch += 1
        self._quiet.clear()
        self._recorder_by_mode.clear()
        self._prepared_key = key

    def begin(self, mode: ModeKeys, step: int) -> bool:
        """Decide what mode step ``step`` of ``mode`` saves; returns :attr:`saving`."""
        self._step = (mode, step)
        self.prepare_if_changed()
        self.ring_only = False
        recording = self._recording()
        # The recorder's collections in this mode whenever one is configured, whether it still
        # records here or not (fired, disabled, no writer on this rank): what every rank agrees on.
        configured_keep = self._recorder_collections(mode)
        budget = self.budget
        sampling = budget is not None and bool(budget.level)
        if sampling:
            # The recorder keeps the expensive collections at the budget's steps only: its
            # per-step non-finite check (the adapter's) catches what falls between them.
            sampled, configured_keep = configured_keep, configured_keep & CHEAP_COLLECTIONS
        quiet = self._quiet.get(mode)
        if quiet is not None and quiet[0] <= step < quiet[1] and not recording:  # between two saves: one comparison
            self.saving_collections = frozenset()
            self.everywhere = configured_keep
            self.saving = False
            return False
        relevant = self._relevant(mode)
        saving = frozenset(p.collection.name for p in relevant if p.by_mode[mode].should_save_step(step)
                           and (not sampling or budget.keeps(p.collection.name, p.by_mode[mode], step)))
        if sampling:
            configured_keep = configured_keep | (sampled & saving)
        self.everywhere = saving | configured_keep
        if recording and self.flight_recorder is not None:
            # Every step captures the recorder's collections; one that saves nothing else
            # goes to the recorder's ring instead of the writer. A step that saves anyway
            # writes them with it (they are on disk: the recorder never writes it again).
            kept = frozenset(p.collection.name for p in relevant if p.collection.name in configured_keep)
            self.ring_only = not saving and bool(kept)
            saving = saving | kept
        elif not saving:
            upcoming = [n for n in (p.by_mode[mode].next_save_step(step) for p in relevant) if n is not None]
            self._quiet[mode] = (step, min(upcoming, default=math.inf))
        self.saving_collections = saving
        # A worker that writes nothing (include_workers="one", not the chief) touches no
        # tensor, unless a dry run or a live rule wants the values.
        self.saving = bool(saving) and self._consumes()
        return self.saving

    def expensive_intervals(self, mode: ModeKeys = ModeKeys.TRAIN) -> Dict[str, int]:
        """The configured save interval in ``mode`` of each included collection the overhead
        budget samples (all but the cheap ones), by name."""
        self.prepare_if_changed()
        return {p.collection.name: p.by_mode[mode].save_interval or _save_config.DEFAULT_SAVE_INTERVAL
                for p in self._relevant(mode) if p.collection.name not in CHEAP_COLLECTIONS}

    def _relevant(self, mode: ModeKeys) -> list:
        """The prepared plans that can save in ``mode`` (TRAIN-only collections only in TRAIN and GLOBAL)."""
        return [p for p in self.prepared
                if mode in (ModeKeys.TRAIN, ModeKeys.GLOBAL) or p.collection.name not in TRAIN_ONLY_COLLECTIONS]

    @property
    def saving_expensive(self) -> bool:
        """Whether the open step saves (or keeps) a collection the overhead budget samples."""
        return bool(self.saving_collections - CHEAP_COLLECTIONS)

    def _recorder_collections(self, mode: ModeKeys) -> frozenset:
        """The configured flight recorder's collections saved in ``mode`` (cached per mode)."""
        if self.flight_recorder is None:
            return frozenset()
        kept = self._recorder_by_mode.get(mode)
        if kept is None:
            kept = self._recorder_by_mode[mode] = frozenset(
                p.collection.name for p in self.prepared
                if p.collection.name in self.flight_recorder.collections
                and (mode in (ModeKeys.TRAIN, ModeKeys.GLOBAL) or p.collection.name not in TRAIN_ONLY_COLLECTIONS))
        return kept

    def _refresh_if_configs_changed(self) -> None:
        """Collections may change between steps (and inside one): plans follow them."""
        if self._prepared_key != self._configs_key():
            self.begin(*self._step)

    def plan_for(self, name: str) -> Optional[TensorPlan]:
        """What to save of tensor ``name`` at this step, or None. Cached per name."""
        self._refresh_if_configs_changed()
        return self.plan_in(name, self.saving_collections)

    def plan_in(self, name: str, saving: frozenset) -> Optional[TensorPlan]:
        """The plan of ``name`` when the collections ``saving`` are saved (cached per set)."""
        cache = self._plan_caches.setdefault(saving, {})
        try:
            return cache[name]
        except KeyError:
            pass
        self.inclusion.seen[name] = None
        if REDUCTION_TAG_PREFIX in name:
            # The reader would take it for a reduction of another tensor.
            if name not in self.inclusion.refused:
                self.inclusion.refused.add(name)
                logger.warning("smdebug: not saving tensor %r: names containing %r are reserved for reductions; "
                               "rename it", name, REDUCTION_TAG_PREFIX)
            cache[name] = None
            return None
        members = [self.by_name[c.name] for c in self.manager.collections_for(name)
                   if c.name in saving]
        plan = None
        if members:
            raw = any(p.reduction_config.save_raw_tensor for p in members)
            reductions = []
            for p in members:
                if p.collection.name not in RAW_ONLY_COLLECTIONS:
                    reductions += [r for r in p.reduction_config.all_reductions() if r not in reductions]
            hist = next((p.collection.name for p in members if p.histogram), None)
            tb_scalar = any(p.collection.name in SCALAR_COLLECTIONS for p in members)
            strip = self.profile.strip_output_index_in_reduction_tags
            plan = TensorPlan(
                name=name,
                raw=raw,
                # A shape next to the raw value would hide the value from the original reader.
                shape=not raw and any(p.reduction_config.save_shape for p in members),
                reductions=tuple(reductions),
                histogram_tag=f"{hist}/{name}" if hist else None,
                tb_scalar=tb_scalar,
                sm_metric=any(p.collection.name in _SM_METRIC_COLLECTIONS for p in members),
                needs_value=raw or bool(reductions) or hist is not None,
                needs_host=raw or hist is not None or tb_scalar,
                reduction_tags=tuple(reduction_tag(name, op, is_abs, strip) for op, is_abs in reductions),
            )
            if not (plan.raw or plan.shape or plan.reductions or plan.histogram_tag):
                plan = None
        cache[name] = plan
        return plan

    def select(self, names: tuple) -> List[Tuple[int, TensorPlan]]:
        """``(index, plan)`` of the ``names`` saved at this step, remembered per tuple of names.

        For adapters that offer the same long list of tensors at every step (a model's
        parameters): one lookup instead of one per name.
        """
        self._refresh_if_configs_changed()
        cache = self._selection_caches.setdefault(self.saving_collections, {})
        selected = cache.get(names)
        if selected is None:
            selected = cache[names] = [(i, plan) for i, plan in enumerate(map(self.plan_for, names))
                                       if plan is not None]
        return selected

    def select_everywhere(self, names: tuple) -> List[Tuple[int, TensorPlan]]:
        """Like :meth:`select`, for the collections saved at this step by *some* worker: the
        same answer on every worker (save configs, step counters, a configured flight
        recorder; see ``step_saves_somewhere``). For adapters whose capture is collective:
        every worker must take part for the same tensors, whatever it writes itself; what a
        worker records is still what :meth:`plan_for` says for it."""
        self._refresh_if_configs_changed()
        colls = self.everywhere
        if colls == self.saving_collections:
            return self.select(names)
        cache = self._selection_caches.setdefault(("everywhere", colls), {})
        selected = cache.get(names)
        if selected is None:
            selected = cache[names] = [(i, plan) for i, plan in enumerate(self.plan_in(n, colls) for n in names)
                                       if plan is not None]
        return selected

    @property
    def version(self) -> tuple:
        """A value that changes whenever :meth:`plan_for`, :meth:`select` or :meth:`selection`
        may answer differently (configuration changed, another set of collections saved):
        adapters key what they derive from plans by it, not by the identity of what the core
        returned."""
        self._refresh_if_configs_changed()
        return self._epoch, self.saving_collections

    def selection(self, names: tuple) -> Selection:
        """The :class:`Selection` of ``names`` (a tuple the adapter reuses) saved at this
        step, for the session's ``start_batch``; cached per tuple of names while the plans stay."""
        self._refresh_if_configs_changed()
        cache = self._selections.setdefault(self.saving_collections, {})
        selection = cache.get(names)
        if selection is None:
            chosen = self.select(names)
            selection = cache[names] = Selection([i for i, _ in chosen], [plan for _, plan in chosen])
        return selection

    def wants(self, name: str) -> bool:
        """Whether tensor ``name`` is saved at this step (adapters call this before copying)."""
        return self.saving and self.plan_for(name) is not None

    def collections_json(self, num_workers: int) -> bytes:
        """The collections file (docs/format.md 4.3): every collection with its configs as
        resolved here. Names matched by an included collection's regexes are listed under
        it, as 1.0.34 did: its readers take a collection's tensors from these lists."""
        self.prepare_if_changed()
        matched: Dict[str, set] = {}
        for tensor in self.inclusion.seen:
            for coll in self.manager.collections_for(tensor):
                if coll.name in self.by_name:
                    matched.setdefault(coll.name, set()).add(tensor)

        def entry(name: str, coll: Collection) -> dict:
            out = coll.to_json_dict()
            if name in matched:
                out["tensor_names"] = sorted(matched[name].union(out["tensor_names"]))
            prepared = self.by_name.get(name)
            save_config = prepared.save_config if prepared else coll.save_config.resolved(
                self.save_config, self.profile.default_save_interval)
            reduction_config = prepared.reduction_config if prepared else (coll.reduction_config or
                                                                           self.reduction_config)
            out["save_config"] = save_config.to_json_dict()
            out["reduction_config"] = reduction_config.to_json_dict()
            if name in RAW_ONLY_COLLECTIONS:
                out["save_histogram"] = False
            return out

        return self.manager.to_json_bytes(num_workers, entry)
