"""The on-disk format layer: names, TFRecord framing, protobuf messages, tensor codec, index files."""
import json
import random
import struct

import ml_dtypes
import numpy as np
import pytest
from google.protobuf import descriptor_pool

from smdebug.exceptions import CorruptRecord, IndexReaderException
from smdebug.storage.format import codec, index, layout, proto, records
from smdebug.modes import ModeKeys

# ---------------------------------------------------------------- layout


def test_paths_follow_format_1_2():
    assert layout.event_file_relpath(7, "worker_0") == "events/000000000007/000000000007_worker_0.tfevents"
    assert layout.index_file_relpath(12345, "worker_12") == "index/000000012/000000012345_worker_12.json"
    assert layout.index_file_relpath(999, "w") == "index/000000000/000000000999_w.json"
    assert layout.collections_file_relpath("worker_0") == "collections/000000000/worker_0_collections.json"
    assert layout.tensorboard_file_relpath(ModeKeys.EVAL, 4, 6097, "vm") == "EVAL/000000000004_6097_vm.tfevents"
    assert layout.END_OF_JOB_FILE == "training_job_end.ts"


@pytest.mark.parametrize("step", [-1, 10**12, True, 1.0, "3", None])
def test_bad_steps_are_rejected(step):
    with pytest.raises(ValueError, match="step"):
        layout.event_file_relpath(step, "worker_0")


@pytest.mark.parametrize("worker", ["", "a/b", "..", "x..y", "a\\b", "nul\x00", None, 3])
def test_bad_worker_names_are_rejected(worker):
    with pytest.raises(ValueError, match="worker"):
        layout.index_file_relpath(0, worker)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("000000000012_worker_0.json", (12, "worker_0")),
        ("index/000000000/000000000012_worker_12.json", (12, "worker_12")),
        ("000000000003__job-worker_replica-0_task-0_device-GPU-0.tfevents",
         (3, "_job-worker_replica-0_task-0_device-GPU-0")),
        ("5_chief_0.csv", (5, "chief_0")),
        ("999999999999_w.json", (10**12 - 1, "w")),
    ],
)
def test_parse_step_and_worker(name, expected):
    assert layout.parse_step_and_worker(name) == expected


@pytest.mark.parametrize(
    "name",
    ["worker_0.json", "_worker_0.json", "-1_worker_0.json", "12_.json", "12.json", "1000000000000_w.json",
     "000000000012_worker_0.json.tmp", "0x1f_w.json", "١٢_w.json", "000000000012_w.txt"],
)
def test_parse_step_and_worker_rejects(name):
    with pytest.raises(ValueError):
        layout.parse_step_and_worker(name)


def test_worker_name_serialization_round_trip():
    device = "/job:worker/replica:0/task:0/device:GPU:0"
    name = layout.serialize_worker_name(device)
    assert name == "_job-worker_replica-0_task-0_device-GPU-0"
    assert layout.deserialize_worker_name(name) == device
    assert layout.parse_collections_worker(layout.collections_file_relpath(name)) == name
    with pytest.raises(ValueError):
        layout.parse_collections_worker("collections/000000000/_collections.json")


# ---------------------------------------------------------------- records


def test_crc32c_check_value_and_smdebug_footer():
    assert records.crc32c(b"123456789") == 0xE3069283
    assert records.masked_crc32c(b"0x12345678") == records.SMDEBUG_PAYLOAD_FOOTER == 0x062DC0B3
    assert records.crc32c(memoryview(b"x123456789")[1:]) == 0xE3069283
    assert records.crc32c_of_parts([b"1234", bytearray(b"56"), memoryview(b"789")]) == 0xE3069283


def test_length_crc_of_format_worked_example():
    # docs/format.md 2.1: N = 160 -> "a0 00 00 00 00 00 00 00 2a 55 72 25"
    assert records.record_header(160) == bytes.fromhex("a000000000000000") + struct.pack("<I", 0x2572552A)
    record = records.frame_record(b"\x00" * 160, real_payload_crc=False)
    assert len(record) == 176 and record[-4:] == bytes.fromhex("b3c02d06")


def test_frame_and_read_records():
    payloads = [b"", b"a", bytes(range(256)) * 3]
    buf = b"".join(records.frame_record(p, real_payload_crc=i % 2 == 0) for i, p in enumerate(payloads))
    for check in records.CHECK_MODES:
        assert [bytes(p) for p in records.iter_records(buf, check=check)] == payloads
    payload, end = records.read_record(buf, 0)
    assert bytes(payload) == b"" and end == 16
    tb_record = records.frame_record(b"hello", real_payload_crc=True)
    assert struct.unpack("<I", tb_record[-4:])[0] == records.masked_crc32c(b"hello")


def test_corrupt_records_raise_corrupt_record():
    good = records.frame_record(b"payload bytes", real_payload_crc=True)
    with pytest.raises(CorruptRecord, match="truncated record header"):
        records.read_record(good[:5])
    with pytest.raises(CorruptRecord, match="truncated record"):
        records.read_record(good[:-1])
    flipped_length = bytes([good[0] ^ 0x01]) + good[1:]
    with pytest.raises(CorruptRecord, match="length CRC"):
        records.read_record(flipped_length)
    huge = struct.pack("<Q", 2**63) + good[8:]
    with pytest.raises(CorruptRecord):
        records.read_record(huge)
    flipped_payload = bytearray(good)
    flipped_payload[14] ^= 0xFF
    records.read_record(flipped_payload, check="minimal")  # minimal does not hash payloads
    with pytest.raises(CorruptRecord, match="payload CRC"):
        records.read_record(flipped_payload, check="full")
    with pytest.raises(CorruptRecord):
        list(records.iter_records(good + good[:7]))
    with pytest.raises(CorruptRecord, match="outside"):
        records.read_record(good, offset=len(good) + 1)
    with pytest.raises(ValueError, match="check"):
        records.read_record(good, check="strict")


def test_garbage_never_raises_anything_but_corrupt_record():
    rng = random.Random(1234)
    for _ in range(300):
        garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        try:
            list(records.iter_records(garbage, check="full"))
        except CorruptRecord:
            pass


def test_verify_payload_crc():
    records.verify_payload_crc(b"abc", records.crc32c(b"abc"))
    with pytest.raises(CorruptRecord, match="does not match"):
        records.verify_payload_crc(b"abd", records.crc32c(b"abc"), "events/x.tfevents@0")


# ---------------------------------------------------------------- proto


def test_messages_live_in_a_private_pool():
    with pytest.raises(KeyError):
        descriptor_pool.Default().FindMessageTypeByName(proto.Event.DESCRIPTOR.full_name)
    assert proto.Event.DESCRIPTOR.file.pool is proto.POOL


def test_wire_format_matches_tensorboards_messages():
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
    except Exception as exc:  # noqa: BLE001 - absent, or generated for a newer protobuf than installed
        pytest.skip(f"TensorBoard's protobuf classes are unavailable: {exc}")

    ours = proto.Event(wall_time=12.5, step=3)
    value = ours.summary.value.add(tag="w")
    value.tensor.dtype = proto.DT_FLOAT
    value.tensor.tensor_shape.dim.add(size=2, name="w_2")
    value.tensor.tensor_content = b"\x00" * 8
    ours.summary.value.add(tag="loss", simple_value=0.5)
    histo = ours.summary.value.add(tag="h").histo
    histo.min, histo.max, histo.num = -1.0, 1.0, 3.0
    histo.bucket_limit.extend([0.0, 1.0])
    histo.bucket.extend([1.0, 2.0])

    theirs = event_pb2.Event(wall_time=12.5, step=3)
    tvalue = theirs.summary.value.add(tag="w")
    tvalue.tensor.dtype = 1
    tvalue.tensor.tensor_shape.dim.add(size=2, name="w_2")
    tvalue.tensor.tensor_content = b"\x00" * 8
    theirs.summary.value.add(tag="loss", simple_value=0.5)
    theirs.summary.value.add(tag="h").histo.CopyFrom(
        summary_pb2.HistogramProto(min=-1.0, max=1.0, num=3.0, bucket_limit=[0.0, 1.0], bucket=[1.0, 2.0])
    )
    assert ours.SerializeToString() == theirs.SerializeToString()


# ---------------------------------------------------------------- codec

_SPECIALS = [np.nan, np.inf, -np.inf, -0.0, 1.5]


def _sample(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return np.array([[True, False, True], [False, False, True]])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[info.min, info.max, 0], [1, info.max - 1, info.min + 1]], dtype=dtype)
    if dtype.kind == "c":
        imaginary = [1.0, np.nan, 3.0, -np.inf, 0.0, 2.0]
        return np.array([complex(r, i) for r, i in zip(_SPECIALS + [2.0], imaginary)]).astype(dtype).reshape(2, 3)
    return np.array(_SPECIALS + [3.0], dtype=np.float64).astype(dtype).reshape(2, 3)


_ALL_DTYPES = [np.float16, np.float32, np.float64, ml_dtypes.bfloat16, np.int8, np.int16, np.int32, np.int64,
               np.uint8, np.uint16, np.uint32, np.uint64, np.bool_, np.complex64, np.complex128]


def _round_trip(array, tag="t", **kwargs):
    args = dict(global_step=11, mode=ModeKeys.EVAL, mode_step=3, wall_time=1234.5)
    args.update(kwargs)
    payload = codec.encode_tensor_event(tag, array, **args)
    framed = records.frame_record(payload, real_payload_crc=False)
    read_back, end = records.read_record(framed)
    assert end == len(framed)
    return codec.decode_tensor_event(read_back)


def _assert_identical(actual, expected):
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    if expected.dtype.kind in "fcV":  # bit-exact, NaN included
        itemsize = expected.dtype.itemsize
        as_bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.uint64}[itemsize]
        assert np.array_equal(np.ascontiguousarray(actual).view(as_bits), np.ascontiguousarray(expected).view(as_bits))
    else:
        assert np.array_equal(actual, expected)


@pytest.mark.parametrize("dtype", _ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_every_dtype_bit_exact(dtype):
    array = _sample(dtype)
    decoded = _round_trip(array, tag="layer/w")
    _assert_identical(decoded.value, array)
    assert (decoded.tag, decoded.global_step, decoded.mode, decoded.mode_step) == ("layer/w", 11, ModeKeys.EVAL, 3)
    assert decoded.wall_time == 1234.5
    assert not decoded.value.flags.writeable
    # 0-d and empty tensors of the same dtype
    _assert_identical(_round_trip(array.reshape(-1)[1].reshape(())).value, array.reshape(-1)[1].reshape(()))
    empty = np.zeros((0, 3), dtype=dtype)
    _assert_identical(_round_trip(empty).value, empty)


def test_bfloat16_nan_payload_bits_survive():
    bits = np.array([0x7FC1, 0xFF80, 0x0001, 0x8000], dtype=np.uint16)
    array = bits.view(ml_dtypes.bfloat16)
    assert np.array_equal(_round_trip(array).value.view(np.uint16), bits)


# What the original smdebug reader can read determines the DataType on the wire (docs/format.md 2.3).
@pytest.mark.parametrize(
    "dtype, wire, marker",
    [
        (np.float16, proto.DT_HALF, None), (np.float32, proto.DT_FLOAT, None), (np.float64, proto.DT_DOUBLE, None),
        (np.int32, proto.DT_INT32, None), (np.int64, proto.DT_INT64, None), (np.uint8, proto.DT_UINT8, None),
        (np.bool_, proto.DT_BOOL, None), (np.complex128, proto.DT_COMPLEX128, None),
        (np.int8, proto.DT_INT32, "int8"), (np.int16, proto.DT_INT32, "int16"), (np.uint16, proto.DT_INT32, "uint16"),
        (np.uint32, proto.DT_INT64, "uint32"), (np.complex64, proto.DT_COMPLEX128, "complex64"),
        (ml_dtypes.bfloat16, proto.DT_FLOAT, "bfloat16"),
    ],
    ids=lambda x: np.dtype(x).name if isinstance(x, type) else str(x),
)
def test_wire_dtype_policy(dtype, wire, marker):
    event = proto.Event()
    event.ParseFromString(codec.encode_tensor_event("t", np.ones(3, dtype), global_step=0, mode=ModeKeys.TRAIN, mode_step=0))
    value = event.summary.value[0]
    assert value.tensor.dtype == wire
    plugins = [(p.plugin_name, p.content.decode()) for p in value.metadata.plugin_data]
    expected = [("mode_step", "0"), ("mode", "1")] + ([("smdebug_dtype", marker)] if marker else [])
    assert plugins == expected


def test_uint64_goes_as_int64_unless_too_large():
    def wire_of(array):
        event = proto.Event()
        event.ParseFromString(codec.encode_tensor_event("t", array, global_step=0, mode=ModeKeys.TRAIN, mode_step=0))
        return event.summary.value[0].tensor.dtype

    small = np.array([0, 2**63 - 1], dtype=np.uint64)
    large = np.array([0, 2**64 - 1], dtype=np.uint64)
    assert wire_of(small) == proto.DT_INT64 and wire_of(large) == proto.DT_UINT64
    _assert_identical(_round_trip(small).value, small)
    _assert_identical(_round_trip(large).value, large)


def test_record_layout_matches_format_2_3():
    event = proto.Event()
    event.ParseFromString(codec.encode_tensor_event(
        "Net_fc1.weight", np.zeros((3, 4), np.float32), global_step=7, mode=ModeKeys.TRAIN, mode_step=4))
    assert event.step == 7 and len(event.summary.value) == 1
    value = event.summary.value[0]
    assert value.tag == "Net_fc1.weight"
    assert [(d.size, d.name) for d in value.tensor.tensor_shape.dim] == [(3, "Net_fc1.weight_3"), (4, "Net_fc1.weight_4")]
    assert value.tensor.tensor_content == bytes(48)
    assert not value.tensor.float_val and not value.tensor.tensor_shape.unknown_rank


@pytest.mark.parametrize("shape", [(), (1,), (5,), (40, 1), (8191,), (8192,), (200, 100), (3, 0), (70000,)])
def test_spliced_bytes_equal_protobufs_own_serialization(shape):
    array = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    parts = codec.encode_tensor_event_parts("x" * 150, array, global_step=10**12 - 1, mode=ModeKeys.PREDICT, mode_step=300, wall_time=5.0)
    spliced = b"".join(parts)
    message = proto.Event()
    message.ParseFromString(spliced)
    assert message.SerializeToString() == spliced
    assert np.array_equal(codec.decode_tensor_event(spliced).value, array)


def test_large_tensor_bytes_are_not_copied():
    array = np.arange(1 << 16, dtype=np.float32)
    parts = codec.encode_tensor_event_parts("big", array, global_step=0, mode=ModeKeys.TRAIN, mode_step=0)
    assert len(parts) == 3 and isinstance(parts[1], memoryview)
    assert np.shares_memory(np.frombuffer(parts[1], dtype=np.uint8), array)


def test_python_and_numpy_scalars_and_lists():
    assert _round_trip(2.5).value.shape == () and _round_trip(2.5).value.dtype == np.float64
    assert _round_trip(np.float32(3)).value.shape == ()
    assert _round_trip(7).value.dtype == np.int64
    assert _round_trip(True).value.dtype == np.bool_
    assert np.array_equal(_round_trip([[1, 2], [3, 4]]).value, [[1, 2], [3, 4]])


def test_non_contiguous_and_big_endian_inputs():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    for view in (base.T, base[:, ::2], base[::-1]):
        assert np.array_equal(_round_trip(view).value, view)
    big_endian = np.arange(5, dtype=">i4")
    decoded = _round_trip(big_endian).value
    assert decoded.dtype == np.int32 and np.array_equal(decoded, [0, 1, 2, 3, 4])


def test_strings_and_bytes():
    words = np.array(["alpha", "βeta", ""])
    decoded = _round_trip(words).value
    assert decoded.dtype.kind == "U" and decoded.tolist() == words.tolist()
    grid = np.array([["a", "b"], ["c", "d"]])
    assert _round_trip(grid).value.tolist() == grid.tolist()
    assert _round_trip(np.array([], dtype=str)).value.shape == (0,)
    assert _round_trip(np.array(["x", "yz"], dtype=object)).value.tolist() == ["x", "yz"]
    raw = np.array([b"\x00\xff", b"ab"])
    _assert_identical(_round_trip(raw).value, raw)
    event = proto.Event()
    event.ParseFromString(codec.encode_tensor_event("s", words, global_step=0, mode=ModeKeys.TRAIN, mode_step=0))
    tensor = event.summary.value[0].tensor
    assert tensor.dtype == 0 and list(tensor.string_val) == [w.encode() for w in words]


@pytest.mark.parametrize(
    "value, message",
    [
        (np.array([1, "a"], dtype=object), "object arrays must hold only str"),
        (np.array(["2020-01-01"], dtype="datetime64[D]"), "dtype datetime64"),
        (np.zeros(2, dtype=[("a", "i4")]), "not supported"),
    ],
)
def test_unsupported_values_raise_type_error(value, message):
    with pytest.raises(TypeError, match=message):
        codec.encode_tensor_event("t", value, global_step=0, mode=ModeKeys.TRAIN, mode_step=0)


def test_bad_encode_arguments():
    with pytest.raises(ValueError, match="tensor name"):
        codec.encode_tensor_event("", 1.0, global_step=0, mode=ModeKeys.TRAIN, mode_step=0)
    with pytest.raises(ValueError, match="mode_step"):
        codec.encode_tensor_event("t", 1.0, global_step=0, mode=ModeKeys.TRAIN, mode_step=-1)
    with pytest.raises(ValueError, match="unknown mode"):
        codec.encode_tensor_event("t", 1.0, global_step=0, mode="SOMETIMES", mode_step=0)


def _original_style_event(tensor, step=5, plugins=(("mode_step", b"2"), ("mode", b"1"))):
    event = proto.Event(wall_time=1.0, step=step)
    value = event.summary.value.add(tag="orig")
    for name, content in plugins:
        value.metadata.plugin_data.add(plugin_name=name, content=content)
    value.tensor.CopyFrom(tensor)
    return event.SerializeToString()


def test_decodes_what_the_original_wrote():
    # A numpy scalar reduction: float32 with shape [1] in tensor_content.
    scalar = proto.TensorProto(dtype=proto.DT_FLOAT, tensor_content=np.float32(2.5).tobytes())
    scalar.tensor_shape.dim.add(size=1)
    decoded = codec.decode_tensor_event(_original_style_event(scalar))
    assert decoded.value.shape == (1,) and decoded.value[0] == 2.5
    assert (decoded.mode, decoded.mode_step, decoded.global_step) == (ModeKeys.TRAIN, 2, 5)

    # Typed value lists instead of tensor_content, including TensorFlow's "repeat the last value".
    for tensor, expected in [
        (proto.TensorProto(dtype=proto.DT_FLOAT, float_val=[1.0, 2.0]), np.array([1.0, 2.0], np.float32)),
        (proto.TensorProto(dtype=proto.DT_INT32, int_val=[7]), np.array([7, 7, 7], np.int32)),
        (proto.TensorProto(dtype=proto.DT_INT64, int64_val=[-3, 4]), np.array([-3, 4], np.int64)),
        (proto.TensorProto(dtype=proto.DT_BOOL, bool_val=[True, False]), np.array([True, False])),
        (proto.TensorProto(dtype=proto.DT_DOUBLE, double_val=[0.5, 1.5]), np.array([0.5, 1.5])),
        (proto.TensorProto(dtype=proto.DT_HALF, half_val=[0x3C00, 0xC000]), np.array([1.0, -2.0], np.float16)),
        (proto.TensorProto(dtype=proto.DT_COMPLEX64, scomplex_val=[1, 2, 3, 4]), np.array([1 + 2j, 3 + 4j], np.complex64)),
        (proto.TensorProto(dtype=proto.DT_INT8, int_val=[-1, 5]), np.array([-1, 5], np.int8)),
    ]:
        tensor.tensor_shape.dim.add(size=len(expected))
        _assert_identical(codec.decode_tensor_event(_original_style_event(tensor)).value, expected)

    # A 1-D string tensor as the original wrote it, without mode entries: GLOBAL, mode step = step.
    strings = proto.TensorProto(dtype=0, string_val=[b"a", b"bc"])
    strings.tensor_shape.dim.add(size=2)
    decoded = codec.decode_tensor_event(_original_style_event(strings, step=9, plugins=()))
    assert decoded.value.tolist() == ["a", "bc"]
    assert (decoded.mode, decoded.mode_step) == (ModeKeys.GLOBAL, 9)


def test_corrupt_payloads_raise_corrupt_record():
    good = proto.TensorProto(dtype=proto.DT_FLOAT, tensor_content=bytes(8))
    good.tensor_shape.dim.add(size=2)
    cases = {
        "not a valid Event": b"\xff\xff\xff",
        "no summary value": proto.Event(step=1, file_version="brain.Event:2").SerializeToString(),
        "needs 12": _original_style_event(proto.TensorProto(
            dtype=proto.DT_FLOAT, tensor_content=bytes(8), tensor_shape=proto.TensorShapeProto(dim=[{"size": 3}]))),
        "unsupported tensor DataType": _original_style_event(proto.TensorProto(dtype=21, tensor_content=b"x")),
        "unknown smdebug_dtype marker": _original_style_event(good, plugins=(("smdebug_dtype", b"float128"),)),
        "bad mode": _original_style_event(good, plugins=(("mode", b"9"),)),
        "negative dimension": _original_style_event(proto.TensorProto(
            dtype=proto.DT_FLOAT, tensor_shape=proto.TensorShapeProto(dim=[{"size": -1}]))),
        "holds 0 values": _original_style_event(proto.TensorProto(
            dtype=proto.DT_FLOAT, tensor_shape=proto.TensorShapeProto(dim=[{"size": 2}]))),
    }
    for message, payload in cases.items():
        with pytest.raises(CorruptRecord, match=message):
            codec.decode_tensor_event(payload, source="somefile")
    histogram_event = proto.Event(step=1)
    histogram_event.summary.value.add(tag="h", simple_value=1.0)
    with pytest.raises(CorruptRecord, match="holds no tensor"):
        codec.decode_tensor_event(histogram_event.SerializeToString())


def test_random_bit_flips_never_escape_as_other_errors():
    payload = codec.encode_tensor_event("w", np.arange(6, dtype=np.int16), global_step=1, mode=ModeKeys.TRAIN, mode_step=1)
    rng = random.Random(7)
    for _ in range(300):
        damaged = bytearray(payload)
        damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        try:
            codec.decode_tensor_event(bytes(damaged))
        except CorruptRecord:
            pass


# ---------------------------------------------------------------- index

_EVENT = "events/000000000007/000000000007_worker_0.tfevents"


def test_build_index_matches_format_3_1():
    data = index.build_index_json(
        ModeKeys.TRAIN, 4, _EVENT,
        [index.IndexEntry("Net_fc1.weight", 0, 178, 123), index.IndexEntry("scalar/lr", 178, 104, None)],
        [("gradient/Net_fc1.weight", (3, 4))],
    )
    assert data.decode() == (
        '{"meta": {"mode": "TRAIN", "mode_step": 4, "event_file_name": "' + _EVENT + '"}, '
        '"tensor_payload": [{"tensorname": "Net_fc1.weight", "start_idx": 0, "length": 178, "crc32c": 123}, '
        '{"tensorname": "scalar/lr", "start_idx": 178, "length": 104}], '
        '"shape_payload": [{"tensorname": "gradient/Net_fc1.weight", "originalname": "gradient/Net_fc1.weight", '
        '"shape": [3, 4]}]}'
    )
    parsed = index.parse_index_json(data, "idx.json")
    assert parsed.mode == ModeKeys.TRAIN and parsed.mode_step == 4 and parsed.event_file_name == _EVENT
    assert parsed.tensors == [index.IndexEntry("Net_fc1.weight", 0, 178, 123), index.IndexEntry("scalar/lr", 178, 104, None)]
    assert parsed.shapes == [("gradient/Net_fc1.weight", (3, 4))]


def test_index_bytes_equal_json_dumps_of_the_document_for_awkward_names():
    entries = [index.IndexEntry('we"ird\\näme/ü', 0, 20, 7), index.IndexEntry("plain", 20, 30, None)]
    data = index.build_index_json(ModeKeys.EVAL, 2, _EVENT, entries, [])
    expected = {"meta": {"mode": "EVAL", "mode_step": 2, "event_file_name": _EVENT},
                "tensor_payload": [{"tensorname": 'we"ird\\näme/ü', "start_idx": 0, "length": 20, "crc32c": 7},
                                   {"tensorname": "plain", "start_idx": 20, "length": 30}],
                "shape_payload": []}
    assert data == json.dumps(expected).encode()
    assert index.build_index_json(ModeKeys.GLOBAL, 0, None, [], [("s", (1,))]) == json.dumps(
        {"meta": {"mode": "GLOBAL", "mode_step": 0}, "tensor_payload": [],
         "shape_payload": [{"tensorname": "s", "originalname": "s", "shape": [1]}]}).encode()


def test_shapes_only_index_has_no_event_file():
    data = index.build_index_json(ModeKeys.GLOBAL, 9, None, [], [("a", "orig_a", (2,))])
    parsed = index.parse_index_json(data, "idx.json")
    assert parsed.event_file_name is None and parsed.shapes == [("a", (2,))] and parsed.shape_original_names == ["orig_a"]
    with pytest.raises(ValueError):
        index.build_index_json(ModeKeys.GLOBAL, 9, None, [index.IndexEntry("a", 0, 16)], [])


def test_original_index_without_crc_and_with_padded_mode_parses():
    data = json.dumps({"meta": {"mode": " EVAL ", "mode_step": 0, "event_file_name": _EVENT},
                       "tensor_payload": [{"tensorname": "x", "start_idx": 0, "length": 100, "extra": 1}]})
    parsed = index.parse_index_json(data.encode(), "idx.json")
    assert parsed.mode == ModeKeys.EVAL and parsed.tensors == [index.IndexEntry("x", 0, 100, None)] and parsed.shapes == []


def _index_with(meta=None, tensors=None, shapes=None, drop=()):
    document = {
        "meta": {"mode": "TRAIN", "mode_step": 1, "event_file_name": _EVENT, **(meta or {})},
        "tensor_payload": tensors if tensors is not None else [{"tensorname": "x", "start_idx": 0, "length": 100}],
        "shape_payload": shapes if shapes is not None else [],
    }
    for key in drop:
        document.pop(key)
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    "data",
    [
        b"", b"{", b"[]", b"null", b"\xff\xfe", b"[" * 100000,
        _index_with(drop=("meta",)),
        _index_with(drop=("tensor_payload", "shape_payload")),
        _index_with(meta={"mode": "TRAINING"}),
        _index_with(meta={"mode": 1}),
        _index_with(meta={"mode_step": "4"}),
        _index_with(meta={"mode_step": -1}),
        _index_with(meta={"mode_step": 10**30}),
        _index_with(meta={"mode_step": True}),
        _index_with(meta={"mode_step": 1.0}),
        _index_with(meta={"event_file_name": "../x.tfevents"}),
        _index_with(meta={"event_file_name": "events/../../etc/passwd.tfevents"}),
        _index_with(meta={"event_file_name": "/etc/events/x.tfevents"}),
        _index_with(meta={"event_file_name": "events\\..\\x.tfevents"}),
        _index_with(meta={"event_file_name": "C:/events/x.tfevents"}),
        _index_with(meta={"event_file_name": "index/000000000/x.tfevents"}),
        _index_with(meta={"event_file_name": "events//x.tfevents"}),
        _index_with(meta={"event_file_name": "events/x.json"}),
        _index_with(meta={"event_file_name": ["events/x.tfevents"]}),
        _index_with(meta={"event_file_name": None}),
        _index_with(tensors={"tensorname": "x"}),
        _index_with(tensors=["x"]),
        _index_with(tensors=[{"tensorname": "", "start_idx": 0, "length": 100}]),
        _index_with(tensors=[{"tensorname": 5, "start_idx": 0, "length": 100}]),
        _index_with(tensors=[{"tensorname": "x", "start_idx": -1, "length": 100}]),
        _index_with(tensors=[{"tensorname": "x", "start_idx": 0, "length": 15}]),
        _index_with(tensors=[{"tensorname": "x", "start_idx": 10**40, "length": 100}]),
        _index_with(tensors=[{"tensorname": "x", "start_idx": "0", "length": 100}]),
        _index_with(tensors=[{"tensorname": "x", "start_idx": 0, "length": 100, "crc32c": 2**32}]),
        _index_with(tensors=[{"tensorname": "x", "start_idx": 0, "length": 100, "crc32c": "abc"}]),
        _index_with(shapes=[{"tensorname": "s", "shape": [2, -1]}]),
        _index_with(shapes=[{"tensorname": "s", "shape": "2,3"}]),
        _index_with(shapes=[{"tensorname": "s", "shape": [2.5]}]),
        _index_with(shapes=[{"tensorname": "s", "originalname": 3, "shape": [2]}]),
        _index_with(shapes=[{"shape": [2]}]),
        b'{"meta": {"mode": "TRAIN", "mode_step": NaN}, "shape_payload": []}',
    ],
)
def test_malicious_or_broken_index_files_are_rejected(data):
    with pytest.raises(IndexReaderException, match=r"^bad/index\.json: "):
        index.parse_index_json(data, "bad/index.json")


@pytest.mark.parametrize("tag", ["x", "smdebug/reductions/l2/a.b:0", "t" * 200])
@pytest.mark.parametrize("shape_dtype", [((), "float64"), ((7,), "int64"), ((3, 4), "float16"), ((2, 2), "bfloat16"),
                                         ((300, 300), "float32"), ((2,), "bool"), ((2,), "int8")])
def test_hand_assembled_records_equal_protobufs_encoding(tag, shape_dtype):
    """Every numeric record is assembled by hand (with cached per-tag fields) for speed; it
    must be byte for byte what protobuf writes for the same message."""
    shape, dtype = shape_dtype
    array = np.ones(shape, dtype=ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    for global_step, mode_step, wall_time in [(0, 0, 0.0), (5, 3, 1.25), (10**9, 7, 1e9)]:
        wire, marker, widened = codec._numeric_content(tag, array)
        expected = proto.Event(wall_time=wall_time, step=global_step)
        value = expected.summary.value.add(tag=tag)
        value.tensor.dtype = wire
        for size in widened.shape:
            value.tensor.tensor_shape.dim.add(size=size, name=f"{tag}_{size}")
        value.tensor.tensor_shape.SetInParent()
        value.tensor.tensor_content = widened.tobytes()
        value.metadata.CopyFrom(codec._metadata_message(ModeKeys.EVAL, mode_step, marker))
        got = codec.encode_tensor_event(tag, array, global_step=global_step, mode=ModeKeys.EVAL,
                                        mode_step=mode_step, wall_time=wall_time)
        assert got == expected.SerializeToString()
