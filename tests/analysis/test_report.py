"""``smdebug report``: the HTML file of a run (numpy-hook runs here; tests/pytorch, tests/tensorflow
and tests/xgboost make it from real framework runs), the shared heatmap code, and computed
reductions of saved full values."""
import os
import re
import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib")

import smdebug as smd
from smdebug.analysis.cli import main
from smdebug.analysis.heatmaps import bin_series, natural_sorted, smooth
from smdebug.storage.format.layout import END_OF_JOB_FILE
from smdebug.trials import create_trial

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "support"))
from report_checks import assert_not_blank, check_report, render, section


def write_mixed_run(out_dir, steps=60, layers=12, end=True, flight=False):
    """A run whose tensors are saved at different intervals: loss and gradient norms at every
    step, weights whole every 7 steps, ``update/`` norms every 3; TRAIN then EVAL."""
    rng = np.random.default_rng(1)
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "losses", "grads", "updates", "optimizer_state"],
                    flight_recorder=smd.FlightRecorder(steps=3, collections="losses") if flight else None)
    hook.get_collection("weights").save_config = smd.SaveConfig(save_interval=7)
    grads = hook.get_collection("grads")
    grads.include("^gradient/")
    grads.reduction_config = smd.ReductionConfig(norms=["l2"], abs_reductions=["max"])
    updates = hook.get_collection("updates")
    updates.include("^update/")
    updates.reduction_config = smd.ReductionConfig(norms=["l2"])
    updates.save_config = smd.SaveConfig(save_interval=3)
    optimizer = hook.get_collection("optimizer_state")
    optimizer.include("^optimizer/")
    optimizer.reduction_config = smd.ReductionConfig(norms=["l2"])
    for step in range(steps):
        hook.set_mode(smd.modes.TRAIN if step < 5 * steps // 6 else smd.modes.EVAL)
        hook.begin_step()
        for layer in range(layers):
            scale = 10.0 ** (-layer / 3)  # spans decades: a log colour scale
            hook.save_tensor(f"Net_layers.{layer}.weight", (rng.standard_normal((8, 4)) * (1 + step / 30))
                             .astype(np.float32), "weights")
            hook.save_tensor(f"gradient/Net_layers.{layer}.weight",
                             (rng.standard_normal((8, 4)) * scale).astype(np.float32), "grads")
            # (not named ...weight: the weights collection would save these whole too)
            hook.save_tensor(f"update/Net_layers.{layer}.kernel",
                             (rng.standard_normal((8, 4)) * 1e-3).astype(np.float32), "updates")
            hook.save_tensor(f"optimizer/Net_layers.{layer}.exp_avg_sq",
                             (rng.random((8, 4)) * 1e-4).astype(np.float32), "optimizer_state")
        loss = np.float32(2.0 / (1 + step)) if not (flight and step == steps - 5) else np.float32("nan")
        hook.save_tensor("loss", loss, "losses")
    hook.close()
    if not end:  # as a run still training looks: everything written but the end marker
        os.remove(os.path.join(out_dir, END_OF_JOB_FILE))
    return out_dir


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    return write_mixed_run(str(tmp_path_factory.mktemp("report") / "run"))


def test_natural_sort_and_smoothing():
    assert natural_sorted(["l10", "l2", "L1", "l2.bias"]) == ["L1", "l2", "l2.bias", "l10"]
    assert np.allclose(smooth([1.0, 1.0, 1.0], 0.9), 1.0)  # debiased: no pull towards 0
    assert list(smooth([1.0, 2.0], 0.0)) == [1.0, 2.0]
    out = smooth([0.0, np.nan, 10.0], 0.5)
    assert np.isnan(out[1]) and 0 < out[2] < 10


def test_bins_keep_every_step_and_hold_sparse_saves():
    """10,000 steps in at most 500 bins; a series saved every 50 steps fills the bins between
    its saves; a NaN marks its bin."""
    steps = np.arange(10_000)
    dense = np.ones(10_000)
    dense[5_000:] = 3.0
    dense[7_777] = np.nan
    sparse_steps = np.arange(0, 10_000, 50)
    binned = bin_series([("dense", steps, dense), ("sparse", sparse_steps, sparse_steps.astype(float))])
    assert binned.matrix.shape == (2, 500) and binned.edges[0] == 0 and binned.edges[-1] == 10_000
    assert binned.matrix[0, 0] == 1.0 and binned.matrix[0, -1] == 3.0
    assert binned.nonfinite[0].sum() == 1 and binned.nonfinite[0, 7_777 // 20]
    assert not np.isnan(binned.matrix[1]).any()  # held between saves, not dropped
    assert binned.matrix[1, 3] == 50.0  # bin of steps 60..79 holds the save at step 50


def test_computed_reductions_from_full_values(mixed_run):
    trial = create_trial(mixed_run)
    df = trial.to_dataframe(["Net_layers.2.weight", "gradient/Net_layers.2.weight"], reductions=["l2", "abs_max"])
    weights = df[df.tensor == "Net_layers.2.weight"]
    assert set(weights.reduction) == {"l2", "abs_max"}
    assert sorted(set(weights.step)) == trial.tensor("Net_layers.2.weight").steps()
    tensor = trial.tensor("Net_layers.2.weight")
    for row in weights.itertuples():
        op, is_abs = ("max", True) if row.reduction == "abs_max" else ("l2", False)
        assert row.value == float(tensor.reduction_value(int(row.step), op, abs=is_abs))
    grads = df[df.tensor == "gradient/Net_layers.2.weight"]  # saved reductions, not recomputed
    assert len(grads[grads.reduction == "l2"]) == len(trial.tensor("gradient/Net_layers.2.weight").steps())
    assert list(df.columns) == ["step", "mode", "mode_step", "worker", "tensor", "reduction", "value"]
    assert df.equals(df.sort_values(["tensor", "reduction", "worker", "step"], kind="stable"))
    only_l2 = trial.to_dataframe(["loss", "gradient/Net_layers.2.weight"], reductions=["l2"])
    assert set(zip(only_l2.tensor, only_l2.reduction)) == {("loss", ""), ("gradient/Net_layers.2.weight", "l2")}
    with pytest.raises(ValueError, match="unknown reduction 'l3'"):
        trial.to_table(reductions=["l3"])


def test_report_of_a_run_saved_at_different_intervals(mixed_run, tmp_path, capsys):
    out = str(tmp_path / "report.html")
    assert main(["report", mixed_run, "-o", out]) == 0
    assert "wrote" in capsys.readouterr().out
    text = check_report(out)
    summary = section(text, "summary")
    assert "<th>state</th><td>ended</td>" in summary
    rows = dict(re.findall(r"<tr><td>(\w+)</td><td>\d+</td><td>[^<]*</td><td>([^<]*)</td></tr>", summary))
    assert rows["weights"] == "TRAIN 7, EVAL 7" and rows["updates"] == "TRAIN 3"  # a training-only collection, as gradients
    assert rows["losses"] == "TRAIN 1, EVAL 1"
    heat = section(text, "heatmaps")
    for group in ("gradient", "update", "optimizer", "weights"):
        assert f"<h3>{group}</h3>" in heat
    assert "magenta" in heat  # the legend of the colours
    assert "<img" in section(text, "curves") and "<img" in section(text, "distributions")
    assert "did not fire" in section(text, "flight-recorder")


def test_report_renders_in_chromium(mixed_run, tmp_path):
    out = str(tmp_path / "report.html")
    assert main(["report", mixed_run, "-o", out, "--smooth", "0.9"]) == 0
    check_report(out)
    console, pixels = render(out, tmp_path)
    assert console == []
    assert_not_blank(pixels)


def test_browser_check_sees_console_errors(tmp_path):
    """The browser test would notice a broken page (so its empty console means something)."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><p>x</p><script>console.error('boom'); missing();</script>"
                    "</body></html>")
    console, _ = render(str(page), tmp_path)
    assert any("boom" in line for line in console) and any("missing" in line for line in console)


def test_report_check_refuses_external_urls(tmp_path):
    from report_checks import check_report as check

    page = tmp_path / "r.html"
    sections = "".join(f"<section id='{s}'></section>" for s in
                       ("summary", "curves", "heatmaps", "distributions", "findings", "flight-recorder"))
    page.write_text(f"<!DOCTYPE html><html><body>{sections}<img src='https://cdn.example/x.png'></body></html>")
    with pytest.raises(AssertionError, match="external"):
        check(str(page))


def test_report_of_a_run_still_training(tmp_path):
    run = write_mixed_run(str(tmp_path / "run"), steps=20, layers=3, end=False)
    out = str(tmp_path / "report.html")
    assert main(["report", run, "-o", out, "--no-rules"]) == 0
    text = check_report(out)
    assert "still training" in section(text, "summary")
    assert "Rules were not run" in section(text, "findings")


def test_report_names_the_flight_recorder_trigger(tmp_path):
    run = write_mixed_run(str(tmp_path / "run"), steps=30, layers=3, flight=True)
    out = str(tmp_path / "report.html")
    assert main(["report", run, "-o", out]) == 0
    text = check_report(out)
    fr = section(text, "flight-recorder")
    assert "The flight recorder fired" in fr and "nonfinite" in fr and "<td>25</td>" in fr
    assert "flight recorder fired" in section(text, "summary")


def test_rules_stop_at_their_time_budget_and_say_so(mixed_run, tmp_path):
    out = str(tmp_path / "report.html")
    assert main(["report", mixed_run, "-o", out, "--rules-budget", "1e-9"]) == 0
    findings = section(check_report(out), "findings")
    assert re.search(r"The rules evaluated global steps 0 to 0 of 0 to 59: their time budget \(1e-09 s\)", findings)
    assert main(["report", mixed_run, "-o", out, "--rules-budget", "0"]) == 0
    assert "time budget" not in section(check_report(out), "findings")


def test_report_usage_errors(mixed_run, tmp_path, capsys):
    assert main(["report", mixed_run, "-o", str(tmp_path / "r.png")]) == 2
    assert main(["report", mixed_run, "-o", str(tmp_path / "r.html"), "--smooth", "1"]) == 2
    assert main(["report", mixed_run, "-o", str(tmp_path / "r.html"), "--reduction", "l7"]) == 2
    assert main(["report", mixed_run, "-o", str(tmp_path / "r.html"), "--rules-budget", "-1"]) == 2
    err = capsys.readouterr().err
    assert ".html" in err and "--smooth" in err and "unknown reduction 'l7'" in err
    assert not os.path.exists(tmp_path / "r.html")


def test_report_of_an_s3_run(tmp_path, monkeypatch):
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    from s3_endpoint import serve

    endpoint = serve(monkeypatch, tmp_path, "bucket")
    try:
        write_mixed_run("s3://bucket/runs/mixed", steps=15, layers=3)
        out = str(tmp_path / "report.html")
        assert main(["report", "s3://bucket/runs/mixed", "-o", out]) == 0
        text = check_report(out)
        assert "s3://bucket/runs/mixed" in section(text, "summary")
        assert "<h3>gradient</h3>" in section(text, "heatmaps")
    finally:
        endpoint.stop()


def test_plot_switches_to_a_heatmap_past_ten_series(mixed_run, tmp_path, capsys):
    import matplotlib

    matplotlib.use("Agg")
    from smdebug.analysis.plots import plot_tensors

    trial = create_trial(mixed_run)
    names = [f"gradient/Net_layers.{i}.weight" for i in (10, 2, 0, 1, 3, 4, 5, 6, 7, 8, 9, 11)]
    ax = plot_tensors(trial, names, reduction="l2")
    assert len(ax.images) == 1 and not ax.get_lines()
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [f"{i}.weight" for i in range(12)]  # natural order, shared prefix cut
    assert ax.get_xlabel() == "global step (all modes on one axis)"
    row = ax.images[0].get_array()[2]  # layer 2: the saved l2 at each step
    assert np.isclose(row[0], trial.tensor(names[1]).reduction_value(0, "l2"))
    # Few series: lines in distinct colours, the smoothed line over the faint saved values.
    ax = plot_tensors(trial, names[:3], reduction="l2", smooth=0.9)
    colours = {tuple(line.get_color()) for line in ax.get_lines()}
    assert len(colours) == 3 and len(ax.get_lines()) == 12  # 3 tensors x 2 modes x (raw, smoothed)
    png = str(tmp_path / "grads.png")
    assert main(["plot", mixed_run, "--regex", "^gradient/", "--reduction", "l2", "--smooth", "0.5", "--logy",
                 "-o", png]) == 0
    many = str(tmp_path / "many.png")  # 36 rows: a taller figure, a row per tensor
    assert main(["plot", mixed_run, "--regex", "^(gradient|update)/", "--regex", "^Net", "--reduction", "l2",
                 "-o", many]) == 0
    from PIL import Image

    with Image.open(png) as im:
        assert im.size == (800, 450)
    with Image.open(many) as im:
        assert im.size[1] > 450


def test_plot_computes_a_reduction_of_a_tensor_saved_whole(mixed_run, tmp_path, capsys):
    import matplotlib

    matplotlib.use("Agg")
    from smdebug.analysis.plots import plot_tensors

    trial = create_trial(mixed_run)
    ax = plot_tensors(trial, "Net_layers.3.weight", reduction="l2")
    x, y = ax.get_lines()[0].get_data()
    tensor = trial.tensor("Net_layers.3.weight")
    assert list(x) == [s for s in tensor.steps() if trial.mode(s).name == "TRAIN"]
    assert list(y) == [float(tensor.reduction_value(int(s), "l2")) for s in x]
    with pytest.raises(ValueError, match="saved whole; plot a reduction computed from its values"):
        plot_tensors(trial, "Net_layers.3.weight")
    assert main(["plot", mixed_run, "Net_layers.3.weight@abs_max", "-o", str(tmp_path / "w.png")]) == 0


def test_notebook_view_shows_a_loss_sparkline_and_a_gradient_heatmap(mixed_run, tmp_path):
    from report_checks import _EXTERNAL

    text = create_trial(mixed_run)._repr_html_()
    assert "<th style='text-align:left'>state</th>" in text and "ended" in text
    assert "alt='loss' src='data:image/png;base64," in text
    assert "alt='gradient L2 norms' src='data:image/png;base64," in text
    assert not _EXTERNAL.findall(text)
    page = tmp_path / "notebook.html"
    page.write_text(f"<!DOCTYPE html><html><body>{text}</body></html>")
    console, pixels = render(str(page), tmp_path, width=900, height=400)
    assert console == []
    assert_not_blank(pixels)


def test_notebook_view_without_matplotlib(mixed_run):
    import subprocess

    code = ("import sys; sys.modules['matplotlib'] = None\n"  # as if matplotlib were not installed
            "from smdebug.trials import create_trial\n"
            f"text = create_trial({mixed_run!r})._repr_html_()\n"
            "assert 'state' in text and '<img' not in text, text\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_report_heatmaps_fall_back_to_a_saved_reduction(mixed_run, tmp_path):
    """--reduction mean: the weights (saved whole) show their computed mean; the gradients,
    saved as l2 and abs_max only, show one of those instead of vanishing."""
    out = str(tmp_path / "report.html")
    assert main(["report", mixed_run, "-o", out, "--reduction", "mean", "--no-rules"]) == 0
    heat = section(check_report(out), "heatmaps")
    assert 'alt="weights heatmap of mean"' in heat and 'alt="gradient heatmap of abs_max"' in heat


def test_bins_keep_a_spike_not_its_mean():
    """A one-step spike (up or down, sign kept) keeps its value in its bin; ``mean=True``
    dilutes it 1:20 as the old bins did; the min/max envelope of a curve keeps both ways."""
    from smdebug.analysis.heatmaps import envelope

    steps = np.arange(10_000)
    values = np.ones(10_000)
    values[6_543] = 100.0
    values[1_234] = -50.0
    binned = bin_series([("g", steps, values)])
    assert binned.shows == "max |value|" and binned.width == 20
    assert binned.matrix[0, 6_543 // 20] == 100.0 and binned.matrix[0, 1_234 // 20] == -50.0
    assert np.nanmax(binned.matrix) == 100.0
    assert bin_series([("g", steps, values)], mean=True).matrix[0, 6_543 // 20] == pytest.approx(99 / 20 + 1)
    env = envelope(steps, values)
    assert len(env.x) == 500 and env.hi.max() == 100.0 and env.lo.min() == -50.0
    assert env.x[np.argmax(env.hi)] == 6_540  # the spike's bin: steps 6,540..6,559
    sparse = envelope(np.arange(0, 10_000, 7), np.ones(1_429))  # empty bins dropped, not NaN
    assert np.isfinite(sparse.lo).all() and sparse.hi.max() == 1.0


def write_spike_run(out_dir, steps=10_000, layers=4, spike_step=6_543, spike_layer=2):
    """A numpy-hook run of ``steps`` TRAIN steps saving each layer's gradient L2 norm and the
    loss at every step; at ``spike_step`` one layer's gradient (and the loss) is 100x."""
    rng = np.random.default_rng(0)
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["losses", "grads"])
    grads = hook.get_collection("grads")
    grads.include("^gradient/")
    grads.reduction_config = smd.ReductionConfig(norms=["l2"])
    for step in range(steps):
        hook.begin_step()
        for layer in range(layers):
            g = (0.01 * (1 + 0.1 * rng.standard_normal(16))).astype(np.float32)
            if step == spike_step and layer == spike_layer:
                g *= 100
            hook.save_tensor(f"gradient/Net_layers.{layer}.weight", g, "grads")
        hook.save_tensor("loss", np.float32(100.0 if step == spike_step else 1.0 / (1 + step / 1000)), "losses")
    hook.close()
    return out_dir


def test_report_keeps_a_one_step_gradient_spike_in_10000_steps(tmp_path):
    """The report's heatmap data (as _heatmaps draws it) keeps the 100x spike at its bin, the
    caption says bins show their extreme, and the loss curve's band reaches the spike."""
    from smdebug.analysis import report

    run_dir = write_spike_run(str(tmp_path / "run"))
    trial = create_trial(run_dir)
    run = report._Run(trial, "l2", progress=False, rules=False)
    [(group, label, binned, left_out)] = list(report._binned_groups(run, report._heatmap_groups(run)))
    assert label == "l2" and left_out == 0 and binned.width == 20 and binned.shows == "max |value|"
    row = binned.rows.index("gradient/Net_layers.2.weight")
    spike = float(np.linalg.norm(np.full(16, 1.0)))  # |g| ~ 0.01 * 100 per element, 16 elements
    assert binned.matrix[row, 6_543 // 20] == pytest.approx(spike, rel=0.35)
    others = np.delete(binned.matrix[row], 6_543 // 20)
    assert binned.matrix[row, 6_543 // 20] > 50 * np.nanmax(others)  # not diluted 1:20
    from smdebug.analysis.heatmaps import envelope
    steps, values, _ = run.series.by_key[("loss", "")]
    loss_band = envelope(steps, values)
    assert loss_band.hi.max() == 100.0 and loss_band.x[np.argmax(loss_band.hi)] == 6_540  # at its bin
    # The gradient's curve (as the report's and smdebug plot's curves draw it: draw_envelope)
    # reaches the spike in the same bin, steps 6,540..6,559, and only there.
    steps, values, _ = run.series.by_key[("gradient/Net_layers.2.weight", "l2")]
    band = envelope(steps, values)
    assert band.width == 20 and band.x[np.argmax(band.hi)] == 6_540
    assert band.hi.max() == pytest.approx(spike, rel=0.35) and np.sort(band.hi)[-2] < band.hi.max() / 50
    out = tmp_path / "report.html"
    assert main(["report", run_dir, "-o", str(out), "--no-rules"]) == 0
    text = check_report(str(out))
    assert "each bin its extreme" in text and "band from each bin's min to its max" in text
