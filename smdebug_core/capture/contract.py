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

from typing import NamedTuple, Optional, Protocol, Sequence, runtime_checkable

from .backend import TensorBackend
from ..collections import FrameworkProfile


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
class SessionSurface(Protocol):
    """What adapters (and integrations driving a hook) call on their session, ``hook.session``.

    Everything an adapter under ``adapters/`` uses is declared here
    (``tests/contract/test_hook_arguments.py`` checks their sources); the rest of
    :class:`~smdebug.capture.session.StepSession` is the core's own.
    """

    # -- steps and modes
    mode: object
    global_step: int
    step_open: bool
    step_mode: object

    def set_mode(self, mode) -> None: ...
    def continue_mode_steps(self, mode, next_step: int) -> None: ...
    def begin_step(self, step: Optional[int] = None) -> bool: ...
    def end_step(self) -> None: ...

    # -- what the open step saves (its plans)
    saving_step: bool
    saving_collections: frozenset
    step_saves_somewhere: bool
    plans_version: tuple

    def plan_for(self, name: str): ...
    def wants(self, name: str) -> bool: ...
    def select(self, names: tuple): ...
    def select_everywhere(self, names: tuple): ...
    def selection(self, names: tuple): ...

    # -- handing tensors over (references; reduced off the training thread)
    backend: TensorBackend

    def start_batch(self, selection, tensors: Sequence, backend): ...
    def record_batch(self, batch) -> None: ...
    def record(self, name: str, value, backend=None) -> bool: ...
    def record_many(self, items, backend=None) -> int: ...
    def record_planned(self, plan, value, backend) -> bool: ...
    def record_whatever_the_config(self, items) -> int: ...
    def note_placement(self, name: str, placement: dict) -> None: ...
    def submit_work(self, what: str, fn, *args): ...
    def discard(self, *refs) -> None: ...

    # -- values the adapter reduced itself
    def reduced_block(self, entries): ...
    def record_reduced(self, block, values) -> int: ...

    # -- collections and the worker
    collection_manager: object
    include_collections: list
    save_all: bool
    include_workers: str
    reduction_config: object
    worker_name: str

    def include(self, name: str, expect: bool = True) -> None: ...
    def nothing_to_save(self, collection: str, reason: str) -> None: ...
    def adopt_worker(self, worker: "Worker", include_workers: Optional[str] = None) -> bool: ...

    # -- the flight recorder
    flight_recorder: object
    recorder: object
    flight_recording: bool

    def set_step_probe(self, probe) -> None: ...

    # -- fail-open policy, stopping, the run's files
    enabled: bool
    stop_reason: Optional[str]
    stop_requested: bool

    def guard(self, where: str): ...
    def disable(self, reason: str, already_reported: bool = False) -> None: ...
    def request_stop(self, reason: str) -> None: ...
    def publish(self) -> None: ...
    def flush(self, timeout: Optional[float] = None) -> bool: ...
    def close(self) -> None: ...


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

    def on_step_end(self) -> None:
        """The open step is about to end (whoever ends it: the adapter, the next
        ``begin_step``, ``close``, the flight recorder): hand over what it still holds."""

    def on_disabled(self, reason: str) -> None:
        """The session disabled itself (fail-open): stop capturing in the framework."""

    def on_step_failed(self) -> None:
        """An exception left the training step: start no more work that needs every
        worker's part (collectives) for this step; keep what the failed step used."""


def _declared(protocol) -> tuple:
    return tuple(sorted({*protocol.__annotations__,
                         *(n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_"))}))


#: The names :class:`SessionSurface` and :class:`Adapter` declare.
SESSION_MEMBERS = _declared(SessionSurface)
ADAPTER_CALLBACKS = _declared(Adapter)


def check_adapter(adapter) -> None:
    """That ``adapter`` has every declared callback; TypeError naming those it lacks."""
    cls = type(adapter).__name__
    missing = [name for name in ADAPTER_CALLBACKS if not hasattr(adapter, name)]
    if missing:
        raise TypeError(f"{cls} is not a smdebug adapter: it lacks the callbacks {missing} "
                        "(smdebug.capture.contract.Adapter)")
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
