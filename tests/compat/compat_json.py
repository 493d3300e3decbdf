"""Arrays and errors as JSON, shared by both sides of the compatibility tests.

The scripts run by the original smdebug's interpreter (numpy 1.x) encode what they read
with :func:`encode_array`; the tests (numpy 2.x) decode it with :func:`decode_array`.
No pickle crosses the process boundary: an array travels as its dtype name, its shape,
its little-endian bytes in hex (bit-exact, NaN payloads included) and, for people reading
a failure message, the values as nested lists with NaN/Inf spelled as strings.
"""
import json

import numpy as np


def _plain(item):
    """``ndarray.tolist()`` output made strict-JSON: non-finite floats as strings, complex as pairs."""
    if isinstance(item, list):
        return [_plain(x) for x in item]
    if isinstance(item, complex):
        return [_plain(item.real), _plain(item.imag)]
    if isinstance(item, float) and item != item:
        return "nan"
    if isinstance(item, float) and item in (float("inf"), float("-inf")):
        return "inf" if item > 0 else "-inf"
    if isinstance(item, bytes):
        return item.hex()
    return item


def encode_array(value):
    """A value returned by a reader (ndarray, numpy scalar or python scalar) as a JSON-able dict."""
    arr = np.asarray(value)
    kind = arr.dtype.kind
    out = {"pytype": type(value).__name__, "shape": list(arr.shape)}
    if kind == "U":
        out["dtype"] = "str"
        out["data"] = arr.tolist()
    elif kind == "S":
        out["dtype"] = "bytes"
        out["data"] = _plain(arr.tolist())
    elif kind == "O":
        out["dtype"] = "object"
        out["data"] = [repr(x) for x in arr.reshape(-1).tolist()]
    else:
        out["dtype"] = arr.dtype.name
        little = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False)
        out["hex"] = little.tobytes().hex()
        out["data"] = _plain(arr.tolist())
    return out


def _dtype_from_name(name):
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # bfloat16 and friends: only ever decoded on our side

        return np.dtype(getattr(ml_dtypes, name))


def decode_array(doc):
    """The ndarray that :func:`encode_array` encoded (strings as a numpy ``str`` array)."""
    if "error" in doc:
        raise AssertionError(f"the reader raised instead of returning a value: {doc}")
    shape = tuple(doc["shape"])
    if doc["dtype"] == "str":
        return np.array(doc["data"], dtype=np.str_).reshape(shape)
    if doc["dtype"] in ("bytes", "object"):
        raise AssertionError(f"unexpected {doc['dtype']} array from the reader: {doc}")
    dtype = _dtype_from_name(doc["dtype"])
    raw = bytes.fromhex(doc["hex"])
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def encode_error(exc):
    return {"error": type(exc).__name__, "message": str(exc)[:300]}


def guarded(fn):
    """``fn()``, or the exception it raised as a JSON-able dict."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - every failure is data for the test to judge
        return encode_error(exc)


def dumps(doc):
    """Strict JSON (a NaN that slipped through is an error, not a non-standard token)."""
    return json.dumps(doc, allow_nan=False, sort_keys=True)
