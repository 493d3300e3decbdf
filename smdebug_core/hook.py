"""The user-facing hook: a thin facade over the step session it owns.

``smd.Hook`` (numpy values, custom loops) and every framework's hook (``smdebug.pytorch.Hook``,
``KerasHook``, ``SessionHook``, ...) are :class:`Hook`. A hook

* is the **adapter** of its session (``smdebug.capture.contract.Adapter``): it names its framework,
  makes its tensor backend, says which worker it is, and reacts to the session's few step
  events. ``Hook`` implements them for numpy values; a framework's hook overrides those it
  needs and builds its own state *before* ``Hook.__init__`` builds the session;
* **owns** a :class:`~smdebug.capture.session.StepSession` (``hook.session``), built from the hook
  arguments (``smdebug.capture.arguments.HookArguments``, their one definition), which holds the
  run's state and machinery. Adapters drive it through its declared surface
  (``smdebug.capture.contract.SessionSurface``);
* forwards the **public API** below to it, explicitly (what users and rules call).
"""
from __future__ import annotations

import atexit
import os
import weakref
from typing import Dict, List, Optional, Type, TypeVar, cast

from . import config as cfg
from .environment import smdebug_enabled
from .capture.arguments import HookArguments, takes_hook_arguments
from .capture.backend import NumpyBackend, TensorBackend
from .collections import NUMPY_PROFILE, Collection, CollectionManager, FrameworkProfile, describe_object
from .capture.contract import Worker
from .exceptions import ConfigError, OutDirError
from .save_config import SaveConfig
from .reduction_config import ReductionConfig
from .capture.inbox import StepInbox
from .capture.session import StepSession
from .capture.session_parts import RunCollections

__all__ = ["Hook", "takes_hook_arguments", "get_hook", "set_hook", "del_hook"]


def _doc_of(method):
    """The session's docstring on the hook's method that forwards to it (one text, one place)."""
    def wrap(fn):
        fn.__doc__ = method.__doc__
        return fn

    return wrap


def _session_view(name: str, doc: str) -> property:
    """A read-only view of the session's attribute ``name`` on the hook."""
    return property(lambda self: getattr(self._session, name), doc=doc)


#: A hook class's own type: its constructors give instances of the class they are called on.
AnyHook = TypeVar("AnyHook", bound="Hook")


@takes_hook_arguments
class Hook:
    """Captures tensors during training and writes them in the smdebug format.

    Usable directly with numpy values in custom loops (``hook.begin_step()``,
    ``hook.record(name, value)``, ``hook.save_scalar(...)``); each framework's hook is a
    ``Hook`` that adapts its framework.

    ``smd.Hook``'s own keyword-only arguments, for a job of several processes that you start
    yourself: ``rank`` and ``world_size`` say which worker this process is; it writes as
    ``worker_<rank>`` (with ``include_workers="all"`` every worker writes into the run, else
    only rank 0). Default: ``$RANK`` and ``$WORLD_SIZE`` (what torchrun and most launchers
    set, and what the PyTorch hook reads), else a single worker. A framework's hook takes its
    worker from its framework.
    """

    #: The framework's name (in messages and the run's metadata); adapters override.
    framework = "numpy"
    #: Default regexes, collections saved by default, default save interval; adapters
    #: declare their framework's (``smdebug.collections.FrameworkProfile``).
    profile: FrameworkProfile = NUMPY_PROFILE
    #: The JSON config file the hook was made from (create_from_json_file); "" otherwise.
    _config_source: str = ""

    def __init__(self, *args, rank: Optional[int] = None, world_size: Optional[int] = None, **kwargs):
        if (rank is not None or world_size is not None) and type(self).worker is not Hook.worker:
            raise ConfigError(f"rank and world_size are arguments of smd.Hook (numpy values); {type(self).__name__} "
                              f"reads its worker from {self.framework}: leave them out")
        self._numpy_worker = _numpy_worker(rank, world_size) if type(self).worker is Hook.worker else None
        # A framework's hook may pass the arguments it already parsed (and narrowed).
        if len(args) == 1 and not kwargs and isinstance(args[0], HookArguments):
            arguments = args[0]
        else:
            arguments = HookArguments(*args, **kwargs)
        self._session = StepSession(self, arguments)
        _register_hook(self)
        if self._session.recorder is not None:
            from .capture.flight_recorder import watch_uncaught_exceptions

            watch_uncaught_exceptions(self)
        atexit.register(_close_at_exit, weakref.ref(self))

    # --- the adapter callbacks (smdebug.capture.contract.Adapter), for numpy values -------------------
    def worker(self) -> Worker:
        """This process's worker: ``rank`` and ``world_size`` given to ``smd.Hook``, else ``$RANK``
        and ``$WORLD_SIZE``, else a single process; adapters ask their framework."""
        return self._numpy_worker or Worker.numbered(0, 1)

    def make_backend(self) -> TensorBackend:
        return NumpyBackend()

    def collection_object(self, collection: Collection, obj) -> None:
        """``coll.add(obj)`` with something other than a tensor name. Adapters that can name
        their framework's objects override this; here it is a clear error, not a no-op."""
        raise ConfigError(
            f"cannot add {describe_object(obj)} to collection {collection.name!r}: this hook takes "
            "tensor names and regexes (strings); to save a value you computed, call "
            f"hook.save_tensor('<name>', value, {collection.name!r}) at each step")

    def on_step_begin(self, saving: bool) -> None:
        """Nothing to arm: numpy values are offered by the user."""

    def on_step_end(self) -> None:
        """Nothing held outside the session: numpy values are recorded when offered."""

    def on_mode_change(self, mode) -> None:
        """Nothing depends on the mode outside the session."""

    def on_close(self) -> None:
        """Nothing installed in a framework to remove."""

    def on_disabled(self, reason: str) -> None:
        """Nothing to detach: the numpy hook installs nothing in a framework."""

    def on_step_failed(self) -> None:
        """Nothing to abandon: the numpy hook starts no collective work."""

    # --- the session -------------------------------------------------------------------
    @property
    def session(self) -> StepSession:
        """The step session this hook owns (what adapters and integrations drive)."""
        return self._session

    enabled = _session_view("enabled", "False once the hook disabled itself (fail-open) or was closed by a failure.")
    out_dir = _session_view("out_dir", "The run directory (a local spool when the run goes to a URL).")
    out_url = _session_view("out_url", "The run's URL when it is written remotely, else None.")
    tensorboard_dir = _session_view("tensorboard_dir", "Where TensorBoard files go, or None.")
    dry_run = _session_view("dry_run", "Whether the hook only logs what it would save.")
    include_workers = _session_view("include_workers", "``'one'`` or ``'all'``: which workers write.")
    save_all = _session_view("save_all", "Whether every tensor is saved (the ``all`` collection).")
    worker_name = _session_view("worker_name", "This worker's name in the run's files.")
    rank = _session_view("rank", "This worker's rank.")
    world_size = _session_view("world_size", "The number of workers.")
    is_chief = _session_view("is_chief", "Whether this is worker 0.")
    writes_files = _session_view("writes_files", "Whether this worker writes the run's files.")
    global_step = _session_view("global_step", "The current global step (-1 before the first).")
    mode = _session_view("mode", "The current mode (``smd.modes``).")
    mode_step = _session_view("mode_step", "The current step of the current mode.")
    stop_reason = _session_view("stop_reason", "Why training was asked to stop, or None.")
    stop_requested = _session_view("stop_requested", "Whether a rule (or ``request_stop``) asked training to stop.")
    flight_recorder = _session_view("flight_recorder", "The flight recorder's configuration, or None.")

    @property
    def save_config(self) -> SaveConfig:
        """The default SaveConfig of the hook's collections."""
        return cast(SaveConfig, self._session.save_config)  # HookArguments made it one

    @property
    def reduction_config(self) -> ReductionConfig:
        """The default ReductionConfig of the hook's collections."""
        return self._session.reduction_config

    @property
    def collection_manager(self) -> CollectionManager:
        """Every collection of this hook (``get_collection`` is the usual way in)."""
        return self._session.collection_manager

    @property
    def include_collections(self) -> List[str]:
        """Names of the collections saved (framework defaults, then the hook arguments' and
        those given to ``save_tensor``)."""
        return self._session.include_collections

    # --- configuration -------------------------------------------------------------------
    def get_collection(self, name: str) -> Collection:
        """The named collection, created (matching nothing yet) if it does not exist."""
        return self._session.collection_manager.get(name)

    def get_collections(self) -> Dict[str, Collection]:
        """All collections, keyed by name."""
        return dict(self._session.collection_manager.collections)

    def add_collection(self, collection: Collection) -> None:
        """Add a :class:`Collection` you built (or replace the one of its name), as in 1.0.34.
        It is saved when it is included (``include_collections``, or its name given to
        ``save_tensor``)."""
        if not isinstance(collection, Collection):
            raise ConfigError(f"add_collection takes a smdebug Collection (smd.Collection(name)), got "
                              f"{type(collection).__name__}: {collection!r}; to add tensors to a collection by "
                              "name, use hook.get_collection(name).add(...)")
        self._session.collection_manager.add(collection)

    def add_to_collection(self, collection_name: str, args) -> None:
        """``get_collection(collection_name).add(args)``."""
        self.get_collection(collection_name).add(args)

    @classmethod
    def create_from_json_file(cls: Type[AnyHook], json_file_path: Optional[str] = None, **overrides) -> AnyHook:
        """A hook configured by a JSON file (``SMDEBUG_CONFIG_FILE_PATH`` when no path is given).

        Keyword arguments override values from the file. ``HookParameters`` may hold
        ``"overwrite": true`` to replace a previous run in ``LocalPath``.
        """
        settings = cfg.load_hook_settings(json_file_path)
        made = _made_from_config
        if not overrides and isinstance(made, cls) and made is _current_hook and not made._session.closed and \
                os.path.abspath(made._config_source) == os.path.abspath(settings.source):
            # Zero code change already made this config's hook (at the script's Trainer or
            # optimizer); a 1.0.34 script asking for it afterwards gets that one, so that one
            # hook, the one it sets modes on, writes the run.
            return made
        kwargs = {**settings.hook_kwargs, **overrides}
        try:
            hook = cls(out_dir=kwargs.pop("out_dir", settings.out_dir), **kwargs)
        except OutDirError as exc:
            if "already holds a run" not in str(exc):
                raise
            raise OutDirError(f"{exc}. This hook is configured by {settings.source}: add \"overwrite\": true to "
                              "its HookParameters to replace the previous run, or point LocalPath at a new "
                              "directory") from None
        for name in settings.apply_collections(hook.collection_manager):
            hook.session.include(name)
        hook._config_source = settings.source
        return hook

    @_doc_of(RunCollections.json)
    def collections_json(self) -> bytes:
        return self._session.collections.json()

    @_doc_of(RunCollections.seen_tensor_names)
    def seen_tensor_names(self) -> List[str]:
        return self._session.collections.seen_tensor_names()

    # --- steps and values ------------------------------------------------------------------
    @_doc_of(StepSession.set_mode)
    def set_mode(self, mode) -> None:
        self._session.set_mode(mode)

    @_doc_of(StepSession.begin_step)
    def begin_step(self, step: Optional[int] = None) -> bool:
        return self._session.begin_step(step)

    def end_step(self) -> None:
        """Finish the current step (optional: the next ``begin_step`` or ``close`` does it).
        Its values are reduced and written off the training thread."""
        self._session.end_step()

    @_doc_of(StepInbox.record)
    def record(self, name: str, value, backend: Optional[TensorBackend] = None) -> bool:
        return self._session.inbox.record(name, value, backend)

    @_doc_of(StepSession.save_tensor)
    def save_tensor(self, tensor_name: str, tensor_value, collections_to_write="default") -> None:
        self._session.save_tensor(tensor_name, tensor_value, collections_to_write)

    @_doc_of(StepSession.save_scalar)
    def save_scalar(self, name: str, value, sm_metric: bool = False, timestamp: Optional[float] = None) -> None:
        self._session.save_scalar(name, value, sm_metric=sm_metric, timestamp=timestamp)

    # --- rules, stopping, the flight recorder -------------------------------------------------
    def add_rule(self, rule, actions=None, **kwargs):
        """Evaluate ``rule`` live on the values this hook saves, in a background thread.

        ``actions`` (e.g. ``smdebug.rules.StopTraining()``) run when the rule triggers.
        Returns the live evaluator (``.wait()``, ``.results``).
        """
        from .analysis.rules.live import attach_rule

        return attach_rule(self, rule, actions=actions, **kwargs)

    def add_step_listener(self, listener) -> None:
        """Call ``listener(StepValues)`` after every saved step, on the training thread.

        Listeners must return quickly (hand the values to their own thread); an exception
        in a listener is logged once and the listener removed. Live rules use this.
        """
        self._session.listeners.add(listener)

    def remove_step_listener(self, listener) -> None:
        self._session.listeners.remove(listener)

    def add_sink(self, sink) -> None:
        """Forward what this hook saves to ``sink`` at each saved step, e.g.
        ``hook.add_sink(smd.sinks.WandbSink())`` or ``smd.sinks.MlflowSink()`` (off the training
        thread; ``hook.close()`` closes it). Any object with ``on_step(FinishedStep)`` that
        returns quickly (and an optional ``close()``) is a sink."""
        self._session.added_sinks.add(sink)

    @_doc_of(StepSession.request_stop)
    def request_stop(self, reason: str) -> None:
        self._session.request_stop(reason)

    @_doc_of(StepSession.dump_flight_recorder)
    def dump_flight_recorder(self, reason: str = "requested", trigger: str = "manual") -> Optional[dict]:
        return self._session.dump_flight_recorder(reason, trigger)

    def record_early_stopping(self, **record) -> None:
        """Record, as part of the run, the early-stopping mechanism that ended (or watched)
        training: ``framework``, ``mechanism``, ``monitor`` (the metric's tensor name),
        ``mode`` (min/max), ``patience``, ``best_step`` (global), ``best_pass``, ``best_value``,
        ``stopped_step``, ``passes_after_best``, ``stopped`` (it ended training). Adapters
        call it; the rules read it (``trial.early_stopping()``). Written by the chief only."""
        session = self._session
        if session.enabled and session.writes_files and session.is_chief:
            from .storage.run_files import write_early_stopping

            with session.guard("record_early_stopping"):
                write_early_stopping(session.out_dir, record)

    def step_failed(self) -> None:
        """An exception left the training step on this worker. Adapters whose capture needs
        every worker's part (collectives) start no more of it for this step: the other
        workers may never reach them. Step owners (trainer callbacks) call it from their
        trainers' exception events."""
        self._session.step_failed()

    # --- fail-open policy and lifecycle ------------------------------------------------------
    @_doc_of(StepSession.guard)
    def guard(self, where: str):
        return self._session.guard(where)

    @_doc_of(StepSession.disable)
    def disable(self, reason: str, already_reported: bool = False) -> None:
        self._session.disable(reason, already_reported)

    @_doc_of(StepSession.flush)
    def flush(self, timeout: Optional[float] = None) -> bool:
        return self._session.flush(timeout)

    def close(self) -> None:
        """Flush the last step, write the collections file and the end-of-training marker."""
        self._session.close()
        _unregister_hook(self)

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, Exception):
            self.step_failed()
            if self._session.recorder is not None:
                # An exception escaped the training loop inside ``with hook:``.
                self.dump_flight_recorder(f"{type(exc).__name__}: {exc}", trigger="exception")
        self.close()
        return False

    def _on_uncaught_exception(self, exc: BaseException) -> None:
        """The process is about to end with ``exc`` (sys.excepthook): write the recorder's
        steps, then finish the run's files (atexit would too, but later and only if it runs)."""
        if isinstance(exc, Exception) and not self._session.closed:
            self.step_failed()
            self.dump_flight_recorder(f"uncaught {type(exc).__name__}: {exc}", trigger="exception")
            self.close()

    def __repr__(self):
        s = self._session
        return (f"<{type(self).__name__} out_dir={s.out_dir!r} worker={s.worker_name} "
                f"step={s.global_step} mode={s.mode.name} collections={s.include_collections}>")


def _close_at_exit(hook_ref: "weakref.ref[Hook]") -> None:
    hook = hook_ref()
    if hook is not None:
        hook.close()


def _numpy_worker(rank, world_size) -> Worker:
    """The worker of a ``smd.Hook``: the arguments, else ``$RANK``/``$WORLD_SIZE``, checked
    (ConfigError naming the value and where it came from)."""
    import os

    given = rank is not None or world_size is not None
    where = "rank={!r}, world_size={!r}".format(rank, world_size)
    if not given:
        rank, world_size = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
        if rank is None and world_size is None:
            return Worker.numbered(0, 1)
        where = f"environment variables RANK={rank!r}, WORLD_SIZE={world_size!r}"
        try:
            rank, world_size = int(rank or 0), int(world_size or 1)
        except ValueError:
            raise ConfigError(f"{where}: both must be integers; or pass smd.Hook(..., rank=, world_size=)") from None
    rank = 0 if rank is None else rank
    world_size = rank + 1 if world_size is None else world_size
    if not (isinstance(rank, int) and isinstance(world_size, int) and not isinstance(rank, bool)
            and not isinstance(world_size, bool) and 0 <= rank < world_size):
        raise ConfigError(f"{where}: a worker's rank must be an integer with 0 <= rank < world_size "
                          "(rank 0 of 1 for a single process)")
    return Worker.numbered(rank, world_size)


# --- the process-wide current hook (zero-code-change and get_hook) -------------------------
_current_hook: Optional[Hook] = None
# The hook get_hook(create_if_not_exists=True) made from the JSON config (zero code change makes
# it so); Hook.create_from_json_file returns it rather than make a second hook of the same run.
_made_from_config: Optional[Hook] = None


def _register_hook(hook: Hook) -> None:
    global _current_hook
    _current_hook = hook


def _unregister_hook(hook: Hook) -> None:
    global _current_hook
    if _current_hook is hook:
        _current_hook = None


def set_hook(hook: Hook) -> None:
    """Make ``hook`` the process's hook, the one ``get_hook()`` returns (1.0.34's name)."""
    if not isinstance(hook, Hook):
        raise ConfigError(f"set_hook takes a smdebug hook (e.g. smdebug.pytorch.Hook), got {hook!r}")
    _register_hook(hook)


def del_hook() -> None:
    """Forget the process's hook: ``get_hook()`` returns None (or, asked to, creates a new one
    from the JSON config) until another hook is constructed. The hook itself is not closed."""
    global _current_hook
    _current_hook = None


def get_hook(hook_class: Type[AnyHook] = Hook,  # type: ignore[assignment]  # mypy: a TypeVar default
             json_config_path: Optional[str] = None,
             create_if_not_exists: bool = False) -> Optional[AnyHook]:
    """The hook of this process: the last one constructed, else (optionally) one from the JSON config.

    Returns None when ``USE_SMDEBUG`` disables smdebug or no config file exists.
    """
    if not smdebug_enabled():
        return None
    if _current_hook is not None and isinstance(_current_hook, hook_class):
        return _current_hook
    if not create_if_not_exists:
        return None
    try:
        hook = hook_class.create_from_json_file(json_config_path)
    except FileNotFoundError:
        return None
    global _made_from_config
    _made_from_config = hook
    return hook

