"""The ``smdebug`` command on a real run: ls, show, plot, export, rules, --version."""
import csv
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from smdebug import __version__
from smdebug.analysis.cli import main
from smdebug.trials import create_trial


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_version_and_entry_points(numpy_run):
    exe = shutil.which("smdebug", path=os.path.dirname(sys.executable))
    assert exe is not None, "the smdebug console script is not installed"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"smdebug-core {__version__}"
    # python -m smdebug is the same command.
    proc = subprocess.run([sys.executable, "-m", "smdebug", "ls", numpy_run], capture_output=True, text=True)
    assert proc.returncode == 0 and "dense.weight" in proc.stdout and proc.stderr == ""


def test_ls(capsys, numpy_run):
    status, out, err = run(capsys, "ls", numpy_run)
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"run       {numpy_run}"
    assert "state     ended" in lines and "workers   worker_0" in lines
    assert "TRAIN     20 steps (0..19)" in lines and "EVAL      10 steps (0..9)" in lines
    assert "collections  losses, weights" in lines
    rows = {line.split()[0]: line for line in lines[lines.index("tensors   3") + 2:]}
    assert set(rows) == {"dense.weight", "loss", "scalar/lr"}
    assert "30 (0..29)" in rows["loss"] and "()" in rows["loss"] and rows["loss"].endswith("values")
    assert rows["dense.weight"].endswith("reductions abs_max,l2,max,mean,min") and " - " in rows["dense.weight"]


def test_show(capsys, numpy_run):
    trial = create_trial(numpy_run)
    status, out, _ = run(capsys, "show", numpy_run, "dense.weight", "--step", "3", "--mode", "eval")
    assert status == 0
    assert out.startswith("dense.weight at global step 23 (EVAL step 3), workers worker_0")
    assert "only reductions were saved" in out
    l2 = float(trial.tensor("dense.weight").reduction_value(3, "l2", mode="eval"))
    assert f"l2         {l2:.8g}" in out
    status, out, _ = run(capsys, "show", numpy_run, "loss")
    assert status == 0 and "global step 29 (EVAL step 9)" in out and "dtype float32, shape ()" in out
    assert out.strip().splitlines()[-1] == str(trial.tensor("loss").value(29))  # numpy's own print


def test_show_unknown_tensor_is_a_clear_error(capsys, numpy_run):
    status, out, err = run(capsys, "show", numpy_run, "los")
    assert status == 3 and out == ""
    assert err.strip() == "smdebug show: tensor 'los' was not saved in trial 'run' (so far); did you mean 'loss'?"
    # A step of another mode: the hint is this command's option, not the Python argument.
    status, _, err = run(capsys, "show", numpy_run, "loss", "--step", "25", "--mode", "eval")
    assert status == 3 and "leave out --mode" in err and "smd.modes" not in err, err
    from smdebug.analysis.cli import _as_options
    assert _as_options("mode EVAL has a step 5 (global step 25): pass mode=smd.modes.EVAL") == \
        "mode EVAL has a step 5 (global step 25): add --mode EVAL"
    status, _, err = run(capsys, "ls", numpy_run + "-missing")
    assert status == 3 and "does not exist" in err
    status, _, err = run(capsys, "ls", "memory://smdebug-cli-test/no-run-here")  # a URL with nothing there
    assert status == 3 and err.startswith("smdebug ls: ") and "memory://smdebug-cli-test/no-run-here" in err


def test_show_a_step_of_the_mode_where_the_tensor_was_not_saved(capsys, tmp_path):
    import smdebug as smd

    out = str(tmp_path / "sparse")
    hook = smd.Hook(out_dir=out, save_config=smd.SaveConfig(save_interval=1), include_collections=["losses"])
    hook.set_mode(smd.modes.EVAL)
    for step in range(3):
        hook.begin_step()
        hook.save_scalar("lr", 0.1)
        if step != 1:
            hook.save_tensor("loss", np.float32(step), "losses")
    hook.close()
    status, _, err = run(capsys, "show", out, "loss", "--step", "1", "--mode", "eval")
    assert status == 3
    assert "not available for step 1 (mode EVAL); steps of 'loss' in mode EVAL: 0, 2" in err, err


def test_plot_lines_and_histogram_are_real_pngs(capsys, numpy_run, tmp_path):
    image = pytest.importorskip("matplotlib.image")
    png = str(tmp_path / "curves.png")
    status, out, _ = run(capsys, "plot", numpy_run, "loss", "scalar/lr", "-o", png)
    assert status == 0 and out.strip() == f"wrote {png}"
    pixels = image.imread(png)
    assert pixels.shape[:2] == (450, 800) and pixels.std() > 0.05  # an 8x4.5 in figure with something drawn
    png2 = str(tmp_path / "norms.png")
    assert run(capsys, "plot", numpy_run, "dense.weight", "--reduction", "l2", "--mode", "train", "--x",
               "mode_step", "-o", png2)[0] == 0
    assert image.imread(png2).shape[:2] == (450, 800)
    hist = str(tmp_path / "hist.png")
    status, out, err = run(capsys, "plot", numpy_run, "dense.weight", "--hist", "-o", hist)
    assert status == 3 and "no saved value to draw a histogram" in err
    status, out, err = run(capsys, "plot", numpy_run, "dense.weight", "-o", hist)
    assert status == 3 and "has no scalar values to plot; its saved reductions: abs_max, l2, max, mean, min" in err
    status, _, err = run(capsys, "plot", numpy_run, "loss", "-o", str(tmp_path / "x.jpg"))
    assert status == 2 and ".png" in err


def test_plot_selects_tensors_by_regex_and_collection(capsys, numpy_run, tmp_path):
    image = pytest.importorskip("matplotlib.image")
    png = str(tmp_path / "selected.png")
    status, out, err = run(capsys, "plot", numpy_run, "--regex", "^dense", "--reduction", "l2", "-o", png)
    assert status == 0 and out.strip() == f"wrote {png}", err
    assert image.imread(png).std() > 0.05
    status, out, _ = run(capsys, "plot", numpy_run, "scalar/lr", "--collection", "losses", "-o", png)
    assert status == 0
    # Everything: the tensors with no scalar values to draw are left out, and said so.
    status, out, err = run(capsys, "plot", numpy_run, "--regex", ".*", "-o", png)
    assert status == 0 and "left out 1 matching tensors without scalar values (pass --reduction): dense.weight" in err
    status, _, err = run(capsys, "plot", numpy_run, "--regex", "^nothing", "-o", png)
    assert status == 3 and "no saved tensor matches --regex ['^nothing']" in err
    status, _, err = run(capsys, "plot", numpy_run, "-o", png)
    assert status == 2 and "give a TENSOR, --regex or --collection" in err


def test_histogram_from_python(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import smdebug as smd
    from smdebug.analysis.plots import plot_histogram

    out = str(tmp_path / "run")
    hook = smd.Hook(out_dir=out, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights"])
    hook.begin_step()
    hook.save_tensor("w.weight", np.arange(100, dtype=np.float32), "weights")
    hook.close()
    ax = plot_histogram(create_trial(out), "w.weight", 0, bins=10)
    assert sum(p.get_height() for p in ax.patches) == 100
    assert ax.get_title() == "w.weight at step 0 (100 values)"


def test_export_csv_reads_back_as_the_dataframe(capsys, numpy_run, tmp_path):
    path = str(tmp_path / "values.csv")
    status, out, _ = run(capsys, "export", numpy_run, "-o", path)
    assert status == 0 and out.strip() == f"wrote 210 rows to {path}"
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["step", "mode", "mode_step", "worker", "tensor", "reduction", "value"]
    trial = create_trial(numpy_run)
    table = list(trial.to_table().rows())
    assert len(rows) - 1 == len(table)
    for got, want in zip(rows[1:], table):
        assert [int(got[0]), got[1], int(got[2]), got[3], got[4], got[5], float(got[6])] == list(want)
    # A selection: one tensor, one mode.
    status, out, _ = run(capsys, "export", numpy_run, "-o", path, "--tensor", "loss", "--mode", "eval")
    assert status == 0 and out.strip() == f"wrote 10 rows to {path}"


def test_export_of_full_tensors_only_says_so_and_writes_nothing(capsys, tmp_path):
    """export writes one number a row: a tensor saved only in full has none, which must not
    look like a successful export of 0 rows."""
    import numpy as np

    import smdebug as smd

    run_dir = str(tmp_path / "run")
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=1))
    hook.begin_step()
    hook.save_tensor("activations", np.ones((4, 3), np.float32), "mine")
    hook.close()
    path = tmp_path / "values.csv"
    status, out, err = run(capsys, "export", run_dir, "-o", str(path), "--tensor", "activations")
    assert status == 2 and out == ""
    assert "nothing to export: activations saved no scalar values or reductions" in err
    assert "smdebug show RUN TENSOR --step N" in err and not path.exists()


def test_export_parquet_or_a_clear_message(capsys, numpy_run, tmp_path):
    path = str(tmp_path / "values.parquet")
    status, out, err = run(capsys, "export", numpy_run, "-o", path)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        assert status == 2 and "parquet export needs pyarrow" in err
        return
    assert status == 0
    got = pq.read_table(path).to_pydict()
    assert len(got["value"]) == 210
    want = list(create_trial(numpy_run).to_table().rows())
    assert list(zip(*(got[c] for c in ["step", "mode", "mode_step", "worker", "tensor", "reduction", "value"]))) \
        == want


def test_rules_subcommand_is_smdebug_rules(capsys, numpy_run):
    status, out, _ = run(capsys, "rules", numpy_run, "--rules", "LossNotDecreasing")
    assert status in (0, 1)
    assert "LossNotDecreasing" in out
    exe = shutil.which("smdebug-rules", path=os.path.dirname(sys.executable))
    alias = subprocess.run([exe, numpy_run, "--rules", "LossNotDecreasing"], capture_output=True, text=True)
    assert alias.returncode == status and alias.stdout == out


def test_reprs(numpy_run):
    trial = create_trial(numpy_run)
    assert repr(trial) == (f"<Trial 'run' at {numpy_run!r}: 30 steps (TRAIN 20, EVAL 10), 3 tensors, "
                           "workers worker_0, ended>")
    assert repr(trial.tensor("dense.weight")) == ("<Tensor 'dense.weight': 30 steps (global 0 to 29); "
                                                  "reductions abs_max, l2, max, mean, min>")
    html = trial._repr_html_()
    assert html.startswith("<div><strong>smdebug Trial run</strong>") and "<table>" in html
    assert "<th style='text-align:left'>TRAIN steps</th><td style='text-align:left'>20 (0 to 19)</td>" in html
    from smdebug.rules import LossNotDecreasing, invoke_rule

    rule = LossNotDecreasing(trial)
    try:
        invoke_rule(rule, raise_eval_cond=False)
    except Exception:  # noqa: BLE001 - the report is what is checked
        pass
    text = repr(rule.report)
    assert text.startswith("<RuleReport LossNotDecreasing (") and ("FIRED" in text or "did not fire" in text)


def test_a_loss_and_a_reduction_on_one_figure(capsys, numpy_run, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from smdebug.analysis.plots import plot_tensors

    ax = plot_tensors(create_trial(numpy_run), ["loss", ("dense.weight", "l2")])
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["loss (TRAIN)", "loss (EVAL)", "dense.weight l2 (TRAIN)", "dense.weight l2 (EVAL)"]
    xs, ys = ax.get_lines()[3].get_data()
    assert list(xs) == list(range(20, 30))  # EVAL on the global time line
    trial = create_trial(numpy_run)
    assert list(ys) == [float(trial.tensor("dense.weight").reduction_value(s, "l2")) for s in range(20, 30)]
    png = str(tmp_path / "mixed.png")
    assert run(capsys, "plot", numpy_run, "loss", "dense.weight@l2", "-o", png)[0] == 0
    from PIL import Image

    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (800, 450)


def test_the_command_works_without_pandas(numpy_run, tmp_path):
    path = str(tmp_path / "values.csv")
    code = (
        "import sys; sys.modules['pandas'] = None\n"  # as if pandas were not installed
        "from smdebug.analysis.cli import main\n"
        f"assert main(['ls', {numpy_run!r}]) == 0\n"
        f"assert main(['show', {numpy_run!r}, 'loss']) == 0\n"
        f"assert main(['export', {numpy_run!r}, '-o', {path!r}]) == 0\n"
        f"assert main(['plot', {numpy_run!r}, 'loss', '-o', {str(tmp_path / 'p.png')!r}]) == 0\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote 210 rows to {path}" in proc.stdout
    with open(path, newline="") as fh:
        assert sum(1 for _ in csv.reader(fh)) == 211


def test_ls_and_summary_survive_a_refused_collection_regex(capsys, tmp_path):
    from smdebug.collections import Collection, CollectionManager
    from smdebug.modes import ModeKeys
    from smdebug.storage.writer import RunWriter, StepData

    out = str(tmp_path / "run")
    manager = CollectionManager()
    manager.add(Collection("evil", include_regex=["^(a+)+$"]))  # nested quantifiers: refused on reading
    writer = RunWriter(out, "worker_0")
    writer.write_collections(manager.to_json_bytes(num_workers=1))
    writer.submit(StepData(global_step=0, mode=ModeKeys.TRAIN, mode_step=0, worker="worker_0",
                           tensors=[("aaaa", np.asarray(1.0))]))
    writer.close()
    assert "evil (regex refused)" in create_trial(out).summary()["collections"]
    status, out_text, err = run(capsys, "ls", out)
    assert status == 0 and "evil (regex refused)" in out_text and err == ""


def test_output_piped_into_head_ends_quietly(tmp_path):
    """`smdebug ls RUN | head -1`: the reader closes the pipe early; no traceback, status 0."""

    import smdebug as smd

    run_dir = str(tmp_path / "run")
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=1))
    hook.begin_step()
    for i in range(3000):  # far more than a pipe buffer of listing
        hook.save_scalar(f"a_rather_long_scalar_name_so_that_the_listing_is_long_{i:05d}", float(i))
    hook.close()
    script = f"{sys.executable} -m smdebug ls {run_dir} | head -1"
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {script}"], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.count("\n") == 1
    assert "Traceback" not in done.stderr and "Broken pipe" not in done.stderr, done.stderr
    assert done.returncode == 0


def test_rules_list_shows_plain_words_not_markup(capsys):
    status, out, _ = run(capsys, "rules", "--list")
    assert status == 0 and "VanishingGradient" in out
    assert "``" not in out and ":class:" not in out and ":meth:" not in out


def test_unknown_tensor_hints_speak_the_commands_language(capsys, tmp_path):
    import numpy as np

    import smdebug as smd

    run_dir = str(tmp_path / "run")
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=1))
    hook.begin_step()
    hook.save_tensor("CrossEntropyLoss_output_0", np.float32(0.5), "losses")
    hook.save_scalar("lr", 0.1)
    hook.close()
    status, _, err = run(capsys, "show", run_dir, "loss")  # a part of the name: the names that hold it
    assert status == 3 and "did you mean 'CrossEntropyLoss_output_0'?" in err
    status, _, err = run(capsys, "show", run_dir, "lr")
    assert "save_scalar() names are prefixed: give scalar/lr" in err and "trial.tensor" not in err
    status, _, err = run(capsys, "show", run_dir, "zzz")
    assert "smdebug ls RUN lists them" in err and "trial.tensor_names()" not in err
