"""Runs this process is writing, so that a reader in the same process sees every ended step.

1.0.34 wrote each step before training went on; here steps are finished and written off the
training thread, in batches. A Trial opened (or refreshed) in the process that trains would
then miss the last steps for a moment: the session registers its ``flush`` under its run's
locations, and the reader calls :func:`flush_before_reading` first. Readers in other
processes see what is on disk, as with 1.0.34.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Callable, Dict, List, Optional

from .remote import is_url, normalize_url

#: How long a reader waits for the writing hook at most (a stuck store must not stall it).
FLUSH_TIMEOUT_S = 10.0

_lock = threading.Lock()
_flushers: Dict[str, List[weakref.WeakMethod]] = {}


def _key(location: str) -> str:
    if is_url(location) and not location.startswith("file://"):
        return normalize_url(location)
    path = location[len("file://"):] if location.startswith("file://") else location
    return os.path.realpath(os.path.expanduser(path))


def register(locations, flush: Callable[[Optional[float]], object]) -> None:
    """``flush`` (a bound method: the registry does not keep its object alive) writes the
    run found at each of ``locations`` (a local directory, a URL)."""
    ref = weakref.WeakMethod(flush)
    with _lock:
        for location in {_key(loc) for loc in locations if loc}:
            _flushers.setdefault(location, []).append(ref)


def unregister(flush: Callable) -> None:
    with _lock:
        for key in list(_flushers):
            kept = [ref for ref in _flushers[key] if ref() is not None and ref() != flush]
            if kept:
                _flushers[key] = kept
            else:
                del _flushers[key]


def flush_before_reading(location: str, timeout: float = FLUSH_TIMEOUT_S) -> None:
    """Flush the hooks of this process that write ``location``. Not from smdebug's own
    threads (a live rule's thread waiting for the pipeline it runs on would wait forever)."""
    if not _flushers or threading.current_thread().name.startswith("smdebug"):
        return  # no hook writes in this process (a reader's): nothing to resolve
    with _lock:
        refs = list(_flushers.get(_key(location), ()))
    for ref in refs:
        flush = ref()
        if flush is not None:
            flush(timeout)
