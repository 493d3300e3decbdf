"""Index files: where each record of a step's event file lives (docs/format.md 3.1).

Every ``tensor_payload`` entry we write carries an extra key, ``crc32c``: the unmasked
CRC32C of the record's payload bytes. Event files must carry smdebug's constant footer
instead of a real payload CRC (otherwise the original reader refuses them), so payload
corruption is detected through the index. The original reader ignores unknown keys.
"""
import functools
import json
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Tuple

from ...exceptions import IndexReaderException
from ...modes import ModeKeys
from .layout import EVENT_FILE_SUFFIX, EVENTS_DIR, MAX_STEP_EXCLUSIVE, validate_step
from .records import RECORD_OVERHEAD

PAYLOAD_CRC_KEY = "crc32c"
#: Top-level index key: name -> placement of a record that is one worker's piece of a sharded
#: tensor (docs/format.md 3.3). Ours; the original reader reads only meta/tensor_payload/shape_payload.
PLACEMENTS_KEY = "shard_placements"
# Offsets and lengths beyond this are not plausible file positions.
_MAX_FILE_OFFSET = 2**62


class IndexEntry(NamedTuple):
    """One record of an event file: tensor name, byte range, payload CRC32C (None if unknown).

    A NamedTuple because a large run has millions of these and opening it must be fast.
    """

    name: str
    start_idx: int
    length: int
    crc32c: Optional[int] = None


@dataclass(frozen=True)
class ParsedIndex:
    """A validated index file."""

    mode: ModeKeys
    mode_step: int
    event_file_name: Optional[str]
    tensors: List[IndexEntry] = field(default_factory=list)
    shapes: List[Tuple[str, Tuple[int, ...]]] = field(default_factory=list)
    #: ``originalname`` of each shape entry, parallel to ``shapes``.
    shape_original_names: List[str] = field(default_factory=list)
    #: name -> :class:`Placement` of a record that is one worker's piece of a sharded tensor.
    placements: Dict[str, "Placement"] = field(default_factory=dict)


class Placement(NamedTuple):
    """Where one worker's piece lies in the full tensor (docs/format.md 3.3): the block at
    ``offsets`` of shape ``local_shape``, or, when ``flat`` (FSDP v1's flat shards), the
    elements ``offsets[0]`` .. ``+ local_shape[0]`` of the flattened full tensor."""

    global_shape: Tuple[int, ...]
    local_shape: Tuple[int, ...]
    offsets: Tuple[int, ...]
    flat: bool


#: Placements with more dimensions than this are refused (as numpy refuses them).
_MAX_DIMS = 64


def build_index_json(mode, mode_step, event_file_relpath, entries, shapes):
    """The bytes of one index file.

    ``entries`` are :class:`IndexEntry`; ``event_file_relpath`` may be None when there are
    none (a shapes-only step). ``shapes`` items are ``(name, shape)`` or
    ``(name, original_name, shape)``.
    """
    return index_json_from_items(mode, mode_step, event_file_relpath,
                                 [entry_json(*entry) for entry in entries], shapes)


def entry_json(name, start_idx, length, crc=None):
    """One ``tensor_payload`` item, formatted as ``json.dumps`` formats it."""
    if crc is None:
        return f'{_entry_head(name)}{int(start_idx)}, "length": {int(length)}}}'
    return f"{_entry_json_head(name, start_idx, length)}{int(crc)}}}"


def entries_json_template(names, starts, lengths) -> List[str]:
    """The ``tensor_payload`` items of several records, joined by ``", "``, as the text around
    their CRCs: one more piece than records, to complete with :func:`complete_entries`. A
    writer that repeats a step's layout makes this once and completes it at each step."""
    pieces = [""]
    for name, start, length in zip(names, starts, lengths):
        pieces[-1] += _entry_json_head(name, start, length)
        pieces.append("}, ")
    pieces[-1] = "}"
    return pieces


def complete_entries(pieces: List[str], crcs: List[int]) -> str:
    """:func:`entries_json_template`'s pieces with each record's CRC in place (one join: a
    step may hold thousands of records)."""
    out = [""] * (2 * len(pieces) - 1)
    out[::2] = pieces
    out[1::2] = map(str, crcs)
    return "".join(out)


def _entry_json_head(name, start_idx, length):
    return f'{_entry_head(name)}{int(start_idx)}, "length": {int(length)}, "{PAYLOAD_CRC_KEY}": '


def index_json_from_items(mode, mode_step, event_file_relpath, entry_items, shapes, placements=None):
    """:func:`build_index_json` from entries already formatted: each item of ``entry_items``
    is one :func:`entry_json` or several joined by ``", "`` (:func:`entries_json_template`).
    ``placements`` (name -> placement of a record that is a piece of a larger tensor) go to
    an extra top-level key, :data:`PLACEMENTS_KEY`, which the original reader never reads."""
    mode = ModeKeys.parse(mode)
    meta = {"mode": mode.name, "mode_step": validate_step(mode_step, "mode_step")}
    if event_file_relpath is not None:
        meta["event_file_name"] = event_file_relpath
    elif entry_items:
        raise ValueError("an index with tensor entries needs the event file's relative path")
    shape_payload = []
    for shape_item in shapes:
        if len(shape_item) == 3:
            name, original, shape = shape_item
        else:
            name, shape = shape_item
            original = name
        shape_payload.append({"tensorname": name, "originalname": original, "shape": [int(s) for s in shape]})
    # The original writes with json's default separators; keep that for byte-level familiarity
    # (what json.dumps of the same document gives, byte for byte: a test compares).
    extra = f', "{PLACEMENTS_KEY}": {json.dumps(placements)}' if placements else ""
    return (f'{{"meta": {json.dumps(meta)}, "tensor_payload": [{", ".join(entry_items)}], '
            f'"shape_payload": {json.dumps(shape_payload)}{extra}}}').encode("utf-8")


@functools.lru_cache(maxsize=1 << 16)
def _entry_head(name):
    return f'{{"tensorname": {json.dumps(name)}, "start_idx": '


def _fail(source, message):
    raise IndexReaderException(f"{source}: {message}")


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(source, what, value, minimum, maximum):
    if not _is_int(value) or not minimum <= value < maximum:
        _fail(source, f"{what} must be an integer in [{minimum}, {maximum}), got {value!r}")
    return value


def _check_name(source, what, value):
    if not isinstance(value, str) or not value:
        _fail(source, f"{what} must be a non-empty string, got {value!r}")
    return value


def _check_event_file_name(source, value):
    if not isinstance(value, str) or not value:
        _fail(source, f"meta.event_file_name must be a non-empty string, got {value!r}")
    parts = value.split("/")
    if (
        "\\" in value
        or "\x00" in value
        or value.startswith("/")
        or ":" in parts[0]  # a Windows drive or URL scheme
        or parts[0] != EVENTS_DIR
        or len(parts) < 2
        or any(part in ("", ".", "..") for part in parts)
        or not value.endswith(EVENT_FILE_SUFFIX)
    ):
        _fail(
            source,
            f"meta.event_file_name {value!r} must be a relative path 'events/.../*.tfevents'"
            " without '..', '.', empty components or backslashes",
        )
    return value


def _explain_bad_tensor_entry(source, i, item):
    where = f"tensor_payload[{i}]"
    if not isinstance(item, dict):
        _fail(source, f"{where} must be an object, got {type(item).__name__}")
    _check_name(source, f"{where}.tensorname", item.get("tensorname"))
    _check_int(source, f"{where}.start_idx", item.get("start_idx"), 0, _MAX_FILE_OFFSET)
    _check_int(source, f"{where}.length", item.get("length"), RECORD_OVERHEAD, _MAX_FILE_OFFSET)
    _check_int(source, f"{where}.{PAYLOAD_CRC_KEY}", item.get(PAYLOAD_CRC_KEY), 0, 2**32)
    _fail(source, f"{where} is invalid: {item!r}")


def parse_index_json(data, source):
    """Parse and validate an index file's bytes; ``source`` (its path) prefixes every error.

    Raises IndexReaderException for anything that does not follow docs/format.md 3.1.
    """
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        _fail(source, f"empty or corrupt index file ({exc.__class__.__name__}: {exc})")
    if not isinstance(document, dict):
        _fail(source, f"index file must hold a JSON object, got {type(document).__name__}")
    meta = document.get("meta")
    if not isinstance(meta, dict) or not meta:
        _fail(source, "index file has no non-empty 'meta' object")
    mode_name = meta.get("mode")
    if not isinstance(mode_name, str) or mode_name.strip() not in ModeKeys.__members__:
        _fail(source, f"meta.mode must be one of {', '.join(ModeKeys.__members__)}, got {mode_name!r}")
    mode = ModeKeys[mode_name.strip()]
    mode_step = _check_int(source, "meta.mode_step", meta.get("mode_step"), 0, MAX_STEP_EXCLUSIVE)

    if "tensor_payload" not in document and "shape_payload" not in document:
        _fail(source, "index file has neither 'tensor_payload' nor 'shape_payload'")
    tensor_payload = document.get("tensor_payload") or []
    shape_payload = document.get("shape_payload") or []
    if not isinstance(tensor_payload, list):
        _fail(source, f"'tensor_payload' must be a list, got {type(tensor_payload).__name__}")
    if not isinstance(shape_payload, list):
        _fail(source, f"'shape_payload' must be a list, got {type(shape_payload).__name__}")

    event_file_name = meta.get("event_file_name")
    if event_file_name == "":
        # 1.0.34's reader took "" for "no event file": a shape-only step, or a step whose
        # entries point into no file. The step counts, with its mode; such entries have no value.
        event_file_name, tensor_payload = None, []
    if event_file_name is not None or tensor_payload:
        event_file_name = _check_event_file_name(source, event_file_name)

    tensors = []
    for i, item in enumerate(tensor_payload):
        # Fast path: inline checks (this loop dominates opening a large run); the detailed
        # checks below run only to explain a bad entry.
        try:
            name, start, length = item["tensorname"], item["start_idx"], item["length"]
            crc = item.get(PAYLOAD_CRC_KEY)
            valid = (
                type(name) is str and name
                and type(start) is int and 0 <= start < _MAX_FILE_OFFSET
                and type(length) is int and RECORD_OVERHEAD <= length < _MAX_FILE_OFFSET
                and (crc is None or (type(crc) is int and 0 <= crc < 2**32))
            )
        except (TypeError, KeyError, AttributeError):
            valid = False
        if not valid:
            _explain_bad_tensor_entry(source, i, item)
        tensors.append(IndexEntry(name, start, length, crc))

    shapes, original_names = [], []
    for i, item in enumerate(shape_payload):
        where = f"shape_payload[{i}]"
        if not isinstance(item, dict):
            _fail(source, f"{where} must be an object, got {type(item).__name__}")
        name = _check_name(source, f"{where}.tensorname", item.get("tensorname"))
        original = item.get("originalname", name)
        if not isinstance(original, str):
            _fail(source, f"{where}.originalname must be a string, got {original!r}")
        shape = item.get("shape")
        if not isinstance(shape, list):
            _fail(source, f"{where}.shape must be a list of integers, got {shape!r}")
        dims = tuple(_check_int(source, f"{where}.shape[{d}]", size, 0, _MAX_FILE_OFFSET) for d, size in enumerate(shape))
        shapes.append((name, dims))
        original_names.append(original)

    placements = _parse_placements(source, document.get(PLACEMENTS_KEY))
    return ParsedIndex(mode, mode_step, event_file_name, tensors, shapes, original_names, placements)


def _parse_placements(source, value) -> Dict[str, Placement]:
    """The validated :data:`PLACEMENTS_KEY` object (absent: none)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        _fail(source, f"'{PLACEMENTS_KEY}' must be an object, got {type(value).__name__}")
    out = {}
    for name, item in value.items():
        where = f"{PLACEMENTS_KEY}[{name!r}]"
        if not isinstance(item, dict):
            _fail(source, f"{where} must be an object, got {type(item).__name__}")

        def dims(key, allow_missing=False):
            dims_value = item.get(key)
            if dims_value is None and allow_missing:
                return None
            if not isinstance(dims_value, list) or len(dims_value) > _MAX_DIMS:
                _fail(source, f"{where}.{key} must be a list of at most {_MAX_DIMS} integers, got {dims_value!r}")
            return tuple(_check_int(source, f"{where}.{key}[{d}]", v, 0, _MAX_FILE_OFFSET)
                         for d, v in enumerate(dims_value))

        global_shape, local_shape = dims("global_shape"), dims("local_shape")
        offsets = dims("offsets", allow_missing=True)
        flat = offsets is None
        if flat:
            offsets = (_check_int(source, f"{where}.flat_offset", item.get("flat_offset"), 0, _MAX_FILE_OFFSET),)
            if len(local_shape) != 1:
                _fail(source, f"{where}: a flat piece has a 1-dimensional local_shape, got {list(local_shape)}")
            total = 1
            for size in global_shape:
                total *= size
            if offsets[0] + local_shape[0] > total:
                _fail(source, f"{where}: elements {offsets[0]}..{offsets[0] + local_shape[0]} lie outside a tensor of "
                              f"{total}")
        elif not (len(offsets) == len(local_shape) == len(global_shape)) or any(
                o + n > g for o, n, g in zip(offsets, local_shape, global_shape)):
            _fail(source, f"{where}: the block at {list(offsets)} of shape {list(local_shape)} lies outside "
                          f"{list(global_shape)}")
        out[name] = Placement(global_shape, local_shape, offsets, flat)
    return out
