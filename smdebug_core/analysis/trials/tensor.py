"""One saved tensor of a trial: its steps, values, shapes and reductions, read from the
records its index entries name (locations.py) through the trial's RecordReader.

Data is keyed by *global* step and worker. A step given in another mode's numbering is
translated through the trial's steps first. A tensor can have, per (step, worker), a raw value,
saved reductions and a saved shape, independently: unlike the original reader, a shape
entry never hides the raw value of the same step (docs/format.md 3.2).
"""
from __future__ import annotations

import bisect
import itertools
import math
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ...exceptions import (
    InvalidWorker,
    ReductionUnavailableForStep,
    ShapeUnavailableForStep,
    TensorUnavailableForStep,
)
from ...modes import ModeKeys
from ...reduction_config import ALLOWED_NORMS, ALLOWED_REDUCTIONS
from ...reductions import reduce
from .event_reads import RecordReader
from ...reduction_config import reduction_label
from .locations import InlineValue, ReadRequest, TensorLocation, TensorRecords
from .progress import progress_bar, progress_wanted
from .steps import StepIndex, StepState
from .table import require_pandas

GLOBAL = ModeKeys.GLOBAL
READABLE_REDUCTIONS = ALLOWED_REDUCTIONS + ALLOWED_NORMS
#: Read a file's wanted records with one pread when the bytes in between are at most
#: this much more than the records themselves.
_COALESCE_SLACK = 1 << 16
_PROGRESS_MIN_FILES = 500


class Tensor:
    """A tensor of a trial. Get it with ``trial.tensor(name)``.

    Steps are global steps unless a ``mode`` is given, in which case they are that
    mode's own step numbers. Without ``worker``, the lexically first worker that saved
    what is asked for is used.
    """

    def __init__(self, name: str, trial, records: TensorRecords, steps: StepIndex, reader: RecordReader,
                 refresh: Callable[[], None]):
        """Made by the trial: ``records``, what its index files say about this tensor;
        ``steps``, its steps; ``reader``, its event files; ``refresh()`` looks for new
        index files unless the trial knows nothing new can appear."""
        self.name = name
        self._trial = trial  # for its settings (cache, progress), name, collections and to_table
        self._steps = steps
        self._reader = reader
        self._refresh = refresh
        self._records = records
        # The records' own dicts (filled as index files are registered), under short names.
        self._locations = records.locations
        self._reductions = records.reductions
        self._shapes = records.shapes
        self._placements = records.placements
        self._step_workers = records.step_workers
        self._cache: Dict[TensorLocation, np.ndarray] = {}

    def __repr__(self):
        steps = self._records.global_steps()
        span = f" (global {steps[0]} to {steps[-1]})" if steps else ""
        kinds = []
        if self._locations:
            kinds.append("values")
        keys = set()
        for by_worker in itertools.islice(self._reductions.values(), 3):
            for by_key in by_worker.values():
                keys.update(by_key)
        if keys:
            kinds.append("reductions " + ", ".join(sorted(reduction_label(*k) for k in keys)))
        if self._shapes:
            kinds.append("shapes")
        return f"<Tensor {self.name!r}: {len(steps)} steps{span}; {'; '.join(kinds) or 'nothing saved'}>"

    def _is_scalar(self) -> bool:
        """Whether the run's collections say this tensor is one number per step (losses,
        metrics, save_scalar values...): its value is its own reduction. The value itself
        is returned as stored, ``()`` or ``(1,)``."""
        scalar = self.__dict__.get("_scalar")
        if scalar is None:
            from ...collections import RAW_ONLY_COLLECTIONS, CollectionKeys

            names = RAW_ONLY_COLLECTIONS | {CollectionKeys.HYPERPARAMETERS}
            scalar = self.name.startswith("scalar/")
            if not scalar:
                collections = self._trial.collections()
                for cname in names:
                    coll = collections.get(cname)
                    try:
                        if coll is not None and coll.matches(self.name):
                            scalar = True
                            break
                    except Exception:  # noqa: BLE001 - a refused regex of the run: not a scalar by it
                        continue
            self._scalar = scalar
        return scalar

    def to_series(self, reduction: Optional[str] = None, mode=GLOBAL, worker: Optional[str] = None,
                  abs: bool = False):
        """The tensor's scalar values (``reduction=None``) or one saved reduction over the
        steps, as a pandas Series of float64 indexed by step (``mode``'s own step numbers,
        global steps for GLOBAL) and named after the tensor (``name/reduction``).

        Without ``worker``, each step's value comes from the lexically first worker that
        saved it, as with ``value()``. Needs pandas (smdebug-core's ``analysis`` extra).
        """
        pd = require_pandas("Tensor.to_series")
        mode = ModeKeys.parse(mode)
        label = ""
        if reduction is not None:
            if reduction not in READABLE_REDUCTIONS:
                raise ValueError(f"unknown reduction {reduction!r}; allowed: {', '.join(READABLE_REDUCTIONS)}")
            label = reduction_label(reduction, bool(abs))
        table = self._trial.to_table(self.name, mode=None if mode is GLOBAL else mode,
                                     workers=None if worker is None else [worker])
        labels = table.column("reduction")
        keep = np.fromiter((x == label for x in labels), bool, len(labels))
        steps = (table.numbers["step"] if mode is GLOBAL else table.numbers["mode_step"])[keep]
        values = table.numbers["value"][keep]
        name = f"{self.name}/{label}" if label else self.name
        if not len(values):
            if label:
                raise ValueError(
                    f"tensor {self.name!r} has no saved {label!r} reduction in mode {mode.name}; "
                    "reduction_value(step, ...) computes one from a saved value, or save it with "
                    "ReductionConfig")
            raise ValueError(f"tensor {self.name!r} has no scalar values in mode {mode.name} (it is not one number "
                             "per step); pass reduction= to get one of its saved reductions")
        # Rows come sorted by worker, then step: the first row of a step is the first worker's.
        steps_u, first = np.unique(steps, return_index=True)
        return pd.Series(values[first], index=pd.Index(steps_u, name="step"), name=name)

    # ------------------------------------------------------------------ steps
    def steps(self, mode=GLOBAL, show_incomplete_steps: bool = False) -> List[int]:
        """Sorted steps at which anything of this tensor was saved (value, reduction or shape).

        Global steps for GLOBAL, else the mode's own step numbers. Only complete steps
        unless ``show_incomplete_steps`` (same rule as ``Trial.steps``).
        """
        mode = ModeKeys.parse(mode)
        index = self._steps
        self._refresh()
        steps = self._records.global_steps()
        if not show_incomplete_steps and not index.loaded_all_steps:
            cut = bisect.bisect_right(steps, index.last_complete_step)
            steps = steps[:cut] + [g for g in steps[cut:] if index.is_complete(g)]
        if mode is GLOBAL:
            return list(steps)
        to_mode = index.global_to_mode
        # A set: a restarted job can save the same mode step at two global steps.
        return sorted({s for m, s in (to_mode[g] for g in steps) if m is mode})

    def prev_steps(self, step, n: Optional[int] = None, mode=GLOBAL) -> List[int]:
        """The saved steps up to and including ``step`` (the last ``n`` of them if given)."""
        steps = self.steps(mode=mode)
        upto = steps[: bisect.bisect_right(steps, step)]
        return upto[-n:] if n else upto

    def _locate(self, step_num, mode) -> Tuple[int, ModeKeys, int]:
        """``(global_step, mode, step)``, raising why if this tensor has nothing there."""
        index, trial_name = self._steps, self._trial.name
        g, mode, step = index.resolve(step_num, mode, self._refresh, trial_name)
        if g not in self._step_workers:
            self._refresh()
            if g not in self._step_workers:
                if index.state(step, mode) is StepState.AVAILABLE:
                    hint = index.hint(step, mode, self.name, self.steps(mode=mode), self._step_workers)
                    raise TensorUnavailableForStep(self.name, step, mode, hint=hint)
                index.raise_missing(step, mode, trial_name)
        return g, mode, step

    def _check_worker(self, g: int, worker: Optional[str], step: int, mode: ModeKeys) -> None:
        if worker is not None and worker not in self._step_workers[g]:
            have = ", ".join(sorted(self._step_workers[g]))
            raise InvalidWorker(
                f"worker {worker!r} saved nothing of tensor {self.name!r} at step {step} "
                f"(mode {mode.name}); workers that did: {have}"
            )
        if worker is not None and mode is not GLOBAL:
            own = self._steps.worker_step_conflicts.get(g, {}).get(worker)
            if own is not None:  # its global step g is another mode step of its own: not this one
                raise TensorUnavailableForStep(
                    self.name, step, mode, hint=f"; {worker} numbers its steps differently (its global step {g} "
                                                f"is its {own[0].name} step {own[1]}): read it by global step, "
                                                f"value({g}, worker={worker!r})")

    @staticmethod
    def _pick(by_worker: Optional[dict], worker: Optional[str]):
        """``(worker, item)`` of the requested worker, or of the first that has one."""
        if not by_worker:
            return None, None
        if worker is not None:
            return worker, by_worker.get(worker)
        if len(by_worker) == 1:  # one worker, the common case: no min() over the keys
            return next(iter(by_worker.items()))
        first = min(by_worker)
        return first, by_worker[first]

    def workers(self, step_num, mode=GLOBAL) -> List[str]:
        """Workers that saved anything of this tensor at the step."""
        g, _, _ = self._locate(step_num, mode)
        return sorted(self._step_workers[g])

    # ------------------------------------------------------------------ values
    def value(self, step_num, mode=GLOBAL, worker: Optional[str] = None) -> np.ndarray:
        """The saved value at a step (a read-only numpy array).

        Raises TensorUnavailableForStep when only reductions or a shape were saved
        there, StepNotYetAvailable / StepUnavailable / NoMoreData for a step that is not
        (yet) in the trial, InvalidWorker for a worker without data there.
        """
        g, mode, step = self._locate(step_num, mode)
        self._check_worker(g, worker, step, mode)
        if worker is None and g in self._placements:
            return self._assemble(g, step, mode)
        chosen, location = self._pick(self._locations.get(g), worker)
        if location is None:
            has_reductions = bool(self._reductions.get(g))
            raise TensorUnavailableForStep(self.name, step, mode, has_reductions)
        return self._read([ReadRequest(None, location, g, chosen)], progress=False)[None]

    def _assemble(self, g: int, step: int, mode: ModeKeys) -> np.ndarray:
        """The full tensor of a sharded parameter from every worker's piece (a worker's own
        piece: ``value(step, worker=...)``). Replicas (HSDP) saved the same block: one is read.
        The pieces must cover the tensor exactly, so what is allocated is what was read."""
        placed = self._placements[g]
        locations = self._locations.get(g, {})
        chosen: Dict[tuple, str] = {}
        for worker in sorted(placed):
            p = placed[worker]
            if worker in locations:
                chosen.setdefault((p.flat, p.offsets), worker)
        shapes = {placed[w].global_shape for w in chosen.values()}
        if len(shapes) != 1:
            raise TensorUnavailableForStep(self.name, step, mode, hint=f"; its pieces disagree on the full shape "
                                                                       f"({sorted(shapes)})")
        global_shape = shapes.pop()
        # Python integers: shapes come from index files, and numpy's int64 products overflow.
        total = math.prod(global_shape)
        covered = sum(math.prod(placed[w].local_shape) for w in chosen.values())
        if covered != total:
            raise TensorUnavailableForStep(
                self.name, step, mode, hint=f"; the saved pieces hold {covered} of its {total} elements (a worker's "
                                            f"piece is missing or not written yet); value(step, worker=...) reads one")
        if len({placed[w].flat for w in chosen.values()}) != 1:
            raise TensorUnavailableForStep(self.name, step, mode, hint="; its pieces mix flat and block placements")
        values = self._read([ReadRequest(w, locations[w], g, w) for w in chosen.values()], progress=False)
        for worker in chosen.values():  # before allocating: the full tensor is then no bigger than what was read
            if tuple(values[worker].shape) != placed[worker].local_shape:
                raise TensorUnavailableForStep(self.name, step, mode, hint=f"; {worker}'s piece has shape "
                                               f"{values[worker].shape}, its placement says {placed[worker].local_shape}")
        dtypes = {values[w].dtype for w in chosen.values()}
        if len(dtypes) != 1:
            raise TensorUnavailableForStep(self.name, step, mode,
                                           hint=f"; its pieces have dtypes {sorted(map(str, dtypes))}")
        full = np.zeros(global_shape, dtype=dtypes.pop())
        filled = np.zeros(global_shape, dtype=bool)  # the pieces must not overlap (then they cover it all)
        for worker in chosen.values():
            p, piece = placed[worker], values[worker]
            if p.flat:
                where = slice(p.offsets[0], p.offsets[0] + p.local_shape[0])
                target, seen = full.reshape(-1), filled.reshape(-1)
            else:
                where = tuple(slice(o, o + n) for o, n in zip(p.offsets, p.local_shape))
                target, seen = full, filled
            if seen[where].any():
                raise TensorUnavailableForStep(self.name, step, mode, hint=f"; {worker}'s piece overlaps another "
                                               "worker's (a damaged index): value(step, worker=...) reads one")
            seen[where] = True
            target[where] = piece
        full.setflags(write=False)
        return full

    def values(
        self,
        mode=GLOBAL,
        worker: Optional[str] = None,
        show_incomplete_steps: bool = False,
        progress: Optional[bool] = None,
    ) -> Dict[int, np.ndarray]:
        """``{step: value}`` for every step with a saved value (steps in ``mode``'s numbering).

        Steps where only reductions or a shape were saved are left out. Each event file
        is opened once and its records read together.
        """
        mode = ModeKeys.parse(mode)
        requests = []
        assembled = {}
        for step in self.steps(mode=mode, show_incomplete_steps=show_incomplete_steps):
            g = step if mode is GLOBAL else self._steps.mode_to_global[mode][step]
            if worker is None and g in self._placements:  # a sharded tensor: the full tensor
                assembled[step] = self._assemble(g, step, mode)
                continue
            chosen, location = self._pick(self._locations.get(g), worker)
            if location is not None:
                requests.append(ReadRequest(step, location, g, chosen))
        out = self._read(requests, progress)
        if assembled:
            out.update(assembled)
            out = dict(sorted(out.items()))
        return out

    def shape(self, step_num, mode=GLOBAL, worker: Optional[str] = None) -> Tuple[int, ...]:
        """The tensor's shape at a step: the saved shape, else the saved value's shape."""
        g, mode, step = self._locate(step_num, mode)
        self._check_worker(g, worker, step, mode)
        if worker is None and g in self._placements:  # a sharded tensor: the full tensor's
            return next(iter(self._placements[g].values())).global_shape
        _, shape = self._pick(self._shapes.get(g), worker)
        if shape is not None:
            return shape
        chosen, location = self._pick(self._locations.get(g), worker)
        if location is None:
            raise ShapeUnavailableForStep(self.name, step, mode)
        return tuple(self._read([ReadRequest(None, location, g, chosen)], progress=False)[None].shape)

    def steady_shape(self, worker: Optional[str] = None) -> Optional[Tuple[int, ...]]:
        """The shape at the first step that saved one (or a value), None when none did: the
        shape at every step for a tensor that keeps its shape (a parameter, its gradient),
        for steps that saved only reductions."""
        for g in sorted(self._shapes):
            _, shape = self._pick(self._shapes[g], worker)
            if shape is not None:
                return tuple(shape)
        for g in sorted(self._locations):
            chosen, location = self._pick(self._locations[g], worker)
            if location is not None:
                return tuple(self._read([ReadRequest(None, location, g, chosen)], progress=False)[None].shape)
        return None

    def shapes(
        self, mode=GLOBAL, worker: Optional[str] = None, show_incomplete_steps: bool = False
    ) -> Dict[int, Tuple[int, ...]]:
        """``{step: shape}`` for every step with a saved shape or value."""
        mode = ModeKeys.parse(mode)
        out: Dict[int, Tuple[int, ...]] = {}
        requests = []
        for step in self.steps(mode=mode, show_incomplete_steps=show_incomplete_steps):
            g = step if mode is GLOBAL else self._steps.mode_to_global[mode][step]
            _, shape = self._pick(self._shapes.get(g), worker)
            if shape is not None:
                out[step] = shape
                continue
            chosen, location = self._pick(self._locations.get(g), worker)
            if location is not None:
                requests.append(ReadRequest(step, location, g, chosen))
        for step, value in self._read(requests, progress=None).items():
            out[step] = tuple(value.shape)
        return dict(sorted(out.items()))

    # ------------------------------------------------------------------ reductions
    def has_value(self, step_num, mode=GLOBAL, worker: Optional[str] = None) -> bool:
        """Whether this tensor's value (not only reductions or a shape) was saved at the step."""
        g, mode, step = self._locate(step_num, mode)
        self._check_worker(g, worker, step, mode)
        by_worker = self._locations.get(g) or {}
        return worker in by_worker if worker is not None else bool(by_worker)

    def has_reductions(self, step_num, mode=GLOBAL, worker: Optional[str] = None) -> bool:
        """Whether any reduction of this tensor was saved at the step."""
        g, mode, step = self._locate(step_num, mode)
        self._check_worker(g, worker, step, mode)
        by_worker = self._reductions.get(g) or {}
        return bool(by_worker.get(worker)) if worker is not None else any(by_worker.values())

    def reduction_value(
        self, step_num, reduction_name: str, mode=GLOBAL, worker: Optional[str] = None, abs: bool = False
    ):
        """One reduction at a step: the saved one if there is one, else computed from the value.

        ``reduction_name`` is one of min, max, mean, std, variance, sum, prod, median, l1,
        l2; ``abs=True`` reduces the absolute values. Computed reductions use the project's
        definitions (smdebug.reductions): ``variance``/``std`` with ddof 0, and ``l1``/``l2``
        as norms of the *flattened* tensor. The original reader took matrix norms of 2-D
        tensors (max column sum, spectral norm) and failed on 3-D and up; we follow what
        its PyTorch hook saved instead, so saved and computed values agree.
        """
        if reduction_name not in READABLE_REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction_name!r}; allowed: {', '.join(READABLE_REDUCTIONS)}")
        key = (reduction_name, bool(abs))
        g, mode, step = self._locate(step_num, mode)
        self._check_worker(g, worker, step, mode)
        by_worker = self._reductions.get(g) or {}
        candidates = [worker] if worker is not None else sorted(by_worker)
        for w in candidates:
            location = by_worker.get(w, {}).get(key)
            if location is not None:
                return self._read([ReadRequest(None, location, g, w)], progress=False)[None]
        if worker is None and g in self._placements:  # a sharded tensor: of the full tensor, not a piece
            return reduce(self._assemble(g, step, mode), reduction_name, bool(abs))
        chosen, raw = self._pick(self._locations.get(g), worker)
        if raw is None:
            saved = set()
            for w in candidates:
                saved.update(by_worker.get(w, {}))
            raise ReductionUnavailableForStep(self.name, step, mode, key, saved)
        value = self._read([ReadRequest(None, raw, g, chosen)], progress=False)[None]
        return reduce(value, reduction_name, bool(abs))

    def reduction_values(
        self, step_num, mode=GLOBAL, worker: Optional[str] = None
    ) -> Dict[Tuple[str, bool], np.ndarray]:
        """All *saved* reductions at a step, as ``{(name, abs): value}``."""
        g, mode, step = self._locate(step_num, mode)
        self._check_worker(g, worker, step, mode)
        chosen, saved = self._pick(
            {w: r for w, r in (self._reductions.get(g) or {}).items() if r}, worker
        )
        if not saved:
            return {}
        return self._read([ReadRequest(key, loc, g, chosen) for key, loc in saved.items()], progress=False)

    # ------------------------------------------------------------------ reading records
    def _read(self, requests: List[ReadRequest], progress: Optional[bool]) -> Dict[object, np.ndarray]:
        """Read and decode records, grouped by event file; returns ``{request.key: value}``."""
        trial = self._trial
        use_cache = trial.cache
        out: Dict[object, np.ndarray] = {}
        by_file: Dict[str, List[ReadRequest]] = {}
        for request in requests:
            if type(request.location) is InlineValue:  # a run store's number: nothing to read
                out[request.key] = request.location.array()
                continue
            if use_cache:
                hit = self._cache.get(request.location)
                if hit is not None:
                    out[request.key] = hit
                    continue
            by_file.setdefault(request.location.event_file, []).append(request)
        if not by_file:
            return out
        wanted = len(by_file) >= _PROGRESS_MIN_FILES and progress_wanted(
            trial.progress if progress is None else progress
        )
        bar = progress_bar(wanted, len(by_file), f"reading {self.name}")
        # Many files (values() over the steps): each is visited once, so none is kept open
        # for a next lookup (that would only push the LRU's files out).
        keep_open = len(by_file) == 1
        fetched = self._fetch_remote_groups(by_file) if len(by_file) > 1 else {}
        try:
            for event_file, group in by_file.items():
                spans = fetched.get(event_file)
                reads = (self._decode_spans(group, spans) if spans is not None
                         else self._read_file_group(event_file, group, keep_open))
                for request, value in reads:
                    out[request.key] = value
                    if use_cache:
                        self._cache[request.location] = value
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return out

    def _fetch_remote_groups(self, by_file: Dict[str, List[ReadRequest]]) -> Dict[str, list]:
        """For object stores: every file's records in one batch of concurrent ranged GETs
        (one per file when its records are close together), instead of one round trip per
        file in turn. ``{event_file: [(lo, bytes)...]}``; files that failed are left out
        and read the ordinary way (which waits for a missing one, or names the error)."""
        storage = self._reader.storage
        if not hasattr(storage, "read_spans"):
            return {}
        plan: List[Tuple[str, int, int]] = []
        for event_file, group in by_file.items():
            group.sort(key=lambda r: r.location.start)
            lo = group[0].location.start
            hi = max(r.location.start + r.location.length for r in group)
            if hi - lo <= sum(r.location.length for r in group) + _COALESCE_SLACK:
                plan.append((event_file, lo, hi - lo))
            else:
                plan.extend((event_file, r.location.start, r.location.length) for r in group)
        try:
            results = storage.read_spans(plan)
        except ValueError:  # a path leaving the run: the ordinary path names the tensor and step
            return {}
        out: Dict[str, list] = {}
        failed = set()
        for (event_file, lo, _), data in zip(plan, results):
            if isinstance(data, BaseException):
                failed.add(event_file)
            else:
                out.setdefault(event_file, []).append((lo, memoryview(data)))
        for event_file in failed:
            out.pop(event_file, None)
        return out

    def _decode_spans(self, group: List[ReadRequest], spans: list):
        """Yield ``(request, value)`` from the byte spans fetched for the group's file."""
        for r in group:
            start = r.location.start
            for lo, data in spans:
                if lo <= start < lo + len(data) or (lo == start and not len(data)):
                    offset = start - lo
                    yield r, self._decode(data[offset : offset + r.location.length], r)
                    break
            else:  # the object ended before this record: _decode reports it
                yield r, self._decode(memoryview(b""), r)

    def _read_file_group(self, event_file: str, group: List[ReadRequest], keep_open: bool = True):
        """Yield ``(request, value)`` for records of one event file, opening it once."""
        if len(group) == 1:
            request = group[0]
            data = self._read_bytes(event_file, [(request.location.start, request.location.length)], request,
                                    keep_open)
            yield request, self._decode(memoryview(data[0]), request)
            return
        group.sort(key=lambda r: r.location.start)
        lo = group[0].location.start
        hi = max(r.location.start + r.location.length for r in group)
        needed = sum(r.location.length for r in group)
        if hi - lo <= needed + _COALESCE_SLACK:
            # Close together (the records of one step): one read for all of them.
            span = memoryview(self._read_bytes(event_file, [(lo, hi - lo)], group[0])[0])
            for r in group:
                offset = r.location.start - lo
                yield r, self._decode(span[offset : offset + r.location.length], r)
        else:
            datas = self._read_bytes(event_file, [(r.location.start, r.location.length) for r in group], group[0])
            for r, data in zip(group, datas):
                yield r, self._decode(memoryview(data), r)

    def _read_bytes(self, event_file: str, ranges: List[Tuple[int, int]], request: ReadRequest,
                    keep_open: bool = True) -> List[bytes]:
        """Byte ranges of an event file (see :meth:`RecordReader.read`)."""
        return self._reader.read(event_file, ranges, request.step, self.name, keep_open)

    def _decode(self, data: memoryview, request: ReadRequest) -> np.ndarray:
        # The stored shape, as 1.0.34 returns it: numbers (save_scalar, XGBoost's values)
        # come back as shape (1,), 0-d tensors (a PyTorch loss) as ().
        return self._reader.decode(data, request)
