"""The KerasHook's ``updates`` collection: what the optimizer's ``apply`` did to each weight.

``update/<weight name>`` (the name the ``weights``/``biases`` collections give the variable)
is the value just after the wrapped ``optimizer.apply`` minus the value just before, in
the same step: exact at any save interval. Half-precision weights are differenced in
float32. Only trainable weights the hook has named are followed.

* **Eager** (TensorFlow ``run_eagerly``, eager custom loops, the torch backend, JAX with
  ``run_eagerly=True``): in a TRAIN step that saves ``updates``, the wanted weights are
  copied before ``apply`` and the differences recorded after it. Under ``jax.jit`` the
  variables hold tracers: the names go to the capture, which warns once each.
* **Inside a TensorFlow graph**: one stash variable per weight (float32 for half-precision
  weights; a lasting copy of the followed weights' memory) takes the value before
  ``apply``, then ``after - stash``, and the stash is offered to the
  capture (:mod:`.capture`), which reduces or copies it as any captured tensor. In a
  specialized step function (:mod:`.keras_functions`) this is traced only into the
  functions of steps that save ``updates``, unconditionally; the function of steps that
  save nothing has none of it. In any other graph (a custom loop's ``tf.function``, Keras'
  own function beyond the specialized ones) both assignments sit in a ``tf.cond`` on one
  flag the hook sets when a step begins (on only in TRAIN steps that save ``updates``).

Reads and assignments of the same variable run in program order inside a ``tf.function``
(automatic control dependencies), so the stash holds the value before the update.
Under MirroredStrategy only the chief replica's graph gets the stash, as any capture site.
A failure here warns once and turns the updates off; training and the rest of the capture go on.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import keras

from smdebug.collections import OPTIMIZER_STEP_REGEXES, UPDATE_PREFIX, CollectionKeys
from smdebug.modes import ModeKeys

from .base import TFHookBase, logger
from .eager_capture import is_traced

K = CollectionKeys
#: The KerasHook's collections: TensorFlow's, and ``updates`` (``^update/``).
KERAS_PROFILE = dataclasses.replace(TFHookBase.profile, regexes={**TFHookBase.profile.regexes,
                                                                 K.UPDATES: OPTIMIZER_STEP_REGEXES[K.UPDATES]})
_HALF = ("float16", "bfloat16")


class KerasUpdates:
    """Updates of the trainable weights one KerasHook names (module docstring)."""

    def __init__(self, hook, tensorflow: bool):
        self._hook = weakref.proxy(hook)
        self._tf = tensorflow
        #: id(variable) -> (variable, its stash variable), for graphs
        self._stashes: Dict[int, Tuple[object, object]] = {}
        self._flag = None  # tf bool variable: whether this step saves updates (graphs without a specialized function)
        self._flag_value = False
        self.failed = False  # a failure turned the updates off

    # --- which weights ------------------------------------------------------------------
    def _named(self, variables) -> List[Tuple[str, Any]]:
        """``(update name, variable)`` of the variables whose update the configuration can save."""
        hook = self._hook
        out = []
        for var in variables:
            name = hook._weights.names.get(id(var))
            if name is not None and hook._tracked.get(name) is var:
                update = UPDATE_PREFIX + name
                if hook._is_included(update, K.UPDATES):
                    out.append((update, var))
        return out

    def wanted_for(self, variables) -> bool:
        """Whether the updates of any of ``variables`` can be saved (the optimizer's apply is wrapped)."""
        return not self.failed and bool(self._named(variables))

    # --- around the optimizer's apply -------------------------------------------------------
    def before(self, optimizer, variables) -> Optional[tuple]:
        """Just before ``optimizer.apply``: what :meth:`after` needs (None: no update is captured here)."""
        if self.failed:
            return None
        try:
            return self._before(optimizer, variables)
        except Exception as exc:  # noqa: BLE001 - updates off, training and the rest of the capture go on
            self._fail(exc)
            return None

    def after(self, pending: tuple) -> None:
        """Just after ``apply``: the differences go to the capture."""
        if self.failed:
            return
        try:
            self._after(pending)
        except Exception as exc:  # noqa: BLE001 - updates off, training and the rest of the capture go on
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        self.failed = True
        self.disarm()
        logger.warning("smdebug: saving the updates failed (%s: %s); they are off for the rest of the run, "
                       "the rest of the capture goes on", type(exc).__name__, exc)

    def _before(self, optimizer, variables) -> Optional[tuple]:
        if self._tf:
            import tensorflow as tf

            if not tf.executing_eagerly():
                return self._before_in_graph(optimizer, variables)
        session = self._hook.session
        if not (session.saving_step and self._hook._step_active and session.mode == ModeKeys.TRAIN
                and K.UPDATES in session.plans.saving_collections):
            return None
        named = [(name, var) for name, var in self._named(variables) if session.plans.wants(name)]
        if not named:
            return None
        traced = [(name, var.value) for name, var in named if is_traced(var.value)]
        if traced:  # inside jax.jit: the capture says once per name that it cannot save them
            self._hook._capture.offer(("updates", id(optimizer)), traced)
            named = [(name, var) for name, var in named if not is_traced(var.value)]
        return ("eager", (("updates", id(optimizer)), [(name, var, self._snapshot(var)) for name, var in named])) \
            if named else None

    def _after(self, pending: tuple) -> None:
        kind, items = pending
        if kind == "eager":
            key, named = items
            self._hook._capture.offer(key, [(name, self._snapshot(var) - before) for name, var, before in named])
            return
        import tensorflow as tf

        key, named, flag = items

        def difference():
            for _, var, stash in named:
                stash.assign(_as_wide(tf, var) - stash.read_value())
            return tf.constant(True)

        done = difference() if flag is None else tf.cond(flag, difference, lambda: tf.constant(False))
        with tf.control_dependencies([done]):
            self._hook._capture.offer(key, [(name, stash) for name, _, stash in named])

    def _snapshot(self, var):
        if self._tf:
            import tensorflow as tf

            return tf.identity(_as_wide(tf, var))
        value = keras.ops.convert_to_numpy(var.value)
        return np.array(value, dtype=np.float32 if value.dtype.name in _HALF else value.dtype, copy=True)

    def _before_in_graph(self, optimizer, variables) -> Optional[tuple]:
        import tensorflow as tf

        from .capture import chief_replica_or_no_strategy

        capture = self._hook._capture
        owner = capture.tracing_for
        if owner is not None and (owner.saves is None or K.UPDATES not in owner.saves):
            return None  # a function for steps that save no updates: nothing in its graph
        if not chief_replica_or_no_strategy():
            return None
        named = [(name, var, self._stash_for(tf, var)) for name, var in self._named(variables)]
        if not named:
            return None
        flag = None if owner is not None else self._flag_in_graph(tf)

        def copy():
            for _, var, stash in named:
                stash.assign(_as_wide(tf, var))
            return tf.constant(True)

        if flag is None:
            copy()
        else:
            tf.cond(flag, copy, lambda: tf.constant(False))
        return ("graph", (("updates", id(optimizer)), named, flag))

    def _stash_for(self, tf, var):
        entry = self._stashes.get(id(var))
        if entry is None or entry[0] is not var:
            from .capture import _plain_variable

            dtype = _wide_dtype(tf, var)
            shape = tuple(var.shape)
            entry = self._stashes[id(var)] = (var, _plain_variable(lambda: tf.zeros(shape, dtype)))
        return entry[1]

    def _flag_in_graph(self, tf):
        if self._flag is None:
            from .capture import _plain_variable

            self._flag = _plain_variable(lambda: tf.constant(self._flag_value))
        token = self._hook._capture._token_for_current_graph()
        with tf.control_dependencies([token] if token is not None else []):
            return self._flag.read_value()

    # --- steps -----------------------------------------------------------------------------
    def arm(self) -> None:
        """When a step begins: whether graphs without a specialized function compute updates."""
        session = self._hook.session
        value = bool(session.enabled and session.saving_step and session.mode == ModeKeys.TRAIN
                     and K.UPDATES in session.plans.saving_collections)
        if value != self._flag_value:
            self._flag_value = value
            if self._flag is not None:
                self._flag.assign(value)

    def disarm(self) -> None:
        self._flag_value = False
        if self._flag is not None:
            try:
                self._flag.assign(False)
            except Exception:  # noqa: BLE001 - best effort while disabling
                pass


def _wide_dtype(tf, var):
    dtype = tf.as_dtype(var.dtype)
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype


def _as_wide(tf, var):
    from .backend import to_tensor

    value = to_tensor(var)
    return tf.cast(value, tf.float32) if value.dtype in (tf.float16, tf.bfloat16) else value
