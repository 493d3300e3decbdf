"""Keras' compiled step functions, one per kind of step: a step pays only for what it saves.

Keras' TensorFlow trainer looks ``model.train_function`` (``test_function``,
``predict_function``) up at every batch, after the ``on_*_batch_begin`` callbacks. When a
batch begins, the KerasHook installs the function made for what that step saves:

* steps that save nothing run a function traced with no capture sites: the graph Keras
  runs without the hook;
* steps that save run the function of their set of saved collections, whose capture
  sites reduce and copy unconditionally: no flag to read, no ``tf.switch_case`` around
  the work (see :mod:`.capture`).

Keras makes each function (``make_train_function(force=True)`` and its siblings, public
API); it is traced on its first call, so a configuration with k kinds of saved steps
traces k + 1 functions, once each, unless the first one traced has no capture site
(nothing the configuration saves is inside the compiled step, as with the default
configuration): then it serves every step, and no other is made. A function whose sites
no longer deliver what the plans of a step ask for (the configuration changed since it
was traced) is made again.
Beyond :data:`MAX_FUNCTIONS` kinds per model and loop, and for a model that runs
eagerly, Keras' own function runs, with flagged sites. If Keras cannot make a function,
one warning says so and that loop keeps Keras' own function.
"""
from __future__ import annotations

import weakref
from typing import Dict, Optional

from smdebug.logger import get_logger

from .capture import GraphCapture, SpecializedFunction

logger = get_logger("smdebug.tensorflow")

#: Kinds of steps (sets of saved collections, nothing saved included) with their own
#: function, per model and loop; each costs a trace and its graph's memory.
MAX_FUNCTIONS = 8

_MAKERS = {"train_function": "make_train_function", "test_function": "make_test_function",
           "predict_function": "make_predict_function"}


class _Loop:
    """The functions of one model for one loop (``train_function``, ...)."""

    __slots__ = ("model", "attr", "generic", "installed", "functions", "sole", "has_sites")

    def __init__(self, model, attr, generic):
        self.model = weakref.ref(model)
        self.attr = attr
        self.generic = generic  # Keras' own function, found installed
        self.installed = generic  # what this module last set (anything else: Keras or the user replaced it)
        # saved collections (empty: nothing saved) -> function; None after Keras failed to make one
        self.functions: Optional[Dict[frozenset, SpecializedFunction]] = {}
        self.sole: Optional[SpecializedFunction] = None  # the one function of a graph without sites
        self.has_sites = False


class StepFunctions:
    """The specialized step functions of the models one KerasHook drives."""

    def __init__(self, capture: GraphCapture):
        self._capture = capture
        self._loops: Dict[tuple, _Loop] = {}  # (id(model), attr) -> loop

    def install(self, model, attr: str, saves: frozenset) -> None:
        """Before ``model`` runs a batch: install as ``model.<attr>`` the function for a step
        that saves the collections ``saves`` (empty: nothing), and arm its sites."""
        capture = self._capture
        capture.running = None
        current = getattr(model, attr, None)
        if current is None or getattr(model, "run_eagerly", False):
            return
        key = (id(model), attr)
        loop = self._loops.get(key)
        if loop is None or loop.model() is not model or current is not loop.installed:
            if loop is not None:
                self._forget(loop)
            loop = self._loops[key] = _Loop(model, attr, current)
        function = self._function_for(loop, model, saves)
        capture.running = function
        target = function if function is not None else loop.generic
        if target is not current:
            setattr(model, attr, target)
            loop.installed = target

    def _function_for(self, loop: _Loop, model, saves: frozenset) -> Optional[SpecializedFunction]:
        functions = loop.functions
        if functions is None:
            return None
        if loop.sole is not None:
            return loop.sole
        if not loop.has_sites:  # until a first trace told whether the graph has sites
            if any(function.offered for function in functions.values()):
                loop.has_sites = True
            else:
                loop.sole = next((function for function in functions.values() if function.called), None)
                if loop.sole is not None:
                    return loop.sole
        function = functions.get(saves)
        if function is not None and saves and not self._capture.fits(function):
            self._capture.forget(function)  # traced for another configuration: make it again
            del functions[saves]
            function = None
        if function is None:
            if len(functions) >= MAX_FUNCTIONS:
                return None
            made = self._make(loop, model)
            if made is None:
                return None
            function = functions[saves] = SpecializedFunction(self._capture, made, saves or None)
        return function

    def _make(self, loop: _Loop, model):
        current = getattr(model, loop.attr, None)
        try:
            getattr(model, _MAKERS[loop.attr])(force=True)
            return getattr(model, loop.attr)
        except Exception as exc:  # noqa: BLE001 - then Keras' own function serves every step
            logger.warning("smdebug: Keras could not make a %s for %s (%s: %s); its own function runs every "
                           "step, with flagged capture sites", loop.attr, getattr(model, "name", "the model"),
                           type(exc).__name__, exc)
            loop.functions = None
            return None
        finally:
            setattr(model, loop.attr, current)

    def restore(self) -> None:
        """Put Keras' own functions back (the hook stops saving; a fit may still be running)."""
        self._capture.running = None
        for loop in list(self._loops.values()):
            self._forget(loop)
            model = loop.model()
            if model is not None and getattr(model, loop.attr, None) is loop.installed:
                try:
                    setattr(model, loop.attr, loop.generic)
                except Exception:  # noqa: BLE001 - best effort while disabling
                    pass
        self._loops.clear()

    def _forget(self, loop: _Loop) -> None:
        """Drop the variants of a loop's functions (the loop itself is being discarded)."""
        for function in (loop.functions or {}).values():
            self._capture.forget(function)
