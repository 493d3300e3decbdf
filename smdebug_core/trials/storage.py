"""File access for trials, behind one small class per storage kind.

The trial only needs a handful of operations (list a directory, read small files, read a
byte range of an event file, check that a file exists). Keeping them here means an
fsspec/S3 backend can be added later without touching the trial logic.

Paths given to these methods are ``/``-separated and relative to the run directory, as
they appear in index files. Untrusted relative paths (``event_file_name`` from an index
file) are checked so that they cannot point outside the run directory.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple


class DirEntry(NamedTuple):
    """One entry of a directory listing."""

    name: str
    is_dir: bool
    mtime_ns: int


class LocalStorage:
    """A run directory on the local file system.

    Event files are read with ``os.pread`` through a small LRU of open file descriptors,
    so reading many records of one file opens it once. ``stats`` counts file opens for
    tests and benchmarks.
    """

    def __init__(self, root: str, max_open_files: int = 32):
        self.root = root
        self._prefix = os.path.join(root, "")
        self._max_open = max(1, int(max_open_files))
        self._open_fds: "OrderedDict[str, int]" = OrderedDict()
        self._lock = threading.Lock()
        self.stats: Dict[str, int] = {"small_files_read": 0, "event_file_opens": 0, "event_reads": 0}

    def __repr__(self):
        return f"LocalStorage({self.root!r})"

    # --- paths ------------------------------------------------------------------------
    def local_path(self, relpath: str) -> str:
        """Absolute local path of ``relpath``; ValueError if it escapes the run directory."""
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
        return self._prefix + (relpath if os.sep == "/" else relpath.replace("/", os.sep))

    # --- metadata ---------------------------------------------------------------------
    def exists(self, relpath: str) -> bool:
        return os.path.exists(self.local_path(relpath))

    def is_dir(self, relpath: str = "") -> bool:
        return os.path.isdir(self.local_path(relpath) if relpath else self.root)

    def mtime_ns(self, relpath: str) -> Optional[int]:
        """Modification time of a file or directory, or None if it does not exist."""
        try:
            return os.stat(self.local_path(relpath)).st_mtime_ns
        except FileNotFoundError:
            return None

    def list_dir(self, relpath: str) -> List[DirEntry]:
        """Entries of a directory (unsorted); an empty list if it does not exist."""
        path = self.local_path(relpath) if relpath else self.root
        try:
            with os.scandir(path) as it:
                out = []
                for e in it:
                    is_dir = e.is_dir()
                    # scandir caches the stat for directories only when asked; files need none.
                    out.append(DirEntry(e.name, is_dir, e.stat().st_mtime_ns if is_dir else 0))
                return out
        except (FileNotFoundError, NotADirectoryError):
            return []

    # --- reading ----------------------------------------------------------------------
    def read_small_files(self, dir_relpath: str, names: Sequence[str]) -> List[Optional[bytes]]:
        """Whole contents of several files of one directory (None for a vanished file).

        Opens the directory once and each file relative to it, which keeps the per-file
        cost to three system calls: index files are many and tiny.
        """
        dir_fd = os.open(self.local_path(dir_relpath), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        out: List[Optional[bytes]] = []
        try:
            for name in names:
                try:
                    fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
                except FileNotFoundError:
                    out.append(None)
                    continue
                try:
                    chunks = []
                    while True:
                        chunk = os.read(fd, 1 << 16)
                        if not chunk:
                            break
                        chunks.append(chunk)
                    out.append(chunks[0] if len(chunks) == 1 else b"".join(chunks))
                finally:
                    os.close(fd)
        finally:
            os.close(dir_fd)
        self.stats["small_files_read"] += len(names)
        return out

    def read_file(self, relpath: str) -> bytes:
        """Whole contents of one file (FileNotFoundError if absent)."""
        with open(self.local_path(relpath), "rb") as f:
            self.stats["small_files_read"] += 1
            return f.read()

    def read_range(self, relpath: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of a file (fewer if the file is shorter).

        Keeps the file open for the next call (LRU). FileNotFoundError if it does not exist.
        """
        fd = self._fd(relpath)
        self.stats["event_reads"] += 1
        return os.pread(fd, length, offset)

    def read_ranges(self, relpath: str, ranges: Sequence[Tuple[int, int]]) -> List[bytes]:
        """Several ``(offset, length)`` byte ranges of one file, opening it once.

        For batch reads that visit each file once: the file is closed afterwards rather
        than pushing the LRU's other files out. FileNotFoundError if it does not exist.
        """
        with self._lock:
            fd = self._open_fds.get(relpath)
        if fd is not None:
            self.stats["event_reads"] += len(ranges)
            return [os.pread(fd, length, offset) for offset, length in ranges]
        fd = os.open(self.local_path(relpath), os.O_RDONLY)
        self.stats["event_file_opens"] += 1
        self.stats["event_reads"] += len(ranges)
        try:
            return [os.pread(fd, length, offset) for offset, length in ranges]
        finally:
            os.close(fd)

    def _fd(self, relpath: str) -> int:
        with self._lock:
            fd = self._open_fds.get(relpath)
            if fd is not None:
                self._open_fds.move_to_end(relpath)
                return fd
        fd = os.open(self.local_path(relpath), os.O_RDONLY)
        with self._lock:
            self.stats["event_file_opens"] += 1
            self._open_fds[relpath] = fd
            while len(self._open_fds) > self._max_open:
                _, old = self._open_fds.popitem(last=False)
                os.close(old)
        return fd

    def forget(self, relpath: str) -> None:
        """Close a cached descriptor (the file was replaced or found corrupt)."""
        with self._lock:
            fd = self._open_fds.pop(relpath, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Close every cached file descriptor."""
        with self._lock:
            fds = list(self._open_fds.values())
            self._open_fds.clear()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def open_storage(path: str):
    """The storage for a trial path: local directories now; ``s3://`` is not supported yet."""
    if path.startswith("s3://"):
        raise NotImplementedError(
            f"S3 trials are not supported yet ({path!r}); copy the run locally "
            "(for example `aws s3 sync`) and open the local directory"
        )
    if "://" in path:
        raise NotImplementedError(f"unsupported storage scheme in trial path {path!r}; only local paths are supported")
    return LocalStorage(os.path.abspath(os.path.expanduser(path)))
