"""The run's catalog (``trial.catalog()``), the one model order, the one update ratio and L2,
and no reach into private Trial state from the rest of analysis."""
import ast
import dataclasses
import pathlib

import numpy as np
import pytest

import smdebug as smd
from smdebug.analysis.trials.catalog import SavedSteps
from smdebug.analysis.trials.health import l2_norm, update_ratio, weight_update_ratio
from smdebug.analysis.trials.order import BY_NAME, ModelOrder, parameter_of
from smdebug.modes import ModeKeys
from smdebug.trials import create_trial

ANALYSIS = pathlib.Path(__file__).resolve().parents[2] / "smdebug_core" / "analysis"


@pytest.fixture(params=["store", "1034"])
def layout(request, monkeypatch):
    if request.param == "1034":
        monkeypatch.setenv("SMDEBUG_LAYOUT", "smdebug-1.0.34")
    else:
        monkeypatch.delenv("SMDEBUG_LAYOUT", raising=False)
    return request.param


def _check_layout(trial, layout):
    assert trial.layout == ("store" if layout == "store" else "smdebug-1.0.34")


def test_catalog_says_what_each_tensor_saved(numpy_run, numpy_run_1034):
    catalogs = [create_trial(run).catalog() for run in (numpy_run, numpy_run_1034)]
    for catalog in catalogs:
        weight = catalog["dense.weight"]
        assert weight.kinds == ("reductions",) and not weight.has_value and weight.has_reductions
        assert sorted(weight.reductions) == ["abs_max", "l2", "max", "mean", "min"]
        assert weight.saved[ModeKeys.TRAIN] == SavedSteps(20, 0, 19, 1, True)
        assert weight.interval("EVAL") == 1 and weight.saved[ModeKeys.EVAL].count == 10
        assert weight.interval(ModeKeys.PREDICT) is None
        assert (weight.num_steps, weight.first_step, weight.last_step) == (30, 0, 29)
        assert weight.workers == tuple(catalog.workers) and len(weight.workers) == 1
        assert catalog["loss"].has_value and catalog["loss"].reductions == ()
        assert set(catalog) == {"dense.weight", "loss", "scalar/lr"}
        assert catalog.names("value") == ["loss", "scalar/lr"]
        assert catalog.steps_saved(["loss"]).tolist() == list(range(30))
        records = catalog.records(["dense.weight"])
        assert len(records["step"]) == 30 * 5 and set(records["reduction"]) == set(weight.reductions)
        # Immutable: a snapshot, made again after a refresh that read something.
        with pytest.raises(dataclasses.FrozenInstanceError):
            weight.kinds = ()
        with pytest.raises(TypeError):
            weight.saved[ModeKeys.TRAIN] = None
    store, old = catalogs

    def described(catalog):
        return {n: (e.kinds, sorted(e.reductions), dict(e.saved), e.num_steps, e.order) for n, e in catalog.items()}
    assert described(store) == described(old)


def test_catalog_is_cached_until_something_new_is_read(numpy_run):
    trial = create_trial(numpy_run)
    assert trial.catalog() is trial.catalog()


def _write_out_of_alphabet(out_dir, whole: bool, steps=3):
    """Layers named against the alphabet, saved whole or as reductions (the run store keeps
    those in two tables, each in the order written)."""
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "outputs"],
                    reduction_config=None if whole else smd.ReductionConfig(norms=["l2"], reductions=["max"]))
    for step in range(steps):
        hook.set_mode(smd.modes.TRAIN)
        hook.begin_step()
        for name in ("zeta", "mu", "alpha"):
            hook.save_tensor(f"Net_{name}.weight", np.full((2, 2), step, np.float32), "weights")
        for name in ("zeta", "mu", "alpha"):
            hook.save_tensor(f"{name}_output_0", np.full((2, 2), step, np.float32), "outputs")
        for name in ("alpha", "mu", "zeta"):  # the backward pass: last layer first
            hook.save_tensor(f"gradient/Net_{name}.weight", np.ones((2, 2), np.float32), "gradients")
    hook.close()
    return out_dir


@pytest.mark.parametrize("whole", [True, False], ids=["whole", "reductions"])
def test_model_order_is_production_order_on_both_layouts(tmp_path, layout, whole):
    trial = create_trial(_write_out_of_alphabet(str(tmp_path / "run"), whole))
    _check_layout(trial, layout)
    catalog = trial.catalog()
    assert all(catalog[n].has_value == whole for n in catalog)
    produced = ["Net_zeta.weight", "Net_mu.weight", "Net_alpha.weight", "zeta_output_0", "mu_output_0",
                "alpha_output_0", "gradient/Net_alpha.weight", "gradient/Net_mu.weight", "gradient/Net_zeta.weight"]
    assert catalog.in_model_order() == produced
    assert [catalog[n].order for n in produced] == list(range(len(produced)))
    assert catalog.order.first(["gradient/Net_mu.weight", "Net_alpha.weight"]) == "Net_alpha.weight"
    # Rows of a heatmap: a gradient at its weight's place.
    grads = [f"gradient/Net_{n}.weight" for n in ("alpha", "mu", "zeta")]
    assert catalog.order.by_layer(grads) == [f"gradient/Net_{n}.weight" for n in ("zeta", "mu", "alpha")]
    # A name the run did not produce comes after, ordered by its name.
    assert catalog.order.sorted(["other.weight", "mu_output_0"]) == ["mu_output_0", "other.weight"]
    if not whole:  # reductions in the order saved
        assert catalog["Net_mu.weight"].reductions == ("max", "l2")


def test_model_order_falls_back_to_names():
    names = ["gradient/Net_fc1.weight", "loss_output_0", "relu1_output_0", "Net_fc10.weight", "Net_fc2.weight",
             "gradient/Net_fc2.weight"]
    assert BY_NAME.sorted(names) == ["Net_fc2.weight", "Net_fc10.weight", "relu1_output_0", "loss_output_0",
                                     "gradient/Net_fc2.weight", "gradient/Net_fc1.weight"]
    order = ModelOrder({"b": 0, "a": 1})
    assert order.sorted(["a", "zz", "b"]) == ["b", "a", "zz"]
    # Gradients written in registration order (PyTorch, once backward ends): backward order all the same.
    order = ModelOrder({"fc1.w": 0, "fc2.w": 1, "gradient/fc1.w": 2, "gradient/fc2.w": 3})
    assert order.sorted(["gradient/fc1.w", "gradient/fc2.w", "fc2.w"]) == ["fc2.w", "gradient/fc2.w", "gradient/fc1.w"]
    assert parameter_of("optimizer/W/exp_avg") == "W" and parameter_of("update_ratio/W") == "W"


def test_the_rules_culprit_follows_the_run_order(tmp_path, layout):
    # Every tensor of the run goes non-finite at step 1: the culprit is the first produced, not
    # the first by name.
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights"])
    for step in range(3):
        hook.set_mode(smd.modes.TRAIN)
        hook.begin_step()
        for name in ("zeta", "mu", "alpha"):
            hook.save_tensor(f"Net_{name}.weight", np.full(2, np.nan if step else 1.0, np.float32), "weights")
    hook.close()
    from smdebug.analysis.rules import invoke_rule
    from smdebug.analysis.rules.builtin import ExplodingTensor

    trial = create_trial(str(tmp_path / "run"))
    _check_layout(trial, layout)
    rule = ExplodingTensor(trial, collection_names="weights")
    invoke_rule(rule, raise_eval_cond=False)
    culprits = [v["details"]["culprit"] for v in rule.report.to_dict()["violations"]]
    assert culprits and culprits[0]["tensor"] == "Net_zeta.weight" and culprits[0]["first_step"] == 1


def test_one_update_ratio_and_l2():
    assert l2_norm(np.array([[3.0, 4.0]], np.float32)) == 5.0
    assert update_ratio(1.0, 4.0) == 0.25 and update_ratio(1.0, 0.0) == np.inf
    assert update_ratio(1.0, 3.0, epsilon=1.0) == 0.25
    assert np.allclose(update_ratio(np.array([1.0, 2.0]), np.array([2.0, 2.0])), [0.5, 1.0])
    assert weight_update_ratio(np.array([3.0, 4.0]), np.array([3.0, 5.0])) == pytest.approx(0.2)


def _private_names_of_trials():
    """Private attributes and methods defined by the classes of analysis/trials/."""
    names = set()
    for path in (ANALYSIS / "trials").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("_"):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                    and node.attr.startswith("_"):
                names.add(node.attr)
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def test_no_reach_into_private_trial_state_outside_the_trials_package():
    private = _private_names_of_trials()
    assert {"_index", "_steps", "_reader", "_locations", "_reductions", "_pick", "_read"} <= private
    found = []
    for path in sorted(ANALYSIS.rglob("*.py")):
        if "trials" in path.relative_to(ANALYSIS).parts:
            continue
        where = path.relative_to(ANALYSIS.parent.parent)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in private and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{where}:{node.lineno}: .{node.attr}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                    and node.args[1].value in {"trial", "_trial"} | private:
                found.append(f"{where}:{node.lineno}: getattr(..., {node.args[1].value!r})")
    assert not found, ("analysis outside analysis/trials/ reaches into private Trial state; use the public "
                       "API (trial.catalog(), Tensor, StepView):\n" + "\n".join(found))
