"""ReductionConfig and Collection: seed examples, string forms, validation, matching."""
import json

import pytest

import smdebug as smd
from smdebug.collections import NUMPY_PROFILE, CollectionManager
from smdebug.exceptions import ConfigError
from smdebug.reduction_config import ReductionConfig, parse_reduction_tag, reduction_tag


def test_seed_signature_example_runs_verbatim():
    rc = smd.ReductionConfig(reductions=None, abs_reductions=None, norms=None, abs_norms=None,
                             save_raw_tensor=False)
    assert rc.all_reductions() == [] and rc.save_raw_tensor is False


def test_seed_example_std_variance_abs_mean_l1():
    rc = ReductionConfig(reductions=["std", "variance"], abs_reductions=["mean"], norms=["l1"])
    assert rc.all_reductions() == [("std", False), ("variance", False), ("l1", False), ("mean", True)]
    assert rc.save_raw_tensor is False


def test_seed_common_api_example():
    rc = smd.ReductionConfig(reductions=["min", "max", "mean"], norms=["l1"])
    assert rc.to_string() == "min,max,mean,l1_norm"


def test_every_seed_string_value_parses():
    words = ["min", "max", "median", "mean", "std", "variance", "sum", "prod", "l1", "l2"]
    text = ",".join(words + ["abs_" + w for w in words])
    rc = ReductionConfig.from_string(text)
    assert len(rc.all_reductions()) == 20
    assert ("l2", True) in rc.all_reductions() and ("median", False) in rc.all_reductions()


def test_string_form_round_trip_in_original_order():
    rc = ReductionConfig.from_string(" abs_l2_norm, min ,l1_norm,abs_mean,max ", save_raw_tensor=True)
    assert rc.to_string() == "min,max,l1_norm,abs_mean,abs_l2_norm"
    assert ReductionConfig.from_json_dict(rc.to_json_dict()) == rc
    assert rc.to_json_dict() == {"save_raw_tensor": True, "reductions": rc.to_string(), "save_shape": False}


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"reductions": ["mean", "avg"]}, "unknown reduction 'avg' in reductions; allowed: min, max, median"),
        ({"norms": ["l3"]}, "unknown norm 'l3' in norms; allowed: l1, l2"),
        ({"save_raw_tensor": "true"}, "save_raw_tensor must be True or False, got 'true'"),
        ({"abs_reductions": 5}, "abs_reductions must be a list"),
    ],
)
def test_bad_reduction_input(kwargs, fragment):
    with pytest.raises(ConfigError) as info:
        ReductionConfig(**kwargs)
    assert fragment in str(info.value)


def test_bad_reduction_string_names_value():
    with pytest.raises(ConfigError, match="unknown reduction 'abs_avg'"):
        ReductionConfig.from_string("min,abs_avg")


def test_reduction_tags():
    assert reduction_tag("gradient/Net_fc1.weight", "l1", True) == "smdebug/reductions/abs_l1/gradient/Net_fc1.weight"
    assert reduction_tag("dense/kernel:0", "min", False) == "smdebug/reductions/min/dense/kernel"
    assert reduction_tag("dense/kernel:0", "min", False, strip_output_index=False) == \
        "smdebug/reductions/min/dense/kernel:0"
    assert parse_reduction_tag("smdebug/reductions/abs_l1/gradient/x") == ("l1", True, "gradient/x")
    assert parse_reduction_tag("gradient/x") is None


def test_collection_seed_constructor_and_properties():
    coll = smd.Collection("custom", include_regex=None, tensor_names=None, reduction_config=None,
                          save_config=None, save_histogram=True)
    coll.include("relu")
    coll.include(["conv.*", "fc"])
    assert coll.include_regex == ("relu", "conv.*", "fc")
    assert coll.matches("layer1_relu_output_0") and coll.matches("fc2.weight") and not coll.matches("bn.bias")
    coll.tensor_names = ["exact"]
    assert coll.tensor_names == {"exact"} and coll.matches("exact")
    coll.reduction_config = smd.ReductionConfig(norms=["l2"])
    coll.save_config = smd.SaveConfig(save_interval=7)
    assert coll.save_config.save_interval == 7


def test_collection_rejects_bad_regex_and_types():
    with pytest.raises(ConfigError, match=r"invalid regex '\(unclosed' in include_regex"):
        smd.Collection("c", include_regex=["(unclosed"])
    with pytest.raises(ConfigError, match="save_histogram must be True or False"):
        smd.Collection("c", save_histogram="yes")
    with pytest.raises(ConfigError, match="reduction_config must be a ReductionConfig"):
        smd.Collection("c", reduction_config={"reductions": "min"})


def test_every_builtin_collection_key_exists():
    keys = ["ALL", "DEFAULT", "WEIGHTS", "BIASES", "GRADIENTS", "LOSSES", "SCALARS", "METRICS", "INPUTS",
            "OUTPUTS", "LAYERS", "SM_METRICS", "SEARCHABLE_SCALARS", "OPTIMIZER_VARIABLES", "HYPERPARAMETERS",
            "PREDICTIONS", "LABELS", "FEATURE_IMPORTANCE", "AVERAGE_SHAP", "FULL_SHAP", "TREES"]
    values = {getattr(smd.CollectionKeys, k) for k in keys}
    assert values == {k.lower() for k in keys}


def test_numpy_profile_regexes():
    mgr = CollectionManager(NUMPY_PROFILE)
    names = lambda t: sorted(c.name for c in mgr.collections_for(t))  # noqa: E731
    assert names("dense.weight") == ["weights"]
    assert names("gradient/dense.weight") == ["gradients"]
    assert names("dense.bias") == ["biases"]
    assert names("train_loss") == ["losses"]


def test_membership_is_cached_and_invalidated_on_change():
    mgr = CollectionManager(NUMPY_PROFILE)
    first = mgr.collections_for("Net_relu_output_0")
    assert first == () and mgr.collections_for("Net_relu_output_0") is first
    mgr.get("relus").include("relu")
    assert [c.name for c in mgr.collections_for("Net_relu_output_0")] == ["relus"]


def test_get_collection_creates_on_demand_and_json_round_trip():
    mgr = CollectionManager(NUMPY_PROFILE)
    coll = mgr.get("mine")
    coll.include("abc")
    coll.add_tensor_name("x")
    coll.reduction_config = ReductionConfig(reductions=["min"], abs_norms=["l2"])
    data = mgr.to_json_bytes(num_workers=2)
    doc = json.loads(data)
    assert set(doc) == {"collections", "_meta"} and doc["_meta"] == {"num_workers": 2}
    back, workers = CollectionManager.from_json(data)
    assert workers == 2
    assert back["mine"].include_regex == ("abc",) and back["mine"].tensor_names == {"x"}
    assert back["mine"].reduction_config == coll.reduction_config
    assert set(back.collections) == set(mgr.collections)


@pytest.mark.parametrize("data", [b"{", b"[]", b'{"collections": [], "_meta": {}}',
                                  b'{"collections": {}, "_meta": {"num_workers": "x"}}'])
def test_untrusted_collections_file(data):
    with pytest.raises(ConfigError):
        CollectionManager.from_json(data)


@pytest.mark.parametrize("value, expected", [(2, 2), ("3", 3), (2.5, None), (True, None), ("two", None), ([2], None)])
def test_num_workers_of_a_collections_file_must_be_an_integer(value, expected):
    data = json.dumps({"collections": {}, "_meta": {"num_workers": value}}).encode()
    if expected is None:
        with pytest.raises(ConfigError, match="num_workers must be an integer"):
            CollectionManager.from_json(data)
    else:
        assert CollectionManager.from_json(data)[1] == expected
