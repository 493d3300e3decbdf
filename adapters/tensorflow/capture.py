"""Getting tensors out of TensorFlow graphs at no cost on steps that save nothing.

A *capture site* is a place in user or Keras code (an optimizer's ``apply``, a layer's
``call``, a wrapped tape's ``gradient``) that offers named tensors to the hook.

* **Eager** (and every non-TensorFlow Keras backend): the tensors are recorded at once
  when the hook saves them at this step.
* **Inside a graph** (``tf.function``, Keras' compiled train step, ``jit_compile``): each
  traced version of a site (a *variant*: its names, static shapes and dtypes) gets an
  int flag variable the hook sets from Python when a step begins, and the site adds
  ``tf.switch_case(flag, [nothing, REDUCE, COPY])``. On steps that save none of its
  tensors the flag is OFF: the graph pays one variable read and an untaken branch.

  - REDUCE (the usual saved step): when the variant is traced, the plans of that step
    fix its *layout*: tensors that need only reductions are reduced right there, in the
    graph (:func:`.backend.reduction_matrix`), and their ``[keys, tensors]`` matrix is
    written with the variant's copy counter into one small float64 vector; tensors needed
    whole (raw, histograms) or not reducible are copied into stash variables. At the end
    of the step the hook reads the vector with one eager read, and the stashes (if any)
    as COPY does. The hook arms REDUCE only when the layout delivers everything the plans
    of this step ask for (checked once per configuration): a tensor the layout skipped or
    reduced with other keys, or one now needed whole, makes it arm COPY instead, so a
    configuration changed after tracing gives the same values, through the slower path.
    (A change made while a step is still open, after its graph ran, applies to REDUCE
    variants from the next step: keys their layout lacks are missing from the open step.)
  - COPY: every tensor is copied whole into its stash variable, and one call of a cached
    concrete function (:class:`.step_reader.StepReader`) reads the stashes and counters and
    computes all reductions (with those of tracked variables read in Python, ``extra``).

  Either way the copy bumps the variant's counter; the hook keeps the count it last saw
  and records a variant only when its counter passed it (a site that did not run in this
  step is not mistaken for fresh data, even after steps of the other mode). Variable
  assignments and the reductions compile under XLA (unsorted segment ops there), so this
  works with ``jit_compile=True``; there, stash variables have static shapes (one stash
  per traced shape), and a tensor whose shape is only known at run time cannot be
  captured (a warning says so). A variant traced in a step that saves none of its
  tensors has an empty layout: it always copies (COPY).
* **Specialized step functions** (Keras' loops, :mod:`.keras_functions`): a function
  traced for steps that save nothing gets no sites at all; one traced for a kind of saved
  step gets variants with no flag (``owner``): they run REDUCE whenever that function
  runs, with the layout of the step they were traced in, and are armed only in steps that
  run their function. The flagged variants above serve every other graph.
* **Distributed** (MirroredStrategy): only the chief replica's graph gets sites; stash
  variables are plain local variables, never mirrored.

Steps driven from inside a graph (a wrapped tape entered in a ``tf.function``) begin
through ``tf.py_function``; every site later in the same graph reads its flag after it.
"""
from __future__ import annotations

import threading
import weakref
from typing import Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from smdebug.logger import get_logger

from .backend import ReducedValue, compute_dtype, reducible, reduction_matrix, to_tensor, union_keys
from .step_reader import StepReader

logger = get_logger("smdebug.tensorflow")

try:  # private, but the only way to know whether the graph is being compiled by XLA
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext as _in_xla_context
except ImportError:  # pragma: no cover - older/newer layouts
    def _in_xla_context(graph):
        return False

try:  # the generated op: no argument checking on the per-step read
    from tensorflow.python.ops.gen_resource_variable_ops import read_variable_op as _read_variable_op
except ImportError:  # pragma: no cover
    def _read_variable_op(handle, dtype):
        return tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype)

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
    """False in the replicas of a multi-device strategy other than the chief (docs/format.md 1.2:
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
    except Exception:  # noqa: BLE001 - devices unreadable: replica 0 is the chief
        chief = 0
    return replica is not None and int(replica) == chief


def in_graph() -> bool:
    """Whether TensorFlow code is being traced into a graph right now."""
    return not tf.executing_eagerly()


def in_xla_context() -> bool:
    try:
        return bool(_in_xla_context(tf.compat.v1.get_default_graph()))
    except Exception:  # noqa: BLE001 - no graph to ask: not in XLA
        return False


#: A variant's mode (the value of its flag): copy nothing; reduce in the graph what its
#: layout reduces and copy the rest of its layout whole; copy every tensor whole.
OFF, REDUCE, COPY = 0, 1, 2
#: Layout entry of a tensor copied whole in REDUCE mode (it is needed whole, or not reducible).
WHOLE = "whole"


class _Variant:
    """One traced version of a site: its names, shapes and dtypes, and its *layout*, what
    REDUCE mode does with each tensor, fixed when it was traced from the plans of that
    step: a tuple of reduction keys (reduced in the graph into ``vector``), :data:`WHOLE`
    (copied into its stash variable), or None (skipped: not saved when it was traced).

    ``flag`` holds the mode (no flag: a variant of a specialized step function, ``owner``,
    which runs REDUCE whenever its function runs), ``copies`` counts the steps in which the variant ran (either
    mode); ``vector`` (float64) holds the packed ``[keys, reduced tensors]`` reductions of
    the last REDUCE copy followed by the value of ``copies`` after it; ``seen`` is the
    count when last read."""

    __slots__ = ("names", "shapes", "layout", "stash", "copies", "flag", "mode", "seen", "reduced", "keys",
                 "whole", "vector", "owner", "_mode_cache", "_unpack_cache")

    def __init__(self, names, shapes, layout, stash, owner=None):
        self.names = names
        self.shapes = shapes
        self.layout = layout
        self.stash = stash
        self.copies = _plain_variable(lambda: tf.constant(0, tf.int64))
        # A variant of a specialized step function (``owner``) has no flag: it always runs REDUCE.
        self.owner = owner
        self.flag = _plain_variable(lambda: tf.constant(OFF, tf.int32)) if owner is None else None
        self.mode = OFF
        self.seen = 0
        self.reduced = tuple(i for i, entry in enumerate(layout) if entry is not None and entry is not WHOLE)
        self.keys = union_keys(layout[i] for i in self.reduced)
        self.whole = tuple(i for i, entry in enumerate(layout) if entry is WHOLE)
        size = len(self.keys) * len(self.reduced) + 1
        self.vector = _plain_variable(lambda: tf.zeros([size], tf.float64)) if self.reduced else None
        self._mode_cache = None  # (the core's plans.version, mode)
        self._unpack_cache = None  # (the core's plans.version, names taken from elsewhere, unpacking plan)

    def mode_for(self, selected, version) -> int:
        """The mode for a step whose saved names of this variant are ``selected`` (the core's
        ``[(index, plan)]``, made under ``version``, its ``plans.version``): REDUCE when the
        traced layout delivers everything each plan asks for, COPY when not (the
        configuration changed since the trace)."""
        cached = self._mode_cache
        if cached is not None and cached[0] == version:
            return cached[1]
        if not selected:
            mode = OFF
        elif all(_layout_fits(self.layout[i], plan) for i, plan in selected):
            mode = REDUCE
        else:
            mode = COPY
        self._mode_cache = (version, mode)
        return mode

    def read_reduced(self, selected, skip, session):
        """After a REDUCE step: ``(count, complete, partial)`` from one read of ``vector``,
        the reductions of the selected names not in ``skip``. ``complete`` is ``(block,
        values)`` for :meth:`StepInbox.record_reduced` (the tensors whose plans get every
        reduction they ask for; the block is laid out once per selection), or None;
        ``partial`` holds ``(name, ReducedValue)`` for a plan with keys the layout lacks
        (configuration changed within the step): those are left out, never made up."""
        # One eager read, the cheapest there is (Variable.numpy() costs three times as much).
        vector = _read_variable_op(self.vector.handle, tf.float64).numpy()
        count = int(vector[-1])
        cached = self._unpack_cache
        version = session.plans.version
        if cached is None or cached[0] != version or cached[1] != skip:
            # Where each wanted reduction is in the vector ([keys, reduced tensors], row-major):
            # the complete plans' first, in one run for the block, then the partial ones'.
            complete_positions, block_entries, partial_positions, partial_entries = [], [], [], []
            for i, tensor_plan in selected:
                entry = self.layout[i]
                if entry is None or entry is WHOLE or self.names[i] in skip:
                    continue
                keys = tuple(k for k in tensor_plan.reductions if k in entry)
                column = self.reduced.index(i)
                where = [self.keys.index(k) * len(self.reduced) + column for k in keys]
                if _layout_fits(entry, tensor_plan):  # every reduction of a plan that asks for nothing else
                    block_entries.append((tensor_plan, self.shapes[i]))
                    complete_positions += where
                else:
                    partial_entries.append((self.names[i], len(partial_positions),
                                            len(partial_positions) + len(keys), keys, self.shapes[i]))
                    partial_positions += where
            block = session.inbox.reduced_block(block_entries) if block_entries else None
            cached = self._unpack_cache = (version, skip, block, np.asarray(complete_positions, dtype=np.int64),
                                           np.asarray(partial_positions, dtype=np.int64), partial_entries)
        _, _, block, complete_positions, partial_positions, partial_entries = cached
        # numpy float64 scalars: records as the writer takes them
        complete = (block, list(vector[complete_positions])) if block is not None else None
        partial = []
        if partial_entries:
            picked = list(vector[partial_positions])
            for name, start, stop, keys, shape in partial_entries:
                partial.append((name, ReducedValue(None, shape, dict(zip(keys, picked[start:stop])))))
        return count, complete, partial


def _does_work(variant) -> bool:
    return bool(variant.reduced or variant.whole)


def _layout_fits(entry, plan) -> bool:
    if entry is WHOLE:
        return True
    if entry is None:
        return False
    return not plan.needs_host and all(key in entry for key in plan.reductions)


class _Site:
    __slots__ = ("key", "armed", "variants", "stashes", "fresh")

    def __init__(self, key):
        self.key = key
        self.armed = False  # whether a variant's flag is up
        self.variants: Dict[tuple, _Variant] = {}  # (signature, layout) -> variant
        self.stashes: Dict[tuple, list] = {}  # signature -> stash variables, shared by its variants
        self.fresh: tuple = ()  # the variants that copied in the step last collected with the site armed


class GraphCapture:
    """The capture sites of one hook, their flags and stashes."""

    def __init__(self, hook):
        self._hook = weakref.proxy(hook)
        self._sites: Dict[object, _Site] = {}
        self._step_tokens: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._lock = threading.RLock()
        self._warned: set = set()
        self._readers: Dict[tuple, tuple] = {}  # -> (the core's selection, StepReader)
        #: The specialized step function being called (so being traced, if it traces) right now.
        self.tracing_for: "SpecializedFunction | None" = None
        #: The specialized step function chosen for the current step (its variants are armed).
        self.running: "SpecializedFunction | None" = None

    # --- called where tensors are available ------------------------------------------
    def offer(self, key, named: Sequence[Tuple[str, object]]) -> None:
        """Offer ``(name, tensor)`` pairs at site ``key`` (eager: recorded now if saved)."""
        hook = self._hook
        session = hook.session
        if not named or not session.enabled:
            return
        if not in_graph():
            if session.saving_step and hook._step_active:
                for name, value in named:
                    if value is not None and session.plans.wants(name):
                        session.inbox.record(name, value)
            return
        self._add_graph_capture(key, named)

    def _add_graph_capture(self, key, named) -> None:
        owner = self.tracing_for
        if owner is not None:
            owner.offered = True
            if owner.saves is None:
                return  # a step function for steps that save nothing: no site at all
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
        signature = tuple((name, shape, dtype.name) for name, _, shape, dtype in usable)
        layout = self._layout(usable)
        with self._lock:
            site = self._sites.get(key)
            if site is None:
                site = self._sites[key] = _Site(key)
            variant = site.variants.get((signature, layout, owner))
            if variant is None:
                stash = site.stashes.get(signature)
                if stash is None:
                    stash = site.stashes[signature] = _new_stash(usable)
                variant = site.variants[(signature, layout, owner)] = _Variant(
                    tuple(name for name, _, _, _ in usable), tuple(shape for _, _, shape, _ in usable), layout, stash,
                    owner)
                if owner is not None:
                    owner.variants.append(variant)
                self._arm_variant_if_wanted(site, variant)  # traced during a step that saves it (e.g. the first)
        values = [value for _, value, _, _ in usable]

        def copy_all():
            # Densifying (IndexedSlices, variable reads) happens here: only on saved steps.
            for var, value in zip(variant.stash, values):
                var.assign(_dense(value))
            variant.copies.assign_add(1)
            return tf.constant(True)

        def reduce():
            for i in variant.whole:
                variant.stash[i].assign(_dense(values[i]))
            count = variant.copies.assign_add(1)
            if variant.reduced:
                # The whole tensors stay in the graph: one small vector leaves it.
                tensors = [_dense(values[i]) for i in variant.reduced]
                sizes = [int(np.prod(variant.shapes[i], dtype=np.int64)) for i in variant.reduced]
                matrix = reduction_matrix(tensors, sizes, variant.keys, compute_dtype(t.dtype for t in tensors),
                                          xla=xla)
                variant.vector.assign(tf.concat([tf.reshape(matrix, [-1]),
                                                 tf.cast(tf.reshape(count, [1]), tf.float64)], 0))
            return tf.constant(True)

        if variant.owner is not None:
            if not _does_work(variant):
                return  # the steps of this function save none of these tensors
            done = reduce()  # unconditionally: the function runs only in steps that save them
        else:
            token = self._token_for_current_graph()
            with tf.control_dependencies([token] if token is not None else []):
                mode = variant.flag.read_value()
            done = tf.switch_case(mode, [lambda: tf.constant(False), reduce, copy_all])
        # A step begun later in the same graph must wait for this copy.
        self._note_site_output(done)

    def _layout(self, usable) -> tuple:
        """What REDUCE mode does with each tensor, from the plans of the step being traced."""
        hook = self._hook
        session = hook.session
        saving = session.saving_step and session.enabled
        layout: List[object] = []  # per tensor: None (not saved), WHOLE, or the plan's reductions
        for name, _, shape, dtype in usable:
            plan = session.plans.plan_for(name) if saving else None
            if plan is None:
                layout.append(None)
            elif plan.needs_host or not plan.reductions or not reducible(shape, dtype):
                layout.append(WHOLE)
            else:
                layout.append(plan.reductions)
        return tuple(layout)

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
        """At the start of a step: set the mode of every variant (OFF when it holds no tensor
        saved at this step)."""
        hook = self._hook
        session = hook.session
        saving = session.saving_step and session.enabled
        with self._lock:
            sites = list(self._sites.values())
        for site in sites:
            armed = False
            for variant in list(site.variants.values()):
                if variant.owner is not None:  # runs, and copies, whenever its function runs
                    variant.mode = self._owned_mode(variant) if saving else OFF
                    armed = armed or variant.mode != OFF
                    continue
                mode = variant.mode_for(session.plans.select(variant.names), session.plans.version) if saving else OFF
                if mode != variant.mode:
                    variant.flag.assign(mode)
                    variant.mode = mode
                armed = armed or mode != OFF
            site.armed = armed

    def site(self, key):
        """The site of ``key`` (None before a graph offered tensors there)."""
        return self._sites.get(key)

    # --- specialized step functions ----------------------------------------------------------
    def _owned_mode(self, variant) -> int:
        """The mode of a variant of a specialized function in a saving step: REDUCE when its
        function is the one this step runs and it reduces or copies anything."""
        return REDUCE if variant.owner is self.running and _does_work(variant) else OFF

    def fits(self, function: "SpecializedFunction") -> bool:
        """Whether the sites traced into ``function`` deliver everything the plans of this
        step ask for of their tensors (False: the configuration changed since it was traced)."""
        hook = self._hook
        session = hook.session
        return all(v.mode_for(session.plans.select(v.names), session.plans.version) != COPY for v in function.variants)

    def forget(self, function: "SpecializedFunction") -> None:
        """Drop the sites' variants traced into ``function`` (it will not run again)."""
        with self._lock:
            for site in self._sites.values():
                for key in [k for k, v in site.variants.items() if v.owner is function]:
                    del site.variants[key]
        function.variants = []
        if self.running is function:
            self.running = None

    def _arm_variant_if_wanted(self, site, variant) -> None:
        hook = self._hook
        session = hook.session
        if session.saving_step and session.enabled and hook._step_active:
            if variant.owner is not None:
                variant.mode = self._owned_mode(variant)
                site.armed = site.armed or variant.mode != OFF
                return
            mode = variant.mode_for(session.plans.select(variant.names), session.plans.version)
            if mode != OFF:
                with tf.init_scope():
                    variant.flag.assign(mode)
                variant.mode = mode
                site.armed = True

    def collect(self, extra: Sequence[Tuple[str, object]] = ()) -> None:
        """At the end of a step: record what armed variants copied in this step, and
        ``extra`` ``(name, eager tensor)`` pairs read earlier in the step (the tracked variables).

        A REDUCE variant's reductions come from one eager read of its vector, and go to the
        session as they are (:meth:`StepInbox.record_reduced`). Everything
        else (``extra``, COPY variants, the WHOLE tensors of REDUCE variants) is read by one
        call of a cached :class:`.step_reader.StepReader`, which reads those stashes and counters and
        computes their reductions; its reductions and counters come to the host in one
        transfer. Only tensors the step needs whole stay tensors. A name in ``extra`` is
        taken from there, not from a variant that also holds it (a site may copy a weight
        that was read when the step began: the read is the step's first value). A variant
        whose counter did not pass the count last seen did not run in this step: nothing
        of it is recorded.
        """
        hook = self._hook
        session = hook.session
        with self._lock:
            sites = [s for s in self._sites.values() if s.armed]
        if not session.saving_step or not (sites or extra):
            return
        variants = [v for site in sites for v in list(site.variants.values()) if v.mode != OFF]
        extra_names = tuple(name for name, _ in extra)
        items, reduced, counts = [], [], {}
        for variant in variants:
            if variant.mode == REDUCE and variant.vector is not None:
                count, complete, partial = variant.read_reduced(session.plans.select(variant.names), extra_names, session)
                if count > variant.seen:
                    if complete is not None:
                        reduced.append(complete)
                    items += partial
                    counts[id(variant)] = count
        in_reader = tuple(v for v in variants if v.mode == COPY or v.whole)
        if in_reader or extra:
            from_extra, per_variant = self._read_stashes(in_reader, extra, extra_names)
            items += from_extra
            for variant, count, values in per_variant:
                if count > variant.seen:
                    items += values
                    counts[id(variant)] = max(count, counts.get(id(variant), 0))
        for variant in variants:
            variant.seen = max(variant.seen, counts.get(id(variant), 0))
        for site in sites:
            site.fresh = tuple(v for v in site.variants.values() if id(v) in counts)
        for block, values in reduced:
            session.inbox.record_reduced(block, values)
        if items:
            session.inbox.record_many(items, session.backend)

    def _read_stashes(self, variants, extra, extra_names):
        """The reader's part of :meth:`collect`: the ``extra`` items, and per variant
        ``(variant, count, [(name, value)])`` of what the step needs from it."""
        hook = self._hook
        session = hook.session
        n_extra = len(extra)
        names = extra_names + tuple(name for v in variants for name in v.names)
        selected = session.plans.select(names)  # [(index, plan)] of the names saved now, cached by the core
        modes = tuple(v.mode for v in variants)
        key = (tuple(map(id, variants)), modes, names, tuple((tuple(t.shape), t.dtype) for _, t in extra))
        entry = self._readers.get(key)
        if entry is None or entry[0] is not selected:
            # What each tensor needs decides the reader: (reductions, whole tensor), None if unwanted.
            needs = [None] * len(names)
            in_extra = set(extra_names)
            # A REDUCE variant's stash holds its WHOLE tensors only (the rest is in its vector).
            skipped, index = set(), n_extra
            for v in variants:
                if v.mode == REDUCE:
                    skipped.update(index + i for i, entry in enumerate(v.layout) if entry is not WHOLE)
                index += len(v.names)
            for index, plan in selected:
                if index < n_extra or (names[index] not in in_extra and index not in skipped):
                    needs[index] = (plan.reductions, plan.needs_host)
            reader = entry[1] if entry is not None and entry[1].needs == needs else None
            if reader is None:
                if len(self._readers) > 32:  # configurations keep changing: do not grow forever
                    self._readers.clear()
                reader = StepReader(variants, [t for _, t in extra], needs)
            # The entry holds ``selected``: its identity says the plans did not change.
            entry = self._readers[key] = (selected, reader)
        counts, values = entry[1]([t for _, t in extra])
        from_extra = [(name, value) for name, value in zip(extra_names, values) if value is not None]
        out, start = [], n_extra
        for variant, count in zip(variants, counts):
            stop = start + len(variant.names)
            out.append((variant, count, [(name, value) for name, value in zip(variant.names, values[start:stop])
                                         if value is not None]))
            start = stop
        return from_extra, out

    def disarm_all(self) -> None:
        with self._lock:
            sites = list(self._sites.values())
        for site in sites:
            for variant in list(site.variants.values()):
                if variant.mode != OFF:
                    if variant.flag is not None:
                        try:
                            variant.flag.assign(OFF)
                        except Exception:  # noqa: BLE001 - best effort while disabling
                            pass
                    variant.mode = OFF
            site.armed = False
        self.running = None

    def _warn_once(self, key, message, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)


class SpecializedFunction:
    """A compiled step function traced for one kind of step (see :mod:`.keras_functions`).

    ``saves`` is None for steps that save nothing: the sites add nothing to its graph.
    Otherwise (the names of the collections its steps save) its sites reduce and copy,
    with no flag, what the plans of the step it was traced in asked for (REDUCE, always).
    Calling it calls ``function`` with the capture knowing which function that is, so a
    trace (the first call, or a retrace for new input shapes) builds the right sites.
    ``called`` and ``offered`` (a site offered tensors while it traced) tell whether the
    graph has sites at all.
    """

    __slots__ = ("function", "saves", "variants", "called", "offered", "_capture", "__weakref__")

    def __init__(self, capture: GraphCapture, function, saves):
        self.function = function
        self.saves = saves
        self.variants: list = []  # the variants traced into this function
        self.called = self.offered = False
        self._capture = capture

    def __call__(self, *args, **kwargs):
        capture = self._capture
        previous, capture.tracing_for = capture.tracing_for, self
        try:
            return self.function(*args, **kwargs)
        finally:
            capture.tracing_for = previous
            self.called = True


def _new_stash(usable) -> list:
    """A variable per tensor for its whole value (the shape it was traced with, or any)."""
    stash = []
    for _, _, shape, dtype in usable:
        if shape is not None:
            stash.append(_plain_variable(lambda: tf.zeros(shape, dtype)))
        else:
            stash.append(_plain_variable(lambda: tf.zeros([0], dtype), shape=tf.TensorShape(None)))
    return stash


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
