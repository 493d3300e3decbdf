"""TFRecord framing with masked CRC32C (docs/format.md 2.1).

A record is ``u64 length | u32 masked_crc32c(length bytes) | payload | u32 footer``.
``events/`` files carry the constant :data:`SMDEBUG_PAYLOAD_FOOTER` as footer (the
original smdebug reader insists on it); TensorBoard files carry the real masked CRC of
the payload (TensorBoard insists on that). Payload integrity of ``events/`` records is
checked through the ``crc32c`` key of their index entries instead (see ``index.py``).
"""
import functools
import struct

import google_crc32c
import numpy as np

from ...exceptions import CorruptRecord

_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
HEADER_SIZE = _LENGTH.size + _CRC.size  # 12
FOOTER_SIZE = _CRC.size  # 4
RECORD_OVERHEAD = HEADER_SIZE + FOOTER_SIZE  # 16

CHECK_MODES = ("minimal", "full", "none")


def _crc_input(data):
    # google_crc32c's C extension takes bytes or read-only buffers such as numpy arrays,
    # but not memoryview/bytearray; a uint8 view over them costs no copy.
    if isinstance(data, bytes):
        return data
    return np.frombuffer(data, dtype=np.uint8)


def crc32c(data, initial=0):
    """Unmasked CRC32C (Castagnoli) of ``data``; pass a previous result as ``initial`` to extend."""
    if initial:
        return google_crc32c.extend(initial, _crc_input(data))
    return google_crc32c.value(_crc_input(data))


def crc32c_of_parts(parts):
    """CRC32C of the concatenation of several buffers, without concatenating them."""
    crc = 0
    for part in parts:
        crc = google_crc32c.extend(crc, _crc_input(part))
    return crc


def crc32c_of_slices(data, slices):
    """CRC32C of each slice (a ``slice`` object) of the bytes ``data``, as a list."""
    # Copying a small slice of bytes costs less than making a numpy view of it; map() keeps
    # a step of many small records to two C-level loops.
    return list(map(google_crc32c.value, map(data.__getitem__, slices)))


@functools.lru_cache(maxsize=32)
def field_crc32c_table(width, trailing):
    """CRC32C's share of each byte of a ``width``-byte field followed by ``trailing`` bytes:
    ``table[k * 256 + b]`` for byte ``b`` at position ``k`` of the field (uint32).

    CRC32C is affine over the bits of messages of one length, so the CRC of a payload whose
    field holds ``x`` is the CRC of the same payload with zeros there, XOR the entries of
    ``x``'s bytes (:func:`crc32c_field_shares`); where the field sits before it does not
    matter, only what follows. Lets a writer checksum hundreds of records that differ in a
    few bytes with a few numpy calls instead of one call per record."""
    zero = google_crc32c.value(bytes(width + trailing))
    basis = np.empty((width, 8), np.uint32)
    message = bytearray(width + trailing)
    for k in range(width):
        for bit in range(8):
            message[k] = 1 << bit
            basis[k, bit] = google_crc32c.value(bytes(message)) ^ zero
        message[k] = 0
    table = np.zeros((width, 256), np.uint32)
    for bit in range(8):  # entries whose highest set bit is ``bit``: XOR with the entries below it
        table[:, 1 << bit:2 << bit] = table[:, :1 << bit] ^ basis[:, bit:bit + 1]
    table.setflags(write=False)
    return table.reshape(-1)


def crc32c_field_shares(fields, trailing):
    """Per row of ``fields`` (uint8, ``[n, width]``): the XOR of its bytes' shares in the
    CRC32C of a payload where the field is followed by ``trailing`` bytes (see
    :func:`field_crc32c_table`)."""
    width = fields.shape[1]
    index = fields.astype(np.intp)
    index += np.arange(width, dtype=np.intp) * 256
    return np.bitwise_xor.reduce(field_crc32c_table(width, trailing).take(index), axis=1)


def mask_crc(crc):
    """TFRecord masking: rotate right by 15 bits and add a constant, mod 2**32."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32


def masked_crc32c(data):
    """Masked CRC32C of ``data`` as stored in TFRecord headers and footers."""
    return mask_crc(crc32c(data))


#: Footer of every record in ``events/`` files: ``masked_crc32c(b"0x12345678")``.
SMDEBUG_PAYLOAD_FOOTER = 0x062DC0B3


@functools.lru_cache(maxsize=4096)  # a run's records come in few distinct lengths
def record_header(payload_length):
    """The 12 bytes before a payload of ``payload_length`` bytes."""
    length_bytes = _LENGTH.pack(payload_length)
    return length_bytes + _CRC.pack(masked_crc32c(length_bytes))


def record_footer(masked_payload_crc):
    """The 4 bytes after a payload, given the (masked) value to store."""
    return _CRC.pack(masked_payload_crc)


def frame_record(payload, real_payload_crc):
    """Frame one payload as a TFRecord.

    ``real_payload_crc=False`` writes the smdebug constant footer (``events/`` files);
    ``True`` writes the real masked CRC32C of the payload (TensorBoard files).
    """
    footer = masked_crc32c(payload) if real_payload_crc else SMDEBUG_PAYLOAD_FOOTER
    return b"".join((record_header(len(payload)), bytes(payload), record_footer(footer)))


def _byte_view(buf):
    view = memoryview(buf)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def read_record(buf, offset=0, check="minimal"):
    """Read the record that starts at ``offset`` of ``buf``.

    Returns ``(payload, next_offset)`` where ``payload`` is a memoryview into ``buf``.

    ``check``:
      * ``"minimal"``: verify the length CRC; the footer is only required to be present
        (it is either the smdebug constant or a real payload CRC; the payload is not hashed);
      * ``"full"``: additionally hash the payload and compare it with the footer, unless the
        footer is the smdebug constant (which says nothing about the payload);
      * ``"none"``: verify nothing beyond the lengths.

    Raises CorruptRecord for truncated or garbled input.
    """
    if check not in CHECK_MODES:
        raise ValueError(f"check must be one of {CHECK_MODES}, got {check!r}")
    view = _byte_view(buf)
    total = len(view)
    if offset < 0 or offset > total:
        raise CorruptRecord(f"record offset {offset} is outside the buffer of {total} bytes")
    if total - offset < HEADER_SIZE:
        raise CorruptRecord(
            f"truncated record header at offset {offset}: need {HEADER_SIZE} bytes, have {total - offset}"
        )
    length_bytes = view[offset : offset + 8]
    (length,) = _LENGTH.unpack(length_bytes)
    (length_crc,) = _CRC.unpack(view[offset + 8 : offset + 12])
    if check != "none" and length_crc != masked_crc32c(length_bytes):
        raise CorruptRecord(f"length CRC mismatch in record at offset {offset}: the header is corrupt")
    start = offset + HEADER_SIZE
    end = start + length
    if end + FOOTER_SIZE > total:
        raise CorruptRecord(
            f"truncated record at offset {offset}: header announces {length} payload bytes,"
            f" only {max(total - start - FOOTER_SIZE, 0)} follow"
        )
    payload = view[start:end]
    if check == "full":
        (footer,) = _CRC.unpack(view[end : end + FOOTER_SIZE])
        if footer != SMDEBUG_PAYLOAD_FOOTER and footer != masked_crc32c(payload):
            raise CorruptRecord(f"payload CRC mismatch in record at offset {offset}")
    return payload, end + FOOTER_SIZE


def iter_records(buf, check="minimal"):
    """Yield the payload of every record in ``buf`` (a whole file's bytes)."""
    view = _byte_view(buf)
    offset = 0
    while offset < len(view):
        payload, offset = read_record(view, offset, check)
        yield payload


def verify_payload_crc(payload, expected_crc32c, source="record"):
    """Raise CorruptRecord unless ``crc32c(payload) == expected_crc32c`` (the index's value)."""
    actual = crc32c(payload)
    if actual != expected_crc32c:
        raise CorruptRecord(
            f"{source}: payload CRC32C {actual:#010x} does not match the index's {expected_crc32c:#010x}"
        )


def append_record(write, parts, footer=None):
    """Write one record whose payload is ``parts`` (buffers, in order) through ``write``;
    returns ``(payload length, payload CRC32C)``. ``footer``: the record's last 4 bytes
    (the constant footer of ``events/`` records unless given)."""
    if footer is None:
        footer = record_footer(SMDEBUG_PAYLOAD_FOOTER)
    if len(parts) == 1:  # a small record: one write call
        payload = parts[0]
        length = len(payload)
        write(b"".join((record_header(length), payload, footer)))
        return length, crc32c(payload)
    length = sum(len(part) for part in parts)
    write(record_header(length))
    for part in parts:  # a large tensor: its bytes go to the file straight from the array
        write(part)
    write(footer)
    return length, crc32c_of_parts(parts)
