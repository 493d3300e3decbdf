"""How much more a small piece of work costs when its code and data have gone cold.

The hook's work on the training thread is many small pieces (a callback, a hand-over, the
reductions of a small batch), each run once per step, in between the framework's own work.
On a machine whose caches are shared with other tenants (this project's 2-core CI VM), code
and data not touched for a few milliseconds come back from memory, and such a piece costs
several times what a loop that repeats it measures. This benchmark measures that factor on
the machine it runs on, so that per-call figures can be read for what they are:

1. a fixed bundle of small operations (a torch add, a numpy allocation, a short Python list
   comprehension) timed right after ``pause`` microseconds of unrelated busy Python;
2. reading one byte of each of 2,048 cache lines (a 128 KiB array) after the same pauses:
   the cost of memory that has left the caches, without any code to run;
3. the hook's own reductions of a small batch (``TorchBackend.start_batch`` and
   ``finish_batch``) right after a training step of a 6-layer 512-wide MLP, and again at
   once: the step's loss (one value: plain Python) and the model's six biases (numpy
   segments).

Run::

    .venv/bin/python benchmarks/bench_cold_code.py
    .venv/bin/python benchmarks/bench_cold_code.py --pauses 0 1000 10000 --repeats 200

Figures: median of ``--repeats`` timings each (docs/performance.md).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch


def _spin(us: float) -> None:
    """Busy Python for ``us`` microseconds, touching almost nothing else."""
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def _bundle(scalar: torch.Tensor) -> float:
    start = time.perf_counter_ns()
    scalar + 1
    np.empty(8)
    [x * 2.0 for x in range(20)]
    return (time.perf_counter_ns() - start) / 1e3


def bundle_after_pauses(pauses, repeats: int):
    scalar = torch.tensor(0.5)
    rows = []
    for pause in pauses:
        times = []
        for _ in range(repeats):
            _spin(pause)
            times.append(_bundle(scalar))
        rows.append((pause, statistics.median(times)))
    return rows


def lines_after_pauses(pauses, repeats: int):
    """Median microseconds to read one byte of each of 2,048 cache lines after each pause."""
    data = np.ones(64 * 2048, dtype=np.uint8)
    lines = np.arange(0, data.size, 64)
    rows = []
    for pause in pauses:
        times = []
        for _ in range(repeats):
            _spin(pause)
            start = time.perf_counter_ns()
            data[lines].sum()
            times.append((time.perf_counter_ns() - start) / 1e3)
        rows.append((pause, statistics.median(times)))
    return rows


def hook_batches_after_step(repeats: int):
    """{batch: (cold, warm)} microseconds of a small batch's hand-over and reductions."""
    from smdebug.pytorch.backend import TorchBackend  # the hook's own reduction path

    backend = TorchBackend()
    keys = (("min", False), ("max", False), ("mean", False), ("std", False), ("l2", False))
    layers = []
    for i in range(6):
        layers.append(torch.nn.Linear(512, 512))
        if i < 5:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 512), torch.randn(64, 512)

    def reduce_once(tensors) -> float:
        start = time.perf_counter_ns()
        backend.finish_batch(backend.start_batch(tensors, keys, False))
        return (time.perf_counter_ns() - start) / 1e3

    biases = [m.bias.detach() for m in model if isinstance(m, torch.nn.Linear)]
    times = {"the loss (one value)": ([], []), "six biases (3,072 values)": ([], [])}
    for _ in range(repeats):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        for (cold, warm), tensors in zip(times.values(), ([loss.detach()], biases)):
            cold.append(reduce_once(tensors))
            warm.append(reduce_once(tensors))
    return {name: (statistics.median(cold), statistics.median(warm)) for name, (cold, warm) in times.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pauses", type=float, nargs="+", default=[0, 100, 1000, 2000, 4000, 8000, 16000],
                        help="microseconds of unrelated busy Python before each timing")
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    print("after a pause of busy Python: small operations (a torch add, np.empty, a list comprehension);")
    print("one byte read from each of 2,048 cache lines")
    print(f"{'pause':>10} {'operations':>12} {'lines':>10}")
    rows = zip(bundle_after_pauses(args.pauses, args.repeats), lines_after_pauses(args.pauses, args.repeats))
    for (pause, ops_us), (_, lines_us) in rows:
        print(f"{pause / 1000:>8.1f}ms {ops_us:>10.1f}us {lines_us:>8.1f}us")
    print("\nthe hook's reductions of a small batch, right after a training step and again at once")
    print(f"{'batch':>28} {'after the step':>15} {'again':>8}")
    for name, (cold, warm) in hook_batches_after_step(args.repeats).items():
        print(f"{name:>28} {cold:>13.1f}us {warm:>6.1f}us  ({cold / warm:.1f}x)")


if __name__ == "__main__":
    main()
