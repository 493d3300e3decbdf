"""The Trial: a read-only view of one run directory (docs/format.md section 5), and
``create_trial``.

A trial discovers data only through the collections and index files (or a run store's
segments); it opens an event or chunk file only when a whole tensor is asked for. Its parts:
opening the run (opening.py), what the index files (run_index.py, bulk.py) or the run store
(store_index.py, store_table.py) say so far, the steps (steps.py), the records
(event_reads.py), and one :class:`Tensor` per name asked for.
"""
from __future__ import annotations

import bisect
import gc
import logging
import numbers
import os
import re
import time
from typing import Dict, List, Optional, Set, Tuple, Union

from ...collections import Collection, CollectionManager
from ...exceptions import StepNotYetAvailable, TensorUnavailable
from ...modes import ModeKeys
from ...storage.format.layout import END_OF_JOB_FILE, MARKER_DIR, validate_step
from ...storage.open_runs import flush_before_reading
from ...storage.run_files import read_markers
from . import budget_view, notebook, settings
from .event_reads import RecordReader
from .opening import check_run_path, collection_workers, list_collection_files, load_collections
from .run_index import RunIndex
from .store_index import pick_index
from .steps import StepState
from .storage import open_storage
from .computed import computed_table, parse_reductions
from ...reduction_config import reduction_label
from .labels import tensor_name_hint
from .table import Table, require_pandas
from .tensor import Tensor

__all__ = ["Trial", "create_trial", "LocalTrial", "StepState"]

logger = logging.getLogger("smdebug.trials")
_warned_mode_none: List[bool] = []  # steps(mode=None) warned once per process

GLOBAL = ModeKeys.GLOBAL


class _Kept:
    """A Trial attribute that one of its parts keeps (``part``: the trial's attribute holding it)."""

    def __init__(self, part: str, doc: str):
        self.part = part
        self.__doc__ = doc

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, trial, owner=None):
        return self if trial is None else getattr(getattr(trial, self.part), self.name)

    def __set__(self, trial, value):
        setattr(getattr(trial, self.part), self.name, value)


class Trial:
    """Everything one training run saved: steps, modes, workers, collections and tensors.

    Create it with :func:`create_trial`. Queries that list things (``steps()``,
    ``tensor_names()``, ``has_passed_step()``) pick up new files written since the last
    call; value lookups refresh only when what they ask for is not known yet.
    """

    def __init__(
        self,
        path: str,
        name: Optional[str] = None,
        range_steps=None,
        check: Union[bool, str] = False,
        index_mode: bool = True,
        cache: bool = False,
        wait_timeout: Optional[float] = None,
        progress: Optional[bool] = None,
        wait_for_directory: bool = False,
        max_expanded_elements: Optional[int] = None,
    ):
        if not index_mode:
            raise NotImplementedError(
                "index_mode=False (discovering tensors by reading whole event files) is not "
                "supported: index files are mandatory in the smdebug format"
            )
        self._storage = open_storage(path)
        self.path = self._storage.root
        flush_before_reading(self.path)  # a hook of this process writing this run: its ended steps first
        self.name = name if name is not None else os.path.basename(self.path.rstrip("/")) or self.path
        range_steps = settings.validate_range_steps(range_steps)
        record_check = settings.record_check(check)
        self.check = check
        self.index_mode = True
        self.cache = bool(cache)
        wait_timeout = settings.wait_timeout(wait_timeout)
        max_expanded_elements = settings.max_expanded_elements(max_expanded_elements)
        self.poll_interval = settings.DEFAULT_POLL_INTERVAL_S
        self.progress = progress
        # Turned off by a caller that knows nothing new can appear (rule engines).
        self.dynamic_refresh = True
        self._incomplete_step_window = settings.incomplete_step_window()
        self._training_end_delay = settings.training_end_delay()

        self.stats: Dict[str, int] = self._storage.stats
        self.stats.update(index_files_parsed=0, refreshes=0)
        # --- the parts: what the index files (or the run store) say, and the records ---
        # Which of the two a run has is known once it has written something (_pick_layout).
        self._index = RunIndex(self._storage, range_steps, self.stats)
        self._layout: Optional[str] = None
        self._steps = self._index.steps
        self._reader = RecordReader(self._storage, self._steps, record_check, wait_timeout, max_expanded_elements)
        self._tensors: Dict[str, Tensor] = {}  # made when first asked for
        self._workers: Set[str] = set()
        self._catalog = None  # made when asked for, again after a refresh that read something

        self._collection_manager: Optional[CollectionManager] = None
        check_run_path(self._storage, self.path, self.wait_timeout, wait_for_directory)
        self._collection_manager, self.num_workers, files = load_collections(
            self._storage, self.path, self.wait_timeout, self.poll_interval)
        self._workers = collection_workers(files)
        self._read_new(progress)  # flushed above

    range_steps = _Kept("_index", "``(begin, end)``: the global steps loaded (None: all).")
    corrupt_index_files = _Kept("_index", "Index files skipped as unreadable, relative to the run.")
    last_complete_step = _Kept("_steps", "The last global step known to be complete (-1: none yet).")
    loaded_all_steps = _Kept("_steps", "Whether training ended and every step is loaded.")
    num_workers = _Kept("_steps", "How many workers the run has (its collections file says).")
    worker_step_conflicts = _Kept(
        "_steps", "Global steps that workers number differently: ``{step: {worker: (mode, mode_step)}}`` "
                  "for the workers whose own numbering differs from the trial's (the first worker read).")
    wait_timeout = _Kept("_reader", "Seconds to wait for a run's files that should be there (collections, "
                                    "an event file the index names).")
    max_expanded_elements = _Kept("_reader", "The most elements a record may expand to.")

    # ------------------------------------------------------------------ lifecycle
    def __repr__(self):
        steps = self._steps
        modes = ", ".join(f"{m.name} {len(steps.sorted_steps(m))}" for m in
                          sorted(steps.mode_to_global, key=lambda m: m.value))
        return (
            f"<Trial {self.name!r} at {self.path!r}: {len(steps.global_to_mode)} steps"
            f"{f' ({modes})' if modes else ''}, {len(self._index.tensors)} tensors, "
            f"workers {', '.join(sorted(self._workers)) or 'none'}, "
            f"{'ended' if self.loaded_all_steps else 'not ended'}>"
        )

    def close(self) -> None:
        """Close the event files kept open for reading."""
        self._storage.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        storage = getattr(self, "_storage", None)
        if storage is not None:
            storage.close()

    @property
    def index_files_read(self) -> int:
        """How many index files this trial has parsed so far (each is read once)."""
        return self.stats["index_files_parsed"]

    # ------------------------------------------------------------------ collections
    def collections(self) -> Dict[str, Collection]:
        """All collections of the run, by name."""
        return self._collection_manager.collections

    def collection(self, name: str) -> Collection:
        """The collection called ``name``. One the run does not have is created empty in this
        trial (as in smdebug 1.0.34), so that regexes can be ``include()``-d into it and it
        can be passed to ``tensor_names(collection=...)``; a debug log names the known ones."""
        coll = self._collection_manager.collections.get(name)
        if coll is None:
            if not isinstance(name, str) or not name:
                raise TypeError(f"a collection name must be a non-empty string, got {name!r}")
            logger.debug("trial %s has no collection %r (known: %s); created empty", self.name, name,
                         ", ".join(sorted(self._collection_manager.collections)) or "none")
            coll = self._collection_manager.get(name)
        return coll

    def _saved_collection(self, name: str) -> Collection:
        """The run's collection called ``name``; KeyError naming the known ones if there is none
        (a typo in ``tensor_names(collection="...")`` must not read as "no tensors")."""
        coll = self._collection_manager.collections.get(name)
        if coll is None:
            known = ", ".join(sorted(self._collection_manager.collections)) or "none"
            raise KeyError(f"no collection named {name!r} in trial {self.name!r}; known: {known}")
        return coll

    # ------------------------------------------------------------------ refreshing
    def _maybe_refresh(self) -> None:
        if self.dynamic_refresh and not self._steps.loaded_all_steps:
            self.refresh()

    def refresh(self, progress: Optional[bool] = None) -> int:
        """Read index files written since the last refresh; returns how many were new.

        Once the end-of-training marker has been seen, all data is known and this
        does nothing.
        """
        if self._steps.loaded_all_steps:
            return 0
        flush_before_reading(self.path)  # a hook of this process writing this run: its ended steps first
        return self._read_new(progress)

    def _read_new(self, progress: Optional[bool]) -> int:  # refresh() after its flush
        self.stats["refreshes"] += 1
        # Looked at before listing: a writer creates the marker after all its other files,
        # so a listing that starts after we saw the marker sees everything.
        ended = self._storage.exists(END_OF_JOB_FILE)
        if self._layout is None:  # store/ (StoreIndex) or index/ and events/ (RunIndex); both: refused
            self._index, self._layout = pick_index(self._storage, self.path, self._index, self._steps, self.stats)
        new = self._index.read_new(self.progress if progress is None else progress)
        if ended:
            if self._training_end_delay > 0:
                time.sleep(self._training_end_delay)
                new += self._index.read_new(False)
            self._steps.mark_ended(self.path)
        else:
            self._steps.apply_incomplete_step_window(self._incomplete_step_window, self.path)
            if len(self._workers) < self._steps.num_workers:
                self._workers = collection_workers(list_collection_files(self._storage))
        if new or (self._catalog is not None and len(self._catalog.workers) != len(self._workers)):
            self._catalog = None  # made again when asked for
        return new

    @property
    def layout(self) -> Optional[str]:
        """The run's layout: ``"store"`` (the run store), ``"smdebug-1.0.34"`` (index and event
        files), or None while the run has written neither."""
        if self._layout is None:
            self._maybe_refresh()
        return self._layout

    # ------------------------------------------------------------------ steps and modes
    def steps(self, mode=GLOBAL, show_incomplete_steps: bool = False) -> List[int]:
        """Sorted saved steps: global steps for GLOBAL, else that mode's own step numbers.

        Only complete steps (every worker wrote them, a later step is complete, or
        training ended) unless ``show_incomplete_steps``. ``mode=None`` gives ``[]``, as in
        smdebug 1.0.34 (with one warning: leave ``mode`` out for every step).
        """
        if mode is None:
            if not _warned_mode_none:
                _warned_mode_none.append(True)
                logger.warning("smdebug: trial.steps(mode=None) returns [] (as smdebug 1.0.34 did); leave mode out "
                               "for every step, or pass mode=smd.modes.TRAIN (EVAL, PREDICT) for one mode's")
            return []
        mode = ModeKeys.parse(mode)
        self._maybe_refresh()
        index = self._steps
        steps = index.sorted_steps(mode)
        if show_incomplete_steps or index.loaded_all_steps:
            return list(steps)
        if mode is GLOBAL:
            cut = bisect.bisect_right(steps, index.last_complete_step)
            return steps[:cut] + [s for s in steps[cut:] if index.is_complete(s)]
        to_global = index.mode_to_global[mode] if steps else {}
        return [s for s in steps if index.is_complete(to_global[s])]

    def modes(self) -> List[ModeKeys]:
        """The modes (other than GLOBAL) that have saved steps."""
        self._maybe_refresh()
        return sorted(self._steps.mode_to_global, key=lambda m: m.value)

    def _resolve(self, step, mode) -> Tuple[int, ModeKeys, int]:
        """``(global_step, mode, step)`` for a step given in ``mode``'s numbering (StepIndex.resolve)."""
        return self._steps.resolve(step, mode, self._maybe_refresh, self.name)

    def mode_modestep(self, global_step) -> Tuple[ModeKeys, int]:
        """``(mode, mode_step)`` of a saved global step."""
        g = validate_step(global_step, "global_step")
        to_mode = self._steps.global_to_mode
        hit = to_mode.get(g)
        if hit is None:
            self._maybe_refresh()
            hit = to_mode.get(g)
            if hit is None:
                self._steps.raise_missing(g, GLOBAL, self.name)
        return hit

    def mode(self, global_step) -> ModeKeys:
        """The mode a saved global step belongs to."""
        return self.mode_modestep(global_step)[0]

    def mode_step(self, global_step) -> int:
        """The mode's own step number of a saved global step."""
        return self.mode_modestep(global_step)[1]

    def global_step(self, mode, mode_step) -> int:
        """The global step of ``mode_step`` of ``mode`` (GLOBAL: the step itself)."""
        mode = ModeKeys.parse(mode)
        step = validate_step(mode_step, "mode_step")
        if mode is GLOBAL:
            return step
        return self._resolve(step, mode)[0]

    def workers(self) -> List[str]:
        """Names of the workers that wrote a collections file."""
        self._maybe_refresh()
        return sorted(self._workers)

    # ------------------------------------------------------------------ completeness
    def has_passed_step(self, step, mode=GLOBAL) -> StepState:
        """AVAILABLE (complete), NOT_YET_AVAILABLE (may still be written) or UNAVAILABLE
        (skipped, or training ended without it)."""
        mode = ModeKeys.parse(mode)
        step = validate_step(step)
        self._maybe_refresh()
        return self._steps.state(step, mode)

    def wait_for_steps(self, required_steps, mode=GLOBAL, timeout: Optional[float] = None) -> None:
        """Block until every step in ``required_steps`` is complete.

        Raises StepUnavailable for a skipped step, NoMoreData for a step past the end of a
        finished run, and StepNotYetAvailable when ``timeout`` seconds pass first
        (``timeout=None`` waits until each step is settled one way or the other).
        """
        mode = ModeKeys.parse(mode)
        if isinstance(required_steps, int):
            required_steps = [required_steps]
        steps = [validate_step(s) for s in required_steps]
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        for step in steps:
            while True:
                self._maybe_refresh()
                state = self._steps.state(step, mode)
                if state is StepState.AVAILABLE:
                    break
                if state is StepState.UNAVAILABLE:
                    self._steps.raise_missing(step, mode, self.name)
                if deadline is not None and time.monotonic() >= deadline:
                    raise StepNotYetAvailable(
                        f"step {step} of mode {mode.name} did not become available within {timeout:g} s"
                    )
                pause = self.poll_interval
                if deadline is not None:
                    pause = min(pause, max(0.0, deadline - time.monotonic()))
                time.sleep(pause)

    def training_ended(self) -> bool:
        """Whether the run's end marker has been seen (all its steps are then loaded)."""
        self._maybe_refresh()
        return self.loaded_all_steps

    def flight_recorder_trigger(self, worker: Optional[str] = None) -> Optional[Dict[str, object]]:
        """What made the run's flight recorder write its steps (docs/flight_recorder.md), or None.

        The marker of ``worker`` (e.g. ``"worker_0"``), else the earliest-stepped of every
        worker's: ``trigger`` (nonfinite, rule, exception, manual), ``reason``, ``global_step``,
        ``first_nonfinite`` (``module``, ``phase``, ``what``), ``nonfinite_tensors``, ``steps_written``."""
        markers = self.flight_recorder_triggers()
        if worker is not None:
            return markers.get(worker)
        stepped = [m for m in markers.values() if isinstance(m.get("global_step"), int)]  # earliest; else any
        return min(stepped, key=lambda m: m["global_step"]) if stepped else next(iter(markers.values()), None)

    def early_stopping(self) -> Optional[Dict[str, object]]:
        """The run's record of its early stopping (``Hook.record_early_stopping``), or None."""
        from ...storage.run_files import read_early_stopping
        return read_early_stopping(lambda path: self._storage.read_file(path, max_bytes=1 << 16))

    def overhead_budget(self) -> Optional[Dict[str, object]]:
        """What the hook's overhead budget did (budget_view.py), None without one: ``budget``,
        ``measured``, ``intervals`` (collection -> ``[(from step, every n steps)]``), ``text``."""
        return budget_view.overhead_budget(self)

    def flight_recorder_triggers(self) -> Dict[str, Dict[str, object]]:
        """Every worker's flight recorder marker, by worker (empty when none fired)."""
        if not self._storage.is_dir(MARKER_DIR):
            return {}
        return read_markers(lambda: [f"{MARKER_DIR}/{e.name}" for e in self._storage.list_dir(MARKER_DIR)],
                            lambda relpath: self._storage.read_file(relpath, max_bytes=1 << 20))

    # ------------------------------------------------------------------ tensors
    def has_tensor(self, name: str) -> bool:
        """Whether any step saved ``name`` (a value, a reduction or a shape)."""
        if name not in self._index.tensors:
            self._maybe_refresh()
        return name in self._index.tensors

    def tensor(self, name: str) -> Tensor:
        """The :class:`Tensor` called ``name``; TensorUnavailable, with close names, if nothing saved it."""
        if not self.has_tensor(name):
            raise TensorUnavailable(f"tensor {name!r} was not saved in trial {self.name!r} (so far)"
                                    + tensor_name_hint(name, self._index.tensors))
        tensor = self._tensors.get(name)
        if tensor is None:
            tensor = self._tensors[name] = Tensor(name, self, self._index.tensors[name], self._steps, self._reader,
                                                  self._maybe_refresh)
        return tensor

    def catalog(self):
        """What each tensor saved (kinds, reductions, save interval per mode, workers, model order):
        a :class:`~smdebug.analysis.trials.catalog.Catalog`, made from the index's columns."""
        from .catalog import build_catalog

        self._maybe_refresh()
        if self._catalog is None:
            i = self._index
            self._catalog = build_catalog(i.log, self._steps, sorted(self._workers), i.shape_steps(), i.tensors.keys())
        return self._catalog

    def _collection_objects(self, collection) -> List[Collection]:
        items = collection if isinstance(collection, (list, tuple, set, frozenset)) else [collection]
        out = []
        for item in items:
            if isinstance(item, Collection):
                out.append(item)
            elif isinstance(item, str):
                out.append(self._saved_collection(item))
            else:
                raise TypeError(f"collection must be a name, a Collection or a list of them, got {item!r}")
        return out

    def tensor_names(
        self,
        collection=None,
        regex=None,
        step=None,
        mode=GLOBAL,
        show_incomplete_steps: bool = False,
    ) -> List[str]:
        """Sorted names of the saved tensors, optionally filtered.

        Args:
            collection: a collection name, Collection, or list of them: keep tensors that
                belong to any of them (their regexes or explicit names).
            regex: a regex or list of regexes (``re.search``): keep tensors matching any.
                Give ``collection`` or ``regex``, not both (ValueError, as in 1.0.34).
            step: only tensors saved at this step (in ``mode``'s numbering).
            mode: restrict to a mode (GLOBAL: all).
            show_incomplete_steps: also count steps not every worker has written yet.

        Reductions (``smdebug/reductions/...``) are not names of their own: they belong
        to their base tensor.
        """
        if collection is not None and regex is not None:
            raise ValueError("tensor_names takes collection= or regex=, not both (as smdebug 1.0.34)")
        mode = ModeKeys.parse(mode)
        self._maybe_refresh()
        index, records = self._steps, self._index
        if step is not None:
            g, mode, step = self._resolve(step, mode)
            if g not in index.global_to_mode:
                index.raise_missing(step, mode, self.name)
            if not show_incomplete_steps and not index.is_complete(g):
                raise StepNotYetAvailable(
                    f"step {step} of mode {mode.name} is incomplete (not every worker has written it); "
                    "pass show_incomplete_steps=True to list what is there"
                )
            candidates = records.tensors_for_step.get(g, set())
        elif mode is GLOBAL:
            candidates = records.tensors.keys()
        else:
            candidates = records.tensors_for_mode.get(mode, set())
        if step is None and not show_incomplete_steps and not index.loaded_all_steps:
            candidates = records.names_with_complete_step(candidates, index.is_complete)

        if collection is not None:
            matchers = [c.matches for c in self._collection_objects(collection)]
        elif regex is not None:
            matchers = []
            for r in [regex] if isinstance(regex, str) else list(regex):
                if not isinstance(r, str):
                    raise TypeError(f"regex must be a string or a list of strings, got {r!r}")
                try:
                    matchers.append(re.compile(r).search)
                except re.error as exc:
                    raise ValueError(f"invalid regex {r!r}: {exc}") from None
        else:
            return sorted(candidates)
        return sorted(n for n in candidates if any(m(n) for m in matchers))

    # ------------------------------------------------------------------ tables
    def _table_names(self, names, regex, collection) -> List[str]:
        """The names of the tensors selected by names, regexes and collections (all without any)."""
        self._maybe_refresh()
        if names is None and regex is None and collection is None:
            return sorted(self._index.tensors)
        chosen = set()
        if names is not None:
            for name in [names] if isinstance(names, str) else list(names):
                if not self.has_tensor(name):
                    self.tensor(name)  # TensorUnavailable, with close names
                chosen.add(name)
        if regex is not None or collection is not None:
            chosen.update(self.tensor_names(collection=collection, regex=regex, show_incomplete_steps=True))
        return sorted(chosen)

    def to_table(self, names=None, *, regex=None, collection=None, mode=None, steps=None, workers=None,
                 show_incomplete_steps: bool = False, progress: Optional[bool] = None,
                 on_error: str = "warn", reductions=None):
        """Every scalar value and every saved reduction of the selected tensors, in columns,
        without pandas: a :class:`smdebug.analysis.trials.table.Table` (see :meth:`to_dataframe`)."""
        keys = parse_reductions(reductions) if reductions is not None else None
        if on_error not in ("warn", "raise"):
            raise ValueError(f"on_error must be 'warn' or 'raise', got {on_error!r}")
        modes = None
        if mode is not None:
            parsed = {ModeKeys.parse(m) for m in ([mode] if isinstance(mode, (str, int, ModeKeys)) else mode)}
            modes = None if GLOBAL in parsed else parsed
        if steps is not None:
            steps = {validate_step(s) for s in ([steps] if isinstance(steps, numbers.Integral) else steps)}
        if workers is not None:
            workers = {workers} if isinstance(workers, str) else set(workers)
            unknown = workers - self._workers
            if unknown:
                raise ValueError(f"unknown worker(s) {sorted(unknown)} in trial {self.name!r}; "
                                 f"its workers: {sorted(self._workers)}")
        selected = self._table_names(names, regex, collection)
        # Large temporary lists and no cycles: the cyclic collector would only rescan the
        # trial's millions of index objects (as while loading them).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            labels = None if keys is None else [reduction_label(*k) for k in keys]
            progress = self.progress if progress is None else progress
            table = self._index.table(selected, modes, steps, workers, show_incomplete_steps, labels, self._reader,
                                      on_error, progress)
            if keys:
                table = Table.concat(table, computed_table(self, selected, keys, modes, steps, workers,
                                                           show_incomplete_steps, table, progress))
            return table
        finally:
            if gc_was_enabled:
                gc.enable()

    def to_dataframe(self, names=None, *, regex=None, collection=None, mode=None, steps=None, workers=None,
                     show_incomplete_steps: bool = False, progress: Optional[bool] = None,
                     on_error: str = "warn", reductions=None):
        """The run's scalars and saved reductions as a long pandas DataFrame.

        One row per value, columns ``step`` (global step), ``mode`` (``"TRAIN"``...),
        ``mode_step``, ``worker``, ``tensor``, ``reduction`` (``""`` for a scalar's own
        value, else ``min``, ``l2``, ``abs_max``...) and ``value`` (float64); texts are
        categoricals. Rows are sorted by tensor, reduction, worker and step.
        ``df.pivot_table(index="step", columns="tensor", values="value")`` gives wide form.

        Args:
            names: a tensor name or a list of them.
            regex: a regex or list of regexes (``re.search``) on tensor names.
            collection: a collection name, Collection, or list of them.
              Without ``names``, ``regex`` and ``collection``: every tensor. With several,
              a tensor selected by any of them is in.
            mode: a mode or list of modes (None or GLOBAL: all). steps: a step or an iterable
              of steps: the modes' own step numbers when ``mode`` is given, else global steps.
            workers: a worker name or a list of them (default: all).
            show_incomplete_steps: also steps not every worker has written yet.
            progress: a progress bar over the event files (default: on a terminal, long reads).
            on_error: ``"warn"`` (default): a value that cannot be read (a damaged record, a
              missing event file) is left out, one warning for all; ``"raise"``: raised.
            reductions: only these reductions (``["l2", "abs_max"]``), saved or, where a
              tensor did not save one at a step, computed from its saved full value (a
              row each, equal to ``reduction_value(...)``); scalar values stay rows.
              Without it: every saved reduction, and none computed.

        A tensor's raw value is a row only when it holds one real number (bool, int or
        float; complex, string and larger tensors are left out). Each row equals
        ``tensor.value(step, mode, worker).item()`` or ``reduction_value(...)``. Event files
        are read once each and their records decoded together (smdebug.analysis.trials.bulk).
        Needs pandas (smdebug-core's ``analysis`` extra); :meth:`to_table` does not.
        """
        require_pandas("Trial.to_dataframe")
        return self.to_table(names, regex=regex, collection=collection, mode=mode, steps=steps, workers=workers,
                             show_incomplete_steps=show_incomplete_steps, progress=progress,
                             on_error=on_error, reductions=reductions).to_pandas()

    def update_ratios(self, *, mode=None, workers=None, progress: Optional[bool] = None):
        """Each layer's update-to-weight ratio, ``l2(update/<w>) / l2(<w>)``, at every step
        both were saved (the ``updates`` collection with the weights): a DataFrame with the
        :meth:`to_dataframe` columns, ``tensor`` the weight's name and ``reduction``
        ``"update_ratio"``. Either L2 may be saved or computed from a saved full value.
        Empty when the run saved no updates. Needs pandas."""
        from .health import update_ratio_table

        require_pandas("Trial.update_ratios")
        return update_ratio_table(self, mode=mode, workers=workers, progress=progress).to_pandas()

    def to_parquet(self, directory, names=None, *, regex=None, collection=None, mode=None, steps=None,
                   workers=None, show_incomplete_steps: bool = False, progress: Optional[bool] = None,
                   on_error: str = "warn") -> List[str]:
        """The :meth:`to_dataframe` rows as Parquet files in ``directory`` (new or empty),
        partitioned by worker and mode: ``worker=<name>/mode=<MODE>/part-0.parquet``, for
        DuckDB, Polars or Spark (``read_parquet('DIR/**/*.parquet', hive_partitioning=true)``);
        a URL (``s3://...``) is written through fsspec. Read and written a group of workers at a
        time (about 4 million records, one worker at least), so memory holds that group's rows. Arguments select as
        for :meth:`to_dataframe`; returns the files written. Needs pyarrow (smdebug-core's
        ``parquet`` extra)."""
        from .parquet import write_partitioned

        return [path for path, _ in write_partitioned(
            self, directory, names=names, regex=regex, collection=collection, mode=mode, steps=steps,
            workers=workers, show_incomplete_steps=show_incomplete_steps, progress=progress, on_error=on_error)]

    def sql(self, query: str):
        """Run a DuckDB SQL query over the run; returns DuckDB's relation (``.df()``, ``.pl()``,
        ``.fetchall()``). Views: ``statistics`` (:meth:`to_dataframe`'s columns, plus ``dtype``,
        ``ndim``, ``wall_time``) and, for a run store, ``tensors`` (where whole tensors lie);
        details in smdebug.analysis.trials.sql. Needs duckdb (smdebug-core's ``sql`` extra)."""
        from .sql import run_sql

        return run_sql(self, query)

    # ------------------------------------------------------------------ notebooks
    def summary(self) -> Dict[str, object]:
        """What the run holds, for people: path, state, workers, modes with their step
        ranges, collections used, and tensor counts."""
        return notebook.summary(self)

    def _repr_html_(self) -> str:
        """Jupyter's view of the run: a summary table, a sparkline of the loss and a small
        heatmap of the gradients' L2 norms (pictures need matplotlib; ``smdebug report``
        shows the whole run)."""
        return notebook.notebook_html(self)


def create_trial(
    path=None,
    name: Optional[str] = None,
    range_steps=None,
    check: Union[bool, str] = False,
    index_mode: bool = True,
    cache: bool = False,
    *,
    out_dir=None,
    wait_timeout: Optional[float] = None,
    progress: Optional[bool] = None,
    max_expanded_elements: Optional[int] = None,
) -> Trial:
    """Open the run written to ``path`` (or ``out_dir=``, its alias) for reading.

    Args:
        path: the run directory; ``~`` is expanded and surrounding whitespace stripped.
            A URL opens a run on an object store: ``s3://bucket/prefix`` (with the
            ``s3`` extra; endpoint, region and credentials from the AWS environment:
            ``AWS_ENDPOINT_URL``, ``AWS_PROFILE``...) or any fsspec URL (``memory://``,
            ``gs://``...); ``file://`` is a local path.
        name: a name for the trial (default: the directory's last component).
        range_steps: ``(begin, end)``: only load global steps ``begin <= step < end``
            (either may be None).
        check: record checks when reading values: False/"minimal" (length CRC; payloads
            are verified against the index's CRC32C when it has one), True/"full" (also
            a real payload CRC footer when present), "none".
        index_mode: must be True (index files are mandatory).
        cache: keep values in memory once read.
        wait_timeout: seconds to wait for the collections files of a run that is still
            starting (default: $SMDEBUG_TRIAL_WAIT_TIMEOUT or 30; ``math.inf`` waits
            as long as it takes). MissingCollectionFiles is raised when it runs out.
            A path that does not exist fails at once (RunNotFound, naming the runs found
            near it) unless ``wait_timeout`` is given: then the directory is waited for
            too. A folder that holds runs in subdirectories, rather than being one, fails
            at once and lists them.
        progress: show progress bars for long loads and reads (default: when stderr is a
            terminal).
        max_expanded_elements: the most elements a record may expand to when it holds
            fewer values than its shape (TensorFlow's repeat-the-last-value rule);
            CorruptRecord beyond (default: $SMDEBUG_MAX_EXPANDED_ELEMENTS or 2**24).
    """
    if path is not None and out_dir is not None and path != out_dir:
        raise ValueError(f"give the run directory once: path={path!r} and out_dir={out_dir!r} differ")
    path = path if path is not None else out_dir
    if path is None:
        raise ValueError("create_trial needs the run directory: create_trial('/path/to/run')")
    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError(f"the trial path must be a string or os.PathLike, got {path!r}") from None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    path = path.strip()
    if not path:
        raise ValueError("the trial path is empty")
    # Asking to wait is the way to open a run before its job has created the directory.
    return Trial(path, name=name, range_steps=range_steps, check=check, index_mode=index_mode, cache=cache,
                 wait_timeout=wait_timeout, progress=progress, wait_for_directory=wait_timeout is not None,
                 max_expanded_elements=max_expanded_elements)


class LocalTrial(Trial):
    """A trial of a local run directory, constructed as in smdebug 1.0.34:
    ``LocalTrial(name, dirname)``. ``parallel`` is accepted and has no effect (reads are
    not threaded here). Prefer :func:`create_trial`."""

    def __init__(self, name, dirname, range_steps=None, parallel=True, check=False, index_mode=True,
                 cache=False, **kwargs):
        super().__init__(os.path.expanduser(os.fspath(dirname)), name=name, range_steps=range_steps, check=check,
                         index_mode=index_mode, cache=cache, **kwargs)
