"""Rules use what the run saved (issue 45): VanishingGradient judges a step that saved only a
gradient's L2 norm by its RMS, L2/sqrt(n), with the element count from a step that saved the
whole gradient (a gradient keeps its parameter's shape); every built-in rule says what it can
read, and ``smdebug rules --list`` shows it."""
import contextlib
import io

import numpy as np

import smdebug as smd
from smdebug.analysis.rules.builtin import BUILTIN_RULES
from smdebug.analysis.rules.cli import main as rules_main
from smdebug.analysis.rules.rule import Rule
from smdebug.rules import VanishingGradient, invoke_rule
from smdebug.trials import create_trial

rng = np.random.default_rng(0)


def norms_run(tmp_path, steps=12, tiny_from=6):
    """Whole gradients every 5 steps (collection ``gradients``), their L2 norm at every step
    (``gradient_norms``), as the README example saves them; tiny from ``tiny_from`` on."""
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=5),
                    include_collections=["gradients", "gradient_norms"],
                    reduction_config=smd.ReductionConfig(save_raw_tensor=True))
    norms = hook.get_collection("gradient_norms")
    norms.include("^gradient/")
    norms.save_config = smd.SaveConfig(save_interval=1)
    norms.reduction_config = smd.ReductionConfig(norms=["l2"])
    for step in range(steps):
        hook.begin_step()
        scale = 1e-12 if step >= tiny_from else 1e-2
        hook.record("gradient/fc1.weight", rng.standard_normal((64, 16)).astype(np.float32) * scale)
    hook.close()
    return create_trial(str(tmp_path / "run"))


def test_vanishing_gradient_reads_l2_norms_at_every_step(tmp_path):
    trial = norms_run(tmp_path)
    tensor = trial.tensor("gradient/fc1.weight")
    assert not tensor.has_value(7) and tensor.has_reductions(7)  # step 7: its L2 norm only
    report = invoke_rule(VanishingGradient(trial, threshold=1e-9), report_path=None).to_dict()
    assert report["steps_without_data"] == 0 and report["datapoints"] == 12, report
    assert [v["step"] for v in report["violations"]] == [6, 7, 8, 9, 10, 11]
    at_7 = next(v for v in report["violations"] if v["step"] == 7)
    assert at_7["details"]["converted_from_l2"] == ["gradient/fc1.weight"]
    assert "RMS = L2/sqrt(n)" in at_7["message"]
    at_10 = next(v for v in report["violations"] if v["step"] == 10)  # the whole gradient: no conversion
    assert at_10["details"]["converted_from_l2"] == []


def test_every_builtin_rule_says_what_it_reads_and_list_shows_it():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert rules_main(["--list"]) == 0
    listing = "\n" + out.getvalue()
    for name, cls in BUILTIN_RULES.items():
        assert cls.reads_what != Rule.reads_what, f"{name} does not say what it reads"
        block = listing[listing.index(f"\n{name}"):]
        assert block.split("\n    reads: ", 1)[1].split("\n", 1)[0] == cls.reads_what, name  # its own block's line
