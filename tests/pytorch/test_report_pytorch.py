"""The report of a real PyTorch run: the README's example (its per-step gradient norms, its
weights saved whole every 50 steps, EVAL passes), rendered in headless chromium."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from smdebug.analysis.cli import main

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "support"))
from report_checks import assert_not_blank, check_report, render, section

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_report_of_the_readme_example(tmp_path):
    run = str(tmp_path / "cnn_run")
    done = subprocess.run([sys.executable, os.path.join(REPO, "examples", "pytorch", "train_cnn.py"), "--out-dir", run,
                           "--steps", "120"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    out = str(tmp_path / "report.html")
    assert main(["report", run, "-o", out, "--rules-budget", "0"]) == 0
    text = check_report(out)
    summary = section(text, "summary")
    assert "<th>framework</th><td>PyTorch</td>" in summary and "<th>state</th><td>ended</td>" in summary
    assert "<td>weights</td><td>3</td><td>values</td><td>TRAIN 50, EVAL 1</td>" in summary
    assert "CrossEntropyLoss" not in section(text, "heatmaps")  # a scalar: a curve, not a heatmap row
    heat = section(text, "heatmaps")
    assert "<h3>gradient</h3>" in heat and "<h3>weights</h3>" in heat and "<h3>biases</h3>" in heat
    assert "12 of 12 tensors saved whole" in section(text, "distributions")
    findings = section(text, "findings")
    assert "<td>VanishingGradient</td>" in findings and "<td>LossNotDecreasing</td>" in findings
    console, pixels = render(out, tmp_path)
    assert console == []
    assert_not_blank(pixels)


def test_heatmap_rows_follow_the_model_not_the_alphabet(tmp_path):
    # Layers named against the alphabet: the report's rows follow the order the model runs them,
    # gradients at their weight's place.
    import torch

    import smdebug.pytorch as smd
    from smdebug.analysis import report
    from smdebug.trials import create_trial

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.zeta = torch.nn.Linear(3, 4)
            self.mu = torch.nn.Linear(4, 4)
            self.alpha = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.alpha(torch.relu(self.mu(torch.relu(self.zeta(x)))))

    net = Net()
    hook = smd.Hook(out_dir=str(tmp_path / "run"), save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients"])
    hook.register_module(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        net(torch.rand(2, 3)).sum().backward()
        optimizer.step()
    hook.close()
    trial = create_trial(str(tmp_path / "run"))
    run = report._Run(trial, "l2", progress=False, rules=False)
    grads = [f"gradient/Net_{n}.weight" for n in ("alpha", "mu", "zeta")]
    assert report._in_model_order(run, grads) == [f"gradient/Net_{n}.weight" for n in ("zeta", "mu", "alpha")]
    weights = [f"Net_{n}.weight" for n in ("alpha", "mu", "zeta")]
    assert report._in_model_order(run, weights) == [f"Net_{n}.weight" for n in ("zeta", "mu", "alpha")]
