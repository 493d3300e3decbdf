"""The contract between the core and its adapters, declared in code (docs/architecture.md).

Two sides:

* :class:`StepSession`: what an adapter, or an integration that drives a hook (the trainer
  callbacks), calls on its hook: step boundaries and modes, what to save this step, handing
  tensors over, reduced values, the guard, stop requests.
* What the core calls on an adapter: its :class:`~smdebug.backend.TensorBackend` (an ABC:
  a backend missing a required method cannot be made) and the hook's few framework
  callbacks, checked by :func:`check_adapter` when a hook is constructed, so that an
  adapter that breaks the contract fails at once, saying what is wrong, instead of at its
  first saved step.
"""
from __future__ import annotations

from typing import Optional, Protocol, Sequence, runtime_checkable

from .backend import TensorBackend
from .collections import FrameworkProfile


@runtime_checkable
class StepSession(Protocol):
    """What adapters call on their hook (``smdebug.Hook`` and every framework's hook)."""

    saving_step: bool

    def set_mode(self, mode) -> None: ...
    def begin_step(self, step: Optional[int] = None) -> bool: ...
    def end_step(self) -> None: ...
    def selection(self, names: Sequence[str]): ...
    def start_batch(self, selection, tensors: Sequence, backend=None): ...
    def record_batch(self, batch) -> None: ...
    def record(self, name: str, value, backend=None) -> bool: ...
    def reduced_block(self, entries): ...
    def record_reduced(self, block, values) -> None: ...
    def guard(self, where: str): ...
    def disable(self, reason: str) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


def check_adapter(hook) -> None:
    """Check what the core needs from ``hook``'s adapter; TypeError naming the problem."""
    cls = type(hook).__name__
    if not isinstance(getattr(hook, "framework", None), str):
        raise TypeError(f"{cls}.framework must be the framework's name (a str), got {hook.framework!r}")
    if not isinstance(hook.profile, FrameworkProfile):
        raise TypeError(f"{cls}.profile must be a smdebug.collections.FrameworkProfile, got {hook.profile!r}")
    if not isinstance(hook.backend, TensorBackend):
        raise TypeError(f"{cls}._make_backend() must return a smdebug.backend.TensorBackend, got "
                        f"{type(hook.backend).__name__}")
    rank, world = hook.rank, hook.world_size
    if not (isinstance(rank, int) and isinstance(world, int) and 0 <= rank < world):
        raise TypeError(f"{cls}._distributed_info() must return (rank, world size) with 0 <= rank < world size, "
                        f"got ({rank!r}, {world!r})")
    if not isinstance(hook.worker_name, str) or not hook.worker_name:
        raise TypeError(f"{cls}._worker_name() must return a non-empty str, got {hook.worker_name!r}")
    missing = [name for name in SESSION_MEMBERS if not hasattr(hook, name)]
    if missing:
        raise TypeError(f"{cls} lacks the StepSession members {missing}")


#: The names :class:`StepSession` declares.
SESSION_MEMBERS = tuple(sorted({*StepSession.__annotations__,
                                *(n for n, v in vars(StepSession).items() if callable(v) and not n.startswith("_"))}))
