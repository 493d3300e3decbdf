"""A run directory on the local file system, read as untrusted (docs/reader_safety.md).

Every file is opened without blocking (a FIFO would otherwise wait for a writer forever),
read only if it is a regular file, only if the path, symbolic links resolved, stays inside
the run directory, and whole files only up to a size the caller gives. Refusals raise
:class:`UnsafeRunFile`.
"""
from __future__ import annotations

import errno
import os
import stat
import sys
import threading
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ...exceptions import UnsafeRunFile
from .paths import DirEntry, check_relpath

# O_NONBLOCK: opening a FIFO for reading does not wait for a writer (it has no effect on
# the reads of a regular file, the only kind read after the fstat check).
_O_READ = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# Where the kernel says which file a descriptor is (Linux): one readlink, and it names the
# file actually opened, so no link can be swapped between the check and the read.
_PROC_FD = "/proc/self/fd/"
_HAVE_PROC_FD = os.path.isdir(_PROC_FD)
# Bulk reads of at least this many files use a second thread (LocalStorage.read_spans_into).
_THREADED_SPANS = 256


def _make_openat2():
    """Linux's ``openat2(dir_fd, path, RESOLVE_BENEATH)`` as ``f(dir_fd, relpath) -> fd``, or None.

    One system call that opens a file and refuses (EXDEV) any path, links included, that
    resolves outside ``dir_fd``: the containment check costs nothing on the fast path.
    None where the kernel (before 5.6), a sandbox or the platform lacks it.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):  # pragma: no cover - no C library to call
        return None

    class OpenHow(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]

    syscall.restype = ctypes.c_long
    syscall.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    # RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS; 437 is openat2 on every Linux architecture.
    how = OpenHow(_O_READ, 0, 0x08 | 0x02)
    how_ptr, how_size, get_errno = ctypes.addressof(how), ctypes.sizeof(how), ctypes.get_errno
    encoding = sys.getfilesystemencoding()

    def openat2(dir_fd: int, relpath: str) -> int:
        fd = syscall(437, dir_fd, relpath.encode(encoding, "surrogateescape"), how_ptr, how_size)
        if fd < 0:
            err = get_errno()
            raise OSError(err, os.strerror(err), relpath)  # FileNotFoundError for ENOENT
        return fd

    openat2.how = how  # keep the struct alive as long as the function
    try:
        os.close(openat2(-100, "."))  # AT_FDCWD: is the call there and allowed?
    except OSError:
        return None
    return openat2


_openat2 = _make_openat2()


def _unreadable(path: str, exc: OSError) -> UnsafeRunFile:
    """A run file the system will not let this process read (permissions, I/O errors)."""
    return UnsafeRunFile(f"{path} cannot be read: {exc.strerror or exc}")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


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
        self._open_fds: "OrderedDict[str, Tuple[int, int]]" = OrderedDict()  # relpath -> (fd, size)
        self._real_root: Optional[str] = None
        self._root_fd: Optional[int] = None  # for openat2, opened once the directory exists
        self._lock = threading.Lock()
        self.stats: Dict[str, int] = {"small_files_read": 0, "event_file_opens": 0, "event_reads": 0}

    def __repr__(self):
        return f"LocalStorage({self.root!r})"

    # --- paths ------------------------------------------------------------------------
    def local_path(self, relpath: str) -> str:
        """Absolute local path of ``relpath``; ValueError if it escapes the run directory."""
        check_relpath(relpath)
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
                    try:
                        is_dir = e.is_dir()
                    except OSError:  # a link loop: listed as a file; reading it says what it is
                        is_dir = False
                    # scandir caches the stat for directories only when asked; files need none.
                    out.append(DirEntry(e.name, is_dir, e.stat().st_mtime_ns if is_dir else 0))
                return out
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._loop(path) from None
            raise

    # --- safe opening ---------------------------------------------------------------
    def _root_prefix(self) -> str:
        """The run directory, symbolic links resolved, with a trailing separator."""
        real = self._real_root
        if real is None:
            real = os.path.join(os.path.realpath(self.root), "")
            if os.path.isdir(real):  # cached once it exists (a trial may wait for it)
                self._real_root = real
        return real

    def _check_inside(self, fd: int, path: str) -> None:
        """UnsafeRunFile unless the open file ``fd`` (opened as ``path``) is inside the run directory."""
        real = None
        if _HAVE_PROC_FD:
            try:
                real = os.readlink(f"{_PROC_FD}{fd}")
            except OSError:
                pass
        if real is None:
            real = os.path.realpath(path)
        if not real.startswith(self._root_prefix()):
            raise UnsafeRunFile(
                f"{path} leads to {real}, outside the run directory {self.root}: symbolic links "
                "that leave the run directory are not followed (docs/reader_safety.md); copy the "
                "data into the run directory instead"
            )

    @staticmethod
    def _loop(path: str) -> UnsafeRunFile:
        return UnsafeRunFile(f"{path} is a symbolic link loop (or a chain of too many links); "
                             "remove or fix the link")

    def _open_regular(self, path: str, shown: str, dir_fd: Optional[int] = None,
                      max_bytes: Optional[int] = None) -> Tuple[int, int]:
        """``(fd, size)`` of the regular file ``path``, or UnsafeRunFile (see the module doc).

        With ``dir_fd`` (a directory already checked to be inside the run), ``path`` is a
        name in it and only a link in its last component needs the containment check;
        otherwise every opened path is checked. ``shown`` is the full path, for messages.
        FileNotFoundError passes through.
        """
        checked_dir = dir_fd is not None
        try:
            fd = os.open(path, _O_READ | (_O_NOFOLLOW if checked_dir else 0), dir_fd=dir_fd)
            followed = not checked_dir
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            if not checked_dir:
                raise self._loop(shown) from None
            try:  # the last component is a symbolic link: follow it, then see where it led
                fd = os.open(path, _O_READ, dir_fd=dir_fd)
            except OSError as exc2:
                if exc2.errno == errno.ELOOP:
                    raise self._loop(shown) from None
                raise
            followed = True
        try:
            if followed:
                self._check_inside(fd, shown)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or (max_bytes is not None and st.st_size > max_bytes):
                raise self._refusal(shown, st, max_bytes)
        except BaseException:
            os.close(fd)
            raise
        return fd, st.st_size

    @staticmethod
    def _refusal(shown: str, st: os.stat_result, max_bytes: Optional[int]) -> UnsafeRunFile:
        """Why a file with this fstat is not read (see ``_open_regular``)."""
        if not stat.S_ISREG(st.st_mode):
            return UnsafeRunFile(f"{shown} is {_kind(st.st_mode)}, not a regular file: "
                                 "only regular files of a run directory are read")
        return UnsafeRunFile(f"{shown} holds {st.st_size} bytes, more than the {max_bytes} "
                             "the format allows for this kind of file; it is not read")

    def _open_in_run(self, relpath: str, max_bytes: Optional[int] = None) -> Tuple[int, int]:
        """``(fd, size)`` of the regular file ``relpath`` of the run (see ``_open_regular``).

        Fast path: one ``openat2`` beneath the run directory and one ``fstat``. A link that
        openat2 will not follow (an absolute one, one leaving the run, a loop) takes the
        checked slow path, which follows links that stay inside and explains the others.
        """
        if _openat2 is not None:
            root_fd = self._root_fd
            if root_fd is None:
                root_fd = self._open_root()
            if root_fd is not None:
                try:
                    fd = _openat2(root_fd, relpath)
                except OSError as exc:
                    # EXDEV, ELOOP: a link to check or explain; ENOENT: maybe the directory
                    # was replaced since root_fd was opened. Other errors are the caller's.
                    if exc.errno not in (errno.EXDEV, errno.ELOOP, errno.ENOENT):
                        raise
                else:
                    try:
                        st = os.fstat(fd)
                    except BaseException:
                        os.close(fd)
                        raise
                    if st.st_mode & 0o170000 == stat.S_IFREG and (max_bytes is None or st.st_size <= max_bytes):
                        return fd, st.st_size
                    os.close(fd)
                    raise self._refusal(self.local_path(relpath), st, max_bytes)
        path = self.local_path(relpath)
        return self._open_regular(path, path, max_bytes=max_bytes)

    def _open_root(self) -> Optional[int]:
        """The run directory's descriptor for openat2 (None while it does not exist)."""
        with self._lock:
            if self._root_fd is None:
                try:
                    self._root_fd = os.open(self.root, os.O_RDONLY | _O_DIRECTORY | os.O_CLOEXEC)
                except OSError:
                    return None
            return self._root_fd

    @staticmethod
    def _read_whole(fd: int, size: int, max_bytes: Optional[int], shown: str, name: str = "") -> bytes:
        """The file's bytes: ``size`` (from fstat) and whatever it grew by since, up to
        ``max_bytes``. ``shown`` (+ ``/name``) names the file in the error."""
        data = os.read(fd, size + 1)
        if len(data) <= size:  # a short read of a regular file: the end
            return data
        chunks = [data]
        total = len(data)
        while True:
            if max_bytes is not None and total > max_bytes:
                where = f"{shown}/{name}" if name else shown
                raise UnsafeRunFile(f"{where} grew past the {max_bytes} bytes the format allows; it is not read")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)

    # --- reading ----------------------------------------------------------------------
    def read_small_files(self, dir_relpath: str, names: Sequence[str],
                         max_bytes: Optional[int] = None) -> List[Union[bytes, None, UnsafeRunFile]]:
        """Whole contents of several files of one directory: per name its bytes, None for a
        vanished file, or the UnsafeRunFile that refused it (a FIFO, a link leaving the run,
        more than ``max_bytes``).

        Opens the directory once (UnsafeRunFile for all if it leads outside the run) and
        each file relative to it, which keeps the per-file cost to four system calls:
        index files are many and tiny.
        """
        dir_path = self.local_path(dir_relpath)
        try:
            dir_fd = os.open(dir_path, os.O_RDONLY | _O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._loop(dir_path) from None
            raise
        out: List[Union[bytes, None, UnsafeRunFile]] = []
        try:
            self._check_inside(dir_fd, dir_path)
            for name in names:
                # Inline on purpose (a run has one index file per step and worker): the
                # bucket is checked, so O_NOFOLLOW and fstat are all a plain file needs.
                try:
                    fd = os.open(name, _O_READ | _O_NOFOLLOW, dir_fd=dir_fd)
                except FileNotFoundError:
                    out.append(None)
                    continue
                except OSError as exc:
                    if exc.errno != errno.ELOOP:  # not readable (permissions, I/O): this file only
                        out.append(_unreadable(f"{dir_path}/{name}", exc))
                        continue
                    fd = None  # a link: the checked path below
                try:
                    if fd is None:
                        fd, size = self._open_regular(name, f"{dir_path}/{name}", dir_fd, max_bytes)
                    else:
                        st = os.fstat(fd)
                        size = st.st_size
                        if st.st_mode & 0o170000 != stat.S_IFREG or (max_bytes is not None and size > max_bytes):
                            raise self._refusal(f"{dir_path}/{name}", st, max_bytes)
                    out.append(self._read_whole(fd, size, max_bytes, dir_path, name))
                except FileNotFoundError:
                    out.append(None)
                except UnsafeRunFile as exc:
                    out.append(exc)
                except OSError as exc:
                    out.append(_unreadable(f"{dir_path}/{name}", exc))
                finally:
                    if fd is not None:
                        os.close(fd)
        finally:
            os.close(dir_fd)
        self.stats["small_files_read"] += len(names)
        return out

    def read_file(self, relpath: str, max_bytes: Optional[int] = None) -> bytes:
        """Whole contents of one file (FileNotFoundError if absent, UnsafeRunFile if refused)."""
        fd, size = self._open_in_run(relpath, max_bytes)
        try:
            self.stats["small_files_read"] += 1
            return self._read_whole(fd, size, max_bytes, self.local_path(relpath))
        finally:
            os.close(fd)

    def open_file(self, relpath: str, max_bytes: Optional[int] = None):
        """The regular file ``relpath`` of the run opened for reading, as a binary file object
        the caller closes (the checks of :meth:`read_file`), for readers that read only parts
        of a file (a Parquet file's footer and some of its columns)."""
        fd, _ = self._open_in_run(relpath, max_bytes)
        self.stats["small_files_read"] += 1
        return os.fdopen(fd, "rb")

    @staticmethod
    def _pread(fd: int, size: int, offset: int, length: int) -> bytes:
        # Never ask for more than the file holds: a corrupt index entry may claim terabytes,
        # and pread allocates its buffer first. A short result is reported by the caller.
        if offset + length > size:
            size = os.fstat(fd).st_size  # grown since it was opened?
            length = max(0, min(length, size - offset))
        return os.pread(fd, length, offset)

    def read_range(self, relpath: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of a file (fewer if the file is shorter).

        Keeps the file open for the next call (LRU). FileNotFoundError if it does not
        exist, UnsafeRunFile if it is refused.
        """
        fd, size = self._fd(relpath)
        self.stats["event_reads"] += 1
        if offset + length > size:
            return self._pread(fd, size, offset, length)
        return os.pread(fd, length, offset)

    def read_ranges(self, relpath: str, ranges: Sequence[Tuple[int, int]]) -> List[bytes]:
        """Several ``(offset, length)`` byte ranges of one file (each fewer bytes if the file
        is shorter), opening it once.

        For batch reads that visit each file once: the file is closed afterwards rather
        than pushing the LRU's other files out. FileNotFoundError if it does not exist,
        UnsafeRunFile if it is refused.
        """
        with self._lock:
            cached = self._open_fds.get(relpath)
        if cached is not None:
            fd, size = cached
            self.stats["event_reads"] += len(ranges)
            return [self._pread(fd, size, offset, length) for offset, length in ranges]
        fd, size = self._open_in_run(relpath)
        self.stats["event_file_opens"] += 1
        self.stats["event_reads"] += len(ranges)
        try:
            return [self._pread(fd, size, offset, length) for offset, length in ranges]
        finally:
            os.close(fd)

    def read_spans(self, spans: Sequence[Tuple[str, int, int]]) -> List[Union[bytes, Exception]]:
        """One byte range of each of many files: ``(relpath, offset, length)`` -> the bytes
        (fewer if the file is shorter), or the exception that file raised
        (FileNotFoundError, UnsafeRunFile, ValueError for a path leaving the run).

        For bulk reads that visit each file once (``Trial.to_dataframe``): the same checked
        opening as :meth:`read_ranges`, in one loop, with no descriptor kept open.
        """
        out: List[Union[bytes, Exception]] = []
        append = out.append
        open_in_run, pread, close = self._open_in_run, os.pread, os.close
        for relpath, offset, length in spans:
            try:
                fd, size = open_in_run(relpath)
            except (OSError, UnsafeRunFile, ValueError) as exc:
                append(exc)
                continue
            try:
                # Never ask for more than the file holds (a corrupt index may claim terabytes).
                append(pread(fd, length, offset) if offset + length <= size else self._pread(fd, size, offset, length))
            except OSError as exc:
                append(exc)
            finally:
                close(fd)
        self.stats["event_file_opens"] += len(spans)
        self.stats["event_reads"] += len(spans)
        return out

    def read_spans_into(self, spans: Sequence[Tuple[str, int, int]], buffer: memoryview,
                        places: Sequence[int], threads: bool = True) -> List[Union[int, Exception]]:
        """Like :meth:`read_spans`, but each span's bytes go into ``buffer`` at its place
        (``places[i]``, room for ``length`` bytes): per span the number of bytes read (fewer
        if the file is shorter), or the exception its file raised.

        The buffer is the caller's, sized by the spans, so a corrupt index cannot make
        this allocate; nothing is joined afterwards. With ``threads``, large batches are
        split between two threads: the system calls release the GIL, so they overlap.
        """
        out: List[Union[int, Exception]] = [0] * len(spans)
        open_in_run, close = self._open_in_run, os.close
        preadv = getattr(os, "preadv", None)

        def run(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                relpath, offset, length = spans[i]
                try:
                    fd, _ = open_in_run(relpath)
                except (OSError, UnsafeRunFile, ValueError) as exc:
                    out[i] = exc
                    continue
                try:
                    place = places[i]
                    if preadv is not None:
                        out[i] = preadv(fd, [buffer[place:place + length]], offset)
                    else:  # a platform without preadv: a bounded read, copied
                        data = os.pread(fd, length, offset)
                        buffer[place:place + len(data)] = data
                        out[i] = len(data)
                except OSError as exc:
                    out[i] = exc
                finally:
                    close(fd)

        n = len(spans)
        if threads and n >= _THREADED_SPANS:
            half = n // 2
            helper = threading.Thread(target=run, args=(half, n), name="smdebug-read", daemon=True)
            try:
                helper.start()
            except RuntimeError:  # no thread can be started: all on this one
                helper = None
                run(half, n)
            try:
                run(0, half)
            finally:
                if helper is not None:
                    helper.join()
        else:
            run(0, n)
        with self._lock:  # callers may read batches from several threads
            self.stats["event_file_opens"] += n
            self.stats["event_reads"] += n
        return out

    def _fd(self, relpath: str) -> Tuple[int, int]:
        with self._lock:
            cached = self._open_fds.get(relpath)
            if cached is not None:
                self._open_fds.move_to_end(relpath)
                return cached
        opened = self._open_in_run(relpath)
        with self._lock:
            self.stats["event_file_opens"] += 1
            self._open_fds[relpath] = opened
            while len(self._open_fds) > self._max_open:
                _, (old, _) = self._open_fds.popitem(last=False)
                os.close(old)
        return opened

    def forget(self, relpath: str) -> None:
        """Close a cached descriptor (the file was replaced or found corrupt)."""
        with self._lock:
            cached = self._open_fds.pop(relpath, None)
        if cached is not None:
            os.close(cached[0])

    def close(self) -> None:
        """Close every cached file descriptor."""
        with self._lock:
            fds = [fd for fd, _ in self._open_fds.values()]
            self._open_fds.clear()
            if self._root_fd is not None:
                fds.append(self._root_fd)
                self._root_fd = None
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

