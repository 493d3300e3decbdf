"""What the overhead budget's per-step non-finite check costs the training thread (PyTorch, CPU).

The check (adapters/pytorch/budget_capture.py) runs at every TRAIN step whatever the budget
samples, so it is a fixed cost the budget cannot lower. Two ways of summing the same
gradients, weights and loss are timed in one process, in alternation:

* ``stacked``: what the check does when every parameter has a gradient: gradients and
  weights of one shape stacked into a buffer kept between steps, large ones summed alone;
* ``concatenated``: the fallback (some parameter has no gradient), and what every step did
  before: every tensor flattened and concatenated in pieces of 1M elements, each summed.

    python benchmarks/bench_budget_check.py                       # count 402 and size 256k
    python benchmarks/bench_budget_check.py --scenarios "count 402" --repeats 400

Figures: the median training-thread CPU (``time.thread_time``) and wall time of one check,
torch at one intra-op thread, after one backward of a ``bench_scaling.py`` model.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_scaling  # the scenarios' models, one definition

from smdebug.pytorch.budget_capture import NonfiniteCheck, _fused_sum

MODELS = {"count 402": (bench_scaling.count_model, 402, 64), "size 256k": (bench_scaling.size_model, 512, 512)}


class _Registered:
    """The registered-models surface the check reads: the parameters, their names and tensors."""

    def __init__(self, model: torch.nn.Module):
        self.params = list(model.named_parameters())
        self.param_names = tuple(name for name, _ in self.params)
        self.param_tensors = [param for _, param in self.params]


def measure(label: str, repeats: int) -> dict:
    factory, arg, width = MODELS[label]
    torch.manual_seed(0)
    model = factory(arg)
    loss = torch.nn.functional.mse_loss(model(torch.randn(64, width)), torch.randn(64, width))
    loss.backward()
    registered = _Registered(model)
    check = NonfiniteCheck(registered)
    losses = [("loss", loss.detach())]
    params = registered.param_tensors

    def stacked():
        return check._cpu_finite(params, [param.grad for param in params], losses)

    def concatenated():
        return bool(torch.isfinite(_fused_sum(check._named(losses)[0])))

    ways = {"stacked": stacked, "concatenated": concatenated}
    cpu = {name: [] for name in ways}
    wall = {name: [] for name in ways}
    for fn in ways.values():
        fn()  # first calls: the layout, the buffer
    for i in range(repeats):
        for name in (ways if i % 2 == 0 else reversed(list(ways))):
            start, start_cpu = time.perf_counter(), time.thread_time()
            ways[name]()
            cpu[name].append(time.thread_time() - start_cpu)
            wall[name].append(time.perf_counter() - start)
    tensors = 2 * len(params) + 1
    return {name: (1e3 * statistics.median(cpu[name]), 1e3 * statistics.median(wall[name]), tensors)
            for name in ways}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("scenario   way            tensors  cpu ms  wall ms")
    for label in args.scenarios:
        for name, (cpu_ms, wall_ms, tensors) in measure(label, args.repeats).items():
            print(f"{label:10s} {name:14s} {tensors:7d} {cpu_ms:7.3f} {wall_ms:8.3f}")


if __name__ == "__main__":
    main()
