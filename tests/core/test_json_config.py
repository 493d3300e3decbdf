"""JSON hook configuration (docs/format.md 7) and environment variables."""
import json
import logging

import pytest

import smdebug as smd
from smdebug import config as cfg
from smdebug import environment
from smdebug.exceptions import ConfigError

SEED_JSON = {
    "LocalPath": "PLACEHOLDER",
    "HookParameters": {
        "save_all": False,
        "include_regex": "regex1,regex2",
        "save_interval": "100",
        "save_steps": "1,2,3,4",
        "start_step": "1",
        "end_step": "1000000",
        "reductions": "min,max,mean",
    },
    "CollectionConfigurations": [
        {
            "CollectionName": "collection_obj_name1",
            "CollectionParameters": {
                "include_regex": "regexe5*",
                "save_interval": 100,
                "save_steps": "1,2,3",
                "start_step": 1,
                "reductions": "min",
            },
        }
    ],
}


def write_config(tmp_path, doc, name="config.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def test_seed_sample_json_builds_a_hook(tmp_path, monkeypatch):
    doc = dict(SEED_JSON, LocalPath=str(tmp_path / "run"))
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", write_config(tmp_path, doc))
    hook = smd.Hook.create_from_json_file()  # no arguments, as the seeds show
    try:
        assert hook.out_dir == str(tmp_path / "run")
        assert hook.reduction_config.all_reductions() == [("min", False), ("max", False), ("mean", False)]
        assert hook.reduction_config.save_raw_tensor is False
        assert hook.get_collection("default").include_regex == ("regex1", "regex2")
        assert {"default", "collection_obj_name1", "losses"} <= set(hook.include_collections)
        coll = hook.get_collection("collection_obj_name1")
        assert coll.include_regex == ("regexe5*",)
        assert coll.reduction_config.all_reductions() == [("min", False)]
        resolved = coll.save_config.resolved(hook.save_config)
        saved = [s for s in range(210) if resolved.should_save_step(smd.modes.TRAIN, s)]
        assert saved == [1, 2, 3, 100, 200]
    finally:
        hook.close()


def test_per_mode_keys_and_collection_precedence(tmp_path):
    # docs/format.md 7.2 example: collection save_steps "7" over hook train.save_interval 3, start_step 1
    doc = {
        "LocalPath": str(tmp_path / "run"),
        "HookParameters": {"train.save_interval": 3, "start_step": 1, "eval.save_interval": "5"},
        "CollectionConfigurations": [{"CollectionName": "weights", "CollectionParameters": {"save_steps": "7"}}],
    }
    settings = cfg.load_hook_settings(write_config(tmp_path, doc))
    hook = smd.Hook(out_dir=settings.out_dir, dry_run=True, **settings.hook_kwargs)
    settings.apply_collections(hook.collection_manager)
    resolved = hook.get_collection("weights").save_config.resolved(hook.save_config)
    assert [s for s in range(13) if resolved.should_save_step("train", s)] == [3, 6, 7, 9, 12]
    assert [s for s in range(11) if resolved.should_save_step("eval", s)] == [5, 7, 10]


def test_save_steps_as_list_and_bool_strings_are_accepted(tmp_path):
    doc = {"LocalPath": str(tmp_path), "HookParameters": {"save_steps": [2, 4], "save_all": "True",
                                                          "reductions": "l2_norm", "save_raw_tensor": "true"}}
    settings = cfg.load_hook_settings(write_config(tmp_path, doc))
    assert settings.hook_kwargs["save_all"] is True
    assert settings.hook_kwargs["save_config"].save_steps == [2, 4]
    assert settings.hook_kwargs["reduction_config"].save_raw_tensor is True


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('{"LocalPath": "/tmp/x", "HookParameters": {', "is not valid JSON"),
        ('["LocalPath"]', "must be a JSON object, got list"),
        ('{"HookParameters": []}', "HookParameters must be an object"),
        ('{"HookParameters": {"save_interval": "often"}}', "save_interval must be an integer, got 'often'"),
        ('{"HookParameters": {"save_interval": 0}}', "save_interval must be >= 1, got 0"),
        ('{"HookParameters": {"start_step": 9, "end_step": 3}}', "end_step (3) must not be smaller"),
        ('{"HookParameters": {"reductions": "min,average"}}', "unknown reduction 'average'"),
        ('{"HookParameters": {"save_all": "sometimes"}}', "save_all must be true or false, got 'sometimes'"),
        ('{"HookParameters": {"reductions": 5}}', "reductions must be a comma-separated string"),
        ('{"LocalPath": 5}', "LocalPath must be a string, got 5"),
        ('{"CollectionConfigurations": {"CollectionName": "x"}}', "CollectionConfigurations must be a list"),
        ('{"CollectionConfigurations": [{"CollectionParameters": {}}]}', "needs a string CollectionName"),
        ('{"CollectionConfigurations": [{"CollectionName": "w", "CollectionParameters": '
         '{"train.save_interval": -1}}]}', "collection 'w': save_interval must be >= 1, got -1"),
    ],
)
def test_malformed_configs_fail_fast(tmp_path, text, fragment):
    with pytest.raises(ConfigError) as info:
        cfg.load_hook_settings(write_config(tmp_path, text))
    assert fragment in str(info.value)


def test_truncated_config_file(tmp_path):
    full = json.dumps(dict(SEED_JSON, LocalPath=str(tmp_path)))
    with pytest.raises(ConfigError, match="is not valid JSON"):
        cfg.load_hook_settings(write_config(tmp_path, full[: len(full) // 2]))


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        cfg.load_hook_settings(str(tmp_path / "nope.json"))


def test_unknown_keys_are_named_in_one_warning(tmp_path, caplog):
    doc = {"LocalPath": str(tmp_path), "Bogus": 1,
           "HookParameters": {"save_intervall": 3, "train.save_interval": 2},
           "CollectionConfigurations": [{"CollectionName": "w", "CollectionParameters": {"colour": "red"}}]}
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        cfg.load_hook_settings(write_config(tmp_path, doc))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "Bogus" in warnings[0] and "save_intervall" in warnings[0] and "w.colour" in warnings[0]
    assert "train.save_interval" not in warnings[0]


@pytest.mark.parametrize("value, enabled", [(None, True), ("1", True), ("true", True), ("0", False),
                                            ("false", False), ("off", False), ("NO", False)])
def test_use_smdebug(monkeypatch, value, enabled):
    if value is None:
        monkeypatch.delenv("USE_SMDEBUG", raising=False)
    else:
        monkeypatch.setenv("USE_SMDEBUG", value)
    assert environment.smdebug_enabled() is enabled


def test_use_smdebug_garbage_is_an_error(monkeypatch):
    monkeypatch.setenv("USE_SMDEBUG", "maybe")
    with pytest.raises(ConfigError, match="USE_SMDEBUG must be true or false, got 'maybe'"):
        environment.smdebug_enabled()


def test_get_hook_honours_use_smdebug(tmp_path, monkeypatch):
    monkeypatch.setenv("SMDEBUG_CONFIG_FILE_PATH", write_config(tmp_path, {"LocalPath": str(tmp_path / "r")}))
    monkeypatch.setenv("USE_SMDEBUG", "0")
    assert smd.get_hook(create_if_not_exists=True) is None
    monkeypatch.setenv("USE_SMDEBUG", "1")
    hook = smd.get_hook(create_if_not_exists=True)
    try:
        assert hook is not None and smd.get_hook() is hook
    finally:
        hook.close()
    assert smd.get_hook() is None


def test_env_names_with_and_without_prefix(monkeypatch):
    monkeypatch.delenv("SMDEBUG_INCOMPLETE_STEP_WAIT_WINDOW", raising=False)
    monkeypatch.setenv("INCOMPLETE_STEP_WAIT_WINDOW", "7")
    assert environment.env_int("INCOMPLETE_STEP_WAIT_WINDOW", 1000) == 7
    monkeypatch.setenv("SMDEBUG_INCOMPLETE_STEP_WAIT_WINDOW", "9")
    assert environment.env_int("INCOMPLETE_STEP_WAIT_WINDOW", 1000) == 9
    monkeypatch.setenv("SMDEBUG_INCOMPLETE_STEP_WAIT_WINDOW", "lots")
    with pytest.raises(ConfigError, match="must be an integer"):
        environment.env_int("INCOMPLETE_STEP_WAIT_WINDOW", 1000)


def test_tensorboard_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("TRAINING_JOB_NAME", raising=False)
    monkeypatch.delenv("TENSORBOARD_CONFIG_FILE_PATH", raising=False)
    out = str(tmp_path)
    assert cfg.resolve_tensorboard_dir(out, None, False) is None
    assert cfg.resolve_tensorboard_dir(out, None, True) == str(tmp_path / "tensorboard")
    assert cfg.resolve_tensorboard_dir(out, "/x/tb", False) == "/x/tb"
    monkeypatch.setenv("TENSORBOARD_CONFIG_FILE_PATH", write_config(tmp_path, {"LocalPath": "/y/tb"}, "tb.json"))
    assert cfg.resolve_tensorboard_dir(out, None, True) == "/y/tb"
    monkeypatch.setenv("TRAINING_JOB_NAME", "job")  # on SageMaker only the platform's file counts
    assert cfg.resolve_tensorboard_dir(out, "/x/tb", False) == "/y/tb"


def _written_layout(hook):
    return hook.session.writer.layout if hasattr(hook, "session") else hook._session.writer.layout


@pytest.mark.parametrize("how", ["argument", "json", "env"])
def test_the_1034_layout_is_chosen_three_ways(tmp_path, monkeypatch, how):
    monkeypatch.delenv("SMDEBUG_LAYOUT", raising=False)
    run = tmp_path / "run"
    if how == "argument":
        hook = smd.Hook(out_dir=str(run), layout="smdebug-1.0.34")
    else:
        doc = {"LocalPath": str(run), "HookParameters": {"save_interval": "1"}}
        if how == "json":
            doc["HookParameters"]["layout"] = "smdebug-1.0.34"
        else:
            monkeypatch.setenv("SMDEBUG_LAYOUT", "smdebug-1.0.34")
        hook = smd.Hook.create_from_json_file(write_config(tmp_path, doc))
    try:
        assert _written_layout(hook) == "smdebug-1.0.34"
    finally:
        hook.close()


def test_sagemaker_config_path_picks_the_1034_layout(tmp_path, monkeypatch):
    """SageMaker's managed rules read the run with 1.0.34: a config at its path picks that layout."""
    monkeypatch.delenv("SMDEBUG_LAYOUT", raising=False)
    path = write_config(tmp_path, {"LocalPath": str(tmp_path / "run")})
    monkeypatch.setattr(cfg, "DEFAULT_CONFIG_FILE", str(path))
    assert cfg.load_hook_settings().hook_kwargs["layout"] == "smdebug-1.0.34"
    path2 = write_config(tmp_path, {"LocalPath": str(tmp_path / "run")}, name="elsewhere.json")
    assert "layout" not in cfg.load_hook_settings(str(path2)).hook_kwargs


def test_a_bad_layout_fails_at_construction_naming_the_choices(tmp_path, monkeypatch):
    monkeypatch.delenv("SMDEBUG_LAYOUT", raising=False)
    with pytest.raises(ConfigError, match=r"^layout must be one of 'store', 'smdebug-1.0.34', got '1.0.34'"):
        smd.Hook(out_dir=str(tmp_path / "run"), layout="1.0.34")
    monkeypatch.setenv("SMDEBUG_LAYOUT", "parquet")
    with pytest.raises(ConfigError, match=r"\$SMDEBUG_LAYOUT: .*got 'parquet'"):
        smd.Hook(out_dir=str(tmp_path / "run2"))
