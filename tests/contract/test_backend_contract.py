"""The contract every tensor backend keeps with the core (smdebug.capture.backend), checked the same
way for each framework installed in the environment (each tox env runs tests/contract):

* one tensor at a time (snapshot + materialize) and in batches (start_batch on the
  training thread, finish_batch on the step pipeline's worker) give the reductions of
  :mod:`smdebug.reductions` and raw values bit for bit, for every dtype the framework has;
* a batch's tensors may change once it is finished (its values are the ones handed over);
* a hook whose backend fails, on either thread, disables itself with one warning and the
  loop goes on; steps written before stay readable;
* a stop request reaches the adapter's side (``stop_requested``) and the run directory.
"""
import importlib
import logging
import os

import numpy as np
import pytest

import smdebug as smd
from smdebug import reductions as reference
from smdebug.capture.backend import NumpyBackend, Request

KEYS = tuple((op, is_abs) for is_abs in (False, True)
             for op in ("min", "max", "mean", "std", "variance", "sum", "prod", "l1", "l2", "median"))


def _values():
    rng = np.random.default_rng(3)
    return {
        "f32 matrix": rng.standard_normal((5, 7)).astype(np.float32),
        "f32 same shape": rng.standard_normal((5, 7)).astype(np.float32),
        "f32 large mean": (1000.0 + 1e-3 * rng.standard_normal(300)).astype(np.float32),
        "f32 big": rng.standard_normal(70000).astype(np.float32),
        "f64": rng.standard_normal(33),
        "f16": rng.standard_normal(6).astype(np.float16),
        "i32": np.arange(-3, 9, dtype=np.int32),
        "i64": np.array([5, -2, 7], dtype=np.int64),
        "with nan": np.array([1.0, np.nan, 3.0], dtype=np.float32),
        "one element": np.array([2.5], dtype=np.float32),
    }


class Framework:
    """How one framework makes tensors for its backend."""

    def __init__(self, name, module, make_backend, to_tensor, skips=()):
        self.name, self.module, self.make_backend, self.to_tensor, self.skips = \
            name, module, make_backend, to_tensor, skips


def _numpy():
    return Framework("numpy", None, NumpyBackend, np.array)


def _torch():
    torch = pytest.importorskip("torch")
    from smdebug.pytorch.backend import TorchBackend

    return Framework("torch", torch, TorchBackend, lambda a: torch.tensor(a))


def _tensorflow():
    tf = pytest.importorskip("tensorflow")
    from smdebug.tensorflow.backend import TFBackend

    return Framework("tensorflow", tf, TFBackend, lambda a: tf.constant(a))


def _mxnet():
    mx = pytest.importorskip("mxnet")
    from smdebug.mxnet.backend import MXNetBackend

    # mxnet reduces on float32/float64 arrays; its backend has no median
    return Framework("mxnet", mx, MXNetBackend, lambda a: mx.nd.array(a, dtype=a.dtype), skips=("median",))


FRAMEWORKS = {"numpy": _numpy, "torch": _torch, "tensorflow": _tensorflow, "mxnet": _mxnet}


@pytest.fixture(params=list(FRAMEWORKS))
def framework(request):
    return FRAMEWORKS[request.param]()


def _keys(framework):
    return tuple(k for k in KEYS if k[0] not in framework.skips)


def _assert_reductions(name, array, keys, got):
    want = reference.reduce_many(array, keys)
    for key, expected in zip(keys, want):
        rtol = 1e-3 if array.dtype == np.float16 else 2e-6
        np.testing.assert_allclose(got[key], expected, rtol=rtol, atol=1e-6, equal_nan=True,
                                   err_msg=f"{name}: {key}")


def test_materialize_equals_the_reference(framework):
    backend = framework.make_backend()
    keys = _keys(framework)
    values = _values()
    requests = [Request(name, backend.snapshot(framework.to_tensor(v), True), raw=True, shape=True, reductions=keys)
                for name, v in values.items()]
    for (name, array), result in zip(values.items(), backend.materialize(requests)):
        assert result.raw.tobytes() == array.tobytes() and result.raw.dtype == array.dtype, name
        assert tuple(result.shape) == array.shape
        _assert_reductions(name, array, keys, result.reductions)


def test_batches_equal_the_reference_and_keep_the_values_handed_over(framework):
    backend = framework.make_backend()
    keys = _keys(framework)
    values = _values()
    tensors = [framework.to_tensor(v) for v in values.values()]
    started = backend.start_batch(tensors, keys, True)
    result = backend.finish_batch(started)
    assert not result.lost and not result.unreduced
    for i, (name, array) in enumerate(values.items()):
        assert result.raw[i].tobytes() == array.tobytes(), name
        assert tuple(result.shapes[i]) == array.shape
        _assert_reductions(name, array, keys, dict(zip(keys, result.reductions[i])))


def test_an_empty_tensor_has_a_shape_and_no_reductions(framework):
    backend = framework.make_backend()
    empty = np.zeros((0, 3), dtype=np.float32)
    result = backend.finish_batch(backend.start_batch([framework.to_tensor(empty)], (("max", False),), True))
    assert result.unreduced == (0,) and tuple(result.shapes[0]) == (0, 3)


class _FailingBackend(NumpyBackend):
    """Fails on tensors whose values are 2 or more, at hand-over or on the worker."""

    def __init__(self, where):
        self.where = where

    def start_batch(self, tensors, keys, raw):
        if self.where == "start" and tensors[0][0] >= 2:
            raise RuntimeError("injected at hand-over")
        return super().start_batch(tensors, keys, raw)

    def finish_here(self, started):
        return False  # on the pipeline's worker

    def finish_batch(self, started):
        if self.where == "finish" and started[0][0][0] >= 2:
            raise RuntimeError("injected on the worker")
        return super().finish_batch(started)


@pytest.mark.parametrize("where", ["start", "finish"])
def test_a_failing_backend_costs_the_capture_not_the_loop(tmp_path, caplog, where):
    out_dir = str(tmp_path / "run")
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"])
    hook.get_collection("weights").include("^w$")
    backend = _FailingBackend(where)
    steps_run = 0
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        for step in range(4):
            hook.begin_step()
            session = hook.session
            batch = session.inbox.start_batch(session.plans.selection(("w",)), [np.full(3, step, np.float32)], backend)
            session.inbox.record_batch(batch)
            steps_run += 1
        hook.close()
    assert steps_run == 4 and not hook.enabled
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "injected" in warnings[0], warnings
    from smdebug.trials import create_trial

    trial = create_trial(out_dir, wait_timeout=1)
    assert trial.steps(show_incomplete_steps=True) == [0, 1]
    assert trial.tensor("w").value(1).tolist() == [1.0, 1.0, 1.0]


def test_a_stop_request_reaches_the_adapter_and_the_run(tmp_path):
    out_dir = str(tmp_path / "run")
    hook = smd.Hook(out_dir=out_dir)
    hook.begin_step()
    assert not hook.stop_requested
    hook.request_stop("loss is NaN")
    assert hook.stop_requested and hook.stop_reason == "loss is NaN"
    assert os.path.exists(os.path.join(out_dir, "training_stop_reason.json"))
    hook.close()


def test_every_adapter_module_imports_no_other_framework():
    # the core imports no framework; importing it must not pull one in
    import sys

    importlib.import_module("smdebug")
    heavy = {"torch", "tensorflow", "mxnet", "xgboost"}
    core_modules = [m for m in sys.modules if m == "smdebug" or m.startswith("smdebug.")
                    and m.split(".")[1] not in ("pytorch", "tensorflow", "mxnet", "xgboost", "lightning", "transformers")]
    for name in core_modules:
        module = sys.modules[name]
        for attr in vars(module).values():
            mod = getattr(attr, "__module__", None) or getattr(attr, "__name__", "")
            assert str(mod).split(".")[0] not in heavy or name.startswith("smdebug.") is False, (name, mod)


HEALTH_KEYS = tuple((op, is_abs) for op in reference.HEALTH_REDUCTIONS for is_abs in (False, True))


def _health_values():
    """Values at and just past each low-precision type's limits, NaN, ±Inf, zeros, subnormals,
    in shapes that take each of a backend's paths (one value, small batches, big tensors)."""
    import ml_dtypes

    limits = []
    for t in (np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        info = ml_dtypes.finfo(t)
        largest, tiny = np.float32(info.max), np.float32(info.smallest_subnormal)
        limits += [largest, -np.nextafter(largest, np.float32(np.inf)), tiny, tiny / 2, np.nextafter(tiny / 2, 1)]
    edge = np.array(limits + [0.0, -0.0, np.nan, np.inf, -np.inf, 1.5, -3.0], dtype=np.float32)
    rng = np.random.default_rng(5)
    big = (rng.standard_normal(70000) ** 3).astype(np.float32)
    big[::997] = 0
    big[5], big[9], big[11] = np.nan, np.inf, 1e-40
    return {"edge f32": edge, "edge f64": edge.astype(np.float64), "edge again": edge[::-1].copy(),
            "big": big, "f16": np.array([0, 1e-7, 6e4, np.inf], dtype=np.float16),
            "i64": np.array([0, 3, 70000], dtype=np.int64), "no finite": np.array([np.nan, np.inf], np.float32),
            "one value": np.array([0.0], np.float32)}


def _assert_health(name, array, keys, got):
    want = reference.reduce_many(array, keys)
    for key, expected in zip(keys, want):
        np.testing.assert_allclose(got[key], expected, rtol=1e-5, atol=0, equal_nan=True, err_msg=f"{name}: {key}")


def test_health_reductions_equal_the_reference_one_by_one_and_in_batches(framework):
    backend = framework.make_backend()
    values = _health_values()
    requests = [Request(name, backend.snapshot(framework.to_tensor(v), True), raw=False, shape=True,
                        reductions=HEALTH_KEYS) for name, v in values.items()]
    for (name, array), result in zip(values.items(), backend.materialize(requests)):
        _assert_health(name, array, HEALTH_KEYS, result.reductions)
    for raw in (False, True):
        for group in (list(values), ["one value"], ["edge f32", "edge again"]):
            result = backend.finish_batch(backend.start_batch([framework.to_tensor(values[n]) for n in group],
                                                              HEALTH_KEYS, raw))
            assert not result.lost
            for i, name in enumerate(group):
                _assert_health(name, values[name], HEALTH_KEYS, dict(zip(HEALTH_KEYS, result.reductions[i])))
