"""Run directories given as URLs (``s3://bucket/prefix``, any fsspec URL): the one place
that knows about schemes, filesystems and spools.

Reading goes straight to the object store (``analysis/trials/remote_storage.py``, :class:`RemoteStorage`).
Writing never does from the training process's hot path: a hook whose ``out_dir`` is a URL
writes the run into a local *spool* directory exactly as it writes a local run, and
``writer/uploader.py`` sends the published files to the URL (docs/format.md 1.4 order).

fsspec and s3fs are optional (the ``s3`` extra). Endpoint, region and credentials come
from the standard AWS environment and config files, as boto3 users expect
(``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``AWS_DEFAULT_REGION``, ``~/.aws/config``...).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
import threading
from typing import Optional, Tuple

#: The file in a spool directory that says where its files go (read by ``smdebug-sync``).
SPOOL_MANIFEST = ".smdebug_spool.json"
SPOOL_DIR_ENV = "SMDEBUG_SPOOL_DIR"
#: Seconds the hook waits, at construction, for the store to say whether the prefix holds an
#: earlier run; past them training starts and the uploader checks before its first upload.
PREFIX_CHECK_TIMEOUT_ENV = "SMDEBUG_PREFIX_CHECK_TIMEOUT"
DEFAULT_PREFIX_CHECK_TIMEOUT_S = 1.0
#: Seconds the check may take to make the store's client (botocore loads its models: local
#: work, 0.2-0.4 s here) before its requests' bound starts.
_CLIENT_SETUP_S = 2.0

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")


def is_url(path) -> bool:
    """Whether ``path`` is a URL with a scheme (``s3://...``, ``file://...``, ``memory://...``)."""
    return isinstance(path, str) and _SCHEME.match(path) is not None


def scheme(url: str) -> str:
    match = _SCHEME.match(url)
    return match.group(1).lower() if match else ""


def normalize_url(url: str) -> str:
    """The URL without surrounding whitespace or trailing slashes (``s3://b/run/`` -> ``s3://b/run``)."""
    url = url.strip()
    head = _SCHEME.match(url)
    rest = url[head.end():] if head else url
    return (head.group(0) if head else "") + rest.rstrip("/") if rest.rstrip("/") else url


def _missing(url: str, exc: ImportError) -> ImportError:
    extra = "s3" if scheme(url) in ("s3", "s3a") else None
    how = ("pip install fsspec s3fs (smdebug-core's 's3' extra)" if extra else
           f"pip install fsspec plus the filesystem package for {scheme(url)}:// (see fsspec's list of implementations)")
    return ImportError(f"{url!r} needs fsspec{' and s3fs' if extra else ''} to be read or written ({exc}); "
                       f"install them: {how}")


def filesystem(url: str, for_writing: bool = False, timeout: Optional[float] = None):
    """``(fs, root)``: the fsspec filesystem of ``url`` and the run's path in it (no trailing slash).

    For S3 the AWS SDK's own settings apply (``AWS_ENDPOINT_URL``, profiles, region). For
    writing (the uploader, which does its own retries with backoff and must notice an outage
    quickly) one request per attempt: neither the SDK nor s3fs retries. ``timeout``: seconds
    each connect and read may take (the hook's check for an earlier run), else 5 and 60.
    ImportError with the command that installs what is missing.
    """
    url = normalize_url(url)
    try:
        import fsspec
    except ImportError as exc:
        raise _missing(url, exc) from None
    options = {}
    single_requests = for_writing or timeout is not None
    if scheme(url) in ("s3", "s3a"):
        try:
            import s3fs  # noqa: F401 - fsspec would import it; this gives our message
        except ImportError as exc:
            raise _missing(url, exc) from None
        options = {
            "config_kwargs": {"retries": {"max_attempts": 1 if single_requests else 3, "mode": "standard"},
                              "connect_timeout": min(5.0, timeout) if timeout else 5,
                              "read_timeout": timeout if timeout else 60},
        }
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:  # botocore reads it too; passing it keeps older botocore versions right
            options["endpoint_url"] = endpoint
        # Never mix the cached instance of another configuration (the writer's retries).
        options["skip_instance_cache"] = single_requests
    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise _missing(url, exc) from None
    except ValueError as exc:  # "Protocol not known"
        raise ValueError(f"{url!r}: {exc}; give a local path or a URL of an installed fsspec filesystem "
                         "(s3://, file://, memory://, gs://, az://...)") from None
    if single_requests and isinstance(getattr(fs, "retries", None), int):
        fs.retries = 1  # s3fs retries a timed-out request 5 times by itself: 5 x 60 s on a hung store
    return fs, root.rstrip("/")


def join(root: str, relpath: str) -> str:
    return f"{root}/{relpath}" if root else relpath


def default_spool_root() -> str:
    """Where spools live: ``$SMDEBUG_SPOOL_DIR``, else ``<tmp>/smdebug-spool``."""
    return os.environ.get(SPOOL_DIR_ENV) or os.path.join(tempfile.gettempdir(), "smdebug-spool")


def make_spool(url: str, worker: str, spool_root: str = None) -> str:
    """A new, empty spool directory for this process's files of the run at ``url``.

    Named after the URL (readable, plus a hash) and this worker, host and process, so two
    hooks, or two ranks on one machine, never share one. Holds ``.smdebug_spool.json``
    with the URL, for ``smdebug-sync``.
    """
    url = normalize_url(url)
    root = spool_root or default_spool_root()
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", url.split("://", 1)[-1])[-60:].strip("_") or "run"
    digest = hashlib.sha1(url.encode()).hexdigest()[:8]
    os.makedirs(root, exist_ok=True)
    spool = tempfile.mkdtemp(prefix=f"{readable}-{digest}-{worker}-{os.getpid()}-", dir=root)
    manifest = {"url": url, "worker": worker, "pid": os.getpid(), "created": time.time()}
    with open(os.path.join(spool, SPOOL_MANIFEST), "w") as fh:
        json.dump(manifest, fh)
    return spool


def read_manifest(spool: str) -> dict:
    """A spool's manifest (OSError, ValueError if it is missing or not a JSON object)."""
    with open(os.path.join(spool, SPOOL_MANIFEST)) as fh:
        manifest = json.load(fh)
    if not isinstance(manifest, dict):
        raise ValueError(f"{SPOOL_MANIFEST} holds {type(manifest).__name__}, not an object")
    return manifest


def spool_url(spool: str) -> str:
    """The URL a spool directory belongs to (from its manifest); ValueError if it has none."""
    try:
        url = read_manifest(spool)["url"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{spool} is not an smdebug spool (no readable {SPOOL_MANIFEST}: {exc}); "
                         "give the URL too: smdebug-sync SPOOL URL") from None
    if not is_url(url):
        raise ValueError(f"{spool}/{SPOOL_MANIFEST} names {url!r}, not a URL")
    return url


def split_url(url: str) -> Tuple[str, str]:
    """``(scheme, rest)`` of a URL."""
    url = normalize_url(url)
    return scheme(url), url.split("://", 1)[1]


def check_remote_out_dir(url: str, worker: str, overwrite: bool, siblings=(), timeout: Optional[float] = None,
                         cancelled: Optional[threading.Event] = None, fs_root=None) -> bool:
    """Refuse a URL that already holds a run of this worker (its collections file or the end
    marker), as a local ``out_dir`` is refused; with ``overwrite`` remove that run's objects,
    but not those the other workers of this job (``siblings``) have already uploaded.

    Returns True; the store's errors propagate (:class:`PrefixCheck` turns them into a
    warning and :data:`UNCHECKED_KEY`; the uploader retries them). ``timeout``: seconds per
    request (one attempt each); ``cancelled``: set by a caller that stopped waiting, so that
    an earlier run found late is not removed behind its back; ``fs_root``: ``(fs, root)``
    made already.
    """
    from ..exceptions import OutDirError
    from .format import layout
    from .format.store import STORE_DIR

    fs, root = fs_root or filesystem(url, for_writing=True, timeout=timeout)
    markers = [layout.END_OF_JOB_FILE, layout.collections_file_relpath(worker)]
    existing = [m for m in markers if fs.exists(join(root, m))]
    if existing and overwrite:
        from .siblings import is_previous_run, job_start_time

        # Not what this job's other workers may already have uploaded.
        siblings = set(siblings)
        job_start = job_start_time() if siblings else float("inf")
        old = []
        for sub in (layout.COLLECTIONS_DIR.split("/")[0], layout.INDEX_DIR, layout.EVENTS_DIR, STORE_DIR,
                    layout.END_OF_JOB_FILE):
            for path, info in fs.find(join(root, sub), detail=True).items():
                if is_previous_run(path.rsplit("/", 1)[-1], _modified_at(info), siblings, job_start, path):
                    old.append(path)
        if old and not (cancelled is not None and cancelled.is_set()):
            fs.rm(old)
        return True
    if existing:
        raise OutDirError(f"out_dir {url} already holds a run ({', '.join(existing)} exist); choose a new prefix, "
                          "delete it, or pass overwrite=True to replace that run")
    return True


class PrefixCheck:
    """:func:`check_remote_out_dir` on a thread of its own, started at once and waited for by
    :meth:`settle` at most ``$SMDEBUG_PREFIX_CHECK_TIMEOUT`` seconds (1) once the store's client
    is made, each request as long at most and tried once: hook construction never waits
    longer on the network (the upload process starts meanwhile)."""

    def __init__(self, url: str, worker: str, overwrite: bool, siblings, spool: str):
        from ..environment import env_nonnegative_float

        self.url, self.worker, self.overwrite, self.siblings, self.spool = url, worker, overwrite, siblings, spool
        self.bound = env_nonnegative_float(PREFIX_CHECK_TIMEOUT_ENV, DEFAULT_PREFIX_CHECK_TIMEOUT_S,
                                           " of seconds") or 0.001
        self._started = time.monotonic()
        self._client_ready: Optional[float] = None
        self._outcome: list = []
        self._settled: Optional[bool] = None  # what settle() decided, once
        self._cancelled = threading.Event()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._check, name="smdebug-prefix-check", daemon=True)
        self._thread.start()

    def _check(self) -> None:
        try:
            fs_root = filesystem(self.url, for_writing=True, timeout=self.bound)
            connect = getattr(fs_root[0], "connect", None)
            if callable(connect):  # s3fs: the client is made here (local work), before the clock starts
                connect()
            with self._cond:
                self._client_ready = time.monotonic()
                self._cond.notify_all()
            outcome = check_remote_out_dir(self.url, self.worker, self.overwrite, self.siblings, timeout=self.bound,
                                           cancelled=self._cancelled, fs_root=fs_root)
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that settles
            outcome = exc
        with self._cond:
            self._outcome.append(outcome)
            self._cond.notify_all()

    def _decided(self) -> bool:
        """Whether the check has an outcome, or its time is up: ``bound`` seconds of requests
        once the client is made (making it, local work, may take up to ``_CLIENT_SETUP_S`` more)."""
        now = time.monotonic()
        if self._outcome:
            return True
        if self._client_ready is None:
            return now >= self._started + self.bound + _CLIENT_SETUP_S
        return now >= self._client_ready + self.bound

    def settle(self) -> bool:
        """True: checked (OutDirError for a prefix holding a run, as for a local out_dir); False:
        the store did not answer in time or failed: one warning, and the spool's manifest tells
        the uploader to check before its first upload (off the training thread). Called again,
        it says the same without waiting, warning or writing again."""
        import logging

        from ..exceptions import OutDirError

        if self._settled is not None:
            return self._settled
        with self._cond:
            while not self._decided():
                self._cond.wait(0.05)
        self._cancelled.set()
        result = self._outcome[0] if self._outcome else None
        if isinstance(result, OutDirError):
            raise result
        self._settled = result is True
        if self._settled:
            return True
        why = (f"{type(result).__name__}: {result}" if isinstance(result, BaseException)
               else f"it did not answer within {self.bound:g} s, {PREFIX_CHECK_TIMEOUT_ENV}")
        logging.getLogger("smdebug").warning(
            "smdebug: could not check %s for an earlier run (%s); training starts now and the run is written into "
            "the spool %s; the uploader checks the prefix before it uploads anything", self.url, why, self.spool)
        set_manifest(self.spool, **{UNCHECKED_KEY: {"worker": self.worker, "overwrite": bool(self.overwrite),
                                                    "siblings": sorted(self.siblings)}})
        return False


#: Spool manifest key of a prefix not checked yet for an earlier run (the store was down when
#: the hook started): ``{"worker", "overwrite", "siblings"}``; the uploader checks first.
UNCHECKED_KEY = "unchecked_prefix"


def set_manifest(spool: str, **entries) -> None:
    """Add or (with None) remove entries of a spool's manifest, atomically."""
    path = os.path.join(spool, SPOOL_MANIFEST)
    manifest = read_manifest(spool)
    for key, value in entries.items():
        if value is None:
            manifest.pop(key, None)
        else:
            manifest[key] = value
    with open(path + ".tmp", "w") as fh:
        json.dump(manifest, fh)
    os.replace(path + ".tmp", path)


def _modified_at(info: dict) -> float:
    """An fsspec listing entry's modification time (seconds since the epoch); -inf when the
    filesystem gives none, so such an object counts as older than anything."""
    for key in ("LastModified", "mtime", "last_modified", "created"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):  # datetime (s3fs, gcsfs, adlfs)
            return value.timestamp()
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return float("-inf")


def start_remote_writer(url: str, worker: str, tensorboard_dir, export_tensorboard: bool, overwrite: bool,
                        check: bool = True, siblings=()):
    """For a hook writing to ``url``: ``(spool, local tensorboard dir or None, extra_dirs,
    prefix_check)``; the caller settles the :class:`PrefixCheck` (None: none made) before the
    uploader starts.

    The spool is where the RunWriter writes; ``extra_dirs`` are the ``(local, URL)`` pairs the
    uploader sends at close (TensorBoard's files, appended to until then).
    """
    filesystem(url, for_writing=True)  # ImportError now, naming the package, not in the writer thread
    spool = make_spool(url, worker)
    prefix_check = PrefixCheck(url, worker, overwrite, siblings, spool) if check else None
    extra = []
    tb_local = None
    if tensorboard_dir is not None and is_url(os.fspath(tensorboard_dir)):
        tb_url = normalize_url(os.fspath(tensorboard_dir))
        if scheme(tb_url) == "file":
            tb_local = split_url(tb_url)[1]
        else:
            tb_local = os.path.join(spool, ".tensorboard")
            extra.append((tb_local, tb_url))
    elif tensorboard_dir is not None:
        tb_local = os.fspath(tensorboard_dir)
    elif export_tensorboard:
        tb_local = os.path.join(spool, "tensorboard")
        extra.append((tb_local, normalize_url(url) + "/tensorboard"))
    if extra:
        set_manifest(spool, extra_dirs={os.path.relpath(local, spool): target for local, target in extra})
    return spool, tb_local, extra, prefix_check
