"""The contract between the core and its adapters, declared in code (docs/architecture.md).

Two sides:

* :class:`SessionSurface`: what an adapter (or an integration that drives a hook, the
  trainer callbacks) calls on the :class:`~smdebug.capture.session.StepSession` its hook owns: step
  boundaries and modes, what to save this step, handing tensors over, reduced values, the
  guard, stop requests.
* :class:`Adapter`: what the session calls back on the adapter that owns it (its name and
  collections profile, a :class:`~smdebug.capture.backend.TensorBackend`, which worker this is,
  non-string collection members, and a few step events). :func:`check_adapter` runs when
  a session is constructed, so that an adapter that breaks the contract fails at once,
  naming what is wrong, instead of at its first saved step. ``TensorBackend`` is an ABC: a
  backend missing a required method cannot be made.
"""
from __future__ import annotations

import difflib
import inspect
from typing import Generic, NamedTuple, Optional, Protocol, Sequence, runtime_checkable

from .backend import TensorBackend
from ..collections import FrameworkProfile
from ..logger import get_logger

logger = get_logger()


class Worker(NamedTuple):
    """Which worker of the job this process writes as."""

    rank: int
    world_size: int
    name: str

    @classmethod
    def numbered(cls, rank: int, world_size: int) -> "Worker":
        """The usual name, ``worker_<rank>`` (docs/format.md 1.2)."""
        return cls(rank, world_size, f"worker_{rank}")


@runtime_checkable
class PlanSurface(Protocol):
    """What to save at the open step: ``session.plans`` (:class:`~smdebug.capture.plans.StepPlans`)."""

    #: Changes whenever a plan may answer differently: key what you derive from plans by it.
    version: tuple
    saving_collections: frozenset
    #: The collections saved at the open step by *some* worker (what collective capture follows).
    everywhere: frozenset

    def plan_for(self, name: str): ...
    def wants(self, name: str) -> bool: ...
    def select(self, names: tuple): ...
    def select_everywhere(self, names: tuple): ...
    def selection(self, names: tuple): ...


@runtime_checkable
class InboxSurface(Protocol):
    """Handing a step's tensors over: ``session.inbox`` (:class:`~smdebug.capture.inbox.StepInbox`)."""

    def start_batch(self, selection, tensors: Sequence, backend): ...
    def record_batch(self, batch) -> None: ...
    def record(self, name: str, value, backend=None) -> bool: ...
    def record_many(self, items, backend=None) -> int: ...
    def record_planned(self, plan, value, backend) -> bool: ...
    def note_placement(self, name: str, placement: dict) -> None: ...
    # values the adapter reduced itself
    def reduced_block(self, entries): ...
    def record_reduced(self, block, values) -> int: ...


@runtime_checkable
class StepDriver(Protocol):
    """The role of whatever owns the step boundaries: a trainer callback driving a hook, or
    an adapter's own hooks. Steps and modes, stopping, the fail-open policy, the run's files."""

    mode: object
    global_step: int
    mode_step: int
    step_open: bool
    step_mode: object
    enabled: bool
    stop_reason: Optional[str]
    stop_requested: bool

    def set_mode(self, mode, by_user: bool = True) -> None: ...
    def continue_mode_steps(self, mode, next_step: int) -> None: ...
    def begin_step(self, step: Optional[int] = None) -> bool: ...
    def end_step(self) -> None: ...
    def abandon_step(self) -> None: ...
    def guard(self, where: str): ...
    def disable(self, reason: str, already_reported: bool = False) -> None: ...
    def request_stop(self, reason: str) -> None: ...
    def publish(self) -> None: ...
    def flush(self, timeout: Optional[float] = None) -> bool: ...
    def close(self) -> None: ...


@runtime_checkable
class TensorCapture(Protocol):
    """The role of an adapter that captures tensors from the framework's own hooks (modules,
    variables, graphs): what the step saves, handing tensors over, collections, the
    worker, the flight recorder."""

    # -- what the open step saves
    plans: PlanSurface
    saving_step: bool
    saving_collections: frozenset
    step_saves_somewhere: bool

    # -- handing tensors over (references; reduced off the training thread)
    inbox: InboxSurface
    backend: TensorBackend

    def record_whatever_the_config(self, items) -> int: ...
    def submit_work(self, what: str, fn, *args): ...
    def discard(self, *refs) -> None: ...

    # -- collections and the worker
    collection_manager: object
    include_collections: list
    save_all: bool
    include_workers: str
    reduction_config: object
    worker_name: str
    world_size: int

    def include(self, name: str, expect: bool = True) -> None: ...
    def nothing_to_save(self, collection: str, reason: str) -> None: ...
    def adopt_worker(self, worker: "Worker", include_workers: Optional[str] = None) -> bool: ...

    # -- the flight recorder
    flight_recorder: object
    recorder: object
    flight_recording: bool

    def set_step_probe(self, probe) -> None: ...

    # -- the overhead budget (capture/budget.py): None without one
    budget: object

    def report_nonfinite(self, identity: tuple, tensors: list, where: Optional[dict] = None) -> None: ...


@runtime_checkable
class SessionSurface(StepDriver, TensorCapture, Protocol):
    """Everything adapters (and integrations driving a hook) may call on their session,
    ``hook.session``: the two roles together. ``tests/contract`` checks the adapters'
    sources against it; the rest of :class:`~smdebug.capture.session.StepSession` is the
    core's own."""


@runtime_checkable
class Adapter(Protocol):
    """What a :class:`~smdebug.capture.session.StepSession` calls on the adapter that owns it.

    ``smdebug.Hook`` implements every callback for plain numpy values; a framework's hook
    overrides those it needs. The session calls nothing else on its adapter.
    """

    #: The framework's name (messages, the run's metadata).
    framework: str
    #: Default regexes, collections saved by default, default save interval.
    profile: FrameworkProfile

    def worker(self) -> Worker:
        """This process's rank, world size and worker name (asked once, at construction)."""

    def make_backend(self) -> TensorBackend:
        """The backend of the framework's tensors (asked once, at construction)."""

    def collection_object(self, collection, obj) -> None:
        """``collection.add(obj)`` with something other than a tensor name (a module, a
        variable): name it, or raise ConfigError."""

    def on_step_begin(self, saving: bool) -> None:
        """A step has begun (``saving``: whether it saves anything here): arm the framework's
        capture for it. Not called while the session is disabled."""

    def on_step_end(self) -> None:
        """The open step is about to end (whoever ends it: the adapter, the next
        ``begin_step``, ``close``, the flight recorder): hand over what it still holds."""

    def on_mode_change(self, mode) -> None:
        """The user switches to ``mode`` (a ModeKeys); called before the session does."""

    def on_close(self) -> None:
        """The session has closed (its files are complete): release the framework's hooks."""

    def on_disabled(self, reason: str) -> None:
        """The session disabled itself (fail-open): stop capturing in the framework."""

    def on_step_failed(self) -> None:
        """An exception left the training step: start no more work that needs every
        worker's part (collectives) for this step; keep what the failed step used."""


def _declared(protocol) -> tuple:
    """The names a protocol declares, its bases' included."""
    names: set = set()
    for cls in protocol.__mro__:
        if cls in (Protocol, object, Generic):
            continue
        names.update(getattr(cls, "__annotations__", {}))
        names.update(n for n, v in vars(cls).items() if callable(v) and not n.startswith("_"))
    return tuple(sorted(names))


#: The names :class:`SessionSurface`, its parts and :class:`Adapter` declare.
SESSION_MEMBERS = _declared(SessionSurface)
PLAN_MEMBERS = _declared(PlanSurface)
INBOX_MEMBERS = _declared(InboxSurface)
ADAPTER_CALLBACKS = _declared(Adapter)
_CALLBACK_METHODS = tuple(n for n in ADAPTER_CALLBACKS if callable(getattr(Adapter, n, None)))


def check_adapter(adapter) -> None:
    """That ``adapter`` has every declared callback; TypeError naming those it lacks."""
    cls = type(adapter).__name__
    missing = [name for name in ADAPTER_CALLBACKS if not hasattr(adapter, name)]
    if missing:
        raise TypeError(f"{cls} is not a smdebug adapter: it lacks the callbacks {missing} "
                        "(smdebug.capture.contract.Adapter)")
    wrong = [f"{name}{_signature(getattr(adapter, name))} (declared {name}{_signature(getattr(Adapter, name), 1)})"
             for name in _CALLBACK_METHODS if not _takes_like(getattr(adapter, name), getattr(Adapter, name))]
    if wrong:
        raise TypeError(f"{cls} breaks the smdebug adapter contract: {'; '.join(wrong)} "
                        "(smdebug.capture.contract.Adapter)")
    _warn_misspelled_callbacks(type(adapter))
    if not isinstance(adapter.framework, str):
        raise TypeError(f"{cls}.framework must be the framework's name (a str), got {adapter.framework!r}")
    if not isinstance(adapter.profile, FrameworkProfile):
        raise TypeError(f"{cls}.profile must be a smdebug.collections.FrameworkProfile, got {adapter.profile!r}")


def check_worker(adapter, worker) -> Worker:
    """``adapter.worker()``'s answer, checked."""
    cls = type(adapter).__name__
    if not (isinstance(worker, tuple) and len(worker) == 3):
        raise TypeError(f"{cls}.worker() must return a smdebug.capture.contract.Worker(rank, world_size, name), "
                        f"got {worker!r}")
    rank, world, name = worker
    if not (isinstance(rank, int) and isinstance(world, int) and 0 <= rank < world):
        raise TypeError(f"{cls}.worker() must return (rank, world size, name) with 0 <= rank < world size, "
                        f"got ({rank!r}, {world!r})")
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls}.worker() must name the worker (a non-empty str), got {name!r}")
    return Worker(rank, world, name)


def check_backend(adapter, backend) -> TensorBackend:
    """``adapter.make_backend()``'s answer, checked."""
    if not isinstance(backend, TensorBackend):
        raise TypeError(f"{type(adapter).__name__}.make_backend() must return a smdebug.capture.backend.TensorBackend, "
                        f"got {type(backend).__name__}")
    return backend


def _signature(fn, drop: int = 0) -> str:
    """``(a, b)``: the parameter names, after the first ``drop``."""
    try:
        names = list(inspect.signature(fn).parameters)[drop:]
    except (TypeError, ValueError):
        return "(...)"
    return f"({', '.join(names)})"


def _takes_like(bound, declared) -> bool:
    """Whether the adapter's bound method accepts the declared callback's arguments."""
    try:
        sig = inspect.signature(bound)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check
        return True
    wanted = list(inspect.signature(declared).parameters)[1:]  # without self
    try:
        sig.bind(*wanted)
    except TypeError:
        return False
    return True


_warned_classes: set = set()


def _warn_misspelled_callbacks(cls) -> None:
    """One warning per class for a public ``on_*`` method that is no callback but nearly
    one's name (``on_step_ended``): it would never be called."""
    if cls in _warned_classes:
        return
    _warned_classes.add(cls)
    # A framework's own callbacks (Keras' on_test_begin) come from a base class that is no adapter.
    framework_names = {n for base in cls.__mro__ if not hasattr(base, "on_step_end") for n in vars(base)}
    for name in dir(cls):
        if not name.startswith("on_") or name in ADAPTER_CALLBACKS or name in framework_names \
                or not callable(getattr(cls, name, None)):
            continue
        close = difflib.get_close_matches(name, _CALLBACK_METHODS, n=1, cutoff=0.88)
        if close:
            logger.warning("smdebug: %s.%s is not an adapter callback and is never called; did you mean %s? "
                           "(smdebug.capture.contract.Adapter)", cls.__name__, name, close[0])

