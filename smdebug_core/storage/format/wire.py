"""The byte layout of a tensor record's ``Event`` (docs/format.md 2.2, 2.3), written down once.

Field numbers and keys of the messages a tensor record uses, protobuf varints and
length-delimited fields, and the ``Summary.Value.metadata`` field (mode step and mode).
``codec`` encodes records by this description; the reader's vectorized walk
(``analysis/trials/record_walk.py``) checks records against it, byte by byte.
"""
import functools
from typing import Optional

# Wire types.
VARINT, FIXED64, LENGTH_DELIMITED = 0, 1, 2

# Field numbers (docs/format.md 2.2).
EVENT_WALL_TIME, EVENT_STEP, EVENT_SUMMARY = 1, 2, 5
SUMMARY_VALUE = 1
VALUE_TAG, VALUE_TENSOR, VALUE_METADATA = 1, 8, 9
TENSOR_DTYPE, TENSOR_SHAPE, TENSOR_CONTENT = 1, 2, 4
SHAPE_DIM, DIM_SIZE, DIM_NAME = 2, 1, 2
METADATA_PLUGIN_DATA = 1
PLUGIN_NAME, PLUGIN_CONTENT = 1, 2

# Plugin entries of the metadata (docs/format.md 2.3).
MODE_STEP_KEY = "mode_step"
MODE_KEY = "mode"
DTYPE_KEY = "smdebug_dtype"
# The original reader accepts only 1-D string tensors: others are written flattened, with
# their true shape ("2,3"; "" for 0-d) in this plugin entry.
SHAPE_KEY = "smdebug_shape"

_SMALL_VARINTS = [bytes((i,)) for i in range(128)]


def varint(value: int) -> bytes:
    """A non-negative integer as a protobuf varint."""
    if value < 128:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_key(field_number: int, wire_type: int) -> bytes:
    return varint((field_number << 3) | wire_type)


def key_byte(field_number: int, wire_type: int) -> int:
    """A field's key as one byte (field numbers below 16), as the vectorized reader compares it."""
    (byte,) = field_key(field_number, wire_type)
    return byte


def length_delimited(field_number: int, payload: bytes) -> bytes:
    """A complete length-delimited (wire type 2) field."""
    return field_key(field_number, LENGTH_DELIMITED) + varint(len(payload)) + payload


# One-byte keys, in the order they appear in a record written by this project.
KEY_EVENT_WALL_TIME = key_byte(EVENT_WALL_TIME, FIXED64)
KEY_EVENT_STEP = key_byte(EVENT_STEP, VARINT)
KEY_EVENT_SUMMARY = key_byte(EVENT_SUMMARY, LENGTH_DELIMITED)
KEY_SUMMARY_VALUE = key_byte(SUMMARY_VALUE, LENGTH_DELIMITED)
KEY_VALUE_TAG = key_byte(VALUE_TAG, LENGTH_DELIMITED)
KEY_VALUE_TENSOR = key_byte(VALUE_TENSOR, LENGTH_DELIMITED)
KEY_TENSOR_DTYPE = key_byte(TENSOR_DTYPE, VARINT)
KEY_TENSOR_SHAPE = key_byte(TENSOR_SHAPE, LENGTH_DELIMITED)
KEY_SHAPE_DIM = key_byte(SHAPE_DIM, LENGTH_DELIMITED)
KEY_DIM_SIZE = key_byte(DIM_SIZE, VARINT)
KEY_DIM_NAME = key_byte(DIM_NAME, LENGTH_DELIMITED)
KEY_TENSOR_CONTENT = key_byte(TENSOR_CONTENT, LENGTH_DELIMITED)
KEY_VALUE_METADATA = key_byte(VALUE_METADATA, LENGTH_DELIMITED)
KEY_PLUGIN_DATA = key_byte(METADATA_PLUGIN_DATA, LENGTH_DELIMITED)
KEY_PLUGIN_NAME = key_byte(PLUGIN_NAME, LENGTH_DELIMITED)
KEY_PLUGIN_CONTENT = key_byte(PLUGIN_CONTENT, LENGTH_DELIMITED)


@functools.lru_cache(maxsize=None)  # one per plugin name
def _plugin_head(name: str) -> bytes:
    """A plugin entry's bytes before its content's length: the name field and the content key."""
    return length_delimited(PLUGIN_NAME, name.encode()) + field_key(PLUGIN_CONTENT, LENGTH_DELIMITED)


def _plugin_entry(name: str, content: bytes) -> bytes:
    body = _plugin_head(name) + varint(len(content)) + content
    return field_key(METADATA_PLUGIN_DATA, LENGTH_DELIMITED) + varint(len(body)) + body


@functools.lru_cache(maxsize=1 << 16)  # the same for every record of a step
def metadata_field(mode: int, mode_step: int, marker: Optional[str] = None) -> bytes:
    """``Summary.Value.metadata`` as a complete field, byte for byte as protobuf serializes it:
    the entries ("mode_step", "<mode_step>"), ("mode", "<mode number>") and, with a dtype
    ``marker``, ("smdebug_dtype", marker). ``mode``: the mode's number (TRAIN 1 ...)."""
    body = _plugin_entry(MODE_STEP_KEY, b"%d" % mode_step) + _plugin_entry(MODE_KEY, b"%d" % mode)
    if marker is not None:
        body += _plugin_entry(DTYPE_KEY, marker.encode())
    return length_delimited(VALUE_METADATA, body)


#: Where the mode step's digits start in :func:`metadata_field` while its lengths take one
#: byte each (a field under 128 bytes): the field's key and length, the entry's key and
#: length, the name field and content key, the content's length.
MODE_STEP_DIGITS_AT = 2 + 2 + len(_plugin_head(MODE_STEP_KEY)) + 1
