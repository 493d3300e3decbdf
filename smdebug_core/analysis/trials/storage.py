"""File access for trials, behind one small class per storage kind.

The trial only needs a handful of operations (list a directory, read small files, read a
byte range of an event file, check that a file exists): :class:`LocalStorage` for a
directory (local_storage.py), :class:`RemoteStorage` for ``s3://`` and other fsspec URLs
(remote_storage.py). Paths given to them are relative to the run directory (paths.py).
"""
from __future__ import annotations

import os

from .local_storage import LocalStorage
from .remote_storage import RemoteStorage

__all__ = ["open_storage", "LocalStorage", "RemoteStorage"]


def open_storage(path: str):
    """The storage for a trial path: a local directory, or a URL (``file://`` is local)."""
    from ...storage import remote

    if remote.is_url(path):
        if remote.scheme(path) == "file":
            return LocalStorage(os.path.abspath(remote.split_url(path)[1] or "/"))
        return RemoteStorage(path)
    return LocalStorage(os.path.abspath(os.path.expanduser(path)))
