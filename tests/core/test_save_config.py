"""SaveConfig semantics: every example of the seed documents, plus docs/format.md 8.2."""
import pytest

import smdebug as smd
from smdebug.exceptions import ConfigError
from smdebug.save_config import SaveConfig, SaveConfigMode


def saved(cfg: SaveConfig, mode=smd.modes.TRAIN, upto=1001):
    resolved = cfg.resolved()
    return [s for s in range(upto) if resolved.should_save_step(mode, s)]


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({}, [0, 500, 1000]),
        ({"save_interval": 1}, list(range(1001))),
        ({"save_interval": 100, "end_step": 200}, [0, 100]),
        ({"save_interval": 100, "end_step": 201}, [0, 100, 200]),
        ({"save_interval": 100, "start_step": 150}, [200, 300, 400, 500, 600, 700, 800, 900, 1000]),
        # save_steps is a union with the interval (docs/format.md 8.2 over the seed that says otherwise)
        ({"save_steps": [3, 7]}, [0, 3, 7, 500, 1000]),
        # the modulo is on the absolute step, not relative to start_step
        ({"start_step": 1, "save_interval": 5}, list(range(5, 1001, 5))),
    ],
)
def test_seed_examples(kwargs, expected):
    assert saved(SaveConfig(**kwargs)) == expected


def test_seed_signature_example_runs_verbatim():
    save_config = smd.SaveConfig(
        mode_save_configs=None,
        save_interval=100,
        start_step=0,
        end_step=None,
        save_steps=None,
    )
    assert saved(save_config, upto=301) == [0, 100, 200, 300]


def test_per_mode_example():
    cfg = smd.SaveConfig(mode_save_configs={
        smd.modes.TRAIN: smd.SaveConfigMode(save_interval=1),
        smd.modes.EVAL: smd.SaveConfigMode(save_interval=2),
        smd.modes.PREDICT: smd.SaveConfigMode(save_interval=3),
        smd.modes.GLOBAL: smd.SaveConfigMode(save_interval=4),
    })
    assert saved(cfg, smd.modes.TRAIN, 6) == [0, 1, 2, 3, 4, 5]
    assert saved(cfg, smd.modes.EVAL, 6) == [0, 2, 4]
    assert saved(cfg, smd.modes.PREDICT, 7) == [0, 3, 6]
    assert saved(cfg, smd.modes.GLOBAL, 9) == [0, 4, 8]


def test_unspecified_modes_and_fields_fall_back():
    cfg = SaveConfig(mode_save_configs={smd.modes.TRAIN: SaveConfigMode(end_step=3)}, save_interval=2)
    # TRAIN keeps the base interval 2 but its own end_step
    assert saved(cfg, smd.modes.TRAIN, 10) == [0, 2]
    # EVAL is unspecified: base config
    assert saved(cfg, smd.modes.EVAL, 7) == [0, 2, 4, 6]


def test_json_collection_config_inherits_hook_config_per_field():
    hook_cfg = SaveConfig(mode_save_configs={smd.modes.TRAIN: SaveConfigMode(save_interval=3)}, start_step=1)
    coll_cfg = SaveConfig(save_steps=[7])
    coll_cfg.fields_from_hook = True  # as the JSON configuration builds a collection's parameters
    resolved = coll_cfg.resolved(parent=hook_cfg)
    # docs/format.md 7.2 example: TRAIN saves at 3, 6, 7, 9, 12 ...
    assert [s for s in range(13) if resolved.should_save_step(smd.modes.TRAIN, s)] == [3, 6, 7, 9, 12]


def test_end_step_zero_switches_off():
    cfg = SaveConfig(save_interval=1)
    cfg.end_step = 0
    assert saved(cfg, upto=10) == []


def test_framework_default_interval():
    assert saved(SaveConfig(), upto=31) == [0]
    assert [s for s in range(31) if SaveConfig().resolved(default_interval=10).should_save_step("train", s)] == [
        0, 10, 20, 30]


def test_json_round_trip():
    cfg = SaveConfig(mode_save_configs={"eval": SaveConfigMode(save_interval=7)}, save_steps=[1, 2]).resolved()
    doc = cfg.to_json_dict()
    assert set(doc) == {"TRAIN", "EVAL", "PREDICT", "GLOBAL"}
    assert doc["EVAL"] == {"save_interval": 7, "save_steps": [1, 2], "start_step": 0, "end_step": None}
    assert SaveConfig.from_json_dict(doc) == cfg


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"save_interval": 0}, "save_interval must be >= 1, got 0"),
        ({"save_interval": -5}, "save_interval must be >= 1, got -5"),
        ({"save_interval": "often"}, "save_interval must be an integer, got 'often'"),
        ({"save_interval": True}, "save_interval must be an integer"),
        ({"start_step": 10, "end_step": 5}, "end_step (5) must not be smaller than start_step (10)"),
        ({"start_step": -1}, "start_step must be >= 0"),
        ({"save_steps": [1, -2]}, "save_steps entry must be >= 0, got -2"),
        ({"save_steps": 3.5}, "save_steps"),
    ],
)
def test_bad_values_fail_fast_with_the_value_named(kwargs, fragment):
    with pytest.raises(ConfigError) as info:
        SaveConfig(**kwargs)
    assert fragment in str(info.value)


def test_bad_mode_names_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown mode 'training'; allowed: TRAIN, EVAL, PREDICT, GLOBAL"):
        SaveConfig(mode_save_configs={"training": SaveConfigMode()})


@pytest.mark.parametrize("kwargs", [
    {"save_interval": 1},
    {"save_interval": 7},
    {"save_interval": 5, "start_step": 3, "end_step": 40},
    {"save_interval": 10, "start_step": 25},
    {"save_interval": 4, "end_step": 0},
    {"save_steps": [2, 9, 33], "save_interval": 20, "end_step": 10},
    {"save_steps": [0, 77], "save_interval": 30, "start_step": 100, "end_step": 100},
])
def test_next_save_step_agrees_with_should_save_step(kwargs):
    config = SaveConfigMode(**kwargs).filled_from(SaveConfigMode(save_interval=500, start_step=0))
    saved = [step for step in range(200) if config.should_save_step(step)]
    for step in range(120):
        expected = next((s for s in saved if s >= step), None)
        got = config.next_save_step(step)
        assert got == expected or (expected is None and (got is None or got >= 200)), (step, got, expected)


def test_hook_skips_steps_between_saves_and_follows_config_changes(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=5),
                    include_collections=["losses"])
    hook.set_mode(smd.modes.TRAIN)
    saved = [step for step in range(12) if hook.begin_step()]
    assert saved == [0, 5, 10]
    hook.get_collection("losses").save_config = smd.SaveConfig(save_interval=3)  # in the quiet stretch 11..14
    saved = [hook.mode_step for _ in range(12, 24) if hook.begin_step()]
    assert saved == [12, 15, 18, 21]
    hook.set_mode(smd.modes.EVAL)  # each mode has its own schedule
    assert hook.begin_step() and not hook.begin_step()
    hook.close()


def test_a_save_config_changed_in_place_while_training_takes_effect(tmp_path):
    import numpy as np

    import smdebug as smd
    from smdebug.trials import create_trial

    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=100),
                    include_collections=["custom"])
    for step in range(12):
        if step == 8:
            hook.get_collection("custom").save_config.save_interval = 2  # in place, mid-training
        hook.begin_step()
        hook.save_tensor("t", np.float32(step), "custom")
    hook.close()
    assert create_trial(str(tmp_path / "run")).tensor("t").steps() == [0, 8, 10]


def test_collection_save_config_takes_modes_not_fields_from_the_hook():
    # The seed: "SaveConfig() will save at steps 0, 500, ..." and "SaveConfig(save_steps=[3, 7])
    # will save at steps 0, 3, 7, 500, ...", whatever the hook's own interval.
    hook_cfg = SaveConfig(save_interval=100)
    upto = 1001
    assert saved(SaveConfig().resolved(parent=hook_cfg), upto=upto) == [0, 500, 1000]
    assert saved(SaveConfig(save_steps=[3, 7]).resolved(parent=hook_cfg), upto=upto) == [0, 3, 7, 500, 1000]
    # A mode left out of mode_save_configs is the hook's, whole.
    per_mode = SaveConfig(mode_save_configs={smd.modes.TRAIN: SaveConfigMode(save_interval=2)})
    resolved = per_mode.resolved(parent=hook_cfg)
    assert saved(resolved, smd.modes.TRAIN, 7) == [0, 2, 4, 6]
    assert saved(resolved, smd.modes.EVAL, 301) == [0, 100, 200, 300]


def test_collection_without_a_config_follows_the_hook_even_after_a_field_is_set():
    coll = smd.Collection("mine")
    coll.save_config.start_step = 150
    assert saved(coll.save_config.resolved(parent=SaveConfig(save_interval=100)), upto=401) == [200, 300, 400]
