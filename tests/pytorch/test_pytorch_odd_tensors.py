"""One tensor, one failure: a tensor the backend cannot handle is skipped with one warning
naming it, and the rest of the step is written (real tensors, no mocks)."""
import logging
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import smdebug.pytorch as smd  # noqa: E402
from smdebug.reductions import reduce  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

REDUCTIONS = ["min", "max", "mean", "std"]



def nested_tensor():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "prototype stage"
        return torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])


@pytest.mark.parametrize("kind", ["meta", "nested"])
def test_save_tensor_of_a_tensor_without_values_skips_it_and_saves_the_rest(run_dir, caplog, kind, smdebug_warnings):
    odd = torch.ones(3, device="meta") if kind == "meta" else nested_tensor()
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=1))
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        for step in range(3):
            hook.begin_step()
            hook.save_tensor("odd", odd, "mine")
            hook.save_tensor("good", torch.full((2,), float(step)), "mine")
        hook.close()
    assert hook.enabled
    messages = smdebug_warnings(messages=True)
    assert len(messages) == 1 and "odd" in messages[0] and kind in messages[0]
    trial = create_trial(run_dir, wait_timeout=1)
    assert trial.steps() == [0, 1, 2]
    assert trial.tensor_names(collection="mine") == ["good"]
    np.testing.assert_array_equal(trial.tensor("good").value(2), [2.0, 2.0])


def test_a_tensor_the_backend_cannot_reduce_is_skipped_with_one_warning(run_dir, caplog, smdebug_warnings):
    # A bits8 tensor holds bytes but no numbers: nothing in torch reduces or converts it.
    odd = torch.zeros(4, dtype=torch.uint8).view(torch.bits8)
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=1),
                    reduction_config=smd.ReductionConfig(reductions=["max"], save_raw_tensor=True))
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        hook.begin_step()
        hook.save_tensor("bits", odd, "mine")  # alone in its step
        for step in range(1, 3):
            hook.begin_step()
            hook.save_tensor("bits", odd, "mine")
            hook.save_tensor("good", torch.full((3,), float(step)), "mine")
        hook.close()
    assert hook.enabled
    messages = smdebug_warnings(messages=True)
    assert len(messages) == 1 and "'bits'" in messages[0]
    trial = create_trial(run_dir, wait_timeout=1)
    assert trial.tensor_names() == ["good"]
    assert trial.steps() == [1, 2]
    assert trial.tensor("good").reduction_value(2, "max") == 2.0


@pytest.mark.parametrize("dtype", [d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None))
                                   if d is not None])
def test_small_float8_reduced_with_another_dtype_in_one_step(run_dir, caplog, dtype, smdebug_warnings):
    small = torch.tensor([0.5, -1.0, 2.0, 1.5]).to(dtype)  # exactly representable
    other = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float32)
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=1),
                    reduction_config=smd.ReductionConfig(reductions=REDUCTIONS))
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        hook.begin_step()
        hook.save_tensor("f8", small, "mine")
        hook.save_tensor("f32", other, "mine")
        hook.close()
    assert hook.enabled and not smdebug_warnings(messages=True)
    trial = create_trial(run_dir, wait_timeout=1)
    for name, values in (("f8", small.to(torch.float64).numpy()), ("f32", other.numpy())):
        for op in REDUCTIONS:
            np.testing.assert_allclose(trial.tensor(name).reduction_value(0, op), reduce(values, op, False),
                                       rtol=1e-6, err_msg=f"{name} {op}")
