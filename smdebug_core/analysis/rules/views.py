"""What a rule reads at one step: a :class:`StepView`, from a Trial or from the training process.

A rule never needs to know where its data comes from. At each step it gets ``self.view``:

* :class:`TrialStepView` reads a saved run through a Trial (``invoke_rule``, the CLI). Before
  the rule runs, everything the rule declared with :meth:`Rule.required_tensors` is fetched
  in one batch: the step's records are read together (one read per event file) and decoded
  once, whatever number of rules share the step.
* :class:`LiveStepView` serves the values the hook has just computed for a saved step
  (``hook.add_rule``): no file is read and nothing is copied again.

Both answer the same questions: which tensors the step has (by collection, regex or name),
a tensor's value, a reduction (the saved one, else computed from the value, with the
project's definitions in :mod:`smdebug.reductions`), and all saved reductions.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ...exceptions import (
    ReductionUnavailableForStep,
    ShapeUnavailableForStep,
    TensorUnavailable,
    TensorUnavailableForStep,
)
from ...logger import get_logger
from ...modes import ModeKeys
from ...reduction_config import reduction_label
from ...reductions import NORMS, REDUCTIONS, reduce
from ..trials.health import l2_norm
from ..trials.order import BY_NAME, ModelOrder
from .step_columns import ChunkColumns, StepRows

logger = get_logger("smdebug.rules")

ReductionKey = Tuple[str, bool]
#: Kinds accepted in ``Required.first_of``.
VALUE = "value"
SAVED_REDUCTIONS = "saved_reductions"


def _as_key(value):
    """A selection argument (None, a name, a list of names) as a dict key; TypeError for any
    other (an iterator would be used up here)."""
    if value is None or isinstance(value, (str, tuple)):
        return value
    if isinstance(value, (list, set, frozenset)):
        return tuple(value)
    raise TypeError(f"not a selection key: {type(value).__name__}")


def _as_tuple(value, what: str) -> tuple:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError(f"{what} must be a string or a list of strings, got {value!r}") from None
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"{what} must hold strings, got {item!r}")
    return items


@dataclass(frozen=True)
class Required:
    """Tensors a rule reads at a step, and what of each; returned by ``Rule.required_tensors``.

    Selection (a union): ``collections`` (names), ``regex`` (``re.search`` patterns),
    ``names`` (exact), or ``all_tensors``. What to fetch of each selected tensor:
    ``value`` (the full tensor), ``reductions`` (``(name, abs)`` pairs: saved, else computed
    from the value), ``saved_reductions`` (every saved reduction), and ``first_of`` (an
    ordered choice: the first of ``"value"`` / ``"saved_reductions"`` the step has).
    """

    collections: Tuple[str, ...] = ()
    regex: Tuple[str, ...] = ()
    names: Tuple[str, ...] = ()
    all_tensors: bool = False
    value: bool = False
    reductions: Tuple[ReductionKey, ...] = ()
    saved_reductions: bool = False
    first_of: Tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "collections", _as_tuple(self.collections, "collections"))
        object.__setattr__(self, "regex", _as_tuple(self.regex, "regex"))
        object.__setattr__(self, "names", _as_tuple(self.names, "names"))
        object.__setattr__(self, "first_of", _as_tuple(self.first_of, "first_of"))
        for kind in self.first_of:
            if kind not in (VALUE, SAVED_REDUCTIONS):
                raise ValueError(f"first_of holds {kind!r}; allowed: {VALUE!r}, {SAVED_REDUCTIONS!r}")
        reductions = tuple((str(op), bool(is_abs)) for op, is_abs in self.reductions)
        object.__setattr__(self, "reductions", reductions)


class _Need:
    """Everything all rules want of one tensor at one step (merged Required entries)."""

    __slots__ = ("value", "reductions", "saved", "first_of")

    def __init__(self):
        self.value = False
        self.reductions: set = set()
        self.saved = False
        self.first_of: Tuple[str, ...] = ()

    def add(self, req: Required) -> None:
        self.value = self.value or req.value
        self.reductions.update(req.reductions)
        self.saved = self.saved or req.saved_reductions
        if req.first_of and not self.first_of:
            self.first_of = req.first_of


def _unreducible(name, view, key, saved, exc) -> ReductionUnavailableForStep:
    error = ReductionUnavailableForStep(name, view.mode_step, view.mode, key, set(saved or ()))
    error.args = (f"reduction {reduction_label(*key)} of tensor {name!r} at step {view.step} "
                  f"cannot be computed: {exc}",)
    return error


def _reduce(array, name, view, key, saved) -> float:
    """A reduction computed from a value; an empty or non-numeric tensor has none."""
    try:
        return _to_float(reduce(array, key[0], key[1]))
    except (ValueError, TypeError) as exc:
        raise _unreducible(name, view, key, saved, exc) from None


def _to_float(value) -> float:
    array = np.asarray(value)
    return float(array.reshape(-1)[0]) if array.size else float("nan")


class StepView:
    """The data of one step of one run, as a rule sees it. Subclasses supply the storage."""

    step: int
    mode: ModeKeys
    mode_step: int
    source: str

    # --- selection ----------------------------------------------------------------------
    def all_names(self) -> List[str]:
        """Every tensor name the step has (values, reductions or shapes), sorted."""
        raise NotImplementedError

    def has_collection(self, name: str) -> bool:
        raise NotImplementedError

    def _in_collection(self, tensor_name: str, collection: str) -> bool:
        raise NotImplementedError

    def tensor_names(self, collection=None, regex=None, names=None, all_tensors: bool = False) -> List[str]:
        """Sorted names at this step in any of the ``collection`` (name or list), matching any
        ``regex``, or listed in ``names``; every name with ``all_tensors``."""
        return self._select_from(self.all_names(), collection, regex, names, all_tensors)

    def selects(self, candidates: List[str], collection=None, regex=None, all_tensors: bool = False) -> List[bool]:
        """For each of ``candidates`` (any names of the run), whether :meth:`tensor_names` with
        these arguments would select it at a step that has it."""
        chosen = set(self._select_from(list(candidates), collection, regex, None, all_tensors))
        return [n in chosen for n in candidates]

    def _select_from(self, candidates: List[str], collection, regex, names, all_tensors: bool) -> List[str]:
        if all_tensors:
            return candidates
        memo = getattr(self, "_membership", None)
        asked = None
        if memo is not None:  # the same question about the same names: answered once per evaluation
            try:
                asked = ("selected", _as_key(collection), _as_key(regex), _as_key(names),
                         self._token_of(candidates, memo))
                hit = memo.get(asked)
            except TypeError:  # an argument that is no name or list of names: the checks below say so
                asked = hit = None
            if hit is not None:
                return list(hit)
        out = self._select_names(candidates, collection, regex, names)
        if asked is not None:
            memo[asked] = tuple(out)
        return out

    def _token_of(self, candidates: List[str], memo: dict) -> int:
        """A small number standing for the name list ``candidates`` in ``memo`` (the step's own
        list is looked up once)."""
        known = self.__dict__.get("_names_token")
        if known is not None and known[0] is candidates:
            return known[1]
        token = memo.setdefault(("names", tuple(candidates)), len(memo))
        if candidates is getattr(self, "_names", None):
            self.__dict__["_names_token"] = (candidates, token)
        return token

    def _select_names(self, candidates: List[str], collection, regex, names) -> List[str]:
        collections = tuple(c for c in _as_tuple(collection, "collection") if self.has_collection(c))
        regexes = _as_tuple(regex, "regex")
        exact = frozenset(_as_tuple(names, "names"))
        if not (collections or regexes or exact):
            return []
        # Whether a name is selected does not depend on the step: decided once per name and
        # query for the whole evaluation where the view shares a cache (BulkSteps); a whole
        # list of names is answered once by _select_from.
        memo = getattr(self, "_membership", None)
        query = (collections, regexes, exact)
        patterns = None
        out = []
        for n in candidates:
            key = (query, n)
            hit = memo.get(key) if memo is not None else None
            if hit is None:
                if patterns is None:
                    patterns = [re.compile(r) for r in regexes]
                hit = (n in exact or any(p.search(n) for p in patterns)
                       or any(self._in_collection(n, c) for c in collections))
                if memo is not None:
                    memo[key] = hit
            if hit:
                out.append(n)
        return out

    def select(self, req: Required) -> List[str]:
        return self.tensor_names(req.collections, req.regex, req.names, req.all_tensors)

    # --- data ---------------------------------------------------------------------------
    def value(self, name: str) -> np.ndarray:
        """The saved value; TensorUnavailableForStep when only reductions/shape were saved."""
        raise NotImplementedError

    def saved_reductions(self, name: str) -> Dict[ReductionKey, float]:
        """Every reduction saved for ``name`` at this step, ``{(op, abs): value}`` (maybe empty)."""
        raise NotImplementedError

    def reduction(self, name: str, op: str, abs: bool = False) -> float:
        """A reduction: the saved one, else computed from the value (ReductionUnavailableForStep if neither)."""
        raise NotImplementedError

    def first_of(self, name: str, order: Sequence[str] = (VALUE, SAVED_REDUCTIONS)):
        """``(kind, data)`` for the first kind in ``order`` the step has for ``name``.

        ``kind`` is ``"value"`` (data: the array) or ``"saved_reductions"`` (data: a dict);
        raises TensorUnavailableForStep when it has neither.
        """
        for kind in order:
            if kind == VALUE:
                try:
                    return VALUE, self.value(name)
                except TensorUnavailableForStep:
                    continue
            elif kind == SAVED_REDUCTIONS:
                saved = self.saved_reductions(name)
                if saved:
                    return SAVED_REDUCTIONS, saved
        raise TensorUnavailableForStep(name, self.mode_step, self.mode)

    def has_value(self, name: str) -> bool:
        """Whether the step holds ``name``'s value (not only reductions), without reading it."""
        try:
            self.value(name)
            return True
        except TensorUnavailableForStep:
            return False

    def size(self, name: str) -> Optional[int]:
        """How many elements ``name`` has at this step, when known (None: only reductions saved)."""
        try:
            return int(np.asarray(self.value(name)).size)
        except TensorUnavailableForStep:
            return None

    def steady_size(self, name: str) -> Optional[int]:
        """How many elements ``name`` has, from this step or, for a tensor that keeps its
        shape (a parameter's gradient), from another step that saved its shape or value."""
        return self.size(name)

    def scalar(self, name: str) -> float:
        """A single number for ``name``: the value if it has one element, else its mean."""
        try:
            array = self.value(name)
        except TensorUnavailableForStep:
            return self.reduction(name, "mean")
        if array.size == 1 and array.dtype.kind in "fiu":  # a loss: the mean of one number is itself
            return float(array.reshape(-1)[0])
        return _reduce(array, name, self, ("mean", False), None)

    def l2(self, name: str) -> float:
        """``name``'s L2 norm at this step: of its value where the step holds it (in float64),
        else its saved ``l2`` reduction (the one definition, smdebug.analysis.trials.health)."""
        try:
            return l2_norm(self.value(name))
        except TensorUnavailableForStep:
            return _to_float(self.reduction(name, "l2"))

    def prefetch(self, requirements: Iterable[Required]) -> None:
        """Fetch what ``requirements`` select, in one batch where the storage allows it."""

    # --- the run around the step (a saved run; a live rule sees one step: these say so) ------
    def catalog(self):
        """The run's :class:`~smdebug.analysis.trials.catalog.Catalog` (what each tensor saved,
        how often); None for a live rule."""
        return None

    def model_order(self) -> ModelOrder:
        """The order the run's tensors are produced in (smdebug.analysis.trials.order): the
        run's where it records it, else from the names."""
        catalog = self.catalog()
        return catalog.order if catalog is not None else BY_NAME

    def run_tensor_names(self, collection=None, regex=None) -> List[str]:
        """The names the whole run saved in ``collection`` or matching ``regex`` (``[]`` live)."""
        return []

    def run_steps(self, mode=ModeKeys.GLOBAL) -> List[int]:
        """The run's saved steps of ``mode`` (``[]`` live)."""
        return []

    def at_step(self, step: int) -> Optional["StepView"]:
        """A view of another saved global step of the run (None live)."""
        return None

    def flight_recorder_trigger(self) -> Optional[dict]:
        """The run's flight recorder marker (docs/flight_recorder.md), None when it did not fire."""
        return None

    def early_stopping(self) -> Optional[dict]:
        """The run's record of its early stopping (``trial.early_stopping()``), None when it has
        none (or for a live rule: training has not ended)."""
        return None

    def __repr__(self):
        return f"<{type(self).__name__} step={self.step} mode={self.mode.name} mode_step={self.mode_step}>"


# ---------------------------------------------------------------------------------------------
class BulkSteps:
    """What many steps of a saved run hold in small records - every saved reduction and every
    one-element value - read in bulk (``Trial.to_table``: whole event files parsed together
    with numpy), ``chunk`` steps at a time, as the rules walk the steps in order; and which
    collections each tensor name belongs to, decided once per name for the whole run.

    The per-step read (one decoded record at a time) costs about 40 us a record: 20 s for
    the 500,000 records of 1,000 steps of 100 tensors with 5 reductions each."""

    def __init__(self, trial, steps: Sequence[int], chunk: int = 256):
        self.trial = trial
        self._steps = list(steps)
        self._chunk = max(1, int(chunk))
        self._columns: Optional[ChunkColumns] = None
        self._next = 0  # position in _steps of the first step not loaded yet
        self.membership: Dict[Tuple[str, str], bool] = {}

    def columns(self, step: int) -> Optional[ChunkColumns]:
        """The chunk of columns holding ``step``, or None when the step is not among those
        this reads (or the bulk read failed)."""
        columns = self._columns
        if (columns is None or not columns.has_step(step)) and self._next < len(self._steps) \
                and step >= self._steps[self._next]:
            self._columns = None  # steps come in order: earlier chunks are done with
            while self._next < len(self._steps) and self._steps[self._next] <= step:
                self._columns = self._load(self._steps[self._next:self._next + self._chunk])
                self._next += self._chunk
            columns = self._columns
        return columns if columns is not None and columns.has_step(step) else None

    def get(self, step: int) -> Optional[StepRows]:
        """The rows of ``step`` (saved reductions and one-element values, read tensor by tensor
        on first use), or None when the step is not among those this reads."""
        columns = self.columns(step)
        return columns.rows(step) if columns is not None else None

    def _load(self, steps: List[int]) -> Optional[ChunkColumns]:
        try:
            table = self.trial.to_table(steps=steps, progress=False, on_error="warn")
        except (AttributeError, TypeError, ValueError, KeyError, OSError) as exc:
            # Not a Trial with a bulk reader, or a read that failed: the rules read step by step.
            logger.debug("rules: bulk read of steps %d-%d unavailable (%s)", steps[0], steps[-1], exc)
            return None
        by_label: Dict[str, object] = {"": ""}
        for op in REDUCTIONS + NORMS:  # every reduction a run may have saved
            for is_abs in (False, True):
                by_label[reduction_label(op, is_abs)] = (op, is_abs)
        return ChunkColumns(table, steps, by_label)


class TrialStepView(StepView):
    """One step of a saved run, read through a Trial (values cached for the rules of the step)."""

    def __init__(self, trial, step: int, bulk: Optional[BulkSteps] = None):
        self.trial = trial
        self.step = int(step)
        self.mode, self.mode_step = trial.mode_modestep(self.step)
        self.source = trial.path
        self._names: Optional[List[str]] = None
        self._values: Dict[str, np.ndarray] = {}
        self._no_value: set = set()
        self._reductions: Dict[str, Dict[ReductionKey, float]] = {}
        self._saved: Dict[str, Dict[ReductionKey, float]] = {}
        self._membership = bulk.membership if bulk is not None else {}
        self.records_read = 0
        rows = bulk.get(self.step) if bulk is not None else None
        if rows is not None:  # what the bulk read holds, turned into objects as rules ask
            self._saved, self._values = rows.saved, rows.values

    def all_names(self) -> List[str]:
        if self._names is None:
            self._names = self.trial.tensor_names(step=self.step)
        return self._names

    def has_collection(self, name: str) -> bool:
        return name in self.trial.collections()

    def _in_collection(self, tensor_name: str, collection: str) -> bool:
        key = (tensor_name, collection)
        known = self._membership.get(key)
        if known is None:
            coll = self.trial.collections().get(collection)
            known = self._membership[key] = coll is not None and coll.matches(tensor_name)
        return known

    def has_value(self, name: str) -> bool:
        if name in self._values:
            return True
        if name in self._no_value:
            return False
        try:
            return self._tensor(name).has_value(self.step)
        except TensorUnavailableForStep:
            return False

    def _tensor(self, name: str):
        try:
            return self.trial.tensor(name)
        except TensorUnavailable:
            raise TensorUnavailableForStep(name, self.mode_step, self.mode) from None

    def value(self, name: str) -> np.ndarray:
        hit = self._values.get(name)
        if hit is not None:
            return hit
        if name in self._no_value:
            raise TensorUnavailableForStep(name, self.mode_step, self.mode, bool(self._saved.get(name)))
        try:
            value = self._tensor(name).value(self.step)
        except TensorUnavailableForStep:
            self._no_value.add(name)
            raise
        self.records_read += 1
        self._values[name] = value
        return value

    def size(self, name: str) -> Optional[int]:
        hit = self._values.get(name)
        if hit is not None:
            return int(np.asarray(hit).size)
        try:  # a saved shape answers without reading the value
            return int(np.prod(self._tensor(name).shape(self.step)))
        except (TensorUnavailable, TensorUnavailableForStep, ShapeUnavailableForStep):
            return super().size(name)

    def steady_size(self, name: str) -> Optional[int]:
        size = self.size(name)
        if size:
            return size
        try:
            shape = self._tensor(name).steady_shape()
        except (TensorUnavailable, TensorUnavailableForStep):
            return None
        return int(np.prod(shape)) if shape is not None else None

    def saved_reductions(self, name: str) -> Dict[ReductionKey, float]:
        hit = self._saved.get(name)
        if hit is None:
            raw = self._tensor(name).reduction_values(self.step)
            self.records_read += len(raw)
            hit = self._saved[name] = {k: _to_float(v) for k, v in raw.items()}
        return hit

    def reduction(self, name: str, op: str, abs: bool = False) -> float:
        key = (op, bool(abs))
        cached = self._reductions.get(name)
        if cached is not None and key in cached:
            return cached[key]
        saved = self._saved.get(name)
        if saved is not None and key in saved:
            result = saved[key]
        elif name in self._values:
            result = _reduce(self._values[name], name, self, key, saved)
        else:
            try:
                result = _to_float(self._tensor(name).reduction_value(self.step, op, abs=key[1]))
            except ValueError as exc:  # an empty or non-numeric tensor
                raise _unreducible(name, self, key, saved, exc) from None
            self.records_read += 1
        self._reductions.setdefault(name, {})[key] = result
        return result

    # --- the batch ----------------------------------------------------------------------
    def prefetch(self, requirements: Iterable[Required]) -> None:
        needs = self._needs(tuple(requirements))
        if not needs:
            return
        try:
            self._prefetch_batched({name: need for name, need in needs.items() if not self._satisfied(name, need)})
        except (AttributeError, ImportError, TypeError, KeyError) as exc:
            # Not a Trial of this package (a stand-in without its index): one public read per record.
            logger.debug("rules: batched read unavailable (%s); reading tensor by tensor", exc)
            self._prefetch_each(needs)

    def _needs(self, requirements: Tuple[Required, ...]) -> Dict[str, _Need]:
        """What ``requirements`` want of each tensor of the step; the same for every step with
        the same names, so made once per evaluation (the rules ask the same at every step)."""
        made = self._membership.setdefault(("needs",), {})
        try:
            asked = (requirements, self._token_of(self.all_names(), self._membership))
            known = made.get(asked)
        except TypeError:  # a requirement that cannot be a key: made for this step only
            asked = known = None
        if known is not None:
            return known
        needs: Dict[str, _Need] = {}
        for req in requirements:
            if not (req.value or req.reductions or req.saved_reductions or req.first_of):
                continue
            for name in self.select(req):
                needs.setdefault(name, _Need()).add(req)
        if asked is not None:
            if len(made) >= 16:  # steps ask a few different things (modes, save intervals): bounded
                made.clear()
            made[asked] = needs
        return needs

    def _satisfied(self, name: str, need: "_Need") -> bool:
        """Whether what was read in bulk already answers ``need`` (nothing to fetch)."""
        if name in self._values:
            return True  # a one-element value: every reduction comes from it
        saved = self._saved.get(name)
        if saved is None or need.value:
            return False
        if need.first_of and need.first_of[0] == VALUE and self.has_value(name):
            return False  # a full value exists and comes first
        return all(key in saved for key in need.reductions)

    def _prefetch_each(self, needs: Dict[str, _Need]) -> None:
        for name, need in needs.items():
            try:
                if need.first_of:
                    self.first_of(name, need.first_of)
                if need.value:
                    self.value(name)
                if need.saved:
                    self.saved_reductions(name)
                for op, is_abs in need.reductions:
                    self.reduction(name, op, is_abs)
            except (TensorUnavailableForStep, ReductionUnavailableForStep):
                continue  # the rule meets the same exception when it asks, and handles it

    def _prefetch_batched(self, needs: Dict[str, _Need]) -> None:
        """All records of all needs read together (smdebug.analysis.trials.step_reads)."""
        from ..trials.step_reads import read_step

        if not needs:
            return
        read = read_step(self.trial, self.step, needs)
        self.records_read += read.records
        self._no_value.update(read.no_value)
        self._values.update(read.values)
        for name, saved in read.saved.items():
            self._saved[name] = {k: _to_float(v) for k, v in saved.items()}
        for name, found in read.reductions.items():
            self._reductions.setdefault(name, {}).update({k: _to_float(v) for k, v in found.items()})
        for name, key in read.from_value:
            if name in self._values:
                try:
                    self._reductions.setdefault(name, {})[key] = _reduce(self._values[name], name, self, key, None)
                except ReductionUnavailableForStep:
                    pass  # the rule gets the exception when it asks

    # --- the run around the step -----------------------------------------------------------
    def catalog(self):
        return self.trial.catalog()

    def run_tensor_names(self, collection=None, regex=None) -> List[str]:
        if collection is None and regex is None:
            return []
        names = set()
        for selector in ({"collection": collection}, {"regex": regex}):  # either (the trial takes one at a time)
            if next(iter(selector.values())) is None:
                continue
            try:
                names.update(self.trial.tensor_names(**selector))
            except (KeyError, ValueError):  # a collection the run does not have
                pass
        return sorted(names)

    def run_steps(self, mode=ModeKeys.GLOBAL) -> List[int]:
        return self.trial.steps(mode=mode)

    def at_step(self, step: int) -> Optional[StepView]:
        return TrialStepView(self.trial, step) if step != self.step else self

    def flight_recorder_trigger(self) -> Optional[dict]:
        try:
            return self.trial.flight_recorder_trigger()
        except (OSError, ValueError):
            return None

    def early_stopping(self) -> Optional[dict]:
        return self.trial.early_stopping()


# ---------------------------------------------------------------------------------------------
class LiveStepView(StepView):
    """One saved step as the hook produced it (``StepValues``): host arrays, nothing read from disk.

    ``collections`` is the hook's collections (name -> Collection) at that step;
    ``membership`` a cache shared across steps (tensor name -> names of its collections).
    """

    def __init__(self, values, collections: Dict[str, object], membership: Dict[str, frozenset], source: str):
        self.values = values
        self.step = values.global_step
        self.mode = values.mode
        self.mode_step = values.mode_step
        self.source = source
        self._collections = collections
        self._membership = membership
        self._names: Optional[List[str]] = None

    def all_names(self) -> List[str]:
        if self._names is None:
            self._names = sorted(set(self.values.tensors) | set(self.values.reductions))
        return self._names

    def has_collection(self, name: str) -> bool:
        return name in self._collections

    def _in_collection(self, tensor_name: str, collection: str) -> bool:
        member_of = self._membership.get(tensor_name)
        if member_of is None:
            member_of = frozenset(n for n, c in self._collections.items() if c.matches(tensor_name))
            self._membership[tensor_name] = member_of
        return collection in member_of

    def value(self, name: str) -> np.ndarray:
        value = self.values.tensors.get(name)
        if value is None:
            raise TensorUnavailableForStep(name, self.mode_step, self.mode, name in self.values.reductions)
        return value

    def saved_reductions(self, name: str) -> Dict[ReductionKey, float]:
        return {k: _to_float(v) for k, v in (self.values.reductions.get(name) or {}).items()}

    def reduction(self, name: str, op: str, abs: bool = False) -> float:
        key = (op, bool(abs))
        saved = self.values.reductions.get(name)
        if saved and key in saved:
            return _to_float(saved[key])
        value = self.values.tensors.get(name)
        if value is None:
            raise ReductionUnavailableForStep(name, self.mode_step, self.mode, key, set(saved or ()))
        return _reduce(value, name, self, key, saved)
