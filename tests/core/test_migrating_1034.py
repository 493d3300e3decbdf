"""Scripts written against smdebug 1.0.34 run unchanged (docs/migrating.md).

Each test is written as a user of the original would write it: public names only, the
numpy ``smd.Hook`` for custom loops, real run directories read back with a Trial.
"""
import json
import os
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import smdebug as smd
from smdebug.analysis.utils import no_refresh
from smdebug.collections import Collection
from smdebug.exceptions import ConfigError, RuleEvaluationConditionMet
from smdebug.reduction_config import ReductionConfig
from smdebug.rules import Rule, invoke_rule
from smdebug.save_config import SaveConfig, SaveConfigMode
from smdebug.trials import LocalTrial, create_trial


#: These tests are about smdebug 1.0.34's files (docs/format.md 1-3); the run store has its own.
pytestmark = pytest.mark.usefixtures("layout_1034")


def train(out_dir, steps, close=True, **hook_args):
    """A custom loop with the numpy hook: a weight and a loss saved every step."""
    hook = smd.Hook(out_dir=str(out_dir), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "losses"], **hook_args)
    hook.get_collection("weights").include("weight")
    hook.get_collection("losses").include("loss")
    for i in range(steps):
        hook.begin_step()
        hook.record("fc.weight", np.full((2, 2), i, np.float32))
        hook.record("loss", np.float32(1.0 / (i + 1)))
    if close:
        hook.close()
    return hook


def event_records(path):
    """(wall_time, tag) of each record of an event file (TFRecord framing, Event messages)."""
    from tensorboard.compat.proto.event_pb2 import Event

    data = open(path, "rb").read()
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        event = Event.FromString(data[pos + 12:pos + 12 + length])
        pos += 12 + length + 4
        out += [(event.wall_time, v.tag) for v in event.summary.value]
    return out


# ------------------------------------------------------------------------------------------ rules
class LastLossAbove(Rule):
    """An original-style rule: declares its tensors in set_required_tensors, reads req_tensors."""

    def __init__(self, base_trial, threshold=0.3):
        super().__init__(base_trial, action_str="")
        self.threshold = threshold
        self.declared = []

    def set_required_tensors(self, step):
        self.req_tensors.add("loss", steps=[step])
        self.req_tensors.add("fc\\..*", steps=[step], should_match_regex=True)

    def invoke_at_step(self, step):
        self.declared.append(sorted(self.req_tensors.get_names()))
        values = {t.name: t.value(step) for t in self.req_tensors.get()}
        return float(values["loss"]) > self.threshold


def test_invoke_rule_returns_when_the_run_stops_below_end_step(tmp_path, monkeypatch):
    # A run that stopped at step 4 without its end marker; the script asks for steps 0-9.
    monkeypatch.setenv("SMDEBUG_TRIAL_WAIT_TIMEOUT", "1")
    hook = train(tmp_path / "run", 5, close=False)
    assert hook.flush(timeout=30)
    trial = create_trial(str(tmp_path / "run"))
    rule = LastLossAbove(trial)
    began = time.monotonic()
    invoke_rule(rule, start_step=0, end_step=10)
    assert time.monotonic() - began < 15
    assert rule.declared == [["fc.weight", "loss"]] * 4  # step 4 is still open: it ends at the next step
    assert rule.report.violation_steps == [0, 1, 2]  # losses 1, 1/2, 1/3 are above 0.3
    hook.close()


def test_original_rule_api_raises_at_the_first_firing(tmp_path):
    train(tmp_path / "run", 4)
    trial = create_trial(str(tmp_path / "run"))
    rule = LastLossAbove(trial, threshold=0.4)
    with pytest.raises(RuleEvaluationConditionMet) as info:
        invoke_rule(rule, start_step=0, end_step=4, raise_eval_cond=True)
    assert info.value.step == 0
    rule.invoke(3)  # 0.25: below the threshold, nothing raised
    assert rule.declared[-1] == ["fc.weight", "loss"]
    from smdebug.rules.rule_invoker import invoke_rule as from_its_1034_module

    assert from_its_1034_module is invoke_rule


def test_original_rule_skips_steps_that_lack_a_declared_tensor(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1))
    for i in range(4):
        hook.begin_step()
        hook.save_tensor("always", np.float32(i), "custom")
        if i % 2 == 0:
            hook.save_tensor("even_only", np.float32(i), "custom")
    hook.close()

    class NeedsEven(Rule):
        def __init__(self, base_trial):
            super().__init__(base_trial, action_str="")
            self.evaluated = []

        def set_required_tensors(self, step):
            self.req_tensors.add("always", steps=[step])
            self.req_tensors.add("even_only", steps=[step])

        def invoke_at_step(self, step):
            values = [t.value(step) for t in self.req_tensors.get()]  # odd steps: even_only is missing
            self.evaluated.append(step)
            return len(values) == 2

    class NeedsUnknown(NeedsEven):
        def set_required_tensors(self, step):
            self.req_tensors.add("no_such_tensor", steps=[step])  # raises TensorUnavailable, as in 1.0.34

    trial = create_trial(str(tmp_path / "run"))
    rule = NeedsEven(trial)
    invoke_rule(rule, start_step=0, end_step=4)
    assert rule.evaluated == [0, 2]
    assert rule.report.violation_steps == [0, 2]
    unknown = NeedsUnknown(trial)
    invoke_rule(unknown, start_step=0, end_step=4)
    assert unknown.evaluated == [] and unknown.report.violation_steps == []


def test_rule_action_str_positional_and_json(tmp_path):
    train(tmp_path / "run", 1)
    trial = create_trial(str(tmp_path / "run"))

    class Plain(Rule):
        def __init__(self, base_trial, action_str):
            super().__init__(base_trial, action_str)  # 1.0.34's positional order

        def invoke_at_step(self, step):
            return False

    assert Plain(trial, "").actions == []
    assert [a.name for a in Plain(trial, '{"name": "StopTraining"}').actions] == ["StopTraining"]
    assert [a.name for a in Plain(trial, '[{"name": "stoptraining", "training_job_prefix": "x"}]').actions] == \
        ["StopTraining"]
    with pytest.raises(ConfigError, match="unknown action 'Reboot'"):
        Plain(trial, "Reboot")

    class Compare(Rule):
        def __init__(self, base_trial, action_str, other_trials=None):
            super().__init__(base_trial, action_str, other_trials)

        def invoke_at_step(self, step):
            return False

    other = create_trial(str(tmp_path / "run"))
    assert Compare(trial, "", [other]).other_trials == [other]
    assert Compare(trial, "StopTraining").other_trials == []
    with_actions = Rule(trial, "", actions=["log"])  # keyword actions stay actions
    assert [type(a).__name__ for a in with_actions.actions] == ["LogMessage"] and with_actions.other_trials == []


# -------------------------------------------------------------------------------- hook behaviour
def test_step_state_is_written_as_steps_are_saved_and_resumed_after_a_kill(tmp_path, monkeypatch):
    """Spot training: the process dies without close(); the next one resumes the numbering."""
    ckpt = tmp_path / "checkpointconfig.json"
    ckpt.write_text(json.dumps({"LocalPath": str(tmp_path / "ckpt")}))
    env = {**os.environ, "CHECKPOINT_CONFIG_FILE_PATH": str(ckpt)}
    script = textwrap.dedent("""
        import os, sys
        import numpy as np
        import smdebug as smd
        hook = smd.Hook(out_dir=sys.argv[1], save_config=smd.SaveConfig(save_interval=1))
        hook.set_mode(smd.modes.TRAIN)
        for i in range(5):
            hook.begin_step()
            hook.save_scalar("loss", 1.0 / (i + 1))
        hook.flush()
        os._exit(0)  # killed: no close()
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run1")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    state = json.loads((tmp_path / "ckpt" / "metadata.json").read_text())
    # Steps 0-3 ended and were flushed; step 4 was still open when the process died.
    assert state[-1]["latest-global-step-seen"] == 3 and state[-1]["latest-mode-step"]["TRAIN"] == 3
    monkeypatch.setenv("CHECKPOINT_CONFIG_FILE_PATH", str(ckpt))
    hook = smd.Hook(out_dir=str(tmp_path / "run2"), save_config=smd.SaveConfig(save_interval=1))
    hook.set_mode(smd.modes.TRAIN)
    hook.begin_step()
    assert hook.global_step == state[-1]["latest-global-step-seen"] + 1
    assert hook.mode_step == state[-1]["latest-mode-step"]["TRAIN"] + 1
    hook.close()


def test_save_tensor_before_the_first_step_is_written(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"))
    hook.save_tensor("labels_seen", np.arange(3), "custom")
    hook.begin_step()
    hook.save_tensor("in_step", np.ones(2), "custom")
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert np.array_equal(trial.tensor("labels_seen").value(0), np.arange(3))
    assert trial.tensor_names(collection="custom") == ["in_step", "labels_seen"]


def test_save_scalar_timestamp_is_the_records_wall_time(tmp_path, monkeypatch):
    monkeypatch.setenv("SAGEMAKER_METRICS_DIRECTORY", str(tmp_path / "metrics"))
    ts = 1_500_000_000.5  # 2017: far from now
    hook = smd.Hook(out_dir=str(tmp_path / "run"), tensorboard_dir=str(tmp_path / "tb"))
    hook.begin_step()
    hook.save_scalar("lr", 0.1, sm_metric=True, timestamp=ts)
    hook.save_scalar("now", 1.0)
    hook.close()
    (metrics_file,) = (tmp_path / "metrics").iterdir()
    line = json.loads(metrics_file.read_text().splitlines()[0])
    assert (line["MetricName"], line["Value"], line["Timestamp"]) == ("scalar/lr_GLOBAL", 0.1, ts)
    with pytest.raises(ConfigError, match="timestamp must be seconds since the epoch"):
        hook.save_scalar("lr", 0.1, timestamp="yesterday")
    events_dir = tmp_path / "run" / "events" / "000000000000"
    records = dict((tag, wall) for f in os.listdir(events_dir) for wall, tag in event_records(events_dir / f))
    assert records["scalar/lr"] == ts
    assert abs(records["scalar/now"] - time.time()) < 600
    assert create_trial(str(tmp_path / "run")).tensor("scalar/lr").value(0).item() == pytest.approx(0.1)
    script = textwrap.dedent("""
        import json, sys
        sys.modules["tensorflow"] = None  # TensorBoard's own reader
        from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
        mux = EventMultiplexer().AddRunsFromDirectory(sys.argv[1])
        mux.Reload()
        out = {}
        for run, tags in mux.Runs().items():
            for tag in tags["scalars"]:
                out[tag] = [(e.wall_time, e.value) for e in mux.Scalars(run, tag)]
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "tb")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    scalars = json.loads(done.stdout.strip().splitlines()[-1])
    lr = next(v for tag, v in scalars.items() if tag.endswith("lr"))
    assert lr == [[ts, pytest.approx(0.1)]]


def test_collections_file_lists_the_tensors_its_regexes_matched(tmp_path):
    train(tmp_path / "run", 2)
    trial = create_trial(str(tmp_path / "run"))
    assert trial.collection("weights").tensor_names == {"fc.weight"}
    assert trial.collection("losses").tensor_names == {"loss"}
    doc = json.loads((tmp_path / "run" / "collections" / "000000000" / "worker_0_collections.json").read_text())
    assert doc["collections"]["losses"]["tensor_names"] == ["loss"]


def test_del_hook_and_set_hook(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"))
    assert smd.get_hook() is hook
    smd.del_hook()
    assert smd.get_hook() is None
    smd.set_hook(hook)
    assert smd.get_hook() is hook
    hook.close()


# ------------------------------------------------------------------------------------ reading
def test_missing_collection_is_empty_and_can_include(tmp_path):
    train(tmp_path / "run", 2)
    trial = create_trial(str(tmp_path / "run"))
    coll = trial.collection("activations")
    assert coll.tensor_names == frozenset() and coll.include_regex == ()
    coll.include("fc")
    assert trial.tensor_names(collection=coll) == ["fc.weight"]
    assert trial.collection("activations") is coll


def test_local_trial_and_no_refresh(tmp_path):
    hook = train(tmp_path / "run", 3, close=False)  # steps 0 and 1 ended; step 2 still open
    assert hook.flush(timeout=30)
    trial = LocalTrial("mytrial", str(tmp_path / "run"))
    assert trial.name == "mytrial" and trial.steps() == [0, 1]
    with no_refresh(trial) as same:
        assert same is trial
        for i in range(3, 5):
            hook.begin_step()
            hook.record("fc.weight", np.full((2, 2), i, np.float32))
        assert hook.flush(timeout=30)
        assert trial.steps() == [0, 1]  # the listing stays as it was
    assert trial.steps() == [0, 1, 2, 3]
    with no_refresh([trial]):
        assert trial.dynamic_refresh is False
    assert trial.dynamic_refresh is True
    hook.close()


def test_index_file_with_empty_event_file_name_is_read(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), reduction_config=smd.ReductionConfig(save_shape=True),
                    include_collections=["weights"])
    hook.get_collection("weights").include("weight")
    hook.begin_step()
    hook.record("fc.weight", np.zeros((3, 4), np.float32))
    hook.close()
    index_dir = tmp_path / "run" / "index" / "000000000"
    (index_file,) = list(index_dir.iterdir())
    doc = json.loads(index_file.read_text())
    assert doc["tensor_payload"] == [] and doc["shape_payload"]
    doc["meta"]["event_file_name"] = ""  # as the original's writer left shape-only steps
    index_file.write_text(json.dumps(doc))
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("fc.weight").shape(0) == (3, 4)


# ------------------------------------------------------------------------- configs as JSON
def test_config_json_round_trips():
    mode = SaveConfigMode(save_interval=5, start_step=2, end_step=50, save_steps=[1, 3])
    assert SaveConfigMode.from_json(mode.to_json()) == mode
    assert mode.to_json_dict() == {"save_interval": 5, "save_steps": [1, 3], "start_step": 2, "end_step": 50}

    config = SaveConfig(mode_save_configs={smd.modes.TRAIN: SaveConfigMode(save_interval=3),
                                           smd.modes.EVAL: SaveConfigMode(save_steps=[7])})
    back = SaveConfig.from_json(config.to_json())
    assert back == config and back.should_save_step(smd.modes.EVAL, 7) and back.should_save_step(smd.modes.TRAIN, 6)
    assert SaveConfig.from_dict({"TRAIN": {"save_interval": 4}}) == \
        SaveConfig(mode_save_configs={smd.modes.TRAIN: SaveConfigMode(save_interval=4)})
    assert SaveConfig.from_dict({smd.modes.TRAIN: SaveConfigMode(save_interval=4)}).get_save_config(
        smd.modes.TRAIN).save_interval == 4

    reduction = ReductionConfig(reductions=["min", "max"], abs_reductions=["mean"], norms=["l2"], save_raw_tensor=True)
    assert ReductionConfig.from_json(reduction.to_json()) == reduction
    assert ReductionConfig.from_dict({"reductions": "l1_norm,abs_max", "save_shape": True}) == \
        ReductionConfig(norms=["l1"], abs_reductions=["max"], save_shape=True)

    coll = Collection("mine", include_regex=["relu"], tensor_names=["fc1_output_0"], reduction_config=reduction,
                      save_config=SaveConfig(save_interval=2), save_histogram=False)
    again = Collection.from_json(coll.to_json())
    assert again == coll and again.save_histogram is False and again.tensor_names == {"fc1_output_0"}
    assert Collection.from_dict(coll.to_json_dict()) == coll
    with pytest.raises(ConfigError, match="SaveConfig.from_json takes a JSON string"):
        SaveConfig.from_json({"TRAIN": {}})


def test_collection_manager_create_export_load(tmp_path):
    from smdebug.collections import CollectionManager

    manager = CollectionManager()
    manager.create_collection("weights")
    manager.add("biases")  # a name, as in 1.0.34
    manager.add(Collection("losses", include_regex=["loss"]))
    manager.get("weights").add("fc.weight")  # add(name) on a collection
    manager.get("weights").include("^conv")
    assert sorted(manager.get_collections()) == ["biases", "losses", "weights"]

    path = manager.export(str(tmp_path / "c.json"))
    loaded = CollectionManager.load(path)
    assert loaded == manager
    assert loaded.get("weights").tensor_names == {"fc.weight"} and loaded.get("weights").include_regex == ("^conv",)

    # 1.0.34's form: export(out_dir, "<worker>_collections.json") makes the file a Trial reads.
    manager.export(str(tmp_path / "run"), "worker_0_collections.json")
    assert (tmp_path / "run" / "collections" / "000000000" / "worker_0_collections.json").is_file()
    assert CollectionManager.load_from_string(json.dumps(manager.to_json_dict())) == manager


def test_smdebug_core_modules_that_1034_code_imports_give_our_objects():
    from smdebug.core.collection import Collection as CoreCollection, CollectionKeys
    from smdebug.core.modes import ALLOWED_MODE_NAMES, ALLOWED_MODES, ModeKeys, str_to_mode_keys
    from smdebug.core.reduction_config import ALLOWED_NORMS, ALLOWED_REDUCTIONS, ReductionConfig as CoreReductionConfig
    from smdebug.core.save_config import DEFAULT_SAVE_CONFIG_INTERVAL, SaveConfig as CoreSaveConfig, SaveConfigMode as CoreSCM

    assert CoreCollection is Collection and CollectionKeys is smd.CollectionKeys
    assert ModeKeys is smd.modes.ModeKeys and str_to_mode_keys("EVAL") is ModeKeys.EVAL
    assert ALLOWED_MODE_NAMES == ["TRAIN", "EVAL", "PREDICT", "GLOBAL"] and ALLOWED_MODES[0] is ModeKeys.TRAIN
    assert CoreReductionConfig is ReductionConfig and "l2" in ALLOWED_NORMS and "mean" in ALLOWED_REDUCTIONS
    assert CoreSaveConfig is SaveConfig and CoreSCM is SaveConfigMode and DEFAULT_SAVE_CONFIG_INTERVAL == 500


def test_str2bool_from_the_profiler_module_parses_flags_as_1034_did():
    from smdebug.profiler.utils import str2bool

    assert [str2bool(v) for v in ("true", "True", "1", "yes", "y", "t", "on")] == [True] * 7
    assert [str2bool(v) for v in ("false", "0", "no", "n", "f", "off", False)] == [False] * 7
    with pytest.raises(ValueError, match="'maybe'"):
        str2bool("maybe")


def test_add_collection_takes_a_collection_built_by_the_user(tmp_path):
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["mine"])
    mine = Collection("mine", include_regex=["^w"])
    hook.add_collection(mine)
    assert hook.get_collection("mine") is mine
    hook.begin_step()
    hook.save_tensor("w0", np.ones(2, np.float32), "default")
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names(collection="mine") == ["w0"]
    with pytest.raises(ConfigError, match="add_collection takes a smdebug Collection"):
        hook.add_collection("mine")


def test_refresh_turns_listing_back_on_inside_its_block(tmp_path):
    from smdebug.analysis.utils import refresh

    hook = train(tmp_path / "run", 3, close=False)  # steps 0 and 1 ended; step 2 still open
    assert hook.flush(timeout=30)
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps() == [0, 1]
    trial.dynamic_refresh = False
    hook.begin_step()  # ends step 2
    assert hook.flush(timeout=30)
    assert trial.steps() == [0, 1]  # not listed again
    with refresh(trial) as same:
        assert same is trial and trial.steps() == [0, 1, 2]
    assert trial.dynamic_refresh is False
    hook.close()
    with pytest.raises(TypeError, match="refresh takes a Trial"):
        with refresh("a path"):
            pass


def test_steps_of_mode_none_is_empty_as_in_1034(tmp_path, smdebug_warnings, monkeypatch):
    from smdebug.analysis.trials import trial as trial_module

    monkeypatch.setattr(trial_module, "_warned_mode_none", [])  # once per process: this test's first
    train(tmp_path / "run", 2)
    trial = create_trial(str(tmp_path / "run"))
    assert trial.steps(mode=None) == [] and trial.steps(mode=None) == []
    warned = [m for m in smdebug_warnings(messages=True) if "steps(mode=None)" in m]
    assert len(warned) == 1 and "leave mode out" in warned[0] and trial.steps() == [0, 1]


def test_save_scalar_of_a_number_reads_back_with_shape_1_as_in_1034(tmp_path):
    # 1.0.34 wraps a number given to save_scalar in a 1-element array; scripts index [0].
    hook = smd.Hook(out_dir=str(tmp_path / "run"))
    hook.begin_step()
    hook.save_scalar("lr", 0.1)
    hook.save_scalar("epoch", 3)
    hook.save_scalar("acc", np.float32(0.5))
    hook.save_scalar("zero_d", np.array(2.0))  # an array keeps its own shape, as in 1.0.34
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor("scalar/lr").value(0).shape == (1,)
    assert trial.tensor("scalar/lr").value(0)[0] == pytest.approx(0.1)
    assert trial.tensor("scalar/epoch").value(0).shape == (1,)
    assert trial.tensor("scalar/acc").value(0).shape == (1,)
    assert trial.tensor("scalar/zero_d").value(0).shape == ()


def test_unknown_keywords_of_trial_tensor_raise_typeerror_as_in_1034(tmp_path):
    # 1.0.34's Trial.tensor(self, tname) takes no keywords: Python raises TypeError, and so do we.
    hook = smd.Hook(out_dir=str(tmp_path / "run"))
    hook.begin_step()
    hook.save_scalar("x", 1.0)
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    with pytest.raises(TypeError, match="step"):
        trial.tensor("scalar/x", step=0)
    with pytest.raises(TypeError):
        trial.tensor("scalar/x").value(0, bogus=True)


# ------------------------------------------------------------------------- round 3 (issue 46)
def test_tensor_names_takes_a_collection_or_a_regex_not_both(tmp_path):
    # 1.0.34 refused the pair (which of the two should win was never defined).
    train(tmp_path / "run", 2)
    trial = create_trial(str(tmp_path / "run"))
    assert trial.tensor_names(collection="weights") == ["fc.weight"]
    assert trial.tensor_names(regex="loss") == ["loss"]
    with pytest.raises(ValueError, match="collection.*regex|regex.*collection"):
        trial.tensor_names(collection="weights", regex="loss")


def test_collection_json_round_trip_gives_a_set_of_names():
    original = Collection("default", include_regex=["conv2d"], tensor_names=["a", "b"],
                          reduction_config=ReductionConfig())
    loaded = Collection.from_json(original.to_json())
    assert loaded == original
    assert type(loaded.tensor_names) is set and loaded.tensor_names == {"a", "b"}
    loaded.tensor_names.add("c")  # a copy: the collection changes only through its methods
    assert loaded.tensor_names == {"a", "b"}


def _index_file(run, step, mode, mode_step):
    """An index file as 1.0.34's dummy runs were written: a tensor entry, no event file."""
    path = run / "index" / f"{step // 1000:09d}" / f"{step:012d}_worker_0.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": {"mode": mode, "mode_step": mode_step, "event_file_name": ""},
                                "tensor_payload": [{"tensorname": "gradients/dummy:0", "start_idx": 0,
                                                    "length": 1}]}))


@pytest.mark.parametrize("ended", [True, False], ids=["complete_job", "incomplete_job"])
def test_index_files_without_event_file_still_count_their_steps_and_modes(tmp_path, ended):
    from smdebug.collections import CollectionManager
    from smdebug.trials import StepState

    run = tmp_path / "run"
    CollectionManager().export(str(run), "worker_0_collections.json")
    for i in range(0, 31, 10):
        _index_file(run, i, "TRAIN", i)
        _index_file(run, 40 + i, "EVAL", i)
    if ended:
        (run / "training_job_end.ts").touch()
    trial = create_trial(str(run))
    assert trial.loaded_all_steps is ended
    assert trial.steps() == trial.steps(show_incomplete_steps=True) == list(range(0, 71, 10))
    assert trial.steps(mode=smd.modes.TRAIN) == trial.steps(mode=smd.modes.EVAL) == [0, 10, 20, 30]
    assert trial.has_passed_step(30) == StepState.AVAILABLE
    assert trial.has_passed_step(23, mode=smd.modes.TRAIN) == StepState.UNAVAILABLE
    assert trial.has_passed_step(30, mode=smd.modes.EVAL) == StepState.AVAILABLE
    later = StepState.UNAVAILABLE if ended else StepState.NOT_YET_AVAILABLE
    assert trial.has_passed_step(80) == later
    assert trial.last_complete_step == 70
