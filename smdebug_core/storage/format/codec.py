"""Tensor <-> serialized ``Event`` (docs/format.md 2.3).

One tensor per ``Event``: ``step`` = global step, ``summary.value[0]`` = {tag, metadata,
tensor}. The metadata holds ``("mode_step", "<n>")`` then ``("mode", "<enum number>")``
and, for dtypes the original smdebug reader cannot read back exactly, a third entry
``("smdebug_dtype", "<numpy dtype name>")``.

Dtype policy: the original reader reads float16/32/64, int32/64, uint8, bool and
complex128 correctly; it reads int8 as uint8 and cannot read int16, uint16, uint32,
uint64, complex64 or bfloat16 at all. Those are written as a *lossless* wider dtype the
original does read (see ``_WIDENED``) plus the ``smdebug_dtype`` entry, which our decoder
uses to cast back, so our round trip is bit- and dtype-exact while the original still
gets the right numbers. uint64 has no lossless wider dtype: when every value is below
2**63 it is written as int64 plus the marker (same numbers for the original); otherwise as
DT_UINT64, which our reader reads and the original cannot.

Large tensors (64 KiB and more) are not copied into the protobuf: the message is
serialized around an empty ``tensor_content`` and the array's bytes are spliced in with
hand-written length prefixes (:func:`encode_tensor_event_parts`). The result is
byte-identical to what protobuf itself would serialize. Small tensors take the plain
protobuf path, which costs less per record.
"""
import functools
import math
import struct
import sys
import time
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from google.protobuf.message import DecodeError

from ...exceptions import CorruptRecord
from ...modes import ModeKeys
from . import proto
from .layout import validate_step
from .wire import (
    DIM_NAME,
    DIM_SIZE,
    DTYPE_KEY,
    EVENT_STEP,
    EVENT_SUMMARY,
    EVENT_WALL_TIME,
    FIXED64,
    LENGTH_DELIMITED,
    MODE_KEY,
    MODE_STEP_KEY,
    SHAPE_DIM,
    SHAPE_KEY,
    SUMMARY_VALUE,
    TENSOR_CONTENT,
    TENSOR_DTYPE,
    TENSOR_SHAPE,
    VALUE_TAG,
    VALUE_TENSOR,
    VARINT,
    field_key,
    length_delimited,
    metadata_field,
    varint,
)
#: Marker value for numpy bytes (``S``) arrays, which are stored like strings.
BYTES_MARKER = "bytes"

_LITTLE_ENDIAN_HOST = sys.byteorder == "little"

# Numpy dtypes written as themselves; the original reader maps all but uint64 back exactly.
_NATIVE = {
    np.dtype(np.float16): proto.DT_HALF,
    np.dtype(np.float32): proto.DT_FLOAT,
    np.dtype(np.float64): proto.DT_DOUBLE,
    np.dtype(np.int32): proto.DT_INT32,
    np.dtype(np.int64): proto.DT_INT64,
    np.dtype(np.uint8): proto.DT_UINT8,
    np.dtype(np.bool_): proto.DT_BOOL,
    np.dtype(np.complex128): proto.DT_COMPLEX128,
    # Unreadable by the original, but nothing wider is lossless; used only when a value
    # is >= 2**63, otherwise uint64 goes out as int64 plus a marker (see _numeric_content).
    np.dtype(np.uint64): proto.DT_UINT64,
}


def _ml_dtypes_widenings():
    # Every narrow float that ml_dtypes offers is exactly representable as float32 and every
    # narrow int as int32. Names differ between ml_dtypes versions, so look them up.
    found = {}
    for name in ("bfloat16", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn",
                 "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
                 "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn"):
        scalar_type = getattr(ml_dtypes, name, None)
        if scalar_type is not None:
            found[np.dtype(scalar_type)] = np.dtype(np.float32)
    for name in ("int2", "int4", "uint2", "uint4"):
        scalar_type = getattr(ml_dtypes, name, None)
        if scalar_type is not None:
            found[np.dtype(scalar_type)] = np.dtype(np.int32)
    return found


# Dtypes written as a lossless wider dtype plus a ("smdebug_dtype", name) marker.
_WIDENED = {
    np.dtype(np.int8): np.dtype(np.int32),  # the original reads DT_INT8 as uint8
    np.dtype(np.int16): np.dtype(np.int32),
    np.dtype(np.uint16): np.dtype(np.int32),
    np.dtype(np.uint32): np.dtype(np.int64),
    np.dtype(np.complex64): np.dtype(np.complex128),
    **_ml_dtypes_widenings(),
}
_UINT64 = np.dtype(np.uint64)
_MARKER_TO_DTYPE = {dtype.name: dtype for dtype in (*_WIDENED, _UINT64)}

WIRE_TO_NUMPY = {
    proto.DT_FLOAT: np.dtype("<f4"),
    proto.DT_DOUBLE: np.dtype("<f8"),
    proto.DT_INT32: np.dtype("<i4"),
    proto.DT_UINT8: np.dtype("u1"),
    proto.DT_INT16: np.dtype("<i2"),
    proto.DT_INT8: np.dtype("i1"),
    proto.DT_COMPLEX64: np.dtype("<c8"),
    proto.DT_INT64: np.dtype("<i8"),
    proto.DT_BOOL: np.dtype(np.bool_),
    proto.DT_BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    proto.DT_UINT16: np.dtype("<u2"),
    proto.DT_COMPLEX128: np.dtype("<c16"),
    proto.DT_HALF: np.dtype("<f2"),
    proto.DT_UINT32: np.dtype("<u4"),
    proto.DT_UINT64: np.dtype("<u8"),
}
_STRING_KINDS = "UOST"  # str, object (of str), bytes, numpy 2 StringDType
#: TensorFlow's typed value lists (``float_val``...) may hold fewer values than the shape has
#: elements, the last value repeated to fill it: a 50-byte record can stand for gigabytes.
#: Decoding fills at most this many elements beyond what the record holds (CorruptRecord
#: otherwise); a trial takes another limit from ``max_expanded_elements`` or
#: ``SMDEBUG_MAX_EXPANDED_ELEMENTS``. 16M elements: 128 MiB as float64.
DEFAULT_MAX_EXPANDED_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class DecodedTensor:
    """One tensor record decoded. ``value`` is a read-only numpy array."""

    tag: str
    value: np.ndarray
    global_step: int
    mode: ModeKeys
    mode_step: int
    wall_time: float = 0.0


def to_numpy(value):
    """Turn a tensor value (ndarray, numpy scalar, python scalar, nested list) into an ndarray.

    0-d stays 0-d: a python float or a numpy scalar becomes a 0-d array.
    """
    if isinstance(value, np.ndarray):
        return value
    return np.asarray(value)


def is_real_number_dtype(dtype):
    """True for integer and real floating dtypes, including ml_dtypes' (bfloat16, float8, int4)."""
    dtype = np.dtype(dtype)
    return dtype.kind in "iuf" or (dtype.kind == "V" and dtype in _WIDENED)


def supported_dtypes():
    """Names of the numeric dtypes the codec can store (strings and bytes come on top)."""
    return sorted({d.name for d in _NATIVE} | set(_MARKER_TO_DTYPE))


# ---------------------------------------------------------------- encoding
#
# Large numeric records are encoded by hand (protobuf wire format, fields in number order,
# as protobuf itself serializes them), so that the array's bytes pass through without a
# copy. Small ones go through the protobuf classes, which is faster per record in Python.
# A test checks both against protobuf's own serialization of the parsed message.

_DOUBLE = struct.Struct("<d")

_KEY_EVENT_SUMMARY = field_key(EVENT_SUMMARY, LENGTH_DELIMITED)
_KEY_SUMMARY_VALUE = field_key(SUMMARY_VALUE, LENGTH_DELIMITED)  # one byte (field 1, wire type 2)

# From this size on, content is returned as a separate memoryview instead of being joined.
_SPLICE_MIN_BYTES = 64 * 1024


def _metadata_message(mode, mode_step, marker):
    metadata = proto.SummaryMetadata()
    metadata.plugin_data.add(plugin_name=MODE_STEP_KEY, content=str(mode_step).encode())
    metadata.plugin_data.add(plugin_name=MODE_KEY, content=str(mode.value).encode())
    if marker is not None:
        metadata.plugin_data.add(plugin_name=DTYPE_KEY, content=marker.encode())
    return metadata


@functools.lru_cache(maxsize=256)
def _cached_metadata(mode, mode_step, marker):
    """(message, serialized field) of ``Summary.Value.metadata``: the same for every record of a step.
    The field's bytes come from :func:`.wire.metadata_field`, the message's serialization byte for byte."""
    return _metadata_message(mode, mode_step, marker), metadata_field(mode.value, mode_step, marker)


def _shape_field(tag, shape):
    dims = []
    for size in shape:
        name = f"{tag}_{size}".encode("utf-8")
        size_field = field_key(DIM_SIZE, VARINT) + varint(size) if size else b""  # proto3 omits zeros
        dims.append(length_delimited(SHAPE_DIM, size_field + length_delimited(DIM_NAME, name)))
    return length_delimited(TENSOR_SHAPE, b"".join(dims))


@functools.lru_cache(maxsize=16)  # every record of a step shares it
def _event_head(wall_time, global_step):
    head = b""
    packed = _DOUBLE.pack(wall_time)
    if packed != bytes(8):
        head = field_key(EVENT_WALL_TIME, FIXED64) + packed
    if global_step:
        head += field_key(EVENT_STEP, VARINT) + varint(global_step)
    return head


def _string_tensor(tag, arr):
    """TensorProto for str/bytes arrays: dtype 0, shape, one string_val per element."""
    marker = None
    flat = arr.reshape(-1).tolist()
    if arr.dtype.kind == "S":
        marker = BYTES_MARKER
        encoded = flat
    else:
        for item in flat:
            if not isinstance(item, str):
                raise TypeError(
                    f"cannot save tensor {tag!r}: object arrays must hold only str, found {type(item).__name__}"
                )
        encoded = [item.encode("utf-8") for item in flat]
    tensor = proto.TensorProto(dtype=proto.DT_INVALID)
    tensor.tensor_shape.dim.add(size=arr.size, name=f"{tag}_{arr.size}")
    tensor.string_val.extend(encoded)
    true_shape = None if arr.ndim == 1 else ",".join(str(d) for d in arr.shape)
    return tensor, marker, true_shape


_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def _widen(arr, wider):
    if arr.dtype == _BFLOAT16:
        # bfloat16 is the top half of a float32: shifting keeps every bit, NaN payloads included
        # (a float conversion would canonicalize NaNs). (reshape: arithmetic on 0-d arrays
        # would return numpy scalars)
        bits = arr.reshape(-1).view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).reshape(arr.shape)
    return arr.astype(wider)


def _narrow(arr, target):
    if target == _BFLOAT16 and arr.dtype == np.float32:
        bits = arr.reshape(-1).view(np.uint32)
        if not (bits & 0xFFFF).any():  # written by _widen: exact inverse
            return (bits >> 16).astype(np.uint16).view(_BFLOAT16).reshape(arr.shape)
    return arr.astype(target)


def _numeric_content(tag, arr):
    """(wire dtype, marker or None, C-ordered little-endian array) for a numeric array."""
    dtype = arr.dtype
    if not dtype.isnative:
        arr = arr.astype(dtype.newbyteorder("="))
        dtype = arr.dtype
    wire = _NATIVE.get(dtype)
    marker = None
    if dtype == _UINT64 and (arr.size == 0 or int(arr.max()) < 2**63):
        # Same bits as int64, which the original reads; the marker restores the dtype.
        marker = dtype.name
        arr = arr.view(np.int64)
        wire = proto.DT_INT64
    elif wire is None:
        wider = _WIDENED.get(dtype)
        if wider is None:
            raise TypeError(
                f"cannot save tensor {tag!r}: dtype {dtype} is not supported;"
                f" supported: {', '.join(supported_dtypes())}, str and bytes"
            )
        marker = dtype.name
        arr = _widen(arr, wider)
        wire = _NATIVE[wider]
    if not _LITTLE_ENDIAN_HOST and arr.dtype.itemsize > 1:
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return wire, marker, arr


def encode_tensor_event_parts(tag, array, *, global_step, mode, mode_step, wall_time=None):
    """Serialize one tensor record as a list of buffers whose concatenation is the ``Event``.

    Small records come as one ``bytes``. For numeric tensors of 64 KiB and more the list is
    ``[prefix, tensor bytes, suffix]``, where the middle item is a memoryview of the
    (possibly converted) array: nothing large is copied. The caller must keep the array
    unchanged until the buffers are written.
    """
    if not isinstance(tag, str) or not tag:
        raise ValueError(f"tensor name must be a non-empty string, got {tag!r}")
    global_step = validate_step(global_step, "global_step")
    mode_step = validate_step(mode_step, "mode_step")
    mode = ModeKeys.parse(mode)
    if wall_time is None:
        wall_time = time.time()
    arr = to_numpy(array)

    if arr.dtype.kind in _STRING_KINDS:
        tensor, marker, true_shape = _string_tensor(tag, arr)
        event = proto.Event(wall_time=wall_time, step=global_step)
        value = event.summary.value.add(tag=tag)
        value.metadata.CopyFrom(_metadata_message(mode, mode_step, marker))
        if true_shape is not None:
            value.metadata.plugin_data.add(plugin_name=SHAPE_KEY, content=true_shape.encode())
        value.tensor.CopyFrom(tensor)
        return [event.SerializeToString()]

    shape = arr.shape
    wire, marker, arr = _numeric_content(tag, arr)
    content = memoryview(arr.reshape(-1).view(np.uint8))
    n = len(content)
    metadata, metadata_bytes = _cached_metadata(mode, mode_step, marker)

    if n == 0:
        # protobuf omits an empty tensor_content; let it build the (rare) empty record.
        event = proto.Event(wall_time=wall_time, step=global_step)
        value = event.summary.value.add(tag=tag)
        value.tensor.dtype = wire
        for size in shape:
            value.tensor.tensor_shape.dim.add(size=size, name=f"{tag}_{size}")
        value.tensor.tensor_shape.SetInParent()
        value.metadata.CopyFrom(metadata)
        return [event.SerializeToString()]

    # Hand-assembled, byte for byte what protobuf would write (tests compare): the fields
    # that depend only on (tag, dtype, shape) are cached, which makes the many small
    # records of a step (reductions, scalars) cheap to encode.
    tag_field, dtype_shape_content_key = _static_fields(tag, wire, shape)
    tensor_prefix = dtype_shape_content_key + varint(n)
    tensor_len = len(tensor_prefix) + n
    value_head = tag_field + varint(tensor_len)
    value_len = len(value_head) + tensor_len + len(metadata_bytes)
    summary_len_bytes = varint(value_len)
    summary_len = 1 + len(summary_len_bytes) + value_len  # 1: the Summary.value key
    prefix = b"".join((
        _event_head(wall_time, global_step),
        _KEY_EVENT_SUMMARY,
        varint(summary_len),
        _KEY_SUMMARY_VALUE,
        summary_len_bytes,
        value_head,
        tensor_prefix,
    ))
    if n < _SPLICE_MIN_BYTES:
        return [b"".join((prefix, content, metadata_bytes))]
    return [prefix, content, metadata_bytes]


@functools.lru_cache(maxsize=8192)
def _static_fields(tag, wire, shape):
    """What depends only on (tag, dtype, shape), the same at every step:
    (Value.tag field + Value.tensor key, TensorProto dtype + shape fields + content key)."""
    return (length_delimited(VALUE_TAG, tag.encode("utf-8")) + field_key(VALUE_TENSOR, LENGTH_DELIMITED),
            field_key(TENSOR_DTYPE, VARINT) + varint(wire) + _shape_field(tag, shape) + field_key(TENSOR_CONTENT, LENGTH_DELIMITED))


# Dtypes whose arrays go into a record as they are (native byte order, no marker): the
# common case, which StepEncoder assembles from cached pieces. uint64 is left out (it
# needs a look at its values), so are all dtypes on big-endian hosts but single bytes.
_VERBATIM_WIRE = {dtype: wire for dtype, wire in _NATIVE.items()
                  if dtype != _UINT64 and (_LITTLE_ENDIAN_HOST or dtype.itemsize == 1)}


@functools.lru_cache(maxsize=8192)
def _value_body(tag, wire, shape, n):
    """Bytes of ``Summary.Value`` before the content that depend only on (tag, dtype, shape):
    the tag field, the tensor key and length, the dtype and shape fields, the content key and length."""
    tag_field, dtype_shape_content_key = _static_fields(tag, wire, shape)
    tensor_prefix = dtype_shape_content_key + varint(n)
    return tag_field + varint(len(tensor_prefix) + n) + tensor_prefix


class StepEncoder:
    """Encodes the tensor records of one step, sharing what every record of a step has in common.

    ``encode(tag, array)`` returns what :func:`encode_tensor_event_parts` returns, byte
    for byte. Step, mode and wall time are validated once; the records of plain numeric
    arrays below 64 KiB (reductions, scalars, small layers: the many records of a step)
    are joined from cached pieces, a few microseconds each, which keeps the writer
    thread's hold on the GIL short while training runs.
    """

    def __init__(self, *, global_step, mode, mode_step, wall_time=None):
        self.global_step = validate_step(global_step, "global_step")
        self.mode = ModeKeys.parse(mode)
        self.mode_step = validate_step(mode_step, "mode_step")
        self.wall_time = time.time() if wall_time is None else wall_time
        self._head = _event_head(self.wall_time, self.global_step)
        self._metadata_field = _cached_metadata(self.mode, self.mode_step, None)[1]
        self._summary_heads = {}  # Value body length -> Event.summary key/length + Summary.value key/length

    @property
    def head(self):
        """The first bytes of every small record of this step (``Event.wall_time`` and ``step``)."""
        return self._head

    @property
    def metadata_field(self):
        """The last bytes of every small record of this step (mode and mode step)."""
        return self._metadata_field

    def middle(self, tag, arr):
        """The bytes between :attr:`head` and the array's own bytes in the record of a
        small plain array (``arr`` a C-contiguous ndarray of a verbatim dtype, 1 byte to
        64 KiB): the record is ``head + middle + arr bytes + metadata_field``. None for
        anything else (those records are built by :func:`encode_tensor_event_parts`).
        ``middle`` depends only on (tag, dtype, shape) and the lengths of head and metadata.
        """
        wire = _VERBATIM_WIRE.get(arr.dtype)
        n = arr.nbytes
        if wire is None or not 0 < n < _SPLICE_MIN_BYTES or not arr.flags.c_contiguous or type(tag) is not str \
                or not tag:
            return None
        body = _value_body(tag, wire, arr.shape, n)
        value_len = len(body) + n + len(self._metadata_field)
        summary_head = self._summary_heads.get(value_len)
        if summary_head is None:
            value_len_bytes = varint(value_len)
            summary_head = self._summary_heads[value_len] = b"".join((
                _KEY_EVENT_SUMMARY, varint(1 + len(value_len_bytes) + value_len), _KEY_SUMMARY_VALUE,
                value_len_bytes))
        return summary_head + body

    def encode(self, tag, array):
        arr = array if type(array) is np.ndarray else to_numpy(array)
        middle = self.middle(tag, arr)
        if middle is None:
            return encode_tensor_event_parts(tag, arr, global_step=self.global_step, mode=self.mode,
                                             mode_step=self.mode_step, wall_time=self.wall_time)
        return [b"".join((self._head, middle, arr, self._metadata_field))]


def encode_tensor_event(tag, array, *, global_step, mode, mode_step, wall_time=None):
    """Serialize one tensor record (an ``Event``) to bytes. See :func:`encode_tensor_event_parts`."""
    parts = encode_tensor_event_parts(
        tag, array, global_step=global_step, mode=mode, mode_step=mode_step, wall_time=wall_time
    )
    return parts[0] if len(parts) == 1 else b"".join(parts)


# ---------------------------------------------------------------- decoding


def parse_event(payload, source="record"):
    """Parse a payload into an ``Event`` message; CorruptRecord if it is not one."""
    event = proto.Event()
    try:
        event.ParseFromString(payload)  # accepts bytes and memoryviews without copying first
    except (DecodeError, ValueError, TypeError, IndexError, RuntimeError) as exc:
        raise CorruptRecord(f"{source}: payload is not a valid Event protobuf ({exc})") from None
    return event


def _plugin_entries(value, source):
    entries = {}
    for plugin in value.metadata.plugin_data:
        try:
            entries[plugin.plugin_name] = bytes(plugin.content).decode("ascii")
        except UnicodeDecodeError:
            raise CorruptRecord(f"{source}: plugin_data {plugin.plugin_name!r} is not ASCII") from None
    return entries


def _shape_of(tensor, source):
    if tensor.tensor_shape.unknown_rank:
        raise CorruptRecord(f"{source}: tensor has unknown rank")
    shape = tuple(dim.size for dim in tensor.tensor_shape.dim)
    if any(size < 0 for size in shape):
        raise CorruptRecord(f"{source}: tensor shape {shape} has a negative dimension")
    return shape


def _decode_strings(tensor, shape, size, marker, source):
    items = list(tensor.string_val)
    if len(items) != size:
        if tensor.tensor_shape.dim:
            raise CorruptRecord(f"{source}: string tensor of shape {shape} holds {len(items)} values")
        shape = (len(items),)  # lenient: no shape recorded, treat as 1-D
    if marker == BYTES_MARKER:
        return np.array(items, dtype=np.bytes_).reshape(shape)
    try:
        texts = [item.decode("utf-8") for item in items]
    except UnicodeDecodeError:
        raise CorruptRecord(f"{source}: string tensor holds invalid UTF-8") from None
    return np.array(texts, dtype=np.str_).reshape(shape)


def _typed_values(tensor, np_dtype):
    """The *_val list TensorFlow uses for a dtype, as a numpy array (or None)."""
    wire = tensor.dtype
    if wire == proto.DT_FLOAT:
        return np.array(tensor.float_val, dtype=np.float32)
    if wire == proto.DT_DOUBLE:
        return np.array(tensor.double_val, dtype=np.float64)
    if wire in (proto.DT_INT32, proto.DT_INT16, proto.DT_INT8, proto.DT_UINT8, proto.DT_UINT16):
        return np.array(tensor.int_val, dtype=np.int64).astype(np_dtype)
    if wire == proto.DT_INT64:
        return np.array(tensor.int64_val, dtype=np.int64)
    if wire == proto.DT_BOOL:
        return np.array(tensor.bool_val, dtype=np.bool_)
    if wire in (proto.DT_HALF, proto.DT_BFLOAT16):  # bit patterns stored as ints
        return np.array(tensor.half_val, dtype=np.int64).astype(np.uint16).view(np_dtype)
    if wire == proto.DT_UINT32:
        return np.array(tensor.uint32_val, dtype=np.uint32)
    if wire == proto.DT_UINT64:
        return np.array(tensor.uint64_val, dtype=np.uint64)
    if wire == proto.DT_COMPLEX64:
        return np.array(tensor.scomplex_val, dtype=np.float32).view(np.complex64) if len(tensor.scomplex_val) % 2 == 0 else None
    if wire == proto.DT_COMPLEX128:
        return np.array(tensor.dcomplex_val, dtype=np.float64).view(np.complex128) if len(tensor.dcomplex_val) % 2 == 0 else None
    return None


def tensor_proto_to_numpy(tensor, marker=None, source="record",
                          max_expanded_elements=DEFAULT_MAX_EXPANDED_ELEMENTS):
    """Decode a ``TensorProto`` into a numpy array, applying an ``smdebug_dtype`` marker.

    Reads ``tensor_content`` when present, otherwise TensorFlow's typed ``*_val`` lists
    (with TensorFlow's rule that a short list is padded with its last value, up to
    ``max_expanded_elements`` elements).
    """
    shape = _shape_of(tensor, source)
    size = math.prod(shape)
    if tensor.dtype in (proto.DT_INVALID, proto.DT_STRING):
        return _decode_strings(tensor, shape, size, marker, source)
    np_dtype = WIRE_TO_NUMPY.get(tensor.dtype)
    if np_dtype is None:
        raise CorruptRecord(f"{source}: unsupported tensor DataType {tensor.dtype}")
    content = tensor.tensor_content
    if content:
        if len(content) != size * np_dtype.itemsize:
            raise CorruptRecord(
                f"{source}: tensor_content holds {len(content)} bytes, shape {shape} of"
                f" {np_dtype.name} needs {size * np_dtype.itemsize}"
            )
        arr = np.frombuffer(content, dtype=np_dtype).reshape(shape)
    else:
        values = _typed_values(tensor, np_dtype)
        if values is None:
            raise CorruptRecord(f"{source}: malformed typed values for DataType {tensor.dtype}")
        if len(values) > size or (len(values) == 0 and size > 0):
            raise CorruptRecord(f"{source}: tensor of shape {shape} holds {len(values)} values")
        if len(values) < size:
            if size > max_expanded_elements:
                raise CorruptRecord(
                    f"{source}: tensor of shape {shape} holds {len(values)} values; repeating the last "
                    f"to fill {size} elements exceeds the limit of {max_expanded_elements} "
                    "(raise it with create_trial(..., max_expanded_elements=N) or "
                    "SMDEBUG_MAX_EXPANDED_ELEMENTS if the record is genuine)"
                )
            values = np.concatenate([values, np.repeat(values[-1:], size - len(values))])
        arr = values.astype(np_dtype, copy=False).reshape(shape)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if marker is not None:
        target = _MARKER_TO_DTYPE.get(marker)
        if target is None:
            raise CorruptRecord(f"{source}: unknown {DTYPE_KEY} marker {marker!r}")
        arr = _narrow(arr, target)
    arr.flags.writeable = False
    return arr


def _restore_shape(array, text, source):
    try:
        shape = tuple(int(d) for d in text.split(",")) if text else ()
    except ValueError:
        raise CorruptRecord(f"{source}: bad {SHAPE_KEY} entry {text!r}") from None
    if any(d < 0 for d in shape) or math.prod(shape) != array.size:
        raise CorruptRecord(f"{source}: {SHAPE_KEY} {shape} does not fit {array.size} values")
    return array.reshape(shape)


def decode_tensor_event(payload, source="record", max_expanded_elements=DEFAULT_MAX_EXPANDED_ELEMENTS):
    """Decode one tensor record's payload (as written by us or by the original smdebug).

    When the mode entries are missing, the mode is GLOBAL and the mode step is the global
    step, as the original ``FileReader`` does. Raises CorruptRecord for anything else
    that does not decode.
    """
    event = parse_event(payload, source)
    if not event.HasField("summary") or not event.summary.value:
        raise CorruptRecord(f"{source}: event holds no summary value (not a tensor record)")
    value = event.summary.value[0]
    if value.WhichOneof("value") != "tensor":
        raise CorruptRecord(f"{source}: summary value {value.tag!r} holds no tensor")
    entries = _plugin_entries(value, source)
    global_step = event.step
    if global_step < 0:
        raise CorruptRecord(f"{source}: negative global step {global_step}")
    try:
        mode = ModeKeys(int(entries[MODE_KEY])) if MODE_KEY in entries else ModeKeys.GLOBAL
        mode_step = int(entries[MODE_STEP_KEY]) if MODE_STEP_KEY in entries else global_step
    except ValueError:
        raise CorruptRecord(
            f"{source}: bad mode/mode_step plugin data {entries.get(MODE_KEY)!r}/{entries.get(MODE_STEP_KEY)!r}"
        ) from None
    # No check that mode_step >= 0: the original stamps a scalar held across set_mode() with
    # the new mode's step -1. Readers take mode and mode step from the index, not from here.
    array = tensor_proto_to_numpy(value.tensor, entries.get(DTYPE_KEY), source, max_expanded_elements)
    if SHAPE_KEY in entries:
        array = _restore_shape(array, entries[SHAPE_KEY], source)
    return DecodedTensor(value.tag, array, global_step, mode, mode_step, event.wall_time)
