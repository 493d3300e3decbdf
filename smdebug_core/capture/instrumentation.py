"""What every framework instrumentor shares (zero-code-change, see zero_code_change.py).

An instrumentor replaces a few framework attributes (``xgboost.train``,
``keras.Model.fit``, ``gluon.Trainer.__init__``, ...) with wrappers that attach the hook
configured by ``SMDEBUG_CONFIG_FILE_PATH``. :class:`Instrumentor` is the base each
adapter's instrumentor derives from (idempotent instrument/uninstrument under one lock,
the framework versions it supports); :class:`Patches` remembers what was replaced so
``uninstrument()`` restores it exactly (adapters use it too, for the per-object wrappers a
hook installs); :func:`configured_hook` gets that hook.
"""
from __future__ import annotations

import os
import re
import threading
import types
from typing import Callable, Dict, List, Optional, Tuple

from ..config import CONFIG_FILE_ENV
from ..exceptions import SMDebugError
from ..logger import get_logger

logger = get_logger("smdebug.zero_code_change")

_INHERITED = object()  # the owner did not define the attribute itself
_warned: set = set()


class Patches:
    """Attributes replaced by wrappers, and how to put each one back.

    Owners may be modules, classes or instances. On instances the attribute is set with
    ``object.__setattr__``, bypassing a framework's own ``__setattr__`` (Keras tracks what
    is assigned to a layer); restoring deletes an attribute the owner only inherited.
    """

    def __init__(self):
        self.lock = threading.RLock()
        # (id(owner), name) -> (owner, name, own value or _INHERITED); ids: owners may be unhashable
        self._saved: Dict[Tuple[int, str], Tuple[object, str, object]] = {}
        self._wrappers: Dict[int, object] = {}

    def __bool__(self) -> bool:
        return bool(self._saved)

    def has(self, owner, name: str) -> bool:
        return (id(owner), name) in self._saved

    def set(self, owner, name: str, value) -> None:
        """Set ``owner.name`` to ``value``, remembering what to restore."""
        own = getattr(owner, "__dict__", {}).get(name, _INHERITED)
        self._saved.setdefault((id(owner), name), (owner, name, own))
        _setter(owner)(owner, name, value)

    def replace(self, owner, name: str, wrap: Callable) -> None:
        """Set ``owner.name`` to ``wrap(current value)``; one wrapper per distinct original.

        The same function often sits under several names (``xgboost.train`` and
        ``xgboost.training.train``): each name is restored on its own, all share a wrapper
        (which keeps the original alive, so its id stays unique).
        """
        current = getattr(owner, name)
        wrapper = self._wrappers.get(id(current))
        if wrapper is None:
            wrapper = self._wrappers[id(current)] = wrap(current)
        self.set(owner, name, wrapper)

    def restore(self) -> None:
        """Put every replaced attribute back, newest first; a failure is logged, not raised."""
        for owner, name, original in reversed(list(self._saved.values())):
            try:
                if original is _INHERITED:
                    if name in getattr(owner, "__dict__", {}):
                        _deleter(owner)(owner, name)
                else:
                    _setter(owner)(owner, name, original)
            except Exception as exc:  # noqa: BLE001 - best effort, often at shutdown
                logger.warning("smdebug: could not restore %s.%s: %s", type(owner).__name__, name, exc)
        self._saved.clear()
        self._wrappers.clear()

    def names(self) -> List[str]:
        return [f"{getattr(owner, '__name__', type(owner).__name__)}.{name}" for owner, name, _ in self._saved.values()]


def _is_namespace(owner) -> bool:
    return isinstance(owner, (type, types.ModuleType))


def _setter(owner):
    return setattr if _is_namespace(owner) else object.__setattr__


def _deleter(owner):
    return delattr if _is_namespace(owner) else object.__delattr__


def configured_hook(get_hook: Callable, framework: str, **kwargs):
    """The hook an instrumentor attaches (created from the JSON config), or None.

    One fail-open policy for every framework: whatever goes wrong, a malformed config and
    an out_dir that cannot be used included, logs one warning that names the config file
    and the problem, and training runs without capture. Zero code change means the user's
    script was not written for the debugger: it must never be what stops it.
    """
    try:
        return get_hook(create_if_not_exists=True, **kwargs)
    except Exception as exc:  # noqa: BLE001 - never stop training for the debugger's sake
        source = os.environ.get(CONFIG_FILE_ENV) or "the default config path"
        # One warning per problem: two instrumentors of one process (Lightning's and
        # PyTorch's) meeting the same bad config say it once.
        problem = (source, type(exc).__name__, str(exc))
        if problem not in _warned:
            _warned.add(problem)
            what = "the config is not usable" if isinstance(exc, SMDebugError) else "the hook could not be created"
            logger.warning("smdebug: zero code change: %s (%s: %s); %s trains without tensor capture. "
                           "Fix %s (or unset %s) to capture.", what, type(exc).__name__, exc, framework, source,
                           CONFIG_FILE_ENV)
        return None


def _release(version: str) -> Tuple[int, ...]:
    """The leading numbers of a version string: "2.13.0+cpu" -> (2, 13, 0)."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


class Instrumentor:
    """Zero code change for one framework; an adapter's ``_instrument`` module holds one.

    Subclasses name the framework and the versions they were written for, and implement
    :meth:`install` (replace attributes through ``self.patches``, or set up whatever else
    they need) and, if they keep more state than patches, :meth:`remove` and
    :meth:`is_instrumented`. :meth:`instrument` and :meth:`uninstrument` are idempotent and
    serialized by one lock. A framework version outside the supported range is not
    instrumented: one warning says which versions are, and training runs uncaptured (the
    fail-open policy, as for a bad config).
    """

    #: For messages: "PyTorch", "XGBoost"...
    framework = "the framework"
    #: The installed distribution whose version is checked ("torch"), or None for no check.
    distribution: Optional[str] = None
    #: Supported versions: (first supported, first unsupported or None), compared on the
    #: leading numbers of the version.
    supported: Tuple[Tuple[int, ...], Optional[Tuple[int, ...]]] = ((0,), None)

    def __init__(self):
        self.patches = Patches()
        self._checked: Optional[bool] = None

    @property
    def lock(self):
        return self.patches.lock

    def is_instrumented(self) -> bool:
        """Whether :meth:`instrument` is in effect."""
        return bool(self.patches)

    def supports(self, version: str) -> bool:
        low, high = self.supported
        release = _release(version)
        return release >= low and (high is None or release < high)

    def supported_text(self) -> str:
        low, high = self.supported
        text = f">= {'.'.join(map(str, low))}"
        return text + (f", < {'.'.join(map(str, high))}" if high is not None else "")

    def _version_ok(self) -> bool:
        if self._checked is None:
            self._checked = True
            if self.distribution is not None:
                from importlib import metadata

                try:
                    version = metadata.version(self.distribution)
                except metadata.PackageNotFoundError:  # installed under another name: trust the import
                    return True
                if not self.supports(version):
                    self._checked = False
                    logger.warning("smdebug: zero code change supports %s %s; %s %s is installed, so this "
                                   "training runs without tensor capture", self.distribution, self.supported_text(),
                                   self.distribution, version)
        return self._checked

    def instrument(self) -> None:
        """Install the instrumentation (no-op when it is, or the version is unsupported)."""
        with self.lock:
            if self.is_instrumented() or not self._version_ok():
                return
            self.install()
            logger.debug("smdebug: instrumented %s: %s", self.framework, ", ".join(self.patches.names()) or "hooks")

    def uninstrument(self) -> None:
        """Undo :meth:`instrument` (no-op when not instrumented)."""
        with self.lock:
            self.remove()
            self.patches.restore()

    def install(self) -> None:  # pragma: no cover - every adapter overrides it
        raise NotImplementedError

    def remove(self) -> None:
        """Undo what :meth:`install` did beyond ``self.patches`` (restored afterwards)."""
