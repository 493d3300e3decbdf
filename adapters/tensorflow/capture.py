"""Getting tensors out of TensorFlow graphs at no cost on steps that save nothing.

A *capture site* is a place in user or Keras code (an optimizer's ``apply``, a layer's
``call``, a wrapped tape's ``gradient``) that offers named tensors to the hook.

* **Eager** (and every non-TensorFlow Keras backend): the tensors are recorded at once
  when the hook saves them at this step.
* **Inside a graph** (``tf.function``, Keras' compiled train step, ``jit_compile``): the
  site adds ``tf.cond(site flag, copy the tensors into stash variables, do nothing)``.
  The flag is a boolean variable the hook sets from Python when a step that saves one of
  the site's tensors begins; on every other step the graph pays one variable read and an
  untaken branch. On a saved step the copy also counts itself in a counter next to the
  stash, and at the end of the step the hook reads every stash whose counter moved since
  the last time it looked (a site that did not run in that step is not mistaken for fresh
  data). Variable assignments compile under XLA, so this works with ``jit_compile=True``;
  there, stash variables have static shapes (one stash per traced shape), and a tensor
  whose shape is only known at run time cannot be captured (a warning says so).
* **Distributed** (MirroredStrategy): only the chief replica's graph gets sites; stash
  variables are plain local variables, never mirrored.

Steps driven from inside a graph (a wrapped tape entered in a ``tf.function``) begin
through ``tf.py_function``; every site later in the same graph reads its flag after it.
"""
from __future__ import annotations

import threading
import weakref
from typing import Dict, Sequence, Tuple

import numpy as np
import tensorflow as tf

from smdebug.logger import get_logger

from .backend import (ReducedValue, compute_dtype, flat_caller, reducible, reduction_matrix, to_tensor,
                      union_keys)

logger = get_logger("smdebug.tensorflow")

try:  # private, but the only way to know whether the graph is being compiled by XLA
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext as _in_xla_context
except ImportError:  # pragma: no cover - older/newer layouts
    def _in_xla_context(graph):
        return False

try:  # constructing the class directly skips variable creators, e.g. MirroredStrategy's
    from tensorflow.python.ops.resource_variable_ops import ResourceVariable as _PlainVariable
except ImportError:  # pragma: no cover
    _PlainVariable = tf.Variable


def _plain_variable(make_initial, shape=None):
    """A local, non-trainable variable, never mirrored or distributed by a strategy.

    Created eagerly even while a graph is traced; ``make_initial`` builds its initial value.
    """
    with tf.init_scope():
        return _PlainVariable(make_initial(), shape=shape, trainable=False)


def chief_replica_or_no_strategy() -> bool:
    """False in the replicas of a multi-device strategy other than the chief (FORMAT 1.2:
    the lexically first device); True everywhere else."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return True
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync <= 1:
        return True
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    try:
        devices = list(tf.distribute.get_strategy().extended.worker_devices)
        chief = devices.index(sorted(devices)[0])
    except Exception:  # noqa: BLE001
        chief = 0
    return replica is not None and int(replica) == chief


def in_graph() -> bool:
    """Whether TensorFlow code is being traced into a graph right now."""
    return not tf.executing_eagerly()


def in_xla_context() -> bool:
    try:
        return bool(_in_xla_context(tf.compat.v1.get_default_graph()))
    except Exception:  # noqa: BLE001
        return False


class _Variant:
    """The stash of one traced version of a site: names, stash variables, and a counter of
    the copies made (``seen``: its value when last read)."""

    __slots__ = ("names", "stash", "copies", "seen")

    def __init__(self, names, stash, copies):
        self.names = names
        self.stash = stash
        self.copies = copies
        self.seen = 0


class _Site:
    __slots__ = ("key", "flag", "armed", "names", "variants", "fresh")

    def __init__(self, key):
        self.key = key
        self.flag = _plain_variable(lambda: tf.constant(False))
        self.armed = False
        self.names: set = set()
        self.variants: Dict[tuple, _Variant] = {}
        self.fresh: tuple = ()  # the variants that copied in the step last collected with the site armed


class GraphCapture:
    """The capture sites of one hook, their flags and stashes."""

    def __init__(self, hook):
        self._hook = weakref.proxy(hook)
        self._sites: Dict[object, _Site] = {}
        self._step_tokens: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._lock = threading.RLock()
        self._warned: set = set()
        self._readers: Dict[tuple, tuple] = {}  # -> (the core's selection, _StepReader)

    # --- called where tensors are available ------------------------------------------
    def offer(self, key, named: Sequence[Tuple[str, object]]) -> None:
        """Offer ``(name, tensor)`` pairs at site ``key`` (eager: recorded now if saved)."""
        hook = self._hook
        if not named or not hook.enabled:
            return
        if not in_graph():
            if hook.saving_step and hook._step_active:
                for name, value in named:
                    if value is not None and hook.wants(name):
                        hook.record(name, value)
            return
        self._add_graph_capture(key, named)

    def _add_graph_capture(self, key, named) -> None:
        if not chief_replica_or_no_strategy():
            return  # one replica's values per replica set: the chief's
        xla = in_xla_context()
        usable = []  # (name, value, static shape or None, dtype)
        for name, value in named:
            if value is None:
                continue
            shape, dtype = _static_shape_and_dtype(value)
            if xla and shape is None:
                self._warn_once(("xla-shape", name),
                                "smdebug cannot capture %s inside an XLA-compiled step: its shape is only known "
                                "at run time (compile with jit_compile=False to capture it)", name)
                continue
            usable.append((name, value, shape, dtype))
        if not usable:
            return
        with self._lock:
            site = self._sites.get(key)
            if site is None:
                site = self._sites[key] = _Site(key)
            new_names = {name for name, _, _, _ in usable} - site.names
            site.names.update(new_names)
            if new_names and not site.armed:
                self._arm_site_if_wanted(site)  # traced during a step that saves it (e.g. the first)
            signature = tuple((name, shape, dtype.name) for name, _, shape, dtype in usable)
            variant = site.variants.get(signature)
            if variant is None:
                variant = site.variants[signature] = self._new_variant(usable)
        token = self._token_for_current_graph()
        with tf.control_dependencies([token] if token is not None else []):
            armed = site.flag.read_value()

        def copy():
            # Densifying (IndexedSlices, variable reads) happens here: only on saved steps.
            for var, (_, value, _, _) in zip(variant.stash, usable):
                var.assign(_dense(value))
            variant.copies.assign_add(1)
            return tf.constant(True)

        done = tf.cond(armed, copy, lambda: tf.constant(False))
        # A step begun later in the same graph must wait for this copy.
        self._note_site_output(done)

    def _new_variant(self, usable) -> _Variant:
        stash = []
        for _, _, shape, dtype in usable:
            if shape is not None:
                stash.append(_plain_variable(lambda: tf.zeros(shape, dtype)))
            else:
                stash.append(_plain_variable(lambda: tf.zeros([0], dtype), shape=tf.TensorShape(None)))
        copies = _plain_variable(lambda: tf.constant(0, tf.int64))
        return _Variant(tuple(name for name, _, _, _ in usable), stash, copies)

    # --- steps begun from inside a graph -----------------------------------------------
    def begin_step_in_graph(self, begin_fn) -> bool:
        """Make every execution of the current graph begin a step by calling ``begin_fn``.

        Returns False (and warns once) inside XLA, where Python cannot run.
        """
        if in_xla_context():
            self._warn_once("xla-step", "smdebug: a wrapped tape entered inside a jit_compile function cannot "
                                        "begin steps (no Python runs there); call hook.begin_step() before each "
                                        "call of the compiled function, or compile with jit_compile=False")
            return False
        graph = tf.compat.v1.get_default_graph()
        previous = self._step_tokens.get(graph)
        deps = [previous[1]] if previous is not None and previous[1] is not None else []

        def run_begin():
            begin_fn()
            return True

        with tf.control_dependencies(deps):
            token = tf.py_function(run_begin, [], Tout=tf.bool, name="smdebug_begin_step")
        self._step_tokens[graph] = [token, None]
        return True

    def _token_for_current_graph(self):
        graph = tf.compat.v1.get_default_graph()
        while graph is not None:
            entry = self._step_tokens.get(graph)
            if entry is not None:
                return entry[0]
            graph = getattr(graph, "outer_graph", None)
        return None

    def _note_site_output(self, tensor) -> None:
        graph = tf.compat.v1.get_default_graph()
        entry = self._step_tokens.get(graph)
        if entry is not None:
            entry[1] = tensor if entry[1] is None else tf.group(entry[1], tensor)

    # --- called by the hook from Python ---------------------------------------------------
    def arm(self) -> None:
        """At the start of a step: raise the flags of sites holding a tensor saved at this step."""
        hook = self._hook
        saving = hook.saving_step and hook.enabled
        with self._lock:
            sites = list(self._sites.values())
        for site in sites:
            want = saving and any(hook.wants(name) for name in site.names)
            if want != site.armed:
                site.flag.assign(want)
                site.armed = want

    def site(self, key):
        """The site of ``key`` (None before a graph offered tensors there)."""
        return self._sites.get(key)

    def _arm_site_if_wanted(self, site) -> None:
        hook = self._hook
        if hook.saving_step and hook.enabled and hook._step_active and \
                any(hook.wants(name) for name in site.names):
            with tf.init_scope():
                site.flag.assign(True)
            site.armed = True

    def collect(self, extra: Sequence[Tuple[str, object]] = ()) -> None:
        """At the end of a step: record what armed sites copied in this step, and ``extra``
        ``(name, eager tensor)`` pairs read earlier in the step (the tracked variables).

        One call of a cached :class:`_StepReader` reads every stash and counter and computes
        the reductions of all of them and of ``extra``; its reductions and counters come to
        the host in one transfer. Only tensors the step needs whole stay tensors. A name in
        ``extra`` is taken from there, not from a stash that also holds it (a site may copy a
        weight that was read when the step began: the read is the step's first value).
        """
        hook = self._hook
        with self._lock:
            sites = [s for s in self._sites.values() if s.armed]
        if not hook.saving_step or not (sites or extra):
            return
        variants = tuple(v for site in sites for v in list(site.variants.values()))
        names = tuple(name for name, _ in extra) + tuple(name for v in variants for name in v.names)
        selected = hook.select(names)  # [(index, plan)] of the names saved now, cached by the core
        key = (tuple(map(id, variants)), names, tuple((tuple(t.shape), t.dtype) for _, t in extra))
        entry = self._readers.get(key)
        if entry is None or entry[0] is not selected:
            # What each tensor needs decides the reader: (reductions, whole tensor), None if unwanted.
            needs = [None] * len(names)
            n_extra = len(extra)
            from_extra = set(names[:n_extra])
            for index, plan in selected:
                if index < n_extra or names[index] not in from_extra:
                    needs[index] = (plan.reductions, plan.needs_host)
            reader = entry[1] if entry is not None and entry[1].needs == needs else None
            if reader is None:
                if len(self._readers) > 32:  # configurations keep changing: do not grow forever
                    self._readers.clear()
                reader = _StepReader(variants, [t for _, t in extra], needs)
            # The entry holds ``selected``: its identity says the plans did not change.
            entry = self._readers[key] = (selected, reader)
        reader = entry[1]
        counts, values = reader([t for _, t in extra])
        fresh = [True] * len(extra)
        moved = set()
        for variant, count in zip(variants, counts):
            # A counter that did not move: that site did not run in this step, its stash is stale.
            is_fresh, variant.seen = count != variant.seen, count
            fresh += [is_fresh] * len(variant.names)
            if is_fresh:
                moved.add(id(variant))
        for site in sites:
            site.fresh = tuple(v for v in site.variants.values() if id(v) in moved)
        hook.record_many([(name, value) for name, value, ok in zip(names, values, fresh)
                          if ok and value is not None], hook.backend)

    def disarm_all(self) -> None:
        with self._lock:
            sites = list(self._sites.values())
        for site in sites:
            if site.armed:
                try:
                    site.flag.assign(False)
                except Exception:  # noqa: BLE001 - best effort while disabling
                    pass
                site.armed = False

    def _warn_once(self, key, message, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)


class _StepReader:
    """The end-of-step reads of one configuration (armed stashes, tracked tensors, plans).

    A concrete function takes the ``extra`` tensors, reads every counter and stash
    variable, and returns the counters and the reductions packed in one float64 vector,
    and the tensors the step needs whole (raw values; a tensor whose shape is only known
    at run time, reduced later by the backend). Calling it returns ``(counts, values)``:
    per variant its counter; per tensor (``extra`` then stashes) a ReducedValue, an eager
    tensor, or None when it is not saved.
    """

    def __init__(self, variants, extra, needs):
        self.needs = list(needs)
        specs = [(t.shape, t.dtype) for t in extra]
        for v in variants:
            specs += [(var.shape, var.dtype) for var in v.stash]
        self._n_counts = len(variants)
        # Per tensor: (reduction keys or None, whether the tensor is returned).
        self._layout = []
        reduced = []
        for index, (need, (shape, dtype)) in enumerate(zip(needs, specs)):
            if need is None:
                self._layout.append(None)
                continue
            keys, whole = need
            static = tuple(int(d) for d in shape) if shape.is_fully_defined() else None
            if keys and reducible(static, dtype):
                reduced.append(index)
                self._layout.append((keys, whole, static))
            else:  # the backend reduces it (if it can), as any recorded tensor
                self._layout.append((None, True, static))
        self._keys = union_keys(self._layout[i][0] for i in reduced)
        self._columns = {index: column for column, index in enumerate(reduced)}
        self._rows = {keys: [self._keys.index(k) for k in keys] for keys, _, _ in
                      (self._layout[i] for i in reduced)}
        returned = [i for i, entry in enumerate(self._layout) if entry is not None and entry[1]]
        self._returned = {index: position for position, index in enumerate(returned)}
        stash = [var for v in variants for var in v.stash]
        copies = [v.copies for v in variants]
        n_extra, keys = len(extra), self._keys
        sizes = [int(np.prod(specs[i][0], dtype=np.int64)) for i in reduced]
        compute = compute_dtype(specs[i][1] for i in reduced)

        def read(tensors):
            values = list(tensors) + [var.read_value() for var in stash]
            packed = []
            if reduced:
                matrix = reduction_matrix([values[i] for i in reduced], sizes, keys, compute)
                packed.append(tf.reshape(matrix, [-1]))
            if copies:
                packed.append(tf.cast(tf.stack([c.read_value() for c in copies]), tf.float64))
            vector = tf.concat(packed, 0) if len(packed) > 1 else packed[0] if packed else tf.zeros([0], tf.float64)
            return [vector] + [values[i] for i in returned]

        # Per tensor, what __call__ does with the outputs: (output position or 0, column in
        # the reductions or None, rows of its keys or None for all of them, keys, shape).
        self._plan = []
        for index, entry in enumerate(self._layout):
            if entry is None:
                self._plan.append(None)
                continue
            keys, whole, static = entry
            position = 1 + self._returned[index] if whole else 0
            if keys is None:
                self._plan.append((position, None, None, None, static))
            else:
                rows = self._rows[keys]
                rows = None if rows == list(range(len(self._keys))) else np.asarray(rows)
                self._plan.append((position, self._columns[index], rows, keys, static))
        signature = [tf.TensorSpec(shape, dtype) for shape, dtype in specs[:n_extra]]
        self._call = flat_caller(tf.function(read, autograph=False).get_concrete_function(signature))

    def __call__(self, extra):
        outputs = self._call(extra)
        vector = outputs[0].numpy()  # the one transfer of the step's reductions and counters
        n_keys, n_reduced = len(self._keys), len(self._columns)
        columns = vector[:n_keys * n_reduced].reshape(n_keys, n_reduced).T  # one row per reduced tensor
        counts = vector[n_keys * n_reduced:].astype(np.int64).tolist()
        values = []
        for entry in self._plan:
            if entry is None:
                values.append(None)
                continue
            position, column, rows, keys, static = entry
            tensor = outputs[position] if position else None
            if column is None:
                values.append(tensor)
            else:
                got = columns[column] if rows is None else columns[column][rows]
                values.append(ReducedValue(tensor, static, dict(zip(keys, got))))
        return counts, values


def _dense(value):
    return tf.convert_to_tensor(to_tensor(value))


def _static_shape_and_dtype(value):
    """(fully known shape as a tuple, or None; dtype) without adding ops to the graph."""
    if isinstance(value, tf.IndexedSlices):
        dense_shape = tf.get_static_value(value.dense_shape) if value.dense_shape is not None else None
        shape = tuple(int(d) for d in dense_shape) if dense_shape is not None else None
        return shape, value.values.dtype
    if not isinstance(value, (tf.Tensor, tf.Variable)):
        inner = getattr(value, "value", None)
        if isinstance(inner, tf.Variable):
            value = inner
        else:
            value = tf.convert_to_tensor(value)
    shape = value.shape
    return (tuple(int(d) for d in shape) if shape.is_fully_defined() else None), value.dtype.base_dtype
