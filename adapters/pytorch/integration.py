"""What the trainer integrations (``smdebug.lightning``, ``smdebug.transformers``) share.

A trainer callback does not subclass the PyTorch hook: it drives one. It owns the step
boundaries (:meth:`smdebug.pytorch.Hook.own_steps`), because the trainer, not the model's
forward pass, knows where an optimizer step begins and ends. This module holds the parts
both callbacks need, defined once:

* :class:`HookSource`: which hook a callback drives (one given, one made from the PyTorch
  hook's arguments or from a JSON config, or the environment's zero-code-change config),
  checked when the callback is constructed and built when the trainer sets up (after a
  distributed launcher started the process, so the rank and worker name are right);
* :class:`StepDriver`: begin a step in a mode (TRAIN steps numbered like the trainer's
  global step), take the loss and the logged metrics, and report stop requests;
* :func:`scalar_items`: the numeric values of a trainer's metrics dict;
* :class:`CallbackHook`: the part of a DebuggerCallback that holds its hook (arguments,
  built once, the active driver);
* :class:`TrainerInstrumentor`: zero code change for a trainer: its constructor is wrapped
  so that every trainer built gets a callback (each integration says which class and how).
"""
from __future__ import annotations

import functools
import inspect
import numbers
import os
from typing import Dict, List, Optional, Tuple

import torch

from smdebug import config as cfg
from smdebug.environment import smdebug_enabled
from smdebug.collections import CollectionKeys
from smdebug.exceptions import ConfigError
from smdebug.hook import get_hook as _core_current_hook
from smdebug.hook import set_hook
from smdebug.capture.instrumentation import Instrumentor, configured_hook
from smdebug.logger import get_logger
from smdebug.modes import ModeKeys

from .hook import Hook, get_hook

logger = get_logger("smdebug.pytorch")

#: The tensor a step's training loss is saved as (in the ``losses`` collection).
LOSS_TENSOR = "loss"
LOSSES = CollectionKeys.LOSSES
_HOOK_PARAMETERS = frozenset(inspect.signature(Hook.__init__).parameters) - {"self"}


class HookSource:
    """Where a trainer callback's hook comes from, checked at once and built at set-up.

    Exactly one of: ``hook`` (an ``smdebug.pytorch.Hook`` you made), ``json_config_path``
    (a hook JSON config), or the PyTorch hook's keyword arguments (``out_dir=...`` and any
    of ``save_config``, ``reduction_config``, ``include_regex``, ``include_collections``,
    ``save_all``, ``include_workers``, ``export_tensorboard``, ``tensorboard_dir``,
    ``dry_run``, ``overwrite``). With none of them, the process's hook configured by
    ``SMDEBUG_CONFIG_FILE_PATH`` (zero code change): a bad or missing config then logs one
    warning and training runs without capture.
    """

    def __init__(self, owner: str, hook: Optional[Hook] = None, json_config_path=None, **hook_kwargs):
        self.owner = owner
        unknown = sorted(set(hook_kwargs) - _HOOK_PARAMETERS)
        if unknown:
            raise ConfigError(f"{owner} DebuggerCallback: unknown argument(s) {', '.join(map(repr, unknown))}; it "
                              f"takes hook=, json_config_path= or the PyTorch hook's arguments "
                              f"({', '.join(sorted(_HOOK_PARAMETERS))})")
        given = [name for name, present in (("hook", hook is not None), ("json_config_path", json_config_path is not None),
                                            ("hook arguments", bool(hook_kwargs))) if present]
        if len(given) > 1:
            raise ConfigError(f"{owner} DebuggerCallback: give one of hook=, json_config_path= or the hook's "
                              f"arguments (out_dir=...), got {' and '.join(given)}")
        if hook is not None and not isinstance(hook, Hook):
            raise ConfigError(f"{owner} DebuggerCallback: hook must be an smdebug.pytorch.Hook, got {hook!r}")
        if hook_kwargs and hook_kwargs.get("out_dir") is None:
            raise ConfigError(f"{owner} DebuggerCallback: out_dir is required with the hook's arguments "
                              f"(got {', '.join(sorted(hook_kwargs))} without it)")
        if json_config_path is not None:
            if not isinstance(json_config_path, (str, os.PathLike)):
                raise ConfigError(f"{owner} DebuggerCallback: json_config_path must be a path, got "
                                  f"{json_config_path!r}")
            json_config_path = os.fspath(json_config_path)
            cfg.load_hook_settings(json_config_path)  # a missing or malformed file fails here, named
        if hook_kwargs:
            _check_hook_arguments(hook_kwargs)
        self.hook, self.json_config_path, self.hook_kwargs = hook, json_config_path, hook_kwargs

    def build(self) -> Optional[Hook]:
        """The hook (made now, once the process knows its rank), or None (no usable config)."""
        if self.hook is not None:
            return self.hook
        if self.hook_kwargs:
            return Hook(**self.hook_kwargs)
        if self.json_config_path is not None:
            return Hook.create_from_json_file(self.json_config_path)
        hook = configured_hook(get_hook, self.owner)  # a bad config has warned
        if hook is None and smdebug_enabled() and not os.environ.get(cfg.CONFIG_FILE_ENV):
            logger.warning("smdebug: %s DebuggerCallback() has nothing to write to: give it out_dir=... (or "
                           "json_config_path=...), or set %s; training runs without capture", self.owner,
                           cfg.CONFIG_FILE_ENV)
        return hook


def _check_hook_arguments(kwargs: dict) -> None:
    """Run the hook's own checks on ``kwargs`` now (a dry run writes and starts nothing).

    One definition of what a valid argument is: the hook's constructor. The process's
    current hook is left as it was.
    """
    previous = _core_current_hook(Hook)
    try:
        Hook(**{**kwargs, "dry_run": True}).close()
    finally:
        if previous is not None:
            set_hook(previous)


def scalar_items(metrics: Optional[dict]) -> List[Tuple[str, float]]:
    """``(name, value)`` for each number (Python, numpy or one-element tensor) in ``metrics``."""
    items = []
    for name, value in (metrics or {}).items():
        if not isinstance(name, str) or not name:
            continue
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                continue
            value = value.detach().item()
        elif isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        items.append((name, float(value)))
    return items


class StepDriver:
    """Drives an owned :class:`smdebug.pytorch.Hook` from a trainer's callbacks.

    TRAIN steps are numbered like the trainer's global step (its count of optimizer
    steps): the TRAIN mode step of the step taken before optimizer step ``n`` is ``n``.
    EVAL and PREDICT steps are one batch each. The global step counts all steps of all
    modes, as for every smdebug hook.
    """

    def __init__(self, hook: Hook, owner: str):
        self.hook = hook
        self.session = hook.session  # modes, step counters, what the step saves
        hook.own_steps(owner)
        hook.get_collection(LOSSES).add_tensor_name(LOSS_TENSOR)
        self.open: Optional[Tuple[ModeKeys, Optional[int]]] = None  # (mode, trainer step) of the open step
        self._wants_loss = False
        self._loss: Optional[torch.Tensor] = None
        self._averaged = 0  # micro-batch losses added with averaged=True in the open step
        self._seen_metrics: Dict[str, object] = {}  # name -> the value object last saved

    @property
    def active(self) -> bool:
        return self.session.enabled

    def begin(self, mode: ModeKeys, trainer_step: Optional[int] = None, log_scalars: bool = False) -> None:
        """Start a step in ``mode`` (TRAIN: the one before optimizer step ``trainer_step``);
        ``log_scalars``: its loss is wanted as a scalar whatever the save config."""
        hook, session = self.hook, self.session
        if session.mode is not mode:
            hook.set_mode(mode)
        if mode is ModeKeys.TRAIN and trainer_step is not None:
            session.continue_mode_steps(ModeKeys.TRAIN, trainer_step)  # a resumed run: TRAIN steps go on from there
        self._loss, self._averaged = None, 0
        hook.begin_step()
        self.open = (mode, trainer_step)
        # Most steps want no loss: no tensor op then (the default config's cost).
        self._wants_loss = log_scalars or LOSSES in session.saving_collections

    def is_open(self, mode: ModeKeys, trainer_step: Optional[int] = None) -> bool:
        return self.open == (mode, trainer_step)

    def add_loss(self, loss, weight: float = 1.0, averaged: bool = False) -> None:
        """Add a micro-batch's loss, times ``weight`` (its share of the step), to the step's.
        ``averaged``: the step's loss is the mean of such losses over the micro-batches it
        ran (their number, known when it ends: an epoch's last step may run fewer)."""
        if self._wants_loss and isinstance(loss, torch.Tensor) and loss.numel() == 1:
            loss = loss.detach().float()
            if weight != 1.0:
                loss = loss * weight
            self._loss = loss if self._loss is None else self._loss + loss
            self._averaged += averaged

    def finish(self, metrics: Optional[dict], log_scalars: bool) -> None:
        """The step's work is done: save its loss (when the step saves) and, with
        ``log_scalars``, the loss and the metrics whose values changed, as scalars."""
        hook, loss = self.hook, self._loss
        if loss is not None and self._averaged > 1:
            loss = loss / self._averaged
        self._loss, self._averaged = None, 0
        if loss is not None and self.session.saving_step:
            hook.record(LOSS_TENSOR, loss.reshape(()))
        if not log_scalars:
            return
        if loss is not None and self.open is not None:
            hook.save_scalar(f"{self.open[0].name.lower()}/{LOSS_TENSOR}", float(loss))
        self.save_metrics(metrics)

    def save_metrics(self, metrics: Optional[dict], only_changed: bool = True) -> None:
        """Save the metrics as scalars in the open step. With ``only_changed`` (a trainer's
        running dict of the last logged values, such as Lightning's ``callback_metrics``),
        only the entries logged anew since last saved: a new value object (trainers store a
        new tensor per logging call), however equal to the last one."""
        if not metrics:
            return
        seen = self._seen_metrics
        if only_changed:
            metrics = {name: value for name, value in metrics.items() if seen.get(name) is not value}
        seen.update(metrics)  # keeping them keeps their ids from being reused
        for name, value in scalar_items(metrics):
            self.hook.save_scalar(name, value)

    def end(self) -> None:
        """End the open step (its files are written in the background)."""
        if self.open is not None:
            self.open = None
            self.hook.end_step()

    def close(self) -> None:
        self.open = None
        self.hook.close()


def loss_of(outputs) -> Optional[torch.Tensor]:
    """The loss in a training/validation step's output: the tensor itself, or ``outputs["loss"]``."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, dict):
        value = outputs.get("loss")
        return value if isinstance(value, torch.Tensor) else None
    value = getattr(outputs, "loss", None)  # a transformers ModelOutput
    return value if isinstance(value, torch.Tensor) else None



class TrainerInstrumentor(Instrumentor):
    """Zero code change for a trainer: ``Trainer.__init__`` is wrapped so that, once a
    trainer is built, :meth:`add_callback` gives it a DebuggerCallback (the hook configured
    by ``SMDEBUG_CONFIG_FILE_PATH``) through the trainer's public callback list, unless the
    script added one itself. The callback owns the process's PyTorch hook, so the PyTorch
    instrumentor captures nothing itself: one hook per process. A failure to add it is one
    warning; the script runs on uncaptured."""

    def trainer_class(self) -> type:  # pragma: no cover - every integration overrides it
        raise NotImplementedError

    def add_callback(self, trainer) -> None:  # pragma: no cover - every integration overrides it
        raise NotImplementedError

    def install(self) -> None:
        self._warned = False
        self.patches.replace(self.trainer_class(), "__init__", self._wrap_init)

    def _wrap_init(self, original):
        instrumentor = self

        @functools.wraps(original)
        def __init__(trainer, *args, **kwargs):
            original(trainer, *args, **kwargs)
            try:
                instrumentor.add_callback(trainer)
            except Exception as exc:  # noqa: BLE001 - zero code change never stops a script
                if not instrumentor._warned:
                    instrumentor._warned = True
                    logger.warning("smdebug: zero code change could not add its callback to the %s Trainer; "
                                   "training runs without capture: %s: %s", instrumentor.framework,
                                   type(exc).__name__, exc)

        return __init__


def is_distributed() -> bool:
    """Whether this process is one rank of several in a torch.distributed job."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class StopVote:
    """Whether to stop, agreed by every rank of a torch.distributed job.

    A trainer must stop all its ranks at the same optimizer step: a rank that stops alone
    leaves the others waiting in their next collective (gloo: they fail; NCCL: they hang),
    and a rule or a stop request may reach one rank only. Each optimizer step every rank
    calls this once with its own verdict: it starts a non-blocking all-reduce (max) of it on
    a gloo group of its own (CPU: no device sync) and returns the previous step's result, so
    training does not wait for it and every rank stops at the same step, one step after the
    first asked. One process: the verdict itself, at once.
    """

    def __init__(self):
        self._group = None
        self._pending = None  # (work, flag) of the vote in flight
        self._broken = False

    def __call__(self, mine: bool) -> bool:
        if self._broken or not is_distributed():
            return mine
        dist = torch.distributed
        try:
            if self._group is None:  # every rank gets here at the same step: a collective call
                self._group = dist.new_group(backend="gloo")
            decided = False
            if self._pending is not None:
                work, flag = self._pending
                work.wait()
                decided = bool(flag.item())
            flag = torch.tensor([1 if mine else 0], dtype=torch.int32)
            self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True), flag)
            return decided
        except Exception as exc:  # noqa: BLE001 - the hook never stops training
            self._broken = True
            logger.warning("smdebug: the ranks cannot agree on stopping (%s: %s); each rank acts on its own stop "
                           "requests from now on", type(exc).__name__, exc)
            return mine


class CallbackHook:
    """Mixed into each trainer's DebuggerCallback (before the trainer's callback class): the
    hook it drives. Subclasses set ``OWNER`` (``"Lightning"``...).

    Constructor arguments: ``out_dir`` and the other keyword arguments of
    :class:`smdebug.pytorch.Hook` (checked here; the hook is made when the trainer sets
    up), or ``json_config_path`` (a hook JSON config), or ``hook`` (a hook you made: its
    steps become the callback's). With none of these, the hook configured by
    ``SMDEBUG_CONFIG_FILE_PATH`` is used (zero code change); without a usable config,
    training runs without capture (one warning).
    """

    OWNER = "a trainer"

    def __init__(self, out_dir=None, *, json_config_path=None, hook: Optional[Hook] = None, **hook_kwargs):
        if out_dir is not None:
            hook_kwargs["out_dir"] = out_dir
        self._source = HookSource(self.OWNER, hook=hook, json_config_path=json_config_path, **hook_kwargs)
        self._driver: Optional[StepDriver] = None
        self._built = False
        self._stop_vote = StopVote()

    @property
    def hook(self) -> Optional[Hook]:
        """The hook this callback drives (None before the trainer sets up, or without a config)."""
        return self._driver.hook if self._driver is not None else None

    def _build(self) -> None:
        """Make the hook, once (when the trainer sets up: the rank is known then)."""
        if not self._built:
            self._built = True
            hook = self._source.build()
            if hook is not None:
                self._driver = StepDriver(hook, self.OWNER)

    def _active(self) -> Optional[StepDriver]:
        driver = self._driver
        return driver if driver is not None and driver.active else None

    def _stop_agreed(self) -> bool:
        """Whether the trainer stops now, every rank agreeing (:class:`StopVote`). Called once
        per optimizer step on every rank, whatever the state of this rank's hook."""
        if self._driver is None:  # no hook on any rank (the same arguments everywhere)
            return False
        driver = self._active()
        stop = self._stop_vote(driver is not None and driver.hook.stop_requested)
        if stop and driver is not None and not driver.hook.stop_requested:
            driver.hook.request_stop("another rank of this job asked to stop")
        return stop

    def close(self) -> None:
        """Write the last step and finish the run's files (also done at interpreter exit)."""
        if self._driver is not None:
            self._driver.close()
