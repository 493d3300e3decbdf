"""Reading and decoding single records of a run's event files, where the index locates them.

``Tensor`` reads every value through a :class:`RecordReader`; the bulk reader uses it for
the records its vectorized walk does not accept, so those come out exactly as ``value()``
reads them (or fail with the same error).
"""
from __future__ import annotations

import time
from typing import List, Tuple

import numpy as np

from ...exceptions import CorruptRecord, MissingEventFile, UnsafeRunFile
from ...modes import ModeKeys
from ...storage.format.codec import decode_tensor_event
from ...storage.format.layout import END_OF_JOB_FILE
from ...storage.format.records import read_record, verify_payload_crc
from .locations import ReadRequest
from .steps import StepIndex

GLOBAL = ModeKeys.GLOBAL
_MISSING_EVENT_POLL_S = 0.1


class RecordReader:
    """The records of one run: its ``storage``, the record ``check`` ("minimal", "full",
    "none"), how long a missing event file is waited for (``wait_timeout``) and the most
    elements a record may expand to (``max_expanded_elements``)."""

    def __init__(self, storage, steps: StepIndex, check: str, wait_timeout: float, max_expanded_elements: int):
        self.storage = storage
        self.steps = steps
        self.check = check
        self.wait_timeout = wait_timeout
        self.max_expanded_elements = max_expanded_elements

    def read(self, event_file: str, ranges: List[Tuple[int, int]], step: int, tensor: str,
             keep_open: bool = False) -> List[bytes]:
        """Byte ranges of an event file the index names for ``tensor`` at ``step``.

        Writers publish the event file before the index (docs/format.md 1.4), so a missing one
        means a non-conforming writer or a slow file system: wait a little (``wait_timeout``,
        not past the end of the job), never forever, then MissingEventFile. A path or link
        leaving the run, or a FIFO, is a CorruptRecord. ``keep_open``: a single range is read
        through the storage's cache of open files (for the next lookup)."""
        storage = self.storage
        deadline = None
        while True:
            try:
                if len(ranges) == 1 and keep_open:
                    return [storage.read_range(event_file, *ranges[0])]
                return storage.read_ranges(event_file, ranges)
            except FileNotFoundError:
                pass
            except (ValueError, UnsafeRunFile) as exc:
                raise CorruptRecord(f"index entry of tensor {tensor!r} at step {step}: {exc}") from None
            except OSError as exc:  # permissions, I/O errors: this tensor at this step, named
                raise CorruptRecord(f"tensor {tensor!r} at step {step}: its event file "
                                    f"{storage.local_path(event_file)} cannot be read: {exc.strerror or exc}") from None
            if deadline is None:
                deadline = time.monotonic() + self.wait_timeout
            if storage.exists(END_OF_JOB_FILE) or time.monotonic() >= deadline:
                mode, _ = self.steps.global_to_mode.get(step, (GLOBAL, step))
                raise MissingEventFile(tensor, step, mode, storage.local_path(event_file))
            time.sleep(min(_MISSING_EVENT_POLL_S, max(0.0, deadline - time.monotonic())))

    def source(self, request: ReadRequest) -> str:
        """Where a record is, for error messages."""
        location = request.location
        return (
            f"{self.storage.local_path(location.event_file)} at offset {location.start} "
            f"(tensor {location.record_name!r}, step {request.step}, worker {request.worker})"
        )

    def decode(self, data: memoryview, request: ReadRequest) -> np.ndarray:
        """The value of the record ``data`` holds (the bytes read at its location); CorruptRecord,
        naming where it is, unless it is the record the index describes."""
        location = request.location
        if len(data) < location.length:
            raise CorruptRecord(
                f"{self.source(request)}: the file holds {len(data)} of the record's {location.length} bytes "
                "there (it ends before the record does)"
            )
        try:
            payload, _ = read_record(data, 0, self.check)
            if location.crc32c is not None:
                verify_payload_crc(payload, location.crc32c, "payload")
            decoded = decode_tensor_event(payload, max_expanded_elements=self.max_expanded_elements)
        except CorruptRecord as exc:
            # The message is built only on failure: this runs once per value read.
            raise CorruptRecord(f"{self.source(request)}: {exc}") from None
        if decoded.tag != location.record_name:
            raise CorruptRecord(
                f"{self.source(request)}: the record holds tensor {decoded.tag!r}, not "
                f"{location.record_name!r}; the index points at the wrong bytes"
            )
        return decoded.value
