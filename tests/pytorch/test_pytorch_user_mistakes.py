"""PyTorch side of issue 21: collections that used to save nothing in silence."""
import logging

import pytest

torch = pytest.importorskip("torch")

import smdebug.pytorch as smd  # noqa: E402
from pt_helpers import batches, make_model, train  # noqa: E402
from smdebug.exceptions import ConfigError  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402


def every_step(**kwargs):
    return smd.Hook(save_config=smd.SaveConfig(save_interval=1), **kwargs)


def test_include_collections_all_saves_every_weight_bias_and_gradient(run_dir):
    hook = every_step(out_dir=run_dir, include_collections=["all"])
    model = make_model()
    hook.register_module(model)
    loss = torch.nn.CrossEntropyLoss()
    hook.register_loss(loss)
    train(model, loss, batches(2))
    hook.close()
    names = set(create_trial(run_dir).tensor_names())
    params = {f"Net_{n}" for n, _ in model.named_parameters()}
    # "all" includes every collection (as in 1.0.34), the step's updates too; plain SGD keeps no state
    assert params | {f"gradient/{p}" for p in params} | {f"update/{p}" for p in params} \
        | {"CrossEntropyLoss_output_0"} == names


def test_include_collections_as_a_string(run_dir):
    hook = every_step(out_dir=run_dir, include_collections="weights")
    model = make_model()
    hook.register_module(model)
    train(model, torch.nn.CrossEntropyLoss(), batches(1))
    hook.close()
    assert hook.include_collections == ["losses", "weights"]
    assert "Net_fc1.weight" in create_trial(run_dir).tensor_names()


def test_add_to_collection_with_a_module_saves_its_outputs(run_dir):
    hook = every_step(out_dir=run_dir)
    model = make_model()
    hook.register_module(model)
    hook.add_to_collection("custom", model.fc1)
    hook.get_collection("mine").add(model.fc2)
    train(model, torch.nn.CrossEntropyLoss(), batches(2))
    hook.close()
    trial = create_trial(run_dir)
    assert {"fc1_output_0", "fc2_output_0"} <= set(trial.tensor_names())
    assert trial.tensor("fc1_output_0").value(1).shape == (4, 6)
    assert {"custom", "mine"} <= set(hook.include_collections)


def test_adding_a_module_before_its_model_is_registered_saves_its_outputs(run_dir):
    hook = every_step(out_dir=run_dir)
    model = make_model()
    hook.get_collection("early").add(model.fc1)  # named once its model is registered, not by its class
    hook.add_to_collection("early2", model.fc2)
    hook.register_module(model)
    train(model, torch.nn.CrossEntropyLoss(), batches(1))
    hook.close()
    trial = create_trial(run_dir)
    assert trial.tensor_names(collection="early") == ["fc1_output_0"]
    assert trial.tensor_names(collection="early2") == ["fc2_output_0"]


def test_adding_a_parameter_saves_it_even_before_its_model_is_registered(run_dir):
    hook = every_step(out_dir=run_dir)
    model = make_model()
    hook.get_collection("custom").add(model.fc2.bias)  # before register_module
    hook.register_module(model)
    hook.add_to_collection("custom", model.conv.weight)  # after
    train(model, torch.nn.CrossEntropyLoss(), batches(1))
    hook.close()
    assert create_trial(run_dir).tensor_names(collection="custom") == ["Net_conv.weight", "Net_fc2.bias"]


def test_adding_a_plain_tensor_or_another_object_raises_a_clear_error(run_dir):
    hook = every_step(out_dir=run_dir)
    with pytest.raises(ConfigError, match=r"cannot add a tensor \(shape \(2, 3\)\) to collection 'custom'.*"
                                          r"hook.save_tensor\('<name>', tensor, 'custom'\)"):
        hook.get_collection("custom").add(torch.zeros(2, 3))
    with pytest.raises(ConfigError, match="cannot add int 5 to collection 'custom'"):
        hook.add_to_collection("custom", 5)
    hook.close()


def test_a_regex_that_matches_no_tensor_warns_with_the_names_the_hook_saw(run_dir, caplog):
    hook = every_step(out_dir=run_dir, include_collections=["fc"])
    hook.get_collection("fc").include("^Sequential_2\\.weight")
    model = make_model()
    hook.register_module(model)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        train(model, torch.nn.CrossEntropyLoss(), batches(3))
    hook.close()
    warnings = [r.getMessage() for r in caplog.records if "matched none" in r.getMessage()]
    assert len(warnings) == 1
    assert "'fc'" in warnings[0] and "'Net_fc1.weight'" in warnings[0] and "'fc1_output_0'" in warnings[0] and "hook.seen_tensor_names()" in warnings[0]
    assert "gradient/Net_fc1.weight" in hook.seen_tensor_names()
