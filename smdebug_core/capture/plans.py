"""What to save of each tensor at the current step: the plans of the step session.

A mixin of :class:`~smdebug.capture.session.StepSession`. When collections or configs change, each included
collection's save and reduction configs are resolved against the hook's (``PreparedCollection``);
from those, :meth:`StepPlans.plan_for` makes a tensor's :class:`~smdebug.capture.step.TensorPlan`
(raw value, reductions, histogram, TensorBoard scalar, SageMaker metric) for the set of
collections saved at this step, cached per name; :meth:`StepPlans.select` and
:meth:`StepPlans.selection` do it for a fixed tuple of names at once (an adapter's
parameters), and :attr:`StepPlans.plans_version` tells adapters when what they derived
from plans must be derived again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ..collections import RAW_ONLY_COLLECTIONS, SCALAR_COLLECTIONS, Collection, CollectionKeys
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
    """The plan-making half of the step session (see the module docstring)."""

    def _configs_key(self) -> tuple:
        """What the prepared collections depend on: their set, their definitions, their save configs."""
        return self.collection_manager.version, tuple(self.include_collections), _save_config.edits()

    def _prepare_if_changed(self) -> None:
        key = self._configs_key()
        if key == self._prepared_key:
            return
        prepared = []
        for name in self.include_collections:
            coll = self.collection_manager.get(name)
            save_config = coll.save_config.resolved(self.save_config, self.profile.default_save_interval)
            if name in RAW_ONLY_COLLECTIONS:
                reduction_config = ReductionConfig(save_raw_tensor=True)
            else:
                reduction_config = coll.reduction_config or self.reduction_config
            histogram = bool(self.tensorboard_dir) and coll.save_histogram and name not in RAW_ONLY_COLLECTIONS
            by_mode = {mode: save_config.get_save_config(mode) for mode in ALL_MODES}
            prepared.append(PreparedCollection(coll, save_config, reduction_config, histogram, by_mode))
        self._prepared = prepared
        self._by_name = {p.collection.name: p for p in prepared}
        self._plan_caches.clear()
        self._selection_caches.clear()
        self._selections.clear()
        self._plans_epoch += 1
        self._quiet.clear()
        self._recorder_by_mode.clear()
        self._prepared_key = key

    def _refresh_if_configs_changed(self) -> None:
        """Collections may change between steps (and inside one): plans follow them."""
        if self._prepared_key != self._configs_key():
            self._update_saving()

    def plan_for(self, name: str) -> Optional[TensorPlan]:
        """What to save of tensor ``name`` at this step, or None. Cached per name."""
        self._refresh_if_configs_changed()
        return self._plan_in(name, self._saving_colls)

    def _plan_in(self, name: str, saving: frozenset) -> Optional[TensorPlan]:
        """The plan of ``name`` when the collections ``saving`` are saved (cached per set)."""
        cache = self._plan_caches.setdefault(saving, {})
        try:
            return cache[name]
        except KeyError:
            pass
        self._inclusion.seen[name] = None
        if REDUCTION_TAG_PREFIX in name:
            # The reader would take it for a reduction of another tensor.
            if name not in self._inclusion.refused:
                self._inclusion.refused.add(name)
                logger.warning("smdebug: not saving tensor %r: names containing %r are reserved for reductions; "
                               "rename it", name, REDUCTION_TAG_PREFIX)
            cache[name] = None
            return None
        members = [self._by_name[c.name] for c in self.collection_manager.collections_for(name)
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
        cache = self._selection_caches.setdefault(self._saving_colls, {})
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
        colls = self._everywhere_colls
        if colls == self._saving_colls:
            return self.select(names)
        cache = self._selection_caches.setdefault(("everywhere", colls), {})
        selected = cache.get(names)
        if selected is None:
            selected = cache[names] = [(i, plan) for i, plan in enumerate(self._plan_in(n, colls) for n in names)
                                       if plan is not None]
        return selected

    @property
    def plans_version(self) -> tuple:
        """A value that changes whenever :meth:`plan_for`, :meth:`select` or :meth:`selection`
        may answer differently (configuration changed, another set of collections saved):
        adapters key what they derive from plans by it, not by the identity of what the core
        returned."""
        self._refresh_if_configs_changed()
        return self._plans_epoch, self._saving_colls

    def selection(self, names: tuple) -> Selection:
        """The :class:`Selection` of ``names`` (a tuple the adapter reuses) saved at this
        step, for :meth:`start_batch`; cached per tuple of names while the plans stay."""
        self._refresh_if_configs_changed()
        cache = self._selections.setdefault(self._saving_colls, {})
        selection = cache.get(names)
        if selection is None:
            chosen = self.select(names)
            selection = cache[names] = Selection([i for i, _ in chosen], [plan for _, plan in chosen])
        return selection

    def wants(self, name: str) -> bool:
        """Whether tensor ``name`` is saved at this step (adapters call this before copying)."""
        return self.saving_step and self.enabled and self.plan_for(name) is not None
