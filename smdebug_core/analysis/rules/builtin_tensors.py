"""Built-in rules that inspect tensors: gradients, weights, any selection (activations:
:mod:`.builtin_activations`).

Parameter names and defaults follow the public SageMaker Debugger built-in rules reference
("List of Debugger built-in rules", docs.aws.amazon.com/sagemaker/latest/dg/debugger-built-in-rules.html).
Each rule works from saved reductions when the run saved the ones it needs and from the full
tensors otherwise; the docstrings say which, and where our reading of the reference had to
choose.
"""
from __future__ import annotations

import math
import re
from collections import deque
from typing import Dict, List, Optional, Tuple

import numpy as np

from ...collections import UPDATE_PREFIX
from ...exceptions import ConfigError
from ...reductions import NAN_WHEN_UNDEFINED
from . import _params as P
from .findings import (MAX_DETAILS, MAX_LISTED, TRAINING_MODES, count, details, earliest, listing, note_found,
                       numeric)
from ..trials.catalog import SHAPE
from ..trials.health import update_ratio, weight_update_ratio
from ..trials.order import layer_of, parameter_of
from .culprit import culprit
from .rule import DATA_MISSING, Rule
from .views import SAVED_REDUCTIONS, VALUE, Required

class _SelectionRule(Rule):
    """A rule over ``collection_names`` and/or ``tensor_regex`` (their union)."""

    #: Whether the rule needs a selection (the reference says "You must specify either ...").
    selection_required = False

    def _init_selection(self, collection_names, tensor_regex) -> None:
        self.collection_names = P.str_list(self.rule_name, "collection_names", collection_names)
        self.tensor_regex = P.regex_list(self.rule_name, "tensor_regex", tensor_regex)
        if self.selection_required and not (self.collection_names or self.tensor_regex):
            raise ConfigError(f"{self.rule_name}: give collection_names and/or tensor_regex "
                              "(the tensors to inspect); both are empty")

    def _required(self, **what) -> Required:
        selected = bool(self.collection_names or self.tensor_regex)
        return Required(collections=self.collection_names, regex=self.tensor_regex, all_tensors=not selected, **what)

    def _selected(self) -> List[str]:
        selected = bool(self.collection_names or self.tensor_regex)
        names = self.view.tensor_names(self.collection_names, self.tensor_regex, all_tensors=not selected)
        if not names and selected:
            self.no_data("no tensor matches collection_names=%s tensor_regex=%s at step %d "
                           "(is the collection saved?)", list(self.collection_names), list(self.tensor_regex),
                           self.view.step)
        return self.reads(names)


# ---------------------------------------------------------------------------------------------
class VanishingGradient(Rule):
    """Fires when the mean absolute value of a gradient drops below ``threshold``.

    Reads the ``gradients`` collection and uses whatever the step saved that determines it:
    the saved ``abs mean`` reduction, else the whole gradient (its mean |value|), else the
    saved L2 norm and the element count (a saved shape, else from a step that saved the
    whole gradient: it keeps its parameter's shape), converted to the RMS
    ``L2 / sqrt(n)``. The RMS is never below the mean |value|, so a gradient judged from it
    fires only when it is certainly small; the finding says when it converted.
    Parameters: ``threshold`` (default 1e-7).
    """

    worst, measure_name = "min", "mean |gradient|"
    reads_what = ("their mean |value| (an abs 'mean' reduction), their values, or an 'l2' reduction with "
                  "their element count (a saved shape, or a step that saved the whole gradient), converted to "
                  "the RMS L2/sqrt(n)")

    def __init__(self, base_trial=None, threshold=0.0000001, actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self.threshold = P.number(self.rule_name, "threshold", threshold, minimum=0)
        self._sizes: Dict[str, int] = {}  # gradient -> element count (0: unknown)
        self._selections: Dict[tuple, Tuple[bool, Optional[List[str]]]] = {}  # see _selection

    def required_tensors(self, step):
        return [Required(collections="gradients", reductions=[("mean", True)])]

    def _magnitude(self, name: str) -> Tuple[Optional[float], bool]:
        """(mean |g|, False), or (RMS from the saved L2 and element count, True), or (None, _)."""
        try:
            return self.view.reduction(name, "mean", abs=True), False
        except DATA_MISSING:
            pass
        try:
            l2 = float(self.view.reduction(name, "l2"))
        except DATA_MISSING:
            return None, False
        n = self._size(name)
        if not n:
            return None, False
        return l2 / math.sqrt(n), True

    def _size(self, name: str) -> int:
        """The gradient's element count, 0 when unknown. A gradient keeps its parameter's shape:
        a step that saved its value or shape, or its parameter's, gives the element count of
        the steps that saved only its L2 norm (looked up once)."""
        n = self._sizes.get(name)
        if n is None:
            parameter = parameter_of(name)
            n = self._sizes[name] = self.view.steady_size(name) or (
                parameter != name and self.view.steady_size(parameter)) or 0
        return n

    def settle_step(self, columns) -> bool:
        view, threshold = self.view, self.threshold
        names = view.tensor_names(collection="gradients")
        if not names:
            return False

        def gradients(candidates):
            return view.selects(candidates, "gradients")

        # The common case: every gradient saved its abs mean at the step and none is small.
        if columns.covered(view.step, ("VanishingGradient", threshold), gradients, len(names), ("mean", True),
                           lambda values: values < threshold):
            self.reads(names)
            self.end_streaks(names)
            return True
        no_abs_mean = columns.covered(view.step, ("VanishingGradient", "no abs mean"), gradients, 0, ("mean", True),
                                      lambda values: np.zeros(len(values), bool))
        # A run whose gradients have no abs mean, no values and no element count: nothing to judge.
        if no_abs_mean and self._selection(names)[0]:
            self.reads(names)
            self.unavailable(len(names))
            return True
        # Gradients saved as an L2 norm only (no abs mean, no value at this step), each with a
        # known element count: judged by their RMS, L2/sqrt(n), in the chunk's columns.
        if no_abs_mean and self._judged_by_rms(names) and columns.covered(
                view.step, ("VanishingGradient", "rms", threshold), gradients, len(names), ("l2", False),
                lambda values: values < threshold, scale=self._rms_factors):
            self.reads(names)
            self.end_streaks(names)
            return True
        return False

    def _selection(self, names: List[str]) -> Tuple[bool, Optional[List[str]]]:
        """What the run says of the gradients ``names``, made once per selection: whether none
        of them can have an element count (the catalog says the run saved none of their values
        or shapes, nor their parameters'), and, when each of them has one, those saved whole at
        some step (None when some element count is unknown)."""
        key = tuple(names)
        found = self._selections.get(key)
        if found is None:
            catalog = self.view.catalog()

            def sizeless(name: str) -> bool:  # nor does its parameter, whose shape it has
                return name not in catalog or (not catalog[name].has_value and SHAPE not in catalog[name].kinds)

            unconvertible = catalog is not None and all(
                n in catalog and sizeless(n) and sizeless(parameter_of(n)) for n in names)
            if unconvertible:
                for name in names:  # what steady_size finds for each of them: nothing
                    self._sizes.setdefault(name, 0)
            whole = None if catalog is None or not all(map(self._size, names)) else \
                [n for n in names if n in catalog and catalog[n].has_value]
            if len(self._selections) >= 16:
                self._selections.clear()  # the selections of a run are few: bounded all the same
            found = self._selections[key] = (unconvertible, whole)
        return found

    def _judged_by_rms(self, names: List[str]) -> bool:
        """Whether this step's gradients ``names`` all have an element count and none of them
        has its value at this step (a value gives the mean |value| itself)."""
        whole = self._selection(names)[1]
        return whole is not None and not any(map(self.view.has_value, whole))

    def _rms_factors(self, chunk_names: List[str]) -> np.ndarray:
        """``1/sqrt(n)`` of each gradient among a chunk's tensor names (NaN: not one, or its
        element count is unknown, so that no row of it is judged here)."""
        gradients = self.view.selects(chunk_names, "gradients")
        sizes = np.array([self._size(n) if selected else 0 for n, selected in zip(chunk_names, gradients)], np.float64)
        with np.errstate(divide="ignore"):
            return np.where(sizes > 0, 1.0 / np.sqrt(sizes), np.nan)

    def invoke_at_step(self, step):
        names = self.reads(self.view.tensor_names(collection="gradients"))
        if not names:
            self.no_data(self.saved_elsewhere("gradients", collection="gradients"))
            return False
        small, converted = {}, set()
        for name in names:
            value, from_l2 = self._magnitude(name)
            if value is None:
                self.unavailable()
                continue
            if from_l2:
                converted.add(name)
            if self.streak_start(name, value < self.threshold) is not None:
                small[name] = value
        if small:
            first = earliest(self, small)
            in_order = self.view.model_order().sorted(small)
            layers = ", ".join(dict.fromkeys(layer_of(n) for n in in_order))
            rms = [n for n in small if n in converted]
            how = (f"; converted: {len(rms)} of them judged by their RMS = L2/sqrt(n) from the saved L2 norm "
                   "and the element count of the gradient or its parameter (the RMS bounds mean |value| from "
                   "above)") if rms else ""
            self.note(f"{len(small)} of {len(names)} gradients have mean |value| below {self.threshold:g} (layers "
                      f"{layers}): {listing(small)}{how}", measure=min(small.values()), tensors=details(small),
                      layers=list(dict.fromkeys(layer_of(n) for n in in_order)),
                      culprit=culprit(first, self.streak_start(first, True), value=small[first]),
                      converted_from_l2=sorted(rms))
        return bool(small)


class ExplodingTensor(_SelectionRule):
    """Fires when a tensor holds NaN (``only_nan=True``) or NaN/infinite values.

    Parameters: ``collection_names``, ``tensor_regex`` (default: every tensor of the step),
    ``only_nan`` (default False). Uses the saved reductions when a tensor has some (NaN and
    infinities propagate into min/max, which are preferred when saved; an infinity mixed
    with its opposite shows as NaN in a mean), else the full tensor.

    XGBoost's ``trees/<column>`` tensors (``Booster.trees_to_dataframe()``) hold NaN by
    design: a leaf row has no split, so Split, Yes, No and Missing are NaN there. Only
    infinities count in them.
    """

    reads_what = ('saved min/max (or any other saved reduction: NaN and infinities propagate), else the whole '
                  "values; a 'nonfinite' count")

    measure_name = "tensors with NaN/inf"
    _PREFERRED = (("min", False), ("max", False), ("max", True))
    #: Tensors where NaN marks "not applicable" rather than a numerical failure.
    _NAN_BY_DESIGN = re.compile(r"^trees/")

    def __init__(self, base_trial=None, collection_names=None, tensor_regex=None, only_nan=False, actions=None,
                 name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self._init_selection(collection_names, tensor_regex)
        self.only_nan = P.boolean(self.rule_name, "only_nan", only_nan)

    def required_tensors(self, step):
        return [self._required(first_of=(SAVED_REDUCTIONS, VALUE))]

    def _check_values(self, values, nan_by_design: bool = False) -> Optional[str]:
        array = numeric(values)
        if array is None or array.dtype.kind not in "fc":
            return None  # integers and booleans cannot be NaN or infinite
        nan = 0 if nan_by_design else int(np.count_nonzero(np.isnan(array)))
        inf = 0 if self.only_nan else int(np.count_nonzero(np.isinf(array)))
        parts = ([f"{nan} NaN"] if nan else []) + ([f"{inf} infinite"] if inf else [])
        return ", ".join(parts) or None

    def _check_reductions(self, saved, nan_by_design: bool = False) -> Optional[str]:
        if all(math.isfinite(v) for v in saved.values()):
            return None  # the common case, without numpy
        keys = [k for k in self._PREFERRED if k in saved] or [k for k in saved if k[0] not in NAN_WHEN_UNDEFINED]
        values = np.array([saved[k] for k in keys], dtype=np.float64)
        if nan_by_design:
            values = values[~np.isnan(values)]
        if np.isnan(values).any():
            return "NaN in its saved reductions"
        if not self.only_nan and np.isinf(values).any():
            return "infinite values in its saved reductions"
        count = saved.get(("nonfinite", False), 0.0)
        if not self.only_nan and not nan_by_design and count > 0:  # NaN and infinities, not told apart
            return f"{int(count)} NaN or infinite values (its saved nonfinite count)"
        return None

    def settle_step(self, columns) -> bool:
        # The common case: every selected tensor has saved reductions or a one-element value
        # at the step (what first_of reads here) and all of them are finite.
        view, selected = self.view, bool(self.collection_names or self.tensor_regex)
        names = view.tensor_names(self.collection_names, self.tensor_regex, all_tensors=not selected)
        if not names or not columns.covered(
                view.step, ("ExplodingTensor", self.collection_names, self.tensor_regex),
                lambda candidates: view.selects(candidates, self.collection_names, self.tensor_regex,
                                                all_tensors=not selected),
                len(names), None, lambda values: ~np.isfinite(values)):
            return False
        self.reads(names)
        return True

    def invoke_at_step(self, step):
        bad = {}
        for name in self._selected():
            nan_by_design = bool(self._NAN_BY_DESIGN.match(name))
            if nan_by_design and self.only_nan:
                continue
            try:
                kind, data = self.view.first_of(name, (SAVED_REDUCTIONS, VALUE))
            except DATA_MISSING:
                self.unavailable()
                continue
            finding = self._check_values(data, nan_by_design) if kind == VALUE else \
                self._check_reductions(data, nan_by_design)
            if finding:
                bad[name] = finding
        for name in bad:
            self.streak_start(name, True)
        if bad:
            what = "NaN" if self.only_nan else "NaN or infinite values"
            first = self._first_nonfinite(bad)
            self.note(f"{what} in {count(len(bad), 'tensor')}: {listing(bad)}", measure=len(bad),
                      tensors=details(bad), culprit=first)
        return bool(bad)

    def _first_nonfinite(self, bad: Dict[str, str]) -> dict:
        """Where the first non-finite value appeared: the flight recorder's module when it fired
        here, else the tensor that went bad first, first in model order (trials/order.py)."""
        first_step = min(self.streak_start(n, True) for n in bad)
        name = self.view.model_order().first(n for n in bad if self.streak_start(n, True) == first_step)
        found = culprit(name, first_step, what=bad[name])
        marker = self.view.flight_recorder_trigger()
        where = (marker or {}).get("first_nonfinite") if (marker or {}).get("trigger") == "nonfinite" else None
        if isinstance(where, dict) and where.get("module") and marker.get("global_step") == first_step:
            found.update(layer=str(where["module"]), why=f"flight recorder: {where.get('phase', '')} "
                                                         f"{where.get('what', '')}".strip())
        return found


class AllZero(_SelectionRule):
    """Fires when at least ``threshold`` percent of a tensor's values are zero.

    Parameters: ``collection_names``, ``tensor_regex`` (one of them is required),
    ``threshold`` (percent, default 100). With ``threshold=100`` saved reductions suffice
    (a zero norm, abs max or abs mean, or min = max = 0); below 100 it needs full tensors.
    """

    reads_what = ('their whole values; with threshold 100, a saved l1/l2/max|.|/mean|.| reduction decides (0 means '
                  'all zero)')

    selection_required = True

    def __init__(self, base_trial=None, collection_names=None, tensor_regex=None, threshold=100, actions=None,
                 name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self._init_selection(collection_names, tensor_regex)
        self.threshold = P.number(self.rule_name, "threshold", threshold, minimum=0, maximum=100,
                                  exclusive_minimum=True)

    def _order(self):
        return (VALUE, SAVED_REDUCTIONS) if self.threshold >= 100 else (VALUE,)

    def required_tensors(self, step):
        return [self._required(first_of=self._order())]

    @staticmethod
    def _all_zero(saved) -> Optional[bool]:
        """From saved reductions: True/False when they decide it, None when they cannot."""
        for key in (("l1", False), ("l2", False), ("l1", True), ("l2", True), ("max", True), ("mean", True),
                    ("sum", True)):
            if key in saved and not np.isnan(saved[key]):
                return saved[key] == 0
        if saved.get(("min", False)) == 0 and saved.get(("max", False)) == 0:
            return True
        for (op, _), value in saved.items():
            # A nonzero min/max/mean/sum/median means some value is nonzero (std, variance and
            # prod can be zero or nonzero either way).
            if op in ("min", "max", "mean", "sum", "median") and value == value and value != 0:
                return False
        return None

    def invoke_at_step(self, step):
        zero = {}
        for name in self._selected():
            try:
                kind, data = self.view.first_of(name, self._order())
            except DATA_MISSING:
                self.unavailable()
                continue
            if kind == VALUE:
                array = numeric(data)
                if array is None or array.size == 0:
                    continue
                percent = 100.0 * (array.size - np.count_nonzero(array)) / array.size
            else:
                decided = self._all_zero(data)
                if decided is None:
                    self.unavailable()
                    continue
                percent = 100.0 if decided else 0.0
            if percent >= self.threshold:
                zero[name] = percent
        return note_found(self, f"at least {self.threshold:g}% zeros", "tensor", zero, "percent_zero", "{:.1f}%")


class UnchangedTensor(_SelectionRule):
    """Fires when a tensor stops changing: its last ``num_steps`` saved values are all close.

    Parameters: ``collection_names``, ``tensor_regex`` (one is required), ``num_steps``
    (default 3, at least 2), ``rtol`` (1e-5), ``atol`` (1e-8), ``equal_nan`` (False), as
    for ``numpy.allclose``. Compares full tensors, or the saved reductions when no full
    tensor was saved. Runs on TRAIN and GLOBAL steps (nothing is trained in EVAL/PREDICT).
    """

    reads_what = 'their whole values, else their saved reductions (compared between steps)'

    selection_required = True

    def __init__(self, base_trial=None, collection_names=None, tensor_regex=None, num_steps=3, rtol=1e-05,
                 atol=1e-08, equal_nan=False, actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self._init_selection(collection_names, tensor_regex)
        self.num_steps = P.number(self.rule_name, "num_steps", num_steps, minimum=2, integer=True)
        self.rtol = P.number(self.rule_name, "rtol", rtol, minimum=0)
        self.atol = P.number(self.rule_name, "atol", atol, minimum=0)
        self.equal_nan = P.boolean(self.rule_name, "equal_nan", equal_nan)
        self._history: Dict[str, deque] = {}

    def required_tensors(self, step):
        if self.view.mode not in TRAINING_MODES:
            return ()
        return [self._required(first_of=(VALUE, SAVED_REDUCTIONS))]

    def invoke_at_step(self, step):
        if self.view.mode not in TRAINING_MODES:
            return False
        unchanged = []
        for name in self._selected():
            try:
                kind, data = self.view.first_of(name, (VALUE, SAVED_REDUCTIONS))
            except DATA_MISSING:
                self.unavailable()
                continue
            if kind == VALUE:
                array = numeric(data)
                if array is None:
                    continue
                fingerprint = (kind, array.shape, None, array)
            else:
                keys = tuple(sorted(data))
                fingerprint = (kind, (len(keys),), keys, np.array([data[k] for k in keys]))
            history = self._history.get(name)
            if history is None or history[-1][:3] != fingerprint[:3]:
                history = self._history[name] = deque(maxlen=self.num_steps)
            history.append(fingerprint)
            if len(history) == self.num_steps:
                latest = fingerprint[3]
                if all(np.allclose(h[3], latest, rtol=self.rtol, atol=self.atol, equal_nan=self.equal_nan)
                       for h in list(history)[:-1]):
                    unchanged.append(name)
        if unchanged:
            self.note(f"no change over the last {self.num_steps} saved steps in {count(len(unchanged), 'tensor')}: "
                      f"{', '.join(unchanged[:MAX_LISTED])}", tensors=unchanged[:MAX_DETAILS])
        return bool(unchanged)


class TensorVariance(_SelectionRule):
    """Fires when a tensor's variance is above ``max_threshold`` or below ``min_threshold``.

    Parameters: ``collection_names``, ``tensor_regex`` (one is required), ``max_threshold``,
    ``min_threshold`` (at least one). Uses the saved ``variance`` (or ``std`` squared), else
    computes the population variance from the full tensor. Tensors of one element (a 1-unit
    bias) are left out: their variance is always 0, so any ``min_threshold`` fired forever (with
    only reductions saved, the run must save shapes too, ``save_shape=True``, to tell).
    """

    reads_what = "their saved 'variance' reduction, else their whole values"

    selection_required = True

    def __init__(self, base_trial=None, collection_names=None, tensor_regex=None, max_threshold=None,
                 min_threshold=None, actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self._init_selection(collection_names, tensor_regex)
        self.max_threshold = P.number(self.rule_name, "max_threshold", max_threshold, allow_none=True)
        self.min_threshold = P.number(self.rule_name, "min_threshold", min_threshold, allow_none=True)
        if self.max_threshold is None and self.min_threshold is None:
            raise ConfigError(f"{self.rule_name}: give max_threshold and/or min_threshold; both are None")
        if self.max_threshold is not None and self.min_threshold is not None \
                and self.min_threshold > self.max_threshold:
            raise ConfigError(f"{self.rule_name}: min_threshold={self.min_threshold:g} is above "
                              f"max_threshold={self.max_threshold:g}")

    def required_tensors(self, step):
        return [self._required(reductions=[("variance", False)])]

    def invoke_at_step(self, step):
        out = {}
        for name in self._selected():
            try:
                variance = self.view.reduction(name, "variance")
            except DATA_MISSING:
                try:
                    variance = self.view.reduction(name, "std") ** 2
                except DATA_MISSING:
                    self.unavailable()
                    continue
            if variance == 0 and (self.view.size(name) or 2) < 2:
                continue  # one element: its variance is 0 by definition, whatever the training does
            if (self.max_threshold is not None and variance > self.max_threshold) or \
                    (self.min_threshold is not None and variance < self.min_threshold):
                out[name] = variance
        return note_found(self, f"variance outside [{self.min_threshold}, {self.max_threshold}]", "tensor", out,
                           "variances")


class WeightUpdateRatio(Rule):
    """Fires when the size of a weight update relative to the weights is too large or too small.

    ratio = ||update||_2 / (||w||_2 + epsilon) for each tensor of the ``weights`` collection.
    The update is the run's ``update/<weight name>`` tensor when it saved one (the ``updates``
    collection: the value after ``optimizer.step()`` minus the value before, at that step; its
    saved l2 norm or its value, and the weight's), else the difference between the weight at
    step s and at the previous saved step p (TRAIN and GLOBAL steps only). Parameters:
    ``num_steps`` (None: compare with the previous saved step; else only when p >= s -
    num_steps), ``large_threshold`` (10.0), ``small_threshold`` (1e-8), ``epsilon`` (1e-9).
    Without updates it needs full weight tensors at consecutive saved steps.
    """

    reads_what = "their full values or an update/<weight> tensor"

    def __init__(self, base_trial=None, num_steps=None, large_threshold=10.0, small_threshold=0.00000001,
                 epsilon=0.000000001, actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self.num_steps = P.number(self.rule_name, "num_steps", num_steps, minimum=1, integer=True, allow_none=True)
        self.large_threshold = P.number(self.rule_name, "large_threshold", large_threshold, minimum=0)
        self.small_threshold = P.number(self.rule_name, "small_threshold", small_threshold, minimum=0)
        self.epsilon = P.number(self.rule_name, "epsilon", epsilon, minimum=0)
        if self.small_threshold > self.large_threshold:
            raise ConfigError(f"{self.rule_name}: small_threshold={self.small_threshold:g} is above "
                              f"large_threshold={self.large_threshold:g}")
        self._previous: Dict[str, Tuple[int, np.ndarray]] = {}
        #: weight name -> the step whose update its latest ratio measured
        self.update_step: Dict[str, int] = {}
        self._origin: Dict[str, int] = {}

    def required_tensors(self, step):
        if self.view.mode not in TRAINING_MODES:
            return ()
        return [Required(collections="weights", first_of=(VALUE, SAVED_REDUCTIONS)),
                Required(regex=(f"^{UPDATE_PREFIX}",), first_of=(VALUE, SAVED_REDUCTIONS))]

    def ratios(self) -> Dict[str, float]:
        """This step's update/weight ratio of every weight the run lets it compute."""
        view, step = self.view, self.view.step
        # update/<weight> tensors can match the weights collection's pattern too: they are not weights.
        names = self.reads([n for n in view.tensor_names(collection="weights")
                            if not n.startswith(UPDATE_PREFIX)])
        if not names:
            self.no_data(self.saved_elsewhere("weights", collection="weights"))
        present = set(view.all_names())
        out: Dict[str, float] = {}
        for name in names:
            update = UPDATE_PREFIX + name
            if update in present:
                try:
                    out[name] = update_ratio(view.l2(update), view.l2(name), self.epsilon)
                    self.update_step[name] = step
                except DATA_MISSING:
                    self.unavailable()
                continue
            if not view.has_value(name):
                self.unavailable()  # only reductions saved: no update to measure
                continue
            try:
                array = numeric(view.value(name))
            except DATA_MISSING:
                self.unavailable()
                continue
            if array is None or not array.size:
                continue
            current = array.astype(np.float64)
            previous = self._previous.get(name)
            self._previous[name] = (step, current)
            if previous is None or previous[1].shape != current.shape:
                continue
            if self.num_steps is not None and previous[0] < step - self.num_steps:
                continue
            out[name] = weight_update_ratio(previous[1], current, self.epsilon)
            # The change from p to s is the update made at step p (weights are saved before the update).
            self.update_step[name] = previous[0]
        return out

    def settle_step(self, columns) -> bool:
        # A run that saved only reductions of its weights: every weight is unavailable at
        # every step, which the catalog tells once for the whole run.
        view = self.view
        if view.mode not in TRAINING_MODES:
            return False
        names = tuple(n for n in view.tensor_names(collection="weights") if not n.startswith(UPDATE_PREFIX))
        if not names:  # a step without weights (saved every so many steps): why, said once per chunk
            elsewhere = self.__dict__.get("_elsewhere")
            if elsewhere is None or elsewhere[0] is not columns:
                elsewhere = self.__dict__["_elsewhere"] = (columns, self.saved_elsewhere("weights",
                                                                                        collection="weights"))
            self.no_data(elsewhere[1])
            return True
        present = tuple(view.all_names())
        known = self.__dict__.setdefault("_without_values", {})
        key = (names, present)
        if key not in known:
            catalog = view.catalog()
            present_names = set(present)
            updates = any(UPDATE_PREFIX + n in present_names for n in names)
            known.clear()  # one selection at a time: bounded
            known[key] = bool(names) and not updates and catalog is not None and all(
                n in catalog and not catalog[n].has_value for n in names)
        if not known[key]:
            return False
        self.reads(list(names))
        self.unavailable(len(names))
        return True

    def invoke_at_step(self, step):
        if self.view.mode not in TRAINING_MODES:
            return False
        out = {name: ratio for name, ratio in self.ratios().items()
               if self.streak_start(name, not self.small_threshold <= ratio <= self.large_threshold) is not None}
        for name in out:
            if self.streak_start(name, True) == step:
                self._origin[name] = self.update_step.get(name, step)
        if out:
            order = self.view.model_order()
            first = min(out, key=lambda n: (self._origin[n], order.key(n)))
            self.note(f"update/weight ratio outside [{self.small_threshold:g}, {self.large_threshold:g}] in "
                      f"{count(len(out), 'weight')}: {listing(out)}", ratios=details(out),
                      culprit=culprit(first, self._origin[first], ratio=out[first]))
        return bool(out)


class SimilarAcrossRuns(_SelectionRule):
    """Fires when a tensor differs between two runs at the same global step.

    Compares ``base_trial`` with ``other_trial`` (a Trial or a run directory) with
    ``numpy.allclose`` (NaNs equal): full tensors when both runs saved them, else the
    reductions both saved. Parameters: ``other_trial`` (required), ``collection_names``,
    ``tensor_regex`` (default: every tensor both runs saved at the step). Steps the other
    run does not have are skipped.
    """

    reads_what = 'their whole values in both runs, else their saved reductions'

    def __init__(self, base_trial=None, other_trial=None, collection_names=None, tensor_regex=None, actions=None,
                 name=None):
        if other_trial is None:
            raise ConfigError("SimilarAcrossRuns: other_trial (the run to compare with) is required")
        super().__init__(base_trial, other_trials=[other_trial], actions=actions, name=name)
        self._init_selection(collection_names, tensor_regex)
        self.other_trial = self.other_trials[0]

    def parameters(self):
        params = super().parameters()
        params["other_trial"] = getattr(self.other_trial, "path", self.other_trial)
        return params

    def required_tensors(self, step):
        return [self._required(first_of=(VALUE, SAVED_REDUCTIONS))]

    def _compare(self, name, other) -> Optional[str]:
        mine = self.view.first_of(name, (VALUE, SAVED_REDUCTIONS))
        theirs = other.first_of(name, (VALUE, SAVED_REDUCTIONS))
        if mine[0] == VALUE and theirs[0] == VALUE:
            a, b = numeric(mine[1]), numeric(theirs[1])
            if a is None or b is None:
                return None if np.array_equal(mine[1], theirs[1]) else "values differ"
            if a.shape != b.shape:
                return f"shapes differ ({a.shape} vs {b.shape})"
            return None if np.allclose(a, b, equal_nan=True) else "values differ"
        keys = set(mine[1]) if mine[0] == SAVED_REDUCTIONS else set(theirs[1])
        if mine[0] == SAVED_REDUCTIONS and theirs[0] == SAVED_REDUCTIONS:
            keys &= set(theirs[1])
        if not keys:
            return None
        ours = np.array([self.view.reduction(name, *k) for k in sorted(keys)])
        other_values = np.array([other.reduction(name, *k) for k in sorted(keys)])
        return None if np.allclose(ours, other_values, equal_nan=True) else "reductions differ"

    def invoke_at_step(self, step):
        other = self.other_views[0] if self.other_views else None
        if other is None:
            from ...exceptions import StepUnavailable

            raise StepUnavailable(f"{self.other_trial.path} has no step {step}")
        theirs = set(other.all_names())
        differ = {}
        for name in self._selected():
            if name not in theirs:
                continue
            try:
                finding = self._compare(name, other)
            except DATA_MISSING:
                self.unavailable()
                continue
            if finding:
                differ[name] = finding
        return note_found(self, f"values differ from {self.other_trial.path}", "tensor", differ, "tensors")
