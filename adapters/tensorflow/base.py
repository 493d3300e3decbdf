"""What every TensorFlow hook shares: identity, tensor backend, capture plumbing.

:class:`TFHookBase` is the core :class:`smdebug.Hook` with

* TensorFlow's collections and naming (``framework = "tensorflow"``; reduction tags keep
  ``:0``; weights and biases are assigned by variable type, so the ``biases`` regex of the
  profile is replaced by the names of the bias variables the hook finds);
* the worker identity of :mod:`.distributed` (Horovod, ``TF_CONFIG``, MirroredStrategy);
* :class:`~.backend.TFBackend` for TensorFlow values (numpy for anything else);
* optional graph capture (:mod:`.capture`): sites are armed when a step begins and read
  when it ends;
* ``tracked`` variables (model weights, optimizer state), read at the start of a step
  that saves them, that is before that step's update, unless a capture site copies them
  inside the step before the update (:meth:`TFHookBase._delivered_by_sites`).
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Tuple

from smdebug.capture.arguments import HookArguments
from smdebug.capture.backend import NumpyBackend, TensorBackend
from smdebug.collections import CollectionKeys, FrameworkProfile
from smdebug.capture.contract import Worker
from smdebug.hook import Hook
from smdebug.logger import get_logger

from . import distributed

logger = get_logger("smdebug.tensorflow")


#: No names: returned by _delivered_by_sites when every tracked variable is read at step begin.
NO_NAMES: frozenset = frozenset()


def tensorflow_loaded() -> bool:
    return "tensorflow" in sys.modules


class TFHookBase(Hook):
    """Base of the TensorFlow hooks (not used directly)."""

    framework = "tensorflow"
    # Weights are found by variable type, not by name (docs/format.md 8.4).
    profile = FrameworkProfile(
        "tensorflow",
        {CollectionKeys.BIASES: (r"^(?!gradient).*bias",), CollectionKeys.GRADIENTS: (r"^gradient",)},
        (CollectionKeys.METRICS, CollectionKeys.LOSSES, CollectionKeys.SM_METRICS),
        extra_collections=(CollectionKeys.WEIGHTS, CollectionKeys.INPUTS, CollectionKeys.OUTPUTS,
                           CollectionKeys.LAYERS, CollectionKeys.OPTIMIZER_VARIABLES, CollectionKeys.SCALARS,
                           CollectionKeys.SEARCHABLE_SCALARS),
        strip_output_index_in_reduction_tags=False,
    )

    #: The capture sites of graphs (capture.py), or None; a subclass sets it before this
    #: constructor runs.
    _capture: Any = None  # a GraphCapture or EagerCapture; not imported: they import this module

    def __init__(self, *args, **kwargs):
        # True while a step begins from inside a graph (tf.py_function): there, Python is not
        # ordered with the graph's variable updates, so variables are read by the graph.
        self._graph_driven = False
        # name -> variable, recorded at the start of a step that saves them.
        self._tracked: Dict[str, object] = {}
        self._tracked_names: Optional[tuple] = None  # tuple(self._tracked), kept for the core's select()
        # (name, value) of tracked variables read when this step began, recorded when it ends
        # with the captured tensors: their reductions then take the same single call.
        self._step_reads: List[Tuple[str, object]] = []
        self._unread_names: Optional[tuple] = None  # (delivered names, tracked names, the rest)
        arguments = HookArguments(*args, **kwargs)
        self._identity: Worker = distributed.from_environment()
        if self._identity.world_size == 1 and tensorflow_loaded():
            mirrored = self._identity_from_current_strategy()
            if mirrored is not None:
                self._identity = mirrored
                arguments = arguments.replace(include_workers=self._one_writer_for_devices(arguments.include_workers))
        super().__init__(arguments)
        # docs/format.md 8.4: TensorFlow assigns biases by variable type, not by regex; a regex would
        # also catch optimizer slots such as "adam/dense_bias_momentum".
        biases = self.session.collection_manager.get(CollectionKeys.BIASES)
        if biases.include_regex == tuple(self.profile.regexes.get(CollectionKeys.BIASES, ())):
            biases.include_regex = []

    # --- identity and backend (the adapter callbacks) ------------------------------------
    @staticmethod
    def _one_writer_for_devices(include_workers: str) -> str:
        # The hook writes one worker's files per process; the devices of a MirroredStrategy
        # would each need their own (include_workers="all" is not supported there yet).
        if include_workers == "all":
            logger.warning("smdebug: include_workers='all' is not supported with MirroredStrategy; saving the "
                           "first replica only (include_workers='one')")
        return "one"

    def _identity_from_current_strategy(self):
        try:
            import tensorflow as tf

            if tf.distribute.has_strategy():
                return distributed.mirrored_identity(tf.distribute.get_strategy())
        except Exception:  # noqa: BLE001 - no strategy to read: a single worker
            return None
        return None

    def worker(self) -> Worker:
        return self._identity

    def make_backend(self) -> TensorBackend:
        if tensorflow_loaded():
            from .backend import TFBackend

            return TFBackend()
        return NumpyBackend()

    def _adopt_strategy(self, strategy) -> None:
        """Take the worker name of a MirroredStrategy met after construction (before any write)."""
        identity = distributed.mirrored_identity(strategy)
        session = self.session
        if identity is None or identity.name == session.worker_name:
            return
        if not session.adopt_worker(identity, self._one_writer_for_devices(session.include_workers)):
            logger.warning("smdebug: the model uses %s but the hook already wrote as %s; keeping that name",
                           type(strategy).__name__, session.worker_name)
            return
        self._identity = identity

    # --- steps -----------------------------------------------------------------------
    @property
    def _step_active(self) -> bool:
        """A step is open and capture is on: the session's state, not kept a second time here."""
        session = getattr(self, "session", None)  # None while the session is being built
        return session is not None and session.step_open and session.enabled

    def on_mode_change(self, mode) -> None:
        """A step still open (its tensors captured by a graph) is finished first."""
        if self._step_active:
            self.end_step()

    def on_step_begin(self, saving: bool) -> None:
        if self._capture is not None:
            try:
                self._choose_graphs()
                self._capture.arm()
            except Exception as exc:  # noqa: BLE001 - fail-open, with a message naming the step
                self.disable(f"arming capture sites: {type(exc).__name__}: {exc}")
                return
        if saving and self._tracked and not self._graph_driven:
            self._record_tracked()

    def on_step_end(self) -> None:
        """Read what the capture sites copied in this step (and the variables read when it began)."""
        reads, self._step_reads = self._step_reads, []
        if self._capture is not None and self._step_active:
            with self.guard("reading captured tensors"):
                self._capture.collect(reads)

    def _record_tracked(self) -> None:
        names = self._tracked_names
        if names is None:
            names = self._tracked_names = tuple(self._tracked)
        delivered = self._delivered_by_sites()
        if delivered:
            # The same frozenset object at every step: the filtered tuple (and the core's
            # selection cached for it) is reused.
            cached = self._unread_names
            if cached is None or cached[0] is not delivered or cached[1] is not names:
                cached = self._unread_names = (delivered, names, tuple(n for n in names if n not in delivered))
            names = cached[2]
        wanted = [(names[i], self._tracked[names[i]]) for i, _ in self.session.plans.select(names)]
        if wanted:
            values = self._read_variables([var for _, var in wanted])
            if self._capture is not None:
                self._step_reads = [(name, value) for (name, _), value in zip(wanted, values)]
            else:
                for (name, _), value in zip(wanted, values):
                    self.session.inbox.record(name, value)

    def _choose_graphs(self) -> None:
        """Once the core decided what this step saves, before the sites are armed: choose
        the compiled functions the step runs (the KerasHook's specialized step functions)."""

    def _delivered_by_sites(self) -> frozenset:
        """Tracked names that a capture site will copy in this step before it changes them
        (not read when the step begins); subclasses decide, the default is none."""
        return NO_NAMES

    def _read_variables(self, variables):
        """Snapshots of the variables' current values (subclasses read them in one call)."""
        return [self._host_or_tensor(v) for v in variables]

    def _host_or_tensor(self, value):
        """The value as the backend takes it (subclasses convert non-TensorFlow tensors)."""
        return value

    def _track(self, name: str, var, collection: Optional[str]) -> None:
        """Save ``var`` as ``name`` (in ``collection``) at the start of steps that save it."""
        if collection is not None:
            coll = self.session.collection_manager.get(collection)
            if name not in coll.tensor_names:
                coll.add_tensor_name(name)
        if self._tracked.get(name) is not var:
            self._tracked[name] = var
            self._tracked_names = None

    def on_disabled(self, reason: str) -> None:
        self._step_reads = []
        if self._capture is not None:
            try:
                self._capture.disarm_all()
            except Exception:  # noqa: BLE001 - already disabled: nothing more to undo
                pass

    def on_close(self) -> None:
        """Graphs that keep running capture nothing more."""
        if self._capture is not None:
            self._capture.disarm_all()

    def collection_object(self, collection, obj) -> None:
        """``coll.add(variable or tensor)``: kept until the model or graph is known, then named."""
        collection.framework_objects.append(obj)

    def _is_included(self, name: str, home: Optional[str] = None) -> bool:
        """Whether tensor ``name`` would be saved in some mode (its home collection or a regex)."""
        if self.session.save_all:
            return True
        included = set(self.session.include_collections)
        if home is not None and home in included:
            return True
        return any(c.name in included for c in self.session.collection_manager.collections_for(name))
