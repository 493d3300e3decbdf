"""Built-in rules over activations: the inputs and outputs of ReLU, tanh and sigmoid modules
(PoorWeightInitialization, DeadRelu, SaturatedActivation).

Parameter names and defaults follow the public SageMaker Debugger built-in rules reference,
as in :mod:`.builtin_tensors`.
"""
from __future__ import annotations

from collections import deque
from typing import Dict, List, Tuple

import numpy as np

from . import _params as P
from .culprit import culprit
from .findings import (TRAINING_MODES, count, details, earliest, listing, numeric,
                       numeric_values)
from .rule import DATA_MISSING, Rule
from .views import Required

#: Default name patterns of activation tensors. The reference's ``.*relu_output`` misses the
#: names users give their modules (``relu1``, ``ReLU``): digits and any case are matched here.
RELU_INPUTS = r"(?i).*relu\w*_input"
RELU_OUTPUTS = r"(?i).*relu\w*_output"
TANH_SIGMOID_INPUTS = (r"(?i).*tanh\w*_input", r"(?i).*sigmoid\w*_input")

class PoorWeightInitialization(Rule):
    """Looks for signs of a poor initialization in the first ``steps`` saved training steps.

    Fires when any holds at a step:
    * the variances of the activation inputs (``activation_inputs_regex``, default
      ``(?i).*relu\\w*_input``) differ across layers by a ratio max/min above ``threshold`` (10.0);
    * for some gradient (``gradients`` collection, full tensors with at least 10 values) the
      95th minus 5th percentile is below ``distribution_range`` (0.001);
    * a loss (``losses`` collection) has not reached a new minimum for ``patience`` (5) steps
      and the mean of its last ``patience`` values is above that of its first by more than two
      standard errors (without that, the reference's check fires on mini-batch noise).
    Parameters: ``activation_inputs_regex``, ``threshold``, ``distribution_range``,
    ``patience``, ``steps`` (10).
    """

    reads_what = "the 'variance' reduction of activation inputs (or their values), whole gradients and the loss"

    _MIN_GRADIENT_SIZE = 10

    def __init__(self, base_trial=None, activation_inputs_regex=RELU_INPUTS, threshold=10.0,
                 distribution_range=0.001, patience=5, steps=10, actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self.activation_inputs_regex = P.regex_list(self.rule_name, "activation_inputs_regex",
                                                    activation_inputs_regex)
        self.threshold = P.number(self.rule_name, "threshold", threshold, minimum=1)
        self.distribution_range = P.number(self.rule_name, "distribution_range", distribution_range, minimum=0)
        self.patience = P.number(self.rule_name, "patience", patience, minimum=1, integer=True)
        self.steps = P.number(self.rule_name, "steps", steps, minimum=1, integer=True)
        self._seen = 0
        self._best: Dict[str, Tuple[float, int]] = {}
        self._first_loss: Dict[str, List[float]] = {}
        self._recent: Dict[str, deque] = {}

    def _active(self) -> bool:
        return self._seen < self.steps and self.view.mode in TRAINING_MODES

    def required_tensors(self, step):
        if not self._active():
            return ()
        return [Required(regex=self.activation_inputs_regex, reductions=[("variance", False)]),
                Required(collections="gradients", value=True),
                Required(collections="losses", value=True)]

    def invoke_at_step(self, step):
        if not self._active():
            return False
        self._seen += 1
        view = self.view
        fired = False
        variances = {}
        for name in view.tensor_names(regex=self.activation_inputs_regex):
            try:
                variances[name] = view.reduction(name, "variance")
            except DATA_MISSING:
                self.unavailable()
        if len(variances) >= 2:
            low, high = min(variances.values()), max(variances.values())
            ratio = high / low if low > 0 else float("inf")
            if ratio > self.threshold:
                fired = True
                # Initialisations aim at unit variance: the layer farthest from it is the culprit.
                worst = max(variances, key=lambda n: abs(np.log(max(variances[n], 1e-300))))
                self.note(f"activation input variances differ across layers by {ratio:.3g}x (> {self.threshold:g}): "
                          f"{listing(variances)}", variance_ratio=ratio, variances=details(variances),
                          culprit=culprit(worst, self.streak_start(("variance", worst), True),
                                          variance=variances[worst]))
        spreads = {}
        for name in view.tensor_names(collection="gradients"):
            try:
                array = numeric(view.value(name))
            except DATA_MISSING:
                continue  # only reductions saved: this check needs full gradients
            if array is None or array.size < self._MIN_GRADIENT_SIZE:
                continue
            low, high = np.percentile(array.astype(np.float64).ravel(), [5, 95])
            spreads[name] = float(high - low)
        if spreads:
            name, spread = min(spreads.items(), key=lambda kv: kv[1])
            if spread < self.distribution_range:
                fired = True
                self.note(f"gradient {name} is concentrated: 95th - 5th percentile = {spread:.3g} "
                          f"(< {self.distribution_range:g})", gradient=name, percentile_range=spread)
        for name in view.tensor_names(collection="losses"):
            try:
                loss = view.scalar(name)
            except DATA_MISSING:
                continue
            recent = self._recent.setdefault(name, deque(maxlen=self.patience))
            recent.append(loss)
            opening = self._first_loss.setdefault(name, [])
            if len(opening) < self.patience:
                opening.append(loss)
            first = float(np.mean(opening))
            best = self._best.get(name)
            if best is None or loss < best[0]:
                self._best[name] = (loss, 0)
                continue
            waited = best[1] + 1
            self._best[name] = (best[0], waited)
            # Mini-batch noise alone leaves a learning loss without a new minimum for a few
            # steps; only a loss whose recent mean is not even below its first value is stuck.
            noise = float(np.sqrt((np.var(opening) + np.var(recent)) / max(1, len(recent) - 1)))
            if waited >= self.patience and len(opening) == self.patience and float(np.mean(recent)) >= first + 2 * noise:
                fired = True
                self.note(f"loss {name} has not decreased for {waited} steps (best {best[0]:.4g}; the last "
                          f"{len(recent)} average {float(np.mean(recent)):.4g}, above the first {len(opening)}'s "
                          f"{first:.4g} by more than their noise)",
                          loss=name)
        return fired


class _ActivityRule(Rule):
    """Shared by DeadRelu and SaturatedActivation: the share of units that are (in)active.

    A unit is one position of the tensor outside the batch axis (axis 0 when the tensor
    has two or more dimensions; each element of a 1-D tensor). A unit's activity is the
    percentage of samples in which it is active; below ``threshold_inactivity`` it counts
    as inactive; the rule fires when more than ``threshold_layer`` percent of a layer's
    units are inactive.
    """

    def _inactive_percent(self, active: np.ndarray) -> float:
        if active.ndim >= 2:
            activity = 100.0 * active.reshape(active.shape[0], -1).mean(axis=0)
        else:
            activity = 100.0 * active.astype(np.float64).ravel()
        return 100.0 * float(np.mean(activity < self.threshold_inactivity))

    def _inactive_layers(self, names, active) -> Dict[str, float]:
        """``{name: percent of inactive units}`` of the layers above ``threshold_layer``.

        ``active(name, array)`` gives the boolean mask of active entries.
        """
        found = {}
        for name, array in numeric_values(self, names):
            percent = self._inactive_percent(active(name, array))
            if self.streak_start(name, percent > self.threshold_layer) is not None:
                found[name] = percent
        return found


class DeadRelu(_ActivityRule):
    """Fires when more than ``threshold_layer`` percent of a ReLU layer's units are dead.

    A unit is dead when it is positive in less than ``threshold_inactivity`` percent of the
    batch. Reads full ReLU outputs: ``tensor_regex`` (default: names matching
    ``(?i).*relu\\w*_output``: the reference's ``.*relu_output`` with numbered and capitalised
    module names, ``relu1``, ``ReLU``). Parameters:
    ``tensor_regex``, ``threshold_inactivity`` (1.0), ``threshold_layer`` (50.0).
    """

    reads_what = 'the whole values of ReLU outputs (the fraction of units at zero)'

    DEFAULT_REGEX = (RELU_OUTPUTS,)

    def __init__(self, base_trial=None, tensor_regex=None, threshold_inactivity=1.0, threshold_layer=50.0,
                 actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self.tensor_regex = P.regex_list(self.rule_name, "tensor_regex", tensor_regex) or self.DEFAULT_REGEX
        self.threshold_inactivity = P.number(self.rule_name, "threshold_inactivity", threshold_inactivity,
                                             minimum=0, maximum=100)
        self.threshold_layer = P.number(self.rule_name, "threshold_layer", threshold_layer, minimum=0, maximum=100)

    def required_tensors(self, step):
        return [Required(regex=self.tensor_regex, value=True)]

    def invoke_at_step(self, step):
        names = self.view.tensor_names(regex=self.tensor_regex)
        if not names:
            self.no_data(self.saved_elsewhere(f"tensors matching {', '.join(self.tensor_regex)}",
                                              regex=self.tensor_regex))
        dead = self._inactive_layers(names, lambda name, array: array > 0)
        if dead:
            first = earliest(self, dead)
            self.note(f"more than {self.threshold_layer:g}% dead units in {count(len(dead), 'ReLU layer')}: "
                      f"{listing(dead, '{:.1f}%')}", percent_dead=details(dead),
                      culprit=culprit(first, self.streak_start(first, True), percent=dead[first]))
        return bool(dead)


class SaturatedActivation(_ActivityRule):
    """Fires when more than ``threshold_layer`` percent of a tanh/sigmoid layer's units saturate.

    A unit is active when its input lies strictly inside ``threshold_tanh`` (default
    (-4.15, 4.15)) or ``threshold_sigmoid`` ((-6.9, 6.9)) - whichever of "tanh" or "sigmoid"
    the tensor name contains - and saturated when active in less than
    ``threshold_inactivity`` (50.0) percent of the batch. Reads full activation inputs:
    ``collection_names`` and ``tensor_regex`` (default ``(?i).*tanh\\w*_input`` and the same
    for sigmoid). The defaults differ from the reference's ((-9.4999, 9.4999), (-23, 16.99999)
    and 1.0), which count only units past the float32 flat ends on 99% of the batch, and so
    miss a layer whose inputs nearly all have a derivative below 1e-3 (docs/migrating.md).
    """

    reads_what = 'the whole values of tanh/sigmoid inputs (the fraction of saturated units)'

    def __init__(self, base_trial=None, collection_names=None, tensor_regex=TANH_SIGMOID_INPUTS,
                 threshold_tanh=(-4.15, 4.15), threshold_sigmoid=(-6.9, 6.9), threshold_inactivity=50.0,
                 threshold_layer=50.0, actions=None, name=None):
        super().__init__(base_trial, actions=actions, name=name)
        self.collection_names = P.str_list(self.rule_name, "collection_names", collection_names)
        self.tensor_regex = P.regex_list(self.rule_name, "tensor_regex", tensor_regex)
        self.threshold_tanh = P.number_pair(self.rule_name, "threshold_tanh", threshold_tanh)
        self.threshold_sigmoid = P.number_pair(self.rule_name, "threshold_sigmoid", threshold_sigmoid)
        self.threshold_inactivity = P.number(self.rule_name, "threshold_inactivity", threshold_inactivity,
                                             minimum=0, maximum=100)
        self.threshold_layer = P.number(self.rule_name, "threshold_layer", threshold_layer, minimum=0, maximum=100)

    def required_tensors(self, step):
        return [Required(collections=self.collection_names, regex=self.tensor_regex, value=True)]

    def invoke_at_step(self, step):
        names = self.view.tensor_names(self.collection_names, self.tensor_regex)
        if not names:
            self.no_data("step %d has no tensor matching collection_names=%s tensor_regex=%s", step,
                         list(self.collection_names), list(self.tensor_regex))
        # Only tanh and sigmoid layers have known saturation bounds; other tensors are not read.
        bounds = {name: self._bounds(name) for name in names}
        saturated = self._inactive_layers(
            [name for name in names if bounds[name] is not None],
            lambda name, array: (array > bounds[name][0]) & (array < bounds[name][1]),
        )
        if saturated:
            first = earliest(self, saturated)
            self.note(f"more than {self.threshold_layer:g}% saturated units in "
                      f"{count(len(saturated), 'activation layer')}: {listing(saturated, '{:.1f}%')}",
                      percent_saturated=details(saturated),
                      culprit=culprit(first, self.streak_start(first, True), percent=saturated[first]))
        return bool(saturated)

    def _bounds(self, name: str):
        lowered = name.lower()
        if "tanh" in lowered:
            return self.threshold_tanh
        if "sigmoid" in lowered:
            return self.threshold_sigmoid
        return None
