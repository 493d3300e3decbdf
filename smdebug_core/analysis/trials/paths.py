"""What the reader's storages share: paths inside a run directory and the entries they list.

Paths are ``/``-separated and relative to the run directory, as they appear in index files.
Untrusted relative paths (``event_file_name`` from an index file) are checked so that they
cannot point outside the run directory.
"""
from typing import NamedTuple


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

