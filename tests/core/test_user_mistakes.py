"""Mistakes a new user makes that used to save nothing in silence (issue 21, configuration).

Each test writes a real run with the numpy Hook (or parses a real JSON file) and checks
that the mistake now works as meant or says what is wrong and what to do.
"""
import json
import logging

import numpy as np
import pytest

import smdebug as smd
from smdebug.collections import Collection, as_name_list
from smdebug.config import load_hook_settings
from smdebug.exceptions import ConfigError, OutDirError
from smdebug.reduction_config import ReductionConfig
from smdebug.trials import create_trial


def train(hook, steps=3):
    for step in range(steps):
        hook.begin_step()
        hook.record("fc.weight", np.full((2, 3), step, np.float32))
        hook.record("fc.bias", np.full((3,), step, np.float32))
        hook.record("gradient/fc.weight", np.full((2, 3), -step, np.float32))
        hook.record("loss", np.float32(1.0 / (step + 1)))
    hook.close()



def test_include_collections_all_saves_every_weight_bias_and_gradient(tmp_path):
    run = tmp_path / "run"
    hook = smd.Hook(out_dir=run, save_config=smd.SaveConfig(save_interval=1), include_collections=["all"])
    assert {"weights", "biases", "gradients", "losses"} <= set(hook.include_collections)
    train(hook)
    trial = create_trial(str(run))
    assert set(trial.tensor_names()) == {"fc.weight", "fc.bias", "gradient/fc.weight", "loss"}
    assert trial.tensor("gradient/fc.weight").steps() == [0, 1, 2]


def test_all_also_includes_collections_created_later(tmp_path):
    hook = smd.Hook(out_dir=tmp_path / "run", include_collections="all")
    hook.get_collection("custom").include("^act")
    assert "custom" in hook.include_collections
    hook.close()


@pytest.mark.parametrize("value", ["weights", ("weights",), ["weights"]])
def test_a_plain_string_is_one_collection_not_its_letters(tmp_path, value):
    hook = smd.Hook(out_dir=tmp_path / "run", include_collections=value)
    assert hook.include_collections == ["losses", "weights"]
    hook.close()


def test_string_arguments_everywhere_a_list_of_names_is_taken(tmp_path):
    assert as_name_list("a.*b", "include_regex") == ["a.*b"]
    assert as_name_list(None, "x") == []
    assert Collection("c", tensor_names="fc.weight").tensor_names == frozenset({"fc.weight"})
    coll = Collection("c")
    coll.tensor_names = "fc.bias"
    assert coll.tensor_names == frozenset({"fc.bias"})
    assert ReductionConfig(reductions="max", norms="l2").all_reductions() == [("max", False), ("l2", False)]
    hook = smd.Hook(out_dir=tmp_path / "run", include_regex="^fc\\.w", save_config=smd.SaveConfig(save_interval=1))
    assert hook.get_collection("default").include_regex == ("^fc\\.w",)
    hook.begin_step()
    hook.save_tensor("mine", np.ones(2), collections_to_write="extra")
    hook.close()
    assert create_trial(str(tmp_path / "run")).tensor("mine").steps() == [0]
    with pytest.raises(ConfigError, match=r"include_collections must hold strings, got 3"):
        smd.Hook(out_dir=tmp_path / "run2", include_collections=["weights", 3])
    with pytest.raises(ConfigError, match="include_collections must be a string or a list of strings"):
        smd.Hook(out_dir=tmp_path / "run3", include_collections=7)


def test_typo_in_an_included_collection_warns_once_with_close_matches(tmp_path, caplog, smdebug_warnings):
    hook = smd.Hook(out_dir=tmp_path / "run", include_collections=["wieghts"],
                    save_config=smd.SaveConfig(save_interval=1))
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        train(hook)
    warnings = smdebug_warnings(messages=True)
    typo = [w for w in warnings if "'wieghts'" in w]
    assert len(typo) == 1, warnings
    assert "did you mean 'weights'" in typo[0] and "hook.get_collection('wieghts').include(" in typo[0]


def test_a_configured_custom_collection_does_not_warn(tmp_path, caplog, smdebug_warnings):
    hook = smd.Hook(out_dir=tmp_path / "run", include_collections=["acts"],
                    save_config=smd.SaveConfig(save_interval=1))
    hook.get_collection("acts").include("^fc")
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        train(hook)
    assert smdebug_warnings(messages=True) == []
    assert "fc.weight" in create_trial(str(tmp_path / "run")).tensor_names()


def test_a_collection_filled_by_save_tensor_in_the_first_step_does_not_warn(tmp_path, caplog, smdebug_warnings):
    hook = smd.Hook(out_dir=tmp_path / "run", include_collections=["custom"],
                    save_config=smd.SaveConfig(save_interval=1))
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        for step in range(3):
            hook.begin_step()
            hook.save_tensor("custom_t", np.arange(3.0) + step, "custom")  # after the step began
        hook.close()
    assert smdebug_warnings(messages=True) == []
    assert create_trial(str(tmp_path / "run")).tensor_names(collection="custom") == ["custom_t"]


def test_an_included_collection_that_matched_nothing_warns_after_its_first_saved_step(tmp_path, caplog, smdebug_warnings):
    hook = smd.Hook(out_dir=tmp_path / "run", include_collections=["outputs_of_fc"],
                    save_config=smd.SaveConfig(save_interval=1))
    hook.get_collection("outputs_of_fc").include("^Sequential_2\\.weight$")
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        hook.begin_step()
        hook.record("fc.weight", np.ones(2))
        hook.record("fc.bias", np.ones(2))
        assert smdebug_warnings(messages=True) == []  # not before the step is over
        hook.begin_step()
        hook.record("fc.weight", np.ones(2))
        hook.begin_step()
        hook.close()
    warnings = smdebug_warnings(messages=True)
    assert len(warnings) == 1, warnings
    message = warnings[0]
    assert "'outputs_of_fc' matched none of the 2 tensor names the hook saw by step 0" in message
    assert "(e.g. 'fc.weight', 'fc.bias')" in message and "hook.seen_tensor_names()" in message
    assert "^Sequential_2\\\\.weight$" in message
    assert hook.seen_tensor_names() == ["fc.weight", "fc.bias"]


def test_include_regex_that_matches_nothing_warns(tmp_path, caplog, smdebug_warnings):
    hook = smd.Hook(out_dir=tmp_path / "run", include_regex=["^conv"], save_config=smd.SaveConfig(save_interval=1))
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        train(hook)
    assert any("'default' matched none" in w for w in smdebug_warnings(messages=True))


def test_default_collections_that_match_nothing_do_not_warn(tmp_path, caplog, smdebug_warnings):
    hook = smd.Hook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1))
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        hook.begin_step()
        hook.record("fc.weight", np.ones(2))  # "losses" is included by default and matches nothing
        hook.close()
    assert smdebug_warnings(messages=True) == []


@pytest.mark.parametrize("save_config", [{"save_interval": 10}, {"TRAIN": {"save_interval": 10}, "end_step": 5}])
def test_save_config_given_as_a_dict_of_fields_says_what_to_write(tmp_path, save_config):
    with pytest.raises(ConfigError) as info:
        smd.Hook(out_dir=tmp_path / "run", save_config=save_config)
    message = str(info.value)
    assert "a SaveConfig or a dict of modes is expected" in message and "save_config=SaveConfig(" in message
    with pytest.raises(ConfigError, match="a SaveConfig or a dict of modes"):
        smd.Hook(out_dir=tmp_path / "run", save_config={"sometimes": {"save_interval": 2}})
    with pytest.raises(ConfigError, match="a SaveConfig or a dict of modes is expected"):
        Collection("c").save_config = {"save_interval": 3}


def test_save_config_as_a_dict_of_modes_still_works(tmp_path):
    hook = smd.Hook(out_dir=tmp_path / "run", save_config={"TRAIN": {"save_interval": 2}}, save_all=True)
    assert hook.save_config.get_save_config("TRAIN").save_interval == 2
    hook.close()


def test_median_norm_is_rejected_not_turned_into_median():
    with pytest.raises(ConfigError, match="unknown reduction 'median_norm'"):
        ReductionConfig.from_string("median_norm")
    assert ReductionConfig.from_string("l2_norm,abs_l1_norm,median").all_reductions() == [
        ("median", False), ("l2", False), ("l1", True)]


def test_deeply_nested_json_config_is_a_config_error(tmp_path):
    path = tmp_path / "hook.json"
    path.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_hook_settings(str(path))
    nested = '{"collections": ' + "[" * 100000 + "]" * 100000 + "}"
    with pytest.raises(ConfigError, match="nested too deeply"):
        smd.collections.CollectionManager.from_json(nested)


def test_create_from_json_file_without_the_variable_names_it(tmp_path, monkeypatch):
    monkeypatch.delenv("SMDEBUG_CONFIG_FILE_PATH", raising=False)
    with pytest.raises(FileNotFoundError, match="SMDEBUG_CONFIG_FILE_PATH is not set"):
        smd.Hook.create_from_json_file()
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", str(tmp_path / "nope.json"))
    with pytest.raises(FileNotFoundError, match="named by SMDEBUG_CONFIG_FILE_PATH.*nope.json"):
        smd.Hook.create_from_json_file()


def test_json_config_overwrite_key_replaces_a_previous_run(tmp_path):
    run = tmp_path / "run"
    train(smd.Hook(out_dir=run, save_all=True))
    path = tmp_path / "hook.json"
    path.write_text(json.dumps({"LocalPath": str(run), "HookParameters": {"save_interval": "1"}}))
    with pytest.raises(OutDirError) as info:
        smd.Hook.create_from_json_file(str(path))
    assert '"overwrite": true' in str(info.value) and str(path) in str(info.value)
    path.write_text(json.dumps({"LocalPath": str(run), "HookParameters": {"save_interval": "1",
                                                                          "overwrite": "true"}}))
    hook = smd.Hook.create_from_json_file(str(path))
    hook.begin_step()
    hook.record("loss", np.float32(3))
    hook.close()
    assert create_trial(str(run)).tensor_names() == ["loss"]


def test_reserved_reduction_prefix_is_refused_at_save(tmp_path, caplog, smdebug_warnings):
    run = tmp_path / "run"
    hook = smd.Hook(out_dir=run, save_all=True, save_config=smd.SaveConfig(save_interval=1))
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        hook.begin_step()
        hook.record("smdebug/reductions/max/fc.weight", np.ones(3))
        hook.record("fc.weight", np.zeros(3))
        hook.begin_step()
        hook.record("smdebug/reductions/max/fc.weight", np.ones(3))
        hook.set_mode(smd.modes.EVAL)  # another set of saved collections: still one warning
        hook.begin_step()
        hook.record("smdebug/reductions/max/fc.weight", np.ones(3))
        hook.close()
    refused = [w for w in smdebug_warnings(messages=True) if "reserved for reductions" in w]
    assert len(refused) == 1 and "'smdebug/reductions/max/fc.weight'" in refused[0]
    trial = create_trial(str(run))
    assert trial.tensor_names() == ["fc.weight"]
    assert trial.tensor("fc.weight").reduction_values(0) == {}
    with pytest.raises(ConfigError, match="reserved for reductions"):
        smd.Hook(out_dir=tmp_path / "r2").save_scalar("smdebug/reductions/max/x", 1.0)


def test_adding_an_object_the_hook_cannot_name_raises_a_clear_error(tmp_path):
    hook = smd.Hook(out_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"cannot add a ndarray of shape \(3,\) to collection 'custom'.*"
                                          r"hook.save_tensor\('<name>', value, 'custom'\)"):
        hook.get_collection("custom").add(np.ones(3))
    with pytest.raises(ConfigError, match="cannot add int 3 to collection 'x'"):
        hook.add_to_collection("x", 3)
    hook.add_to_collection("x", ["fc.weight"])  # names still work
    assert hook.get_collection("x").tensor_names == frozenset({"fc.weight"})
    hook.close()


def test_typo_is_reported_even_when_plans_were_made_before_the_first_step(tmp_path, caplog, smdebug_warnings):
    hook = smd.Hook(out_dir=tmp_path / "run", include_collections="wieghts",
                    save_config=smd.SaveConfig(save_interval=1))
    hook.collections_json()  # prepares the plans before any step (as some adapters do)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        train(hook)
    assert len([w for w in smdebug_warnings(messages=True) if "did you mean 'weights'" in w]) == 1


def test_typo_in_a_json_collection_name_warns(tmp_path, caplog, smdebug_warnings):
    path = tmp_path / "hook.json"
    path.write_text(json.dumps({"LocalPath": str(tmp_path / "run"), "HookParameters": {"save_interval": "1"},
                                "CollectionConfigurations": [{"CollectionName": "gradeints"}]}))
    hook = smd.Hook.create_from_json_file(str(path))
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        train(hook)
    warnings = [w for w in smdebug_warnings(messages=True) if "'gradeints'" in w]
    assert len(warnings) == 1 and "did you mean 'gradients'" in warnings[0]


def test_s3_urls_without_the_s3_extra_say_what_to_install():
    import subprocess
    import sys

    code = ("import sys; sys.modules['fsspec'] = None; sys.modules['s3fs'] = None\n"
            "import smdebug\nfrom smdebug.trials import create_trial\n"
            "for use in (lambda u: smdebug.Hook(out_dir=u), create_trial):\n"
            "    try:\n        use('s3://bucket/run')\n    except ImportError as exc:\n        print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2, done.stderr
    assert all("'s3://bucket/run' needs fsspec and s3fs" in line and 'pip install fsspec s3fs (smdebug-core\'s \'s3\' extra)' in line
               for line in lines)
