"""Step-time overhead of the PyTorch hook: hooked loop time / the same loop without a hook.

Run::

    .venv/bin/python benchmarks/bench_pytorch.py                 # this package (smdebug-core)
    python benchmarks/bench_pytorch.py --smdebug-original       # smdebug 1.0.34, in its own env

Scenarios (each saves every step unless said otherwise):

a. ``full``: weights, biases, gradients and losses, whole tensors, of a small CNN;
b. ``reductions``: min, max, mean, std, l1 and l2 norms of weights, biases and gradients
   (no whole tensors) of the same CNN;
c. ``default``: the default configuration (losses, every 500 steps), run 4x as many
   steps as the others: its cost is a fixed start/close cost plus a per-step counter
   check, and a long run is what it is for;
d. ``many_modules``: a 60-module MLP (20 x Linear/LayerNorm/ReLU) with every module
   output saved; its steps take ~3 ms, so it also runs 4x as many steps.

Baseline and hooked runs alternate in one process (``--reps`` times, after a warm-up
pair); the table shows ``min ratio``, the fastest hooked run over the fastest baseline run
(on a shared machine run times jump between levels: the minimum is the stable figure),
the median and range of the per-pair ratios, and the fastest step times.
The hooked time includes ``hook.close()`` (the writer finishing the run's files). Targets
on CPU: b <= 1.10, c <= 1.02, d <= 2.0. ``--threads 1`` gives steadier figures on small
machines (torch's intra-op threads and the writer thread otherwise share the cores);
``--dry-run`` measures the hook without the writer. ``--alternate 4`` trains the baseline
and the hooked model in the same loop, 4 steps of one then 4 of the other: on a machine
whose speed changes within a second (as the shared CI machine's does) whole runs one after
the other are compared at different speeds, blocks of a few steps at the same speed.

``--smdebug-original`` drives the same scenarios through smdebug 1.0.34's
``smdebug.pytorch.Hook``. That package is also imported as ``smdebug``, so it runs in a
separate interpreter whose environment has it installed (with numpy<2, protobuf 3.20).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time

import torch


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 3)
        self.conv2 = torch.nn.Conv2d(16, 32, 3)
        self.fc1 = torch.nn.Linear(32 * 5 * 5, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def many_modules_mlp(width=32, blocks=20):
    layers = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


SCENARIOS = {
    # name: (model factory, input shape, hook configuration)
    "full": (SmallCNN, (64, 1, 28, 28),
             dict(collections=["weights", "biases", "gradients", "losses"], interval=1)),
    "reductions": (SmallCNN, (64, 1, 28, 28),
                   dict(collections=["weights", "biases", "gradients"], interval=1,
                        reductions=dict(reductions=["min", "max", "mean", "std"], norms=["l1", "l2"]))),
    "default": (SmallCNN, (64, 1, 28, 28), dict()),
    "many_modules": (many_modules_mlp, (32, 32), dict(include_regex=[r"_output_\d+$"], interval=1)),
}


def make_hook(smd, out_dir, config, dry_run=False):
    kwargs = {"out_dir": out_dir}
    if dry_run:
        kwargs["dry_run"] = True
    if "interval" in config:
        kwargs["save_config"] = smd.SaveConfig(save_interval=config["interval"])
    if "collections" in config:
        kwargs["include_collections"] = config["collections"]
    if "reductions" in config:
        kwargs["reduction_config"] = smd.ReductionConfig(**config["reductions"])
    if "include_regex" in config:
        kwargs["include_regex"] = config["include_regex"]
    return smd.Hook(**kwargs)


def close_hook(hook):
    close = getattr(hook, "close", None) or getattr(hook, "_cleanup")
    close()


def run_loop(factory, shape, steps, hook_setup=None):
    """Seconds for ``steps`` training steps (plus closing the hook, if any)."""
    torch.manual_seed(0)
    model = factory()
    loss_fn = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(*shape, generator=gen), torch.randint(0, 10, (shape[0],), generator=gen))
            for _ in range(4)]
    hook = hook_setup(model, loss_fn) if hook_setup else None
    start = time.perf_counter()
    for i in range(steps):
        x, y = data[i % len(data)]
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    if hook is not None:
        close_hook(hook)
    return time.perf_counter() - start


def run_alternating(factory, shape, steps, hook_setup, block):
    """(baseline seconds, hooked seconds) of ``steps`` steps each, two models trained in one
    loop: ``block`` baseline steps, then ``block`` hooked steps, and so on (the order of
    each pair of blocks alternates, so the writer's work after a hooked block falls as
    often on a hooked block as on a baseline one). The hooked total includes ``close()``.

    On a shared machine whose speed changes within a second, whole runs measured one after
    the other see different speeds; blocks of a few steps see the same.
    """
    torch.manual_seed(0)
    models = [factory(), factory()]
    loss_fns = [torch.nn.CrossEntropyLoss(), torch.nn.CrossEntropyLoss()]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.01) for m in models]
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(*shape, generator=gen), torch.randint(0, 10, (shape[0],), generator=gen))
            for _ in range(4)]
    hook = hook_setup(models[1], loss_fns[1])
    totals = [0.0, 0.0]
    done = [0, 0]
    pair = 0
    while min(done) < steps:
        for which in ((0, 1) if pair % 2 == 0 else (1, 0)):
            model, loss_fn, optimizer = models[which], loss_fns[which], optimizers[which]
            start = time.perf_counter()
            for _ in range(min(block, steps - done[which])):
                x, y = data[done[which] % len(data)]
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
                done[which] += 1
            totals[which] += time.perf_counter() - start
        pair += 1
    start = time.perf_counter()
    close_hook(hook)
    totals[1] += time.perf_counter() - start
    return totals[0], totals[1]


def bench(name, smd, dry_run, steps, reps, work_dir, block=0):
    factory, shape, config = SCENARIOS[name]
    counter = [0]

    def setup(model, loss_fn):
        counter[0] += 1
        hook = make_hook(smd, f"{work_dir}/{name}_{counter[0]}", config, dry_run)
        hook.register_module(model)
        hook.register_loss(loss_fn)
        return hook

    if name in ("default", "many_modules"):
        steps *= 4  # short steps: the hook's fixed start/close cost would otherwise weigh more than in real runs
    ratios, base_times, hooked_times = [], [], []
    for rep in range(reps + 1):
        if block:
            base, hooked = run_alternating(factory, shape, steps, setup, block)
        else:
            base = run_loop(factory, shape, steps)
            hooked = run_loop(factory, shape, steps, setup)
        shutil.rmtree(f"{work_dir}/{name}_{counter[0]}", ignore_errors=True)
        if rep == 0:
            continue  # warm-up pair
        ratios.append(hooked / base)
        base_times.append(base / steps)
        hooked_times.append(hooked / steps)
    return {"scenario": name, "ratio_of_mins": min(hooked_times) / min(base_times),
            "median_ratio": statistics.median(ratios), "lowest_ratio": min(ratios), "highest_ratio": max(ratios),
            "base_ms": 1e3 * min(base_times), "hooked_ms": 1e3 * min(hooked_times)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smdebug-original", action="store_true",
                        help="benchmark smdebug 1.0.34 (run in an environment where it is installed)")
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--steps", type=int, default=40, help="training steps per timed run")
    parser.add_argument("--reps", type=int, default=7, help="timed baseline/hooked pairs per scenario")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--dry-run", action="store_true",
                        help="hooks capture and reduce but write nothing (separates the adapter's cost from the "
                             "writer's)")
    parser.add_argument("--alternate", type=int, default=0, metavar="BLOCK",
                        help="train the baseline and the hooked model in one loop, alternating blocks of BLOCK "
                             "steps (steadier on a machine whose speed changes within seconds)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import smdebug.pytorch as smd  # ours, or the original in its own environment

    version = getattr(__import__("smdebug"), "__version__", "?")
    label = f"smdebug {version}" + (" (original)" if args.smdebug_original else "") + \
        (", dry run" if args.dry_run else "") + (f", alternating blocks of {args.alternate} steps" if args.alternate else "")
    work_dir = tempfile.mkdtemp(prefix="bench_pytorch_")
    try:
        results = [bench(name, smd, args.dry_run, args.steps, args.reps, work_dir, args.alternate)
                   for name in args.scenarios]
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)

    print(f"{label}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{args.steps} steps x {args.reps} interleaved pairs")
    print(f"{'scenario':<14}{'min ratio':>10}{'median ratio':>14}{'(range)':>13}{'base ms/step':>14}"
          f"{'hooked ms/step':>16}")
    for r in results:
        spread = f"{r['lowest_ratio']:.2f}-{r['highest_ratio']:.2f}"
        print(f"{r['scenario']:<14}{r['ratio_of_mins']:>10.3f}{r['median_ratio']:>14.3f}{spread:>13}"
              f"{r['base_ms']:>14.2f}{r['hooked_ms']:>16.2f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"label": label, "results": results}, handle, indent=1)


if __name__ == "__main__":
    main()
