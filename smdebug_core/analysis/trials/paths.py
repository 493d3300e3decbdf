"""Paths and names inside a run directory, as the reader takes them: relative paths and the
directory entries the storages list, and worker names in file names.

Paths are ``/``-separated and relative to the run directory, as they appear in index files.
Untrusted relative paths (``event_file_name`` from an index file) are checked so that they
cannot point outside the run directory.
"""
from typing import NamedTuple

from ...storage.format.layout import deserialize_worker_name


def check_relpath(relpath: str) -> None:
    """ValueError unless ``relpath`` is a plain ``/``-separated path inside the run directory."""
    if (
        not relpath
        or relpath[0] == "/"
        or "\\" in relpath
        or "\x00" in relpath
        or "//" in relpath
        or relpath.endswith("/")
        or (".." in relpath and ".." in relpath.split("/"))
    ):
        raise ValueError(f"path {relpath!r} is not a plain relative path inside the run directory")


class DirEntry(NamedTuple):
    """One entry of a directory listing."""

    name: str
    is_dir: bool
    mtime_ns: int


def worker_from_name(raw: str) -> str:
    """The worker a collections or index file name stands for."""
    # TensorFlow MirroredStrategy workers are serialized device names, which always
    # start with "/" and so are stored starting with "_" (docs/format.md 1.2). Only those are
    # deserialized; the original's "'__' anywhere in the path" test is a known bug.
    return deserialize_worker_name(raw) if raw.startswith("_") else raw
