"""What every framework instrumentor shares (zero-code-change, see zero_code_change.py).

An instrumentor replaces a few framework attributes (``xgboost.train``,
``keras.Model.fit``, ``gluon.Trainer.__init__``, ...) with wrappers that attach the hook
configured by ``SMDEBUG_CONFIG_FILE_PATH``. :class:`Patches` remembers what was replaced so
``uninstrument()`` restores it exactly; :func:`configured_hook` gets that hook.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, List, Tuple

from .exceptions import SMDebugError
from .logger import get_logger

logger = get_logger("smdebug.zero_code_change")

_INHERITED = object()  # the owner did not define the attribute itself
_warned: set = set()


class Patches:
    """Attributes replaced by wrappers, and how to put each one back."""

    def __init__(self):
        self.lock = threading.RLock()
        self._saved: Dict[Tuple[object, str], object] = {}
        self._wrappers: Dict[int, object] = {}

    def __bool__(self) -> bool:
        return bool(self._saved)

    def replace(self, owner, name: str, wrap: Callable) -> None:
        """Set ``owner.name`` to ``wrap(current value)``; one wrapper per distinct original.

        The same function often sits under several names (``xgboost.train`` and
        ``xgboost.training.train``): each name is restored on its own, all share a wrapper.
        """
        current = getattr(owner, name)
        self._saved[(owner, name)] = vars(owner).get(name, _INHERITED)
        wrapper = self._wrappers.get(id(current))
        if wrapper is None:
            wrapper = self._wrappers[id(current)] = wrap(current)
        setattr(owner, name, wrapper)

    def restore(self) -> None:
        """Put every replaced attribute back (an inherited one is deleted again)."""
        for (owner, name), original in self._saved.items():
            if original is _INHERITED:
                if name in vars(owner):
                    delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._saved.clear()
        self._wrappers.clear()

    def names(self) -> List[str]:
        return [f"{getattr(owner, '__name__', owner)}.{name}" for owner, name in self._saved]


def configured_hook(get_hook: Callable, framework: str, **kwargs):
    """The hook an instrumentor attaches (created from the JSON config), or None.

    A configuration mistake (malformed JSON, an out_dir that cannot be used) raises: the
    user asked for debugging and should know now. Any other failure warns once per
    framework and training runs without the hook.
    """
    try:
        return get_hook(create_if_not_exists=True, **kwargs)
    except SMDebugError:
        raise
    except Exception as exc:  # noqa: BLE001 - never stop training for the debugger's sake
        if framework not in _warned:
            _warned.add(framework)
            logger.warning("smdebug: could not create the %s hook (%s: %s); training runs without it",
                           framework, type(exc).__name__, exc)
        return None
