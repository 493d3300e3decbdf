"""Zero-code-change: instrument an unmodified training script from the environment.

How it starts
    The installed package puts ``smdebug_zero_code_change.pth`` in site-packages. Python
    runs its single line at every interpreter start; that line only reads
    ``SMDEBUG_CONFIG_FILE_PATH`` and, when it is set, imports this module. With the
    variable unset nothing else happens: no import, no patch. Importing this module *is*
    the bootstrap (it calls :func:`bootstrap`), so a ``sitecustomize.py`` or the first
    line of a launcher can do the same with ``import smdebug.capture.zero_code_change``.

What it does
    :func:`bootstrap` returns at once when ``USE_SMDEBUG`` is 0/false/no/off. Otherwise
    :func:`install` puts an import watcher first in ``sys.meta_path``. When the script
    imports a module named in :data:`INSTRUMENTORS` (``torch``, ``tensorflow``,
    ``keras``, ``xgboost``, ``mxnet``, ``pytorch_lightning``, ``transformers.trainer``), the
    watcher lets the normal import run and, right after that module has finished executing,
    imports that
    framework's instrumentor (``smdebug.<framework>._instrument``) and calls its
    ``instrument()``. A framework imported before :func:`install` is instrumented at once.
    Instrumentors use only the frameworks' public hooks and callbacks; each creates its
    hook lazily from the JSON config (``get_hook(create_if_not_exists=True)``).

This module imports no framework. An instrumentor that is not installed is skipped;
one that fails logs a warning and training goes on uninstrumented.
"""
from __future__ import annotations

import importlib
import importlib.abc
import os
import sys
import threading
from typing import Dict, List, Optional

from ..config import CONFIG_FILE_ENV
from ..environment import smdebug_enabled
from ..logger import get_logger

logger = get_logger("smdebug.zero_code_change")

#: The entry-point group through which adapters declare their instrumentors: the entry
#: point's name is the framework's module (top-level, or a submodule), its value the instrumentor module (with
#: ``instrument()`` and ``uninstrument()``). Ours are declared in setup.cfg; a third-party
#: adapter declares its own the same way, and the core names none of them.
ENTRY_POINT_GROUP = "smdebug.instrumentors"

#: Framework module -> instrumentor module: the entry points, read at install(),
#: plus those added with register_instrumentor().
INSTRUMENTORS: Dict[str, str] = {}

_lock = threading.RLock()
_finder: Optional["_PostImportFinder"] = None
_instrumented: List[str] = []  # instrumentor modules whose instrument() ran, in order


def discover_instrumentors() -> Dict[str, str]:
    """Add the instrumentors declared in the ``smdebug.instrumentors`` entry-point group."""
    from importlib.metadata import entry_points

    try:
        found = entry_points(group=ENTRY_POINT_GROUP)
    except TypeError:  # Python 3.9: a dict of groups
        found = entry_points().get(ENTRY_POINT_GROUP, [])
    for entry in found:
        INSTRUMENTORS.setdefault(entry.name, entry.value)
    return INSTRUMENTORS


def register_instrumentor(framework_module: str, instrumentor_module: str) -> None:
    """Instrument ``framework_module`` with ``instrumentor_module`` when it is imported."""
    INSTRUMENTORS[framework_module] = instrumentor_module
    if _finder is not None and framework_module in sys.modules:
        _instrument(framework_module)


def bootstrap() -> None:
    """Entry point of the ``.pth`` file (and of a ``sitecustomize``): install unless disabled."""
    try:
        if not os.environ.get(CONFIG_FILE_ENV):
            return
        if not smdebug_enabled():
            logger.info("smdebug: USE_SMDEBUG disables zero-code-change instrumentation")
            return
        install()
    except Exception as exc:  # noqa: BLE001 - a bad environment must not stop the interpreter
        logger.warning("smdebug: zero-code-change instrumentation not installed: %s: %s", type(exc).__name__, exc)


def install() -> None:
    """Watch imports and instrument each supported framework once it is imported."""
    global _finder
    with _lock:
        if _finder is None:
            discover_instrumentors()
            _finder = _PostImportFinder()
            sys.meta_path.insert(0, _finder)
        for framework in list(INSTRUMENTORS):
            if framework in sys.modules:
                _instrument(framework)


def uninstall() -> None:
    """Stop watching imports and call ``uninstrument()`` of every instrumentor that ran."""
    global _finder
    with _lock:
        if _finder is not None:
            try:
                sys.meta_path.remove(_finder)
            except ValueError:
                pass
            _finder = None
        while _instrumented:
            name = _instrumented.pop()
            module = sys.modules.get(name)
            if module is None:
                continue
            try:
                module.uninstrument()
            except Exception as exc:  # noqa: BLE001 - a broken instrumentor costs its own undoing only
                logger.warning("smdebug: %s.uninstrument() failed: %s: %s", name, type(exc).__name__, exc)


def is_installed() -> bool:
    """Whether the import watcher is active in this process."""
    return _finder is not None


def instrumented() -> List[str]:
    """Instrumentor modules that have run, in order."""
    return list(_instrumented)


def _instrument(framework: str) -> None:
    target = INSTRUMENTORS.get(framework)
    if target is None:
        return
    with _lock:
        if target in _instrumented:
            return
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            if exc.name and (target == exc.name or target.startswith(exc.name + ".")):
                logger.debug("smdebug: no instrumentor %s for %s; skipped", target, framework)
                return
            logger.warning("smdebug: cannot load %s to instrument %s: %s", target, framework, exc)
            return
        except Exception as exc:  # noqa: BLE001 - an adapter that fails to load never breaks the user's import
            logger.warning("smdebug: cannot load %s to instrument %s: %s: %s", target, framework,
                           type(exc).__name__, exc)
            return
        try:
            module.instrument()
        except Exception as exc:  # noqa: BLE001 - instrumenting never breaks the user's import
            logger.warning("smdebug: instrumenting %s failed; training goes on without smdebug: %s: %s",
                           framework, type(exc).__name__, exc)
            return
        _instrumented.append(target)
        logger.info("smdebug: instrumented %s (zero-code-change, config %s)", framework,
                    os.environ.get(CONFIG_FILE_ENV))


class _InstrumentingLoader(importlib.abc.Loader):
    """Runs the framework's own loader, then its instrumentor."""

    def __init__(self, loader, framework: str):
        self._loader = loader
        self._framework = framework

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        try:
            self._loader.exec_module(module)
        finally:
            # Give the module its real loader back: nothing later sees this wrapper.
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._loader
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._loader
        _instrument(self._framework)

    def __getattr__(self, name):  # get_source, get_resource_reader, ... of the real loader
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of a watched module (a framework's top-level
    module, or a submodule such as ``transformers.trainer`` that its package imports lazily)."""

    def __init__(self):
        self._busy = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in INSTRUMENTORS or getattr(self._busy, "active", False):
            return None
        self._busy.active = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.active = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _InstrumentingLoader(spec.loader, fullname)
        return spec


# Importing this module is the bootstrap (see the module docstring).
bootstrap()
