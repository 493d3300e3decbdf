"""Comparing runs (smdebug compare, smdebug.analysis.compare) on real PyTorch runs: two runs
made to differ at a known step and layer, identical runs, runs with different steps."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

from pt_helpers import batches, make_model, train  # noqa: E402

import smdebug.pytorch as smd  # noqa: E402
from smdebug.analysis import compare, plot_comparison  # noqa: E402
from smdebug.analysis.cli import main  # noqa: E402

PERTURBED_STEP = 5


def make_run(out_dir, perturb_at=None, steps=8, norms_only=False, biases=False):
    """SGD on the shared Net; with ``perturb_at``, fc2's weight is nudged after the optimizer
    step before that step, so that step is the first whose values differ."""
    model = make_model()
    loss_fn = torch.nn.CrossEntropyLoss()
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "losses"] + (["biases"] if biases else []),
                    reduction_config=smd.ReductionConfig(norms=["l2"], save_raw_tensor=not norms_only))
    hook.register_module(model)
    hook.register_loss(loss_fn)

    def nudge(i):
        if perturb_at is not None and i == perturb_at - 1:
            with torch.no_grad():
                model.fc2.weight[0, 0] += 0.05

    train(model, loss_fn, batches(steps), after_step=nudge)
    hook.close()
    return out_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("compare")
    return {"ref": make_run(str(base / "ref")), "same": make_run(str(base / "same")),
            "nudged": make_run(str(base / "nudged"), perturb_at=PERTURBED_STEP),
            "nudged_norms": make_run(str(base / "nudged_norms"), perturb_at=PERTURBED_STEP, norms_only=True),
            "short": make_run(str(base / "short"), steps=6), "biases": make_run(str(base / "biases"), biases=True)}


def cli(capsys, *argv):
    status = main(["compare", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_divergence_names_the_perturbed_step_and_layer(capsys, runs):
    result = compare([runs["ref"], runs["nudged"]])
    div = result.divergence
    # Step 5 is the first step that differs; within it the weights are written first (conv,
    # fc1, fc2), before the loss and the gradients, which all differ too: fc2's weight is first.
    assert (div.step, div.mode, div.mode_step, div.tensor, div.reduction) == (PERTURBED_STEP, "TRAIN", 5,
                                                                              "Net_fc2.weight", "")
    assert div.element == (0, 0)
    assert div.values["nudged"] - div.values["ref"] == pytest.approx(0.05, rel=1e-4)
    assert div.relative_difference == pytest.approx(abs(div.values["nudged"] - div.values["ref"])
                                                    / max(abs(div.values["nudged"]), abs(div.values["ref"])))
    # The frame: every earlier row agrees, the loss at that step differs.
    frame = result.frame
    assert not frame[frame.step < PERTURBED_STEP]["differs"].any()
    loss = frame[(frame.tensor == "CrossEntropyLoss_output_0") & (frame.step == PERTURBED_STEP)]
    assert bool(loss["differs"].iloc[0]) and list(frame.columns[6:8]) == ["ref", "nudged"]

    status, out, err = cli(capsys, runs["ref"], runs["nudged"], "--diverge")
    assert status == 1 and err == ""
    lines = [line for line in out.splitlines() if line.startswith("first divergence")]
    assert len(lines) == 1 and lines[0].startswith(f"first divergence: step {PERTURBED_STEP}, tensor Net_fc2.weight ")
    assert f"ref {div.values['ref']:.9g}" in lines[0] and f"nudged {div.values['nudged']:.9g}" in lines[0]
    assert "relative difference" in lines[0]


def test_divergence_from_saved_reductions_only(capsys, runs):
    # Only norms saved: the l2 of fc2's weight is the first value that differs.
    status, out, _ = cli(capsys, runs["nudged_norms"], runs["ref"], "--diverge", "--scalars-only")
    assert status == 1
    assert out.startswith(f"first divergence: step {PERTURBED_STEP}, tensor Net_fc2.weight (reduction l2)")
    # A tolerance wider than the nudge: the weights agree.
    result = compare([runs["ref"], runs["nudged_norms"]], names=["Net_fc2.weight"], rtol=0.1)
    assert result.divergence is None and result.compared["values"] == 8


def test_identical_runs_agree(capsys, runs):
    status, out, err = cli(capsys, runs["ref"], runs["same"], "--diverge")
    assert status == 0 and err == ""
    assert out.startswith("no divergence: ") and "first divergence" not in out
    result = compare([runs["ref"], runs["same"]], rtol=0, atol=0)
    assert not result.diverged and result.compared["tensors"] > 0 and result.only_in == {}
    assert (result.frame["relative_difference"] == 0).all()


def test_runs_with_different_steps_say_what_only_one_has(capsys, runs):
    status, out, _ = cli(capsys, runs["ref"], runs["short"], "--diverge")
    assert status == 0  # the six shared steps agree
    assert "only in ref: 2 steps: TRAIN 6, TRAIN 7" in out.splitlines()
    result = compare([runs["short"], runs["ref"]])
    assert result.only_in == {"ref": {"tensors": [], "steps": [("TRAIN", 6), ("TRAIN", 7)]}}
    late = result.frame[result.frame.step >= 6]
    assert late["short"].isna().all() and late["ref"].notna().all() and not late["differs"].any()
    # Tensors only one run saved.
    status, out, _ = cli(capsys, runs["ref"], runs["biases"], "--diverge")
    assert status == 0
    assert out.splitlines()[0] == "only in biases: 3 tensors: Net_conv.bias, Net_fc1.bias, Net_fc2.bias"
    assert out.splitlines()[1].startswith("no divergence: ")
    status, out, err = cli(capsys, runs["ref"], runs["short"], "--tensor", "no_such_tensor", "--diverge")
    assert status == 3 and "no_such_tensor" in err


def test_overlay_plot_one_colour_and_label_per_run(capsys, runs, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    result = compare([runs["ref"], runs["nudged"], runs["short"]])
    fig = plot_comparison(result, reduction="l2", names=["gradient/Net_fc1.weight", "Net_fc2.weight"])
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["Net_fc2.weight (l2)", "gradient/Net_fc1.weight (l2)"]
    for ax in panels:
        lines = {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}
        assert list(lines) == ["ref", "nudged", "short"]
        assert len({matplotlib.colors.to_hex(line.get_color()) for line in lines.values()}) == 3  # one per run
        assert max(lines["short"].get_xdata()) == 5 and max(lines["ref"].get_xdata()) == 7  # its own last step
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["ref", "nudged", "short"]
    assert len({matplotlib.colors.to_hex(h.get_color()) for h in legend.legend_handles}) == 3
    out = str(tmp_path / "overlay.png")
    status, text, _ = cli(capsys, runs["ref"], runs["nudged"], "-o", out)
    assert status == 0 and f"wrote {out}" in text
    with open(out, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(out) > 10_000
    # The listing without -o: the first step beyond the tolerance per tensor.
    status, text, _ = cli(capsys, runs["ref"], runs["nudged"])
    row = next(line for line in text.splitlines() if line.startswith("CrossEntropyLoss_output_0"))
    assert status == 0 and row.split()[-1] == str(PERTURBED_STEP)
    assert np.isfinite(result.frame["relative_difference"].dropna()).all()
