"""Putting files of a run under their final names: atomically, then telling the uploader.

Every file reaches its final name by ``os.replace`` of a complete ``<name>.tmp``, so a
reader (or a ``kill -9``) never sees a half-written file under a final name. No fsync: a
process crash loses nothing that was renamed, only a machine crash could. A remote run's
``out_dir`` is its spool (``storage/uploader.py``): each published file is handed on.

Used by the writer thread only.
"""
import os

from ..format import layout

# Directories known to exist; every saved step has its own events/ directory, so it is bounded.
_MAX_KNOWN_DIRS = 4096
# Tries at a folder whose parent vanished meanwhile (a sibling worker's close removes empty
# shared folders); out_dir itself is never made, so a deleted run still fails on the last.
_MKDIR_ATTEMPTS = 3
# out_dir is absolute (os.path.abspath): joining with "/" gives a valid path on POSIX, even for out_dir "/".
_POSIX_PATHS = os.sep == "/"
_O_CLOEXEC_BINARY = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


class Publisher:
    """The files of one run directory, ``out_dir`` (absolute), and its ``uploader`` (or None)."""

    def __init__(self, out_dir, uploader=None):
        self.out_dir = out_dir
        self.uploader = uploader
        self._known_dirs = set()

    def path(self, relpath):
        if _POSIX_PATHS:  # a few string operations less for each of a step's files
            return f"{self.out_dir}/{relpath}"
        return layout.join_under(self.out_dir, relpath)

    def exists(self, relpath):
        return os.path.exists(self.path(relpath))

    def spool_full(self):
        """Whether the uploader asks for new steps to be skipped (it warns once itself)."""
        return self.uploader is not None and self.uploader.spool_full()

    def ensure_parent(self, relpath):
        self._ensure_dir(relpath.rpartition("/")[0])

    def _ensure_dir(self, rel_dir):
        # mkdir one level at a time below out_dir: if out_dir itself was deleted, this fails
        # instead of silently recreating it.
        if not rel_dir or rel_dir in self._known_dirs:
            return
        for attempt in range(_MKDIR_ATTEMPTS):
            self._ensure_dir(rel_dir.rpartition("/")[0])
            try:
                os.mkdir(self.path(rel_dir))
            except FileExistsError:
                pass
            except FileNotFoundError:
                # Another worker of the run removed a shared folder above once it was empty
                # (its writer's close): forget the folders known and make them again.
                if attempt == _MKDIR_ATTEMPTS - 1:
                    raise
                self._known_dirs.clear()
                continue
            break
        if len(self._known_dirs) >= _MAX_KNOWN_DIRS:
            self._known_dirs.clear()
        self._known_dirs.add(rel_dir)

    def in_folder(self, relpath, make):
        """``make(path of relpath)`` once relpath's folder exists; the folder is made again
        if a sibling worker removed it meanwhile (empty: its close, or an overwrite's sweep)."""
        for attempt in range(_MKDIR_ATTEMPTS):
            self.ensure_parent(relpath)
            try:
                return make(self.path(relpath))
            except FileNotFoundError:
                if attempt == _MKDIR_ATTEMPTS - 1:
                    raise
                self._known_dirs.clear()

    def open_new(self, relpath, buffering=-1):
        """``relpath`` created (or truncated) for writing, in place."""
        return self.in_folder(relpath, lambda path: open(path, "wb", buffering=buffering))

    def open_tmp(self, relpath, buffering):
        """``<relpath>.tmp`` opened for writing, to be published by :meth:`publish_tmp`."""
        return self.in_folder(relpath, lambda path: open(path + layout.TMP_SUFFIX, "wb", buffering=buffering))

    def open_append(self, relpath, buffering):
        """The published ``relpath`` opened to append records after its own."""
        return open(self.path(relpath), "ab", buffering=buffering)

    def publish_tmp(self, relpath, nbytes):
        """Rename the written and closed ``<relpath>.tmp`` (``nbytes`` long) into place."""
        final = self.path(relpath)
        os.replace(final + layout.TMP_SUFFIX, final)
        if self.uploader is not None:
            self.uploader.notify(relpath, nbytes)

    def write_atomically(self, relpath, data, private_tmp=False):
        """Write ``data`` (bytes) to ``relpath`` through its ``.tmp`` and publish it.
        ``private_tmp``: a ``.tmp`` name of this process and writer, for a file that other
        writers of the run (workers) may write at the same moment."""
        final = self.path(relpath)
        tmp = f"{final}.{os.getpid()}-{id(self):x}{layout.TMP_SUFFIX}" if private_tmp else final + layout.TMP_SUFFIX
        # One write of bytes in hand: os.open spares the file object's fstat, ioctl and lseek.
        fd = self.in_folder(relpath, lambda _: os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC_BINARY,
                                                       0o666))
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, final)
        if self.uploader is not None:
            self.uploader.notify(relpath, len(data))

    def announce(self, relpath, nbytes):
        """``relpath``, written in place and complete (a chunk of the run store), goes to the uploader."""
        if self.uploader is not None:
            self.uploader.notify(relpath, nbytes)

    def write_with(self, relpath, write):
        """Publish what ``write(path)`` writes at a temporary path (a Parquet file) as ``relpath``."""
        final = self.path(relpath)
        tmp = final + layout.TMP_SUFFIX
        self.in_folder(relpath, lambda _: write(tmp))
        os.replace(tmp, final)
        if self.uploader is not None:
            self.uploader.notify(relpath, os.path.getsize(final))
