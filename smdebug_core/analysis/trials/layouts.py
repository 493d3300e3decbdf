"""Reading event files of one layout side by side: the bulk reader's fast path.

Runs write the same records step after step, so most event files of a run hold their
wanted records at the same offsets, with the same lengths and names. Such files are read
side by side into one buffer (a row per file) and compared with one of them, the
*model*, fully checked by ``record_walk.walk_records``: every byte of its records must be
equal in the others, except the bytes that legitimately vary (wall time, step varint,
value, mode step digits), which get their own checks. A file that passes is therefore
parsed exactly as the model, and its values lie at the model's offsets. Payload CRC32Cs:
one CRC32C per file over each run of adjacent records, compared with the CRC that the
index's payload CRC32Cs imply (CRC32C is affine: see :func:`_runs_match_index_crcs`). A
file that fails any check goes to the record by record walk, which says which records are
damaged.
"""
from __future__ import annotations

import functools
import operator
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat
from typing import List, Tuple

import google_crc32c
import numpy as np

from ...storage.format import wire
from ...storage.format.records import FOOTER_SIZE, HEADER_SIZE
from .record_walk import FAST_DTYPES, FAST_MAX_RECORD, PAD, walk_records

_LAYOUT_MIN_FILES = 8  # fewer files of one layout: the general walk
_LAYOUT_MAX_SPAN = 1 << 20  # longer spans: the general walk
_LAYOUT_BATCH_BYTES = 2 << 20  # buffer for one batch of files of one layout (a few are reused)
_LAYOUT_MODELS = 3  # files tried as the model of a batch
_READ_AHEAD = 2  # batches being read, or read and waiting, while one is checked
# One reading thread: a second one made the whole slower on two cores (more time waiting
# for the GIL between system calls, for the thread checking the batches too).
_READ_THREADS = 1


def _mix(x, in_place: bool = False) -> np.ndarray:
    """A 64-bit hash of each integer (splitmix64's finalizer); wraps modulo 2^64.
    ``in_place``: ``x`` is a uint64 array that may be overwritten."""
    x = x if in_place else np.asarray(x).astype(np.uint64)
    shifted = np.empty_like(x)
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)):
        np.right_shift(x, np.uint64(shift), out=shifted)
        x ^= shifted
        if factor is not None:
            x *= np.uint64(factor)
    return x


def _digit_count(x: np.ndarray) -> np.ndarray:
    """Decimal digits of each non-negative integer (a mode step's text length)."""
    return np.searchsorted(10 ** np.arange(1, 19, dtype=np.int64), x, side="right") + 1


def _varint_size(x: np.ndarray) -> np.ndarray:
    """Bytes of each non-negative integer as a protobuf varint (an Event.step's length)."""
    return np.searchsorted(np.int64(1) << (7 * np.arange(1, 9, dtype=np.int64)), x, side="right") + 1


def _layout_groups(c, plan, step_table, file_info=None) -> List[np.ndarray]:
    """Files (indices into the plan) whose wanted records have exactly the same offsets in
    their span, lengths and names, and whose steps have the same mode and the same number of
    step varint bytes and mode step digits: one array per group of at least
    ``_LAYOUT_MIN_FILES`` files. ``plan``: a ``bulk.FilePlan``; ``file_info``:
    :meth:`RecordLog.file_info`."""
    order, first, count, fos = plan.order, plan.first, plan.count, plan.file_of_sorted
    length = plan.sorted(c["length"])
    span = plan.hi - plan.lo
    longest = np.maximum.reduceat(length, first)
    eligible = plan.coalesce & (span <= _LAYOUT_MAX_SPAN) & (longest <= FAST_MAX_RECORD)
    candidates = np.flatnonzero(eligible)
    if len(candidates) < _LAYOUT_MIN_FILES:
        return []
    known, mode_of, mode_step_of = step_table
    steps = c["step"][order[first]]
    at = np.searchsorted(known, steps)
    kind = mode_of[at] + 8 * (_digit_count(mode_step_of[at]) + 32 * _varint_size(steps))
    if file_info is not None:
        # Files read whole (every record of their index file wanted): the index file's
        # template (names) and layout (offsets, lengths) say everything; no hashing needed.
        template, layout, records = file_info
        file_id = c["file"][order[first[candidates]]]
        if (records[file_id] == count[candidates]).all():
            key = (template[file_id] * (int(layout.max(initial=0)) + 1) + layout[file_id]) * 4096 + kind[candidates]
            if int(template.max(initial=0) + 1) * (int(layout.max(initial=0)) + 1) < 1 << 50:
                return _groups_of(candidates, key)
    rel = plan.sorted(c["start"]) - plan.lo[fos]
    name = plan.sorted(c["name"])
    # Per file: a hash of its records' (offset, length, name, rank) and of its step's kind;
    # equal hashes are checked for exact equality below.
    # (Fields may overlap in the packed value: that only makes more hashes collide.)
    packed = np.arange(len(order), dtype=np.uint64)
    packed -= first[fos].astype(np.uint64)  # the record's rank in its file
    packed <<= np.uint64(37)
    packed += rel.astype(np.uint64)
    packed += length.astype(np.uint64) << np.uint64(20)
    record_hash = _mix(packed, in_place=True)
    record_hash += name.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    key = _mix(np.add.reduceat(record_hash, first) + _mix(count + (span << 24))) ^ _mix(kind + (1 << 50))
    groups = []
    for files in _groups_of(candidates, key[candidates]):
        m = int(count[files[0]])
        if not (count[files] == m).all():
            files = files[count[files] == m]
        at_rows = first[files][:, None] + np.arange(m)
        same = (span[files] == span[files[0]]) & (kind[files] == kind[files[0]])
        for column in (rel, length, name):
            block = column[at_rows]
            same &= (block == block[0]).all(axis=1)
        files = files[same]
        if len(files) >= _LAYOUT_MIN_FILES:
            groups.append(files)
    return groups


def _groups_of(items: np.ndarray, key: np.ndarray) -> List[np.ndarray]:
    """``items`` grouped by equal ``key`` (order kept within a group); groups of at least
    ``_LAYOUT_MIN_FILES``."""
    _, inverse, sizes = np.unique(key, return_inverse=True, return_counts=True)
    by_group = np.argsort(inverse.reshape(-1), kind="stable")
    bounds = np.r_[0, np.cumsum(sizes)]
    return [items[by_group[bounds[g]:bounds[g + 1]]] for g in np.flatnonzero(sizes >= _LAYOUT_MIN_FILES).tolist()]


def _read_into(storage, spans, buffer: np.ndarray, places: List[int], threads: bool = True) -> list:
    """Per span the number of bytes read into ``buffer`` at its place, or the exception."""
    reader = getattr(storage, "read_spans_into", None)
    if reader is not None:
        return reader(spans, memoryview(buffer), places, threads=threads)
    out = []
    for place, data in zip(places, storage.read_spans(spans)):
        if isinstance(data, bytes):
            buffer[place:place + len(data)] = np.frombuffer(data, np.uint8)
            data = len(data)
        out.append(data)
    return out


def _read_batches(storage, rows, plan, batches):
    """Per batch ``(files, span, stride, ...)``: ``(batch, table, flat, results)``, its
    files' spans read into ``table``, a ``(files, stride)`` uint8 array, a row per file
    (``flat``: the same bytes followed by ``PAD`` zero bytes).

    The arrays are views of a few reused buffers (fresh memory costs a page fault per 4 KiB
    written). With several batches on local storage, a thread reads the next batches while
    the caller checks this one: the reads wait on system calls, the checks are numpy loops
    that release the GIL. A batch's array is valid until the next one is asked for."""
    size = max(len(b[0]) * b[2] for b in batches) + PAD

    def read(buffer, batch, span, stride, *_, threads=True):
        g = len(batch)
        table = buffer[:g * stride].reshape(g, stride)
        buffer[g * stride:g * stride + PAD] = 0
        file_ids = rows.columns["file"][plan.order[plan.first[batch]]].tolist()
        spans = [(rows.files[f], o, span) for f, o in zip(file_ids, plan.lo[batch].tolist())]
        results = _read_into(storage, spans, buffer, list(range(0, g * stride, stride)), threads)
        if span < stride:
            table[:, span:] = 0
        return table, buffer[:g * stride + PAD], results

    def one_by_one():
        buffer = np.zeros(size, np.uint8)
        for batch in batches:
            yield (batch,) + read(buffer, *batch)

    if len(batches) == 1 or not hasattr(storage, "read_spans_into"):
        yield from one_by_one()
        return
    # The next batches are read on another thread while the caller checks this one.
    free = [np.zeros(size, np.uint8) for _ in range(_READ_AHEAD + 1)]
    pending: "deque" = deque()
    todo = iter(batches)

    def submit():
        batch = next(todo, None)
        if batch is not None:
            buffer = free.pop()
            pending.append((batch, buffer, pool.submit(read, buffer, *batch, threads=False)))

    with ThreadPoolExecutor(max_workers=_READ_THREADS, thread_name_prefix="smdebug-table-reader") as pool:
        try:
            submit()
        except RuntimeError:  # no thread can be started (interpreter shutting down...)
            yield from one_by_one()
            return
        try:
            for _ in range(_READ_AHEAD - 1):
                submit()
            while pending:
                batch, buffer, future = pending.popleft()
                yield (batch,) + future.result()
                free.append(buffer)
                submit()
        finally:
            for _, _, future in pending:
                future.cancel()


def read_layouts(storage, check: str, stats, rows, plan, step_table, values, keep, bar) -> np.ndarray:
    """Read and decode the files of :func:`_layout_groups` (``rows``: ``bulk.Rows``, ``plan``:
    their ``bulk.FilePlan``) into ``values`` and ``keep``; returns the rows settled (a value,
    or left out as a tensor of several elements). ``check``: the trial's record check."""
    c = rows.columns
    done = np.zeros(len(rows), bool)
    groups = _layout_groups(c, plan, step_table, rows.file_info)
    if not groups:
        return done
    crc_sorted = plan.sorted(c["crc"])
    batches = []
    for number, files in enumerate(groups):
        span = int(plan.hi[files[0]] - plan.lo[files[0]])
        stride = -(-span // 8) * 8
        per_batch = max(1, _LAYOUT_BATCH_BYTES // stride)
        batches += [(files[at:at + per_batch], span, stride, number) for at in range(0, len(files), per_batch)]
    by_layout = 0
    models = {}  # group -> its model, from the group's first batch
    for (batch, span, stride, number), table, flat, results in _read_batches(storage, rows, plan, batches):
        settled = _read_layout_batch(check, rows, plan, step_table, batch, span, crc_sorted, values, keep, done,
                                     table, flat, results, models, number)
        by_layout += settled
        if bar is not None:
            bar.update(settled)
    stats["table_records_bulk"] = stats.get("table_records_bulk", 0) + int(keep.sum())
    stats["table_files_by_layout"] = stats.get("table_files_by_layout", 0) + by_layout
    return done


def _read_layout_batch(check, rows, plan, step_table, batch, span, crc_sorted, values, keep, done,
                       table, flat, results, models, number) -> int:
    """One batch of files of one layout, read (see above); returns how many files it settled."""
    c = rows.columns
    order, first = plan.order, plan.first
    m = int(plan.count[batch[0]])
    g, stride = table.shape
    got = np.fromiter(map(operator.eq, results, repeat(span)), bool, g)  # an exception is no int
    at_rows = first[batch][:, None] + np.arange(m)  # positions in plan.order, a row per file
    row_ids = at_rows if plan.in_order else order[at_rows]
    rel = (c["start"][row_ids[0]] - plan.lo[batch[0]]).astype(np.int64)
    length = c["length"][row_ids[0]]
    model = models.get(number)
    if model is None:
        model = _layout_model(check, c, rows.names, table, flat, row_ids, rel, length, got, step_table)
        if model is None:  # no good model in this batch: its files take the general walk
            return 0
        models[number] = model
    model_row, mask, klass, digit_cols, content = model
    words = table.view("<u8")
    model_words, mask_words = model_row.view("<u8"), mask.view("<u8")
    ok = got.copy()
    chunk = max(1, (1 << 18) // stride)  # a few hundred files at a time: stays in cache
    differ = np.empty((min(chunk, g), stride // 8), np.uint64)
    for at in range(0, g, chunk):
        part = words[at:at + chunk]
        d = differ[:len(part)]
        np.bitwise_xor(part, model_words, out=d)
        d &= mask_words
        ok[at:at + chunk] &= ~d.any(axis=1)
    if len(digit_cols):
        ok &= ((table[:, digit_cols] - np.uint8(0x30)) < 10).all(axis=1)
    files_ok = np.flatnonzero(ok)
    if len(files_ok):
        ok[files_ok] = _runs_match_index_crcs(table, files_ok, model_row, _runs(rel, length), rel, length,
                                              crc_sorted[at_rows[files_ok]])
        files_ok = np.flatnonzero(ok)
    if not len(files_ok):
        return 0
    rows_ok = row_ids[files_ok]
    sub = table if len(files_ok) == g else table[files_ok]
    for code, slots, starts in content:
        np_dtype = FAST_DTYPES[code]
        picked = sub[:, (starts[:, None] + np.arange(np_dtype.itemsize)).reshape(-1)]
        ids = rows_ok[:, slots].reshape(-1)
        values[ids] = np.ascontiguousarray(picked).view(np_dtype).astype(np.float64).reshape(-1)
        keep[ids] = True
    # Records of several elements are well formed and no scalar: settled, without a row.
    done[rows_ok[:, klass != 0]] = True
    return len(files_ok) if (klass != 0).all() else 0


def _layout_model(check, c, names, table, flat, row_ids, rel, length, got, step_table):
    """Check a model file of the batch (``table``, the same bytes as ``flat`` followed by
    ``PAD`` zeros) with :func:`.record_walk.walk_records` and describe its layout: ``(model's bytes, mask, klass,
    digit_cols, content)``, or None when none of the files tried is one. ``klass`` per record:
    1 a scalar, 2 a well-formed tensor of several elements, 0 anything else (left to the
    general walk); ``mask`` per byte of a span: 0xFF must equal the model, 0x80 only the
    high bit (varint bytes), 0 anything (varying bytes and bytes of other records)."""
    known, mode_of, mode_step_of = step_table
    m = len(rel)
    best = None
    buffer = flat
    stride = table.shape[1]
    readable = np.flatnonzero(got)
    # Files tried: the first, the middle and the last one read (damage tends to come in runs).
    tried = dict.fromkeys(readable[[0, len(readable) // 2, -1]].tolist()) if len(readable) else {}
    for j in list(tried)[:_LAYOUT_MODELS]:
        off = j * stride + rel
        step = int(c["step"][row_ids[j, 0]])
        at = int(np.searchsorted(known, step))
        metadata = wire.metadata_field(int(mode_of[at]), int(mode_step_of[at]))
        w, dtype, unit, c_start, c_stop, tag_start, tag_stop, p, pe = walk_records(
            buffer, off, length, off + length, check, ([metadata], np.zeros(m, np.int64)))
        name_ids = c["name"][row_ids[j]]
        tags = np.fromiter((bytes(buffer[a:b]) == names[i].encode("utf-8")
                            for a, b, i in zip(tag_start.tolist(), tag_stop.tolist(), name_ids.tolist())), bool, m)
        ok = w.ok & w.same & tags
        size = np.array([FAST_DTYPES[d].itemsize if d in FAST_DTYPES else 0 for d in dtype.tolist()])
        ok &= size > 0
        c_len = c_stop - c_start
        several = ok & (c_len > size) & (c_len % np.maximum(size, 1) == 0)
        klass = np.where(ok & unit & (c_len == size), 1, np.where(several, 2, 0))
        if best is None or (klass != 0).sum() > (best[1] != 0).sum():
            best = (j, klass, dtype, c_start - j * stride, c_stop - j * stride, p - j * stride, pe - j * stride,
                    len(b"%d" % int(mode_step_of[at])))
        if (klass != 0).all():
            break
    if best is None or not (best[1] != 0).any():
        return None
    j, klass, dtype, c_start, c_stop, p, pe, digits_len = best
    row = buffer[j * stride:(j + 1) * stride]
    mask = np.zeros(stride, np.uint8)
    digit_cols, content = [], {}
    for r in np.flatnonzero(klass).tolist():
        mask[int(rel[r]):int(rel[r] + length[r])] = 0xFF
        varying = []
        pos = int(p[r])
        if row[pos] == wire.KEY_EVENT_WALL_TIME:  # wall_time: any 8 bytes
            varying += range(pos + 1, pos + 9)
            pos += 9
        if row[pos] == wire.KEY_EVENT_STEP:  # Event.step: a varint of the model's length (high bits checked)
            q = pos + 1
            while row[q] >= 0x80:
                q += 1
            mask[pos + 1:q + 1] = 0x80
        cs, ce = int(c_start[r]), int(c_stop[r])
        varying += range(cs, ce)
        # The metadata field starts where the tensor ends; its mode step digits a fixed
        # distance on (the model's metadata is wire.metadata_field's, a short field).
        digits = range(ce + wire.MODE_STEP_DIGITS_AT, ce + wire.MODE_STEP_DIGITS_AT + digits_len)
        digit_cols += digits
        varying += digits
        mask[varying] = 0
        if klass[r] == 1:
            content.setdefault(int(dtype[r]), []).append((r, cs))
    content_list = [(code, np.asarray([r for r, _ in items]), np.asarray([s for _, s in items], np.intp))
                    for code, items in content.items()]
    return row.copy(), mask, klass, np.asarray(digit_cols, np.intp), content_list


def _runs(rel: np.ndarray, length: np.ndarray) -> List[Tuple[int, int, int, int]]:
    """The records (sorted by offset) as runs of adjacent ones: ``(first, stop, start byte,
    end byte)`` each."""
    runs = []
    first = 0
    for r in range(1, len(rel) + 1):
        if r == len(rel) or rel[r] != rel[r - 1] + length[r - 1]:
            runs.append((first, r, int(rel[first]), int(rel[r - 1] + length[r - 1])))
            first = r
    return runs


@functools.lru_cache(maxsize=64)
def _shift_tables(distances: Tuple[int, ...]) -> Tuple[np.ndarray, np.ndarray]:
    """For each distance, CRC32C's register advanced over that many zero bytes (a linear
    map of its 32 bits) as four 256-entry tables, one per byte of the register; all
    concatenated, and where each byte's table starts."""
    images = []
    for distance in distances:
        zeros = bytes(distance)
        images += [google_crc32c.extend((1 << bit) ^ 0xFFFFFFFF, zeros) ^ 0xFFFFFFFF for bit in range(32)]
    basis = np.array(images, np.uint32).reshape(len(distances), 4, 8)
    tables = np.zeros((len(distances), 4, 256), np.uint32)
    for b in range(8):  # the entries whose top set bit is b
        tables[:, :, 1 << b:2 << b] = tables[:, :, :1 << b] ^ basis[:, :, b:b + 1]
    return tables.reshape(-1), np.arange(4 * len(distances), dtype=np.intp) * 256


def _shifted_xor(values: np.ndarray, distances: Tuple[int, ...]) -> np.ndarray:
    """Per row of ``values`` (uint32, a column per distance): the XOR of each value's
    register advanced over its column's distance of zero bytes; one table lookup per byte."""
    flat, base = _shift_tables(distances)
    index = np.ascontiguousarray(values, "<u4").view(np.uint8).reshape(len(values), -1).astype(np.intp)
    index += base
    return np.bitwise_xor.reduce(flat.take(index), axis=1)


def _runs_match_index_crcs(table: np.ndarray, files: np.ndarray, model: np.ndarray, runs, rel, length,
                           crcs: np.ndarray):
    """Per file (rows ``files`` of ``table``): the CRC32C of each run of its records equals
    the one its index's payload CRC32Cs imply.

    CRC32C is affine: two byte strings of one length that differ only inside payloads have
    CRCs that differ by the payloads' CRC differences, each advanced over the bytes that
    follow it. With the ``model``'s bytes (whose framing bytes every checked file shares),
    a run's expected CRC is the model's XOR, per record, (index CRC XOR the model's payload
    CRC) advanced to the end of the run; one CRC32C call per file and run checks all its
    records. A file fails when any record's payload differs from what its index CRC says,
    unless the CRC changes of two or more damaged records cancel exactly (for random damage
    as likely, 2^-32, as one record's CRC32C missing it). Records without an index CRC
    (other writers) are not checked, as value() does not check them; a run where only some
    have one is not accepted here (the record by record walk checks those)."""
    ok = np.ones(len(files), bool)
    for first, stop, start, end in runs:
        want = crcs[:, first:stop]
        has = want >= 0
        every = has.all(axis=1)
        ok &= every | ~has.any(axis=1)
        check = np.flatnonzero(ok & every)
        if not len(check):
            continue
        picked = files[check]
        rows = table[:, start:end] if len(picked) == len(table) else table[picked, start:end]
        actual = np.fromiter(map(google_crc32c.value, rows), np.int64, len(rows))
        ends = [int(rel[r] + length[r] - FOOTER_SIZE) for r in range(first, stop)]
        model_payload = np.array([google_crc32c.value(model[int(rel[r]) + HEADER_SIZE:e].tobytes())
                                  for r, e in zip(range(first, stop), ends)], np.int64)
        delta = np.ascontiguousarray((want[check] ^ model_payload).astype("<u4"))
        expected = _shifted_xor(delta, tuple(end - e for e in ends)).astype(np.int64)
        expected ^= google_crc32c.value(model[start:end].tobytes())
        ok[check[actual != expected]] = False
    return ok
