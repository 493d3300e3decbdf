"""torch.compile: a compiled model trains with the hook; saved values match eager training.

CPU compilation with the default (inductor) backend takes ~30 s, so the test uses
``aot_eager`` (dynamo capture and AOT autograd, no code generation). Set
``SMDEBUG_TEST_COMPILE_BACKEND=inductor`` to run it with inductor.
"""
import logging
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import smdebug.pytorch as smd  # noqa: E402
from pt_helpers import batches, make_model, train  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

BACKEND = os.environ.get("SMDEBUG_TEST_COMPILE_BACKEND", "aot_eager")


def run(out_dir, compile_how):
    model, loss_fn = make_model(seed=3), torch.nn.CrossEntropyLoss()
    runnable = model
    if compile_how == "wrapper":
        runnable = torch.compile(model, backend=BACKEND)
    elif compile_how == "in_place":
        model.compile(backend=BACKEND)
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "biases", "gradients", "losses"])
    hook.get_collection("fc1").add_module_tensors(model.fc1)  # a submodule: not capturable when compiled
    hook.get_collection("model_out").add_module_tensors(runnable)
    hook.register_module(runnable)
    hook.register_loss(loss_fn)
    train(runnable, loss_fn, batches(3))
    hook.close()
    return create_trial(out_dir)


@pytest.mark.parametrize("compile_how", ["wrapper", "in_place"])
def test_compiled_model_saves_what_eager_saves(tmp_path, caplog, compile_how):
    torch._dynamo.reset()
    eager = run(str(tmp_path / "eager"), None)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        compiled = run(str(tmp_path / "compiled"), compile_how)
    assert compiled.steps() == eager.steps() == [0, 1, 2]
    expected = set(eager.tensor_names()) - {"fc1_output_0"}
    assert set(compiled.tensor_names()) == expected
    for name in sorted(expected):
        for step in eager.steps():
            np.testing.assert_allclose(compiled.tensor(name).value(step), eager.tensor(name).value(step),
                                       rtol=1e-5, atol=1e-6, err_msg=f"{name} step {step}")
    # smdebug compare's answer for the same two runs (README "Comparing runs").
    from smdebug.analysis import compare

    result = compare([eager, compiled], rtol=1e-5, atol=1e-6)
    assert result.divergence is None and result.compared["tensors"] == 3 * (len(expected) - 1)
    assert result.only_in == {"eager": {"tensors": ["fc1_output_0"], "steps": []}}
    warnings = [r.getMessage() for r in caplog.records if "torch.compile" in r.getMessage()]
    assert len(warnings) == 1 and "fc1" in warnings[0]


def test_model_compiled_after_registration_still_saves_submodule_outputs(tmp_path):
    """Hooks registered before torch.compile are traced by it: they run eagerly behind a graph break."""
    def run_late(out_dir, compile_it):
        torch._dynamo.reset()
        model, loss_fn = make_model(seed=3), torch.nn.CrossEntropyLoss()
        hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["losses"])
        hook.get_collection("fc1").add_module_tensors(model.fc1)
        hook.register_module(model)
        hook.register_loss(loss_fn)
        runnable = torch.compile(model, backend=BACKEND) if compile_it else model
        train(runnable, loss_fn, batches(3))
        hook.close()
        return create_trial(out_dir)

    eager, late = run_late(str(tmp_path / "eager"), False), run_late(str(tmp_path / "late"), True)
    assert late.tensor("fc1_output_0").steps() == eager.tensor("fc1_output_0").steps() == [0, 1, 2]
    for step in (0, 1, 2):
        np.testing.assert_allclose(late.tensor("fc1_output_0").value(step), eager.tensor("fc1_output_0").value(step),
                                   rtol=1e-5, atol=1e-6)
