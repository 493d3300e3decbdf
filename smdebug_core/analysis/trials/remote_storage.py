"""A run directory on an object store or any fsspec filesystem (``s3://``, ``memory://``),
read as untrusted as a local one (docs/reader_safety.md)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ...exceptions import UnsafeRunFile
from .paths import DirEntry, check_relpath


class RemoteStorage:
    """A run directory on an object store or any fsspec filesystem (``s3://``, ``memory://``).

    Same operations as :class:`LocalStorage`, on keys instead of files; every object is
    untrusted as a local file is (docs/reader_safety.md). Index objects are listed by key
    in order (``list_index_files``, S3's ``StartAfter``: a refresh lists only what comes
    after the steps already complete) and fetched concurrently; values are read with
    ranged GETs, never a whole event object for one tensor; whole-object reads ask for at
    most ``max_bytes + 1`` bytes, so an object larger than the format allows is refused
    without being downloaded.
    """

    remote = True

    def __init__(self, url: str):
        from ...storage import remote

        self.root = remote.normalize_url(url)
        self._fs, self._base = remote.filesystem(self.root)
        self._is_s3 = remote.scheme(self.root) in ("s3", "s3a")
        self._lock = threading.Lock()
        self._spans: "OrderedDict[str, List[Tuple[int, bytes]]]" = OrderedDict()  # read-ahead cache
        self._span_bytes = 0
        self.stats: Dict[str, int] = {"small_files_read": 0, "event_file_opens": 0, "event_reads": 0,
                                      "list_requests": 0, "get_requests": 0, "bytes_fetched": 0}

    def __repr__(self):
        return f"RemoteStorage({self.root!r})"

    def local_path(self, relpath: str) -> str:
        """The URL of ``relpath`` (for messages); ValueError if it is not a plain path inside the run."""
        check_relpath(relpath)  # the same checks as local paths: no "..", no absolute, no empty parts
        return f"{self.root}/{relpath}"

    def _key(self, relpath: str) -> str:
        self.local_path(relpath)
        return f"{self._base}/{relpath}" if self._base else relpath

    # --- metadata ---------------------------------------------------------------------
    def exists(self, relpath: str) -> bool:
        key = self._key(relpath)
        try:
            self._fs.invalidate_cache(key)  # a live run: a listing cached earlier may predate it
            return bool(self._fs.isfile(key))
        except FileNotFoundError:
            return False

    def is_dir(self, relpath: str = "") -> bool:
        """Whether any object lies under ``relpath`` (object stores have no directories)."""
        path = self._key(relpath) if relpath else self._base
        try:
            self.stats["list_requests"] += 1
            return bool(self._fs.ls(path, detail=False)) if self._fs.isdir(path) else False
        except (FileNotFoundError, NotADirectoryError):
            return False

    def mtime_ns(self, relpath: str) -> Optional[int]:
        return None  # object stores have no directory times; listing is by key instead

    def list_dir(self, relpath: str) -> List[DirEntry]:
        """Entries of a "directory" (one level of keys); an empty list if there is none."""
        path = self._key(relpath) if relpath else self._base
        try:
            self.stats["list_requests"] += 1
            self._fs.invalidate_cache(path)  # a live run: always ask the store
            entries = self._fs.ls(path, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        for e in entries:
            name = e["name"].rstrip("/").rsplit("/", 1)[-1]
            if name:
                out.append(DirEntry(name, e.get("type") == "directory", 0))
        return out

    def list_index_files(self, index_dir: str, start_after: Optional[str]) -> List[Tuple[str, str]]:
        """``(bucket, name)`` of every object ``index_dir/<bucket>/<name>`` whose key relative to
        the run comes after ``start_after`` (None: all), in key order."""
        prefix = self._key(index_dir) + "/"
        keys: List[str] = []
        if self._is_s3:
            bucket, _, key_prefix = prefix.partition("/")
            kwargs = {"Bucket": bucket, "Prefix": key_prefix}
            if start_after:
                kwargs["StartAfter"] = self._key(start_after).partition("/")[2]
            while True:
                self.stats["list_requests"] += 1
                page = self._fs.call_s3("list_objects_v2", **kwargs)
                keys.extend(bucket + "/" + obj["Key"] for obj in page.get("Contents", ()))
                if not page.get("IsTruncated"):
                    break
                kwargs["ContinuationToken"] = page["NextContinuationToken"]
        else:
            self.stats["list_requests"] += 1
            try:
                self._fs.invalidate_cache(prefix.rstrip("/"))
                keys = sorted(self._fs.find(prefix.rstrip("/")))
            except FileNotFoundError:
                keys = []
            if start_after:
                after = self._key(start_after)
                keys = [k for k in keys if k > after]
        out = []
        for key in keys:
            rest = key[len(prefix):] if key.startswith(prefix) else key.split(index_dir + "/", 1)[-1]
            parts = rest.split("/")
            if len(parts) == 2 and parts[0] and parts[1]:  # deeper keys are no index files
                out.append((parts[0], parts[1]))
        return out

    # --- reading ----------------------------------------------------------------------
    @staticmethod
    def _is_range_error(exc: BaseException) -> bool:
        text = f"{type(exc).__name__} {exc}"
        return "InvalidRange" in text or "416" in text

    def _cat_ranges(self, keys: List[str], starts: List[int], ends: List[int]) -> list:
        """Concurrent ranged GETs (s3fs runs them together); per range bytes or the exception."""
        self.stats["get_requests"] += len(keys)
        if not keys:
            return []
        try:
            results = self._fs.cat_ranges(keys, starts, ends, on_error="return")
        except TypeError:  # a filesystem without on_error
            results = self._fs.cat_ranges(keys, starts, ends)
        out = []
        for result in results:
            if isinstance(result, BaseException) and self._is_range_error(result):
                result = b""  # a range past the end of the object: no bytes there
            elif not isinstance(result, BaseException):
                self.stats["bytes_fetched"] += len(result)
            out.append(result)
        return out

    def read_small_files(self, dir_relpath: str, names: Sequence[str],
                         max_bytes: Optional[int] = None) -> List[Union[bytes, None, UnsafeRunFile]]:
        """Whole objects, fetched concurrently: per name its bytes, None if it vanished, or an
        UnsafeRunFile if it is larger than ``max_bytes`` (only ``max_bytes + 1`` bytes are fetched)."""
        keys = [self._key(f"{dir_relpath}/{name}") for name in names]
        limit = (max_bytes + 1) if max_bytes is not None else None
        if limit is None:
            results = [self._fs.cat_file(k) for k in keys]
        else:
            results = self._cat_ranges(keys, [0] * len(keys), [limit] * len(keys))
        out: List[Union[bytes, None, UnsafeRunFile]] = []
        for name, result in zip(names, results):
            if isinstance(result, FileNotFoundError):
                out.append(None)
            elif isinstance(result, BaseException):
                raise result
            elif max_bytes is not None and len(result) > max_bytes:
                out.append(UnsafeRunFile(f"{self.root}/{dir_relpath}/{name} holds more than the {max_bytes} bytes "
                                         "the format allows for this kind of file; it is not read"))
            else:
                out.append(bytes(result))
        self.stats["small_files_read"] += len(names)
        return out

    def read_file(self, relpath: str, max_bytes: Optional[int] = None) -> bytes:
        """One whole object (FileNotFoundError if absent, UnsafeRunFile if larger than ``max_bytes``)."""
        dir_relpath, _, name = relpath.rpartition("/")
        result = self.read_small_files(dir_relpath, [name], max_bytes)[0] if dir_relpath else None
        if not dir_relpath:
            self.stats["get_requests"] += 1
            result = self._fs.cat_file(self._key(relpath))
        if result is None:
            raise FileNotFoundError(self.local_path(relpath))
        if isinstance(result, UnsafeRunFile):
            raise result
        return result

    def read_range(self, relpath: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer past the end), one ranged GET."""
        return self.read_ranges(relpath, [(offset, length)])[0]

    def read_ranges(self, relpath: str, ranges: Sequence[Tuple[int, int]]) -> List[bytes]:
        """Several byte ranges of one object, as concurrent ranged GETs."""
        results = self.read_spans([(relpath, o, n) for o, n in ranges])
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    def read_spans(self, spans: Sequence[Tuple[str, int, int]]) -> List[Union[bytes, BaseException]]:
        """``(relpath, offset, length)`` ranges of many objects, fetched concurrently: per span
        its bytes or the exception (FileNotFoundError for a missing object).

        Each GET also reads up to ``READ_AHEAD`` bytes past its range (the records that
        follow: the step's other tensors), kept in a bounded cache, so reading every tensor
        of a run costs about one GET per event object rather than one per tensor; a large
        event object is still never fetched whole for one small tensor.
        """
        self.stats["event_reads"] += len(spans)
        out: List[Union[bytes, BaseException, None]] = [None] * len(spans)
        todo = []
        for i, (relpath, offset, length) in enumerate(spans):
            hit = self._cached(relpath, offset, length)
            if hit is not None:
                out[i] = hit
            else:
                todo.append(i)
        if todo:
            fetched = self._cat_ranges([self._key(spans[i][0]) for i in todo], [spans[i][1] for i in todo],
                                       [spans[i][1] + spans[i][2] + self.READ_AHEAD for i in todo])
            for i, data in zip(todo, fetched):
                relpath, offset, length = spans[i]
                if isinstance(data, BaseException):
                    out[i] = data
                    continue
                data = bytes(data)
                self._remember(relpath, offset, data)
                out[i] = data[:length]
        return out  # type: ignore[return-value]

    #: Bytes read past each requested range, and the most bytes kept (event objects never
    #: change once uploaded: docs/format.md 1.4.1).
    READ_AHEAD = 64 * 1024
    CACHE_BYTES = 64 << 20

    def _cached(self, relpath: str, offset: int, length: int) -> Optional[bytes]:
        with self._lock:
            spans = self._spans.get(relpath)
            if spans is None:
                return None
            for lo, data in spans:
                if lo <= offset and offset + length <= lo + len(data):
                    self._spans.move_to_end(relpath)
                    return data[offset - lo : offset - lo + length]
        return None

    def _remember(self, relpath: str, offset: int, data: bytes) -> None:
        with self._lock:
            self._spans.setdefault(relpath, []).append((offset, data))
            self._spans.move_to_end(relpath)
            self._span_bytes += len(data)
            while self._span_bytes > self.CACHE_BYTES and self._spans:
                _, dropped = self._spans.popitem(last=False)
                self._span_bytes -= sum(len(d) for _, d in dropped)

    def forget(self, relpath: str) -> None:
        with self._lock:
            dropped = self._spans.pop(relpath, None)
            if dropped:
                self._span_bytes -= sum(len(d) for _, d in dropped)

    def close(self) -> None:
        with self._lock:
            self._spans.clear()
            self._span_bytes = 0

