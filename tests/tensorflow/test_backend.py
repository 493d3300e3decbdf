"""TFBackend: batched on-device reductions equal smdebug.reductions; raw values round-trip."""
import pytest

tf = pytest.importorskip("tensorflow")

import numpy as np  # noqa: E402

from smdebug import reductions as reference  # noqa: E402
from smdebug.capture.backend import Request  # noqa: E402
from smdebug.tensorflow.backend import TFBackend  # noqa: E402

KEYS = tuple((op, is_abs) for is_abs in (False, True)
             for op in ("min", "max", "median", "mean", "std", "variance", "sum", "prod", "l1", "l2"))


def sample_values():
    rng = np.random.default_rng(7)
    return {
        "float32 matrix": rng.standard_normal((3, 4)).astype("float32"),
        "float32 4-d": rng.standard_normal((2, 3, 2, 2)).astype("float32"),
        # Bigger than SEGMENT_MAX_NUMEL: reduced on its own, between tensors reduced together.
        "float32 big": (rng.standard_normal((120, 90)) + 3.0).astype("float32"),
        "float64 big": rng.standard_normal(9000),
        "float64 vector": rng.standard_normal(9),
        "float16": rng.standard_normal(6).astype("float16"),
        "int32": np.arange(-3, 4, dtype="int32"),
        "int64": np.array([5, -2, 7], dtype="int64"),
        "bool": np.array([True, False, True, True]),
        "complex64": (rng.standard_normal(4) + 1j * rng.standard_normal(4)).astype("complex64"),
        "scalar": np.float32(-2.5),
        "one element": np.array([3.0], dtype="float32"),
    }


def test_every_reduction_of_every_dtype_equals_the_reference():
    backend = TFBackend()
    values = sample_values()
    requests = [Request(name, backend.snapshot(tf.constant(v), False), raw=True, shape=True, reductions=KEYS)
                for name, v in values.items()]
    results = backend.materialize(requests)
    for (name, value), result in zip(values.items(), results):
        want = reference.reduce_many(value, KEYS)
        got = [result.reductions[key] for key in KEYS]
        tolerance = 1e-3 if value.dtype == np.float16 else 2e-6
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=1e-6, err_msg=name)
        assert all(np.asarray(g).dtype == np.float64 for g in got)
        np.testing.assert_array_equal(result.raw, value)
        assert result.shape == np.shape(value)


def test_variables_are_snapshot_before_an_update():
    backend = TFBackend()
    var = tf.Variable([1.0, 2.0, 3.0])
    snap = backend.snapshot(var, True)
    var.assign_sub([1.0, 1.0, 1.0])
    (result,) = backend.materialize([Request("w", snap, raw=True, shape=False, reductions=(("sum", False),))])
    np.testing.assert_array_equal(result.raw, [1.0, 2.0, 3.0])
    assert float(result.reductions[("sum", False)]) == 6.0


def test_only_requested_reductions_and_empty_or_string_tensors_are_skipped():
    backend = TFBackend()
    requests = [
        Request("a", tf.constant([1.0, -4.0]), raw=False, shape=False, reductions=(("max", True),)),
        Request("b", tf.constant([2.0, 3.0, 4.0]), raw=False, shape=False, reductions=(("min", False),)),
        Request("empty", tf.zeros([0, 3]), raw=True, shape=True, reductions=(("mean", False),)),
        Request("text", tf.constant(["x", "y"]), raw=True, shape=False, reductions=(("mean", False),)),
    ]
    a, b, empty, text = backend.materialize(requests)
    assert a.reductions == {("max", True): 4.0} and a.raw is None
    assert b.reductions == {("min", False): 2.0}
    assert empty.reductions == {} and empty.shape == (0, 3)
    assert text.reductions == {} and list(text.raw) == [b"x", b"y"]


def test_symbolic_tensors_are_refused_with_a_clear_message():
    backend = TFBackend()

    @tf.function
    def f(x):
        with pytest.raises(TypeError, match="eager"):
            backend.snapshot(x, False)
        return x

    f(tf.constant(1.0))


def test_reduced_values_pass_through_with_their_tensor():
    from smdebug.tensorflow.backend import ReducedValue

    backend = TFBackend()
    done = ReducedValue(tf.constant([[1.0, 2.0]]), (1, 2), {("max", False): np.float64(2.0), ("min", False): 1.0})
    shape_only = ReducedValue(None, (3,), {("max", False): np.float64(5.0)})
    requests = [Request("a", backend.snapshot(done, False), raw=True, shape=False, reductions=(("max", False),)),
                Request("b", backend.snapshot(shape_only, False), raw=False, shape=True, reductions=(("max", False),)),
                Request("c", tf.constant([4.0, -1.0]), raw=False, shape=False, reductions=(("min", False),))]
    a, b, c = backend.materialize(requests)
    assert a.reductions == {("max", False): 2.0} and a.raw.tolist() == [[1.0, 2.0]] and a.shape is None
    assert b.reductions == {("max", False): 5.0} and b.raw is None and b.shape == (3,)
    assert c.reductions == {("min", False): -1.0}
