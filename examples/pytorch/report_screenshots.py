"""Make the report screenshots of docs/: the README example's run and a 48-layer model's.

Trains a 48-layer MLP (synthetic regression, no download) with the hook saving the loss and
every gradient's L2 norm at every step and the weights whole every 50 steps, writes
``smdebug report`` of it and of the README example's run (``--cnn-run``, written by
examples/pytorch/train_cnn.py), and screenshots both with headless chromium:

    python examples/pytorch/train_cnn.py --out-dir /tmp/cnn_run
    python examples/pytorch/report_screenshots.py --cnn-run /tmp/cnn_run --out-dir /tmp/shots
"""
import argparse
import os
import shutil
import subprocess
import tempfile

import torch

import smdebug.pytorch as smd
from smdebug.analysis.report import write_report

LAYERS = 48
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars")


def train_deep(out_dir, steps=400, width=32):
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.MSELoss()
    hook = smd.Hook(out_dir=out_dir, include_collections=["weights", "losses", "gradient_norms"],
                    save_config=smd.SaveConfig(save_interval=50))
    hook.get_collection("losses").save_config = smd.SaveConfig(save_interval=1)
    norms = hook.get_collection("gradient_norms")
    norms.include("^gradient/.*weight")
    norms.save_config = smd.SaveConfig(save_interval=1)
    norms.reduction_config = smd.ReductionConfig(norms=["l2"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
    target = torch.randn(width, 1)
    for step in range(steps):
        model.train()
        x = torch.randn(64, width)
        optimizer.zero_grad()
        loss = loss_fn(model(x), torch.sin(x @ target))
        loss.backward()
        optimizer.step()
        if (step + 1) % 100 == 0:
            model.eval()
            with torch.no_grad():
                x = torch.randn(64, width)
                loss_fn(model(x), torch.sin(x @ target))
    hook.close()


def screenshot(html_path, png_path, height):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("needs chromium (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", f"--window-size=1150,{height}",
                        f"--screenshot={png_path}", "file://" + os.path.abspath(html_path)],
                       check=True, capture_output=True)
    _trim_bottom(png_path)


def _trim_bottom(png_path, margin=24):
    """Cut the blank page below the report (the window is taller than most reports)."""
    import numpy as np
    from PIL import Image

    with Image.open(png_path) as image:
        rgb = image.convert("RGB")
    rows = np.flatnonzero((np.asarray(rgb) < 245).any(axis=(1, 2)))
    if len(rows):
        rgb.crop((0, 0, rgb.width, min(rgb.height, int(rows[-1]) + margin))).save(png_path, optimize=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cnn-run", required=True, help="the README example's run directory")
    parser.add_argument("--out-dir", required=True, help="where the runs, reports and screenshots go")
    parser.add_argument("--height", type=int, default=6000, help="window height in pixels (the blank below is cut)")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    deep = os.path.join(args.out_dir, "deep_run")
    if not os.path.exists(deep):
        train_deep(deep)
    for name, run in (("report_example", args.cnn_run), ("report_48_layers", deep)):
        html = os.path.join(args.out_dir, f"{name}.html")
        write_report(run, html, rules_budget=0)
        screenshot(html, os.path.join(args.out_dir, f"{name}.png"), args.height)
        print(f"wrote {html} and {name}.png")


if __name__ == "__main__":
    main()
