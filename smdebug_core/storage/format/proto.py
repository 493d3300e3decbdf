"""The protobuf messages of the event files (docs/format.md 2.2), built at import time.

No protoc and no generated code: the file descriptor is assembled here from plain Python
data, added to a private :class:`~google.protobuf.descriptor_pool.DescriptorPool` (so it
can never clash with TensorFlow's, TensorBoard's or the original smdebug's registrations
in the default pool), and the message classes are made from it. This works with every
protobuf from 3.20 to current, because only the stable descriptor/message-factory API is
used. Package names never appear on the wire, so the bytes are the same as TensorFlow's.

Only the fields the format uses are declared; any other field on the wire is kept as an
unknown field and ignored.
"""
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_PACKAGE = "smdebug_core.tf"

# TensorFlow's DataType numbers (docs/format.md 2.2).
DT_INVALID = 0
DT_FLOAT = 1
DT_DOUBLE = 2
DT_INT32 = 3
DT_UINT8 = 4
DT_INT16 = 5
DT_INT8 = 6
DT_STRING = 7
DT_COMPLEX64 = 8
DT_INT64 = 9
DT_BOOL = 10
DT_QINT8 = 11
DT_QUINT8 = 12
DT_QINT32 = 13
DT_BFLOAT16 = 14
DT_QINT16 = 15
DT_QUINT16 = 16
DT_UINT16 = 17
DT_COMPLEX128 = 18
DT_HALF = 19
DT_RESOURCE = 20
DT_VARIANT = 21
DT_UINT32 = 22
DT_UINT64 = 23

_F = descriptor_pb2.FieldDescriptorProto
_OPTIONAL = _F.LABEL_OPTIONAL
_REPEATED = _F.LABEL_REPEATED


def _field(message, name, number, ftype, label=_OPTIONAL, type_name=None, oneof_index=None):
    field = message.field.add(name=name, number=number, type=ftype, label=label)
    if type_name is not None:
        field.type_name = f".{_PACKAGE}.{type_name}"
    if oneof_index is not None:
        field.oneof_index = oneof_index
    return field


def _build_file():
    fdp = descriptor_pb2.FileDescriptorProto(name="smdebug_core/tf_event.proto", package=_PACKAGE, syntax="proto3")

    data_type = fdp.enum_type.add(name="DataType")
    for name, number in sorted(((k, v) for k, v in globals().items() if k.startswith("DT_")), key=lambda kv: kv[1]):
        data_type.value.add(name=name, number=number)

    shape = fdp.message_type.add(name="TensorShapeProto")
    dim = shape.nested_type.add(name="Dim")
    _field(dim, "size", 1, _F.TYPE_INT64)
    _field(dim, "name", 2, _F.TYPE_STRING)
    _field(shape, "dim", 2, _F.TYPE_MESSAGE, _REPEATED, "TensorShapeProto.Dim")
    _field(shape, "unknown_rank", 3, _F.TYPE_BOOL)

    # proto3 packs repeated scalars by default, as TensorFlow's tensor.proto does.
    tensor = fdp.message_type.add(name="TensorProto")
    _field(tensor, "dtype", 1, _F.TYPE_ENUM, type_name="DataType")
    _field(tensor, "tensor_shape", 2, _F.TYPE_MESSAGE, type_name="TensorShapeProto")
    _field(tensor, "version_number", 3, _F.TYPE_INT32)
    _field(tensor, "tensor_content", 4, _F.TYPE_BYTES)
    _field(tensor, "float_val", 5, _F.TYPE_FLOAT, _REPEATED)
    _field(tensor, "double_val", 6, _F.TYPE_DOUBLE, _REPEATED)
    _field(tensor, "int_val", 7, _F.TYPE_INT32, _REPEATED)
    _field(tensor, "string_val", 8, _F.TYPE_BYTES, _REPEATED)
    _field(tensor, "scomplex_val", 9, _F.TYPE_FLOAT, _REPEATED)
    _field(tensor, "int64_val", 10, _F.TYPE_INT64, _REPEATED)
    _field(tensor, "bool_val", 11, _F.TYPE_BOOL, _REPEATED)
    _field(tensor, "dcomplex_val", 12, _F.TYPE_DOUBLE, _REPEATED)
    _field(tensor, "half_val", 13, _F.TYPE_INT32, _REPEATED)
    _field(tensor, "uint32_val", 16, _F.TYPE_UINT32, _REPEATED)
    _field(tensor, "uint64_val", 17, _F.TYPE_UINT64, _REPEATED)

    histo = fdp.message_type.add(name="HistogramProto")
    for number, name in enumerate(("min", "max", "num", "sum", "sum_squares"), start=1):
        _field(histo, name, number, _F.TYPE_DOUBLE)
    _field(histo, "bucket_limit", 6, _F.TYPE_DOUBLE, _REPEATED)
    _field(histo, "bucket", 7, _F.TYPE_DOUBLE, _REPEATED)

    # smdebug declares plugin_data repeated and content as string; TensorFlow declares one
    # PluginData with bytes content. Same wire format; bytes never fails on bad UTF-8.
    metadata = fdp.message_type.add(name="SummaryMetadata")
    plugin = metadata.nested_type.add(name="PluginData")
    _field(plugin, "plugin_name", 1, _F.TYPE_STRING)
    _field(plugin, "content", 2, _F.TYPE_BYTES)
    _field(metadata, "plugin_data", 1, _F.TYPE_MESSAGE, _REPEATED, "SummaryMetadata.PluginData")
    _field(metadata, "display_name", 2, _F.TYPE_STRING)
    _field(metadata, "summary_description", 3, _F.TYPE_STRING)

    summary = fdp.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.oneof_decl.add(name="value")
    _field(value, "tag", 1, _F.TYPE_STRING)
    _field(value, "node_name", 7, _F.TYPE_STRING)
    _field(value, "metadata", 9, _F.TYPE_MESSAGE, type_name="SummaryMetadata")
    _field(value, "simple_value", 2, _F.TYPE_FLOAT, oneof_index=0)
    _field(value, "obsolete_old_style_histogram", 3, _F.TYPE_BYTES, oneof_index=0)
    _field(value, "histo", 5, _F.TYPE_MESSAGE, type_name="HistogramProto", oneof_index=0)
    _field(value, "tensor", 8, _F.TYPE_MESSAGE, type_name="TensorProto", oneof_index=0)
    _field(summary, "value", 1, _F.TYPE_MESSAGE, _REPEATED, "Summary.Value")

    event = fdp.message_type.add(name="Event")
    event.oneof_decl.add(name="what")
    _field(event, "wall_time", 1, _F.TYPE_DOUBLE)
    _field(event, "step", 2, _F.TYPE_INT64)
    _field(event, "file_version", 3, _F.TYPE_STRING, oneof_index=0)
    _field(event, "graph_def", 4, _F.TYPE_BYTES, oneof_index=0)
    _field(event, "summary", 5, _F.TYPE_MESSAGE, type_name="Summary", oneof_index=0)
    return fdp


POOL = descriptor_pool.DescriptorPool()
POOL.Add(_build_file())


def _message_class(name):
    descriptor = POOL.FindMessageTypeByName(f"{_PACKAGE}.{name}")
    get_class = getattr(message_factory, "GetMessageClass", None)
    if get_class is not None:  # protobuf >= 4.21
        return get_class(descriptor)
    return message_factory.MessageFactory(POOL).GetPrototype(descriptor)  # protobuf 3.20.x


Event = _message_class("Event")
Summary = _message_class("Summary")
SummaryValue = _message_class("Summary.Value")
SummaryMetadata = _message_class("SummaryMetadata")
PluginData = _message_class("SummaryMetadata.PluginData")
TensorProto = _message_class("TensorProto")
TensorShapeProto = _message_class("TensorShapeProto")
TensorShapeDim = _message_class("TensorShapeProto.Dim")
HistogramProto = _message_class("HistogramProto")

# Newer protobuf attaches nested classes to their parents; 3.20's MessageFactory does not.
for _outer, _name, _inner in (
    (Summary, "Value", SummaryValue),
    (SummaryMetadata, "PluginData", PluginData),
    (TensorShapeProto, "Dim", TensorShapeDim),
):
    if not hasattr(_outer, _name):
        setattr(_outer, _name, _inner)
