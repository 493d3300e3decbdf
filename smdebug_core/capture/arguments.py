"""The hook arguments, defined once: :class:`HookArguments` (their signature, checks and
docstring) and :func:`takes_hook_arguments`, which shows them on every user-facing hook
(``smd.Hook``, each framework's ``Hook``, ``KerasHook``, ``SessionHook``).

A hook's ``__init__(self, *args, <its own keyword-only arguments>, **kwargs)`` passes
``*args, **kwargs`` here; the step session (``session.py``) is built from the result.
"""
from __future__ import annotations

import dataclasses
import inspect
import os
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from ..storage import remote
from ..layouts import resolve_layout
from . import preemption
from .budget import resolve_budget
from ..collections import as_name_list
from ..exceptions import ConfigError
from ..flight_recorder_config import FlightRecorder
from ..reduction_config import ReductionConfig
from ..save_config import SaveConfig


@dataclass(frozen=True)
class HookArguments:
    """What every hook is configured with.

    Args:
        out_dir: run directory to write (must not already hold a run, unless ``overwrite``).
        export_tensorboard: also write TensorBoard scalars/histograms (to ``out_dir/tensorboard``
            unless ``tensorboard_dir`` is given).
        tensorboard_dir: where to write TensorBoard files (implies export_tensorboard).
        dry_run: decide and log what would be saved, write nothing.
        reduction_config: default ReductionConfig (None: save full tensors).
        save_config: default SaveConfig, or a dict of mode -> SaveConfigMode (None: every 500 steps).
        include_regex: regexes of tensor names to save (they go to the ``default`` collection).
        include_collections: names of collections to save, in addition to the framework's
            default-saved ones (one name may be given as a string). ``"all"`` saves every
            collection, as in the original library.
        save_all: save every tensor the adapter sees (the ``all`` collection).
        include_workers: ``"one"`` (the chief only) or ``"all"`` workers write.
        overwrite: remove a previous run's smdebug files from ``out_dir`` instead of refusing it.
        flight_recorder: a :class:`~smdebug.FlightRecorder` (or a dict of its arguments): keep
            the last N steps of its collections in memory whatever the save config, and write
            them when a captured tensor turns NaN or infinite, a rule's action asks, or an
            exception escapes the training step (docs/flight_recorder.md).
        flush_on_signals: the signals on which the steps that have ended are written before the
            signal takes its course (docs/faults.md): None (default) reads
            ``$SMDEBUG_FLUSH_ON_SIGNALS``, else SIGTERM; False for none; or names such as
            ``("SIGTERM", "SIGUSR1")``. A handler the program installed first still runs after.
        layout: how the run is stored: ``"store"`` (the default: statistics as Parquet rows,
            whole tensors in chunk files, docs/format.md 10) or ``"smdebug-1.0.34"`` (the files
            smdebug 1.0.34 and SageMaker's managed rules read). None reads ``$SMDEBUG_LAYOUT``;
            a JSON config at SageMaker's path defaults to ``"smdebug-1.0.34"``.
        overhead_budget: the share of step time the hook may add, a number in (0, 1) such as
            0.02 (or a dict ``{"fraction": 0.02, "max_factor": 64}``). The hook measures its own
            cost and saves the expensive collections (weights, gradients, full tensors, ...) every
            ``2**k`` times their configured interval, the smallest ``k`` that keeps within it;
            losses, metrics and scalars keep their interval (capture/budget.py). None (default)
            reads ``$SMDEBUG_OVERHEAD_BUDGET``; unset, the save configs are exact.
    """

    out_dir: object = None
    export_tensorboard: bool = False
    tensorboard_dir: Optional[str] = None
    dry_run: bool = False
    reduction_config: Optional[ReductionConfig] = None
    save_config: object = None
    include_regex: object = None
    include_collections: Optional[Sequence[str]] = None
    save_all: bool = False
    include_workers: str = "one"
    overwrite: bool = False
    flight_recorder: object = None
    flush_on_signals: object = None
    layout: Optional[str] = None
    overhead_budget: object = None

    def __post_init__(self):
        # Checked and normalized here, before the session touches the disk.
        out_dir = self.out_dir
        if out_dir is None:
            raise ConfigError("out_dir is required: the directory the run is written to")
        if not isinstance(out_dir, (str, os.PathLike)):
            raise ConfigError(f"out_dir must be a path, got {out_dir!r}")
        out_dir = os.fspath(out_dir).strip()
        if remote.is_url(out_dir) and remote.scheme(out_dir) == "file":
            out_dir = remote.split_url(out_dir)[1]
        for flag in ("export_tensorboard", "dry_run", "save_all", "overwrite"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if self.include_workers not in ("one", "all"):
            raise ConfigError(f"include_workers must be 'one' or 'all', got {self.include_workers!r}")
        if self.reduction_config is not None and not isinstance(self.reduction_config, ReductionConfig):
            raise ConfigError(f"reduction_config must be a ReductionConfig, got {self.reduction_config!r}")
        normalized = dict(
            out_dir=out_dir,
            save_config=SaveConfig.coerce(self.save_config),
            flight_recorder=FlightRecorder.coerce(self.flight_recorder),
            include_collections=tuple(as_name_list(self.include_collections, "include_collections")),
            include_regex=tuple(as_name_list(self.include_regex, "include_regex")),
            flush_on_signals=preemption.flush_signals(self.flush_on_signals),
            layout=_checked(resolve_layout, self.layout),
            overhead_budget=resolve_budget(self.overhead_budget),
        )
        for name, value in normalized.items():
            object.__setattr__(self, name, value)

    @property
    def out_url(self) -> Optional[str]:
        """The run's URL when ``out_dir`` is one (s3://, any fsspec URL), else None."""
        return remote.normalize_url(self.out_dir) if remote.is_url(self.out_dir) else None

    def replace(self, **changes) -> "HookArguments":
        """A copy with ``changes`` (an adapter narrowing what its framework cannot do)."""
        return dataclasses.replace(self, **changes)


def _checked(resolve, value):
    """``resolve(value)``, its ValueError a ConfigError (bad input fails at construction)."""
    try:
        return resolve(value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


#: The hook arguments' names, in their positional order.
ARGUMENT_NAMES: Tuple[str, ...] = tuple(f.name for f in dataclasses.fields(HookArguments))
_ARGS_DOC = HookArguments.__doc__.split("    Args:\n", 1)[1]


def takes_hook_arguments(cls):
    """Class decorator for a user-facing hook whose ``__init__`` is ``(self, *args, <its own
    keyword-only arguments>, **kwargs)`` and builds :class:`HookArguments` from ``*args,
    **kwargs``: shows the hook arguments on the class (``help()``, IDEs,
    ``inspect.signature``), followed by its own arguments, and adds their Args to its
    docstring."""
    init = cls.__init__
    core = inspect.signature(HookArguments)
    self_param = next(iter(inspect.signature(init).parameters.values()))
    own = [p for p in inspect.signature(init).parameters.values() if p.kind is p.KEYWORD_ONLY]
    init.__signature__ = core.replace(parameters=[self_param, *core.parameters.values(), *own])
    shared = "\n\n    Hook arguments (shared by every framework's hook):\n" + _ARGS_DOC
    cls.__doc__ = (cls.__doc__ or "").rstrip() + shared
    return cls
