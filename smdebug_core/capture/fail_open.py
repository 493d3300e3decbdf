"""The fail-open policy, in one place: an error in capture disables capture with one warning
naming where it happened, and training goes on. ``KeyboardInterrupt`` and ``SystemExit`` are
the user's and pass through.

:func:`never_raises` guards a whole method of a session or of an adapter's hook (anything
with ``enabled`` and ``disable``); :class:`Guard` is the same as a context manager.
"""
from __future__ import annotations

import functools


def never_raises(where: str):
    """Decorator for entry points called from training: errors disable capture instead
    (the same policy as :meth:`StepSession.guard`, for a whole method). For methods of a
    session or of a hook (anything with ``enabled`` and ``disable``)."""

    def wrap(fn):
        @functools.wraps(fn)
        def guarded(self, *args, **kwargs):
            if not self.enabled:
                return None
            try:  # the guard's policy without making a guard: this runs several times a step
                return fn(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - never into training
                fail_open(self, where, exc)
                return None

        return guarded

    return wrap


class Guard:
    """``with session.guard(where):`` — the fail-open policy as a context manager."""

    __slots__ = ("session", "where")

    def __init__(self, session, where: str):
        self.session, self.where = session, where

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None or not isinstance(exc, Exception):
            return False  # KeyboardInterrupt and SystemExit are the user's, not ours: they pass
        fail_open(self.session, self.where, exc)
        return True  # the contract is to never break training


def fail_open(owner, where: str, exc: Exception) -> None:
    """The fail-open policy: the failing part (capture) is disabled with one warning naming
    ``where``; training goes on."""
    owner.disable(f"{where}: {type(exc).__name__}: {exc}")
