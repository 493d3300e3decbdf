"""Step-time overhead of one live rule: VanishingGradient on saved reductions.

Each workload trains the same small model twice over, with the same hook configuration
(every step saved, gradients and weights reduced to abs-mean and l2, no full tensors):

* ``hook``: the hooked run;
* ``hook+rule``: the same with ``hook.add_rule(VanishingGradient())`` (evaluation in the
  background thread, overlapped with the next step: max_lag_steps=1);
* ``hook+rule+stop``: the same with ``actions=StopTraining()`` (max_lag_steps=0: the training
  thread waits for each step's evaluation, so a stop lands at the next step boundary).

Blocks of ``--steps`` steps of each variant are interleaved (order rotated every round) for
``--rounds`` rounds; each block yields its median step time and the reported figure is the
median over blocks, on three clocks: wall time (the step time; the target is ``hook+rule`` /
``hook`` <= 1.02 on a quiet machine), the training thread's CPU time, and the whole process's
CPU time per step (what the rule's thread adds when the cores are busy).

Workloads: ``numpy`` (a 4-layer MLP forward/backward in numpy, recorded with the core numpy
Hook) and ``torch`` (the same MLP in PyTorch with ``smdebug.pytorch.Hook``; skipped if torch
or the adapter is missing).

    python benchmarks/bench_rules.py                        # both workloads, 30 rounds of 10 steps
    python benchmarks/bench_rules.py --workload numpy --rounds 30 --steps 60
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

# One BLAS thread: the comparison is about the hook's and the rule's cost, not about how
# the machine's other load interacts with a multi-threaded BLAS.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

VARIANTS = ("hook", "hook+rule", "hook+rule+stop")
WIDTH, BATCH, LAYERS = 256, 64, 4


def _numpy_session(out_dir: str, variant: str):
    import smdebug as smd
    from smdebug.rules import StopTraining, VanishingGradient

    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.05 for _ in range(LAYERS)]
    x = rng.standard_normal((BATCH, WIDTH)).astype(np.float32)
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["gradients", "weights"],
                    reduction_config=smd.ReductionConfig(abs_reductions=["mean"], norms=["l2"]))
    if variant == "hook+rule":
        hook.add_rule(VanishingGradient(), report_path=None)
    elif variant == "hook+rule+stop":
        hook.add_rule(VanishingGradient(), actions=StopTraining(), report_path=None)

    def step():
        hook.begin_step()
        activations = [x]
        for w in weights:
            activations.append(np.maximum(activations[-1] @ w, 0))
        grad = activations[-1] / BATCH
        for i in reversed(range(LAYERS)):
            g_w = activations[i].T @ grad
            grad = (grad @ weights[i].T) * (activations[i] > 0)
            hook.record(f"gradient/layer{i}.weight", g_w)
            hook.record(f"layer{i}.weight", weights[i])
            weights[i] -= 1e-3 * g_w
        hook.save_scalar("loss", float(activations[-1].mean()))

    return step, hook.close


def _torch_session(out_dir: str, variant: str):
    import torch

    import smdebug.pytorch as smd
    from smdebug.rules import StopTraining, VanishingGradient

    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.MSELoss()
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["gradients", "weights"],
                    reduction_config=smd.ReductionConfig(abs_reductions=["mean"], norms=["l2"]))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    if variant == "hook+rule":
        hook.add_rule(VanishingGradient(), report_path=None)
    elif variant == "hook+rule+stop":
        hook.add_rule(VanishingGradient(), actions=StopTraining(), report_path=None)

    def step():
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()

    return step, hook.close


SESSIONS = {"numpy": _numpy_session, "torch": _torch_session}


CLOCKS = {"wall": time.perf_counter, "thread_cpu": time.thread_time, "process_cpu": time.process_time}


def _block(session, variant: str, steps: int, warmup: int = 5) -> dict:
    """Median per-step time (s) of one block on each clock, in a fresh hook and directory.

    ``wall`` is the step time; ``thread_cpu`` the training thread's CPU time (insensitive to
    other processes on a busy machine); ``process_cpu`` the CPU time of every thread of the
    process during the step (hook writer and rule thread included).
    """
    out_dir = tempfile.mkdtemp(prefix="bench_rules_")
    try:
        step, close = session(out_dir + "/run", variant)
        for _ in range(warmup):
            step()
        samples = {clock: [] for clock in CLOCKS}
        for _ in range(steps):
            start = {clock: read() for clock, read in CLOCKS.items()}
            step()
            for clock, read in CLOCKS.items():
                samples[clock].append(read() - start[clock])
        close()
        return {clock: statistics.median(values) for clock, values in samples.items()}
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def run_workload(name: str, rounds: int, steps: int) -> dict:
    session = SESSIONS[name]
    blocks = {v: [] for v in VARIANTS}
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[: r % len(VARIANTS)]
        for variant in order:
            blocks[variant].append(_block(session, variant, steps))
    medians = {v: {clock: statistics.median(b[clock] for b in blocks[v]) for clock in CLOCKS} for v in VARIANTS}
    result = {"workload": name, "rounds": rounds, "steps_per_block": steps, "target": "wall ratio hook+rule <= 1.02"}
    for clock in CLOCKS:
        base = medians["hook"][clock]
        result[clock] = {
            "median_step_ms": {v: round(medians[v][clock] * 1e3, 4) for v in VARIANTS},
            "ratio_rule": round(medians["hook+rule"][clock] / base, 4),
            "ratio_rule_stop": round(medians["hook+rule+stop"][clock] / base, 4),
        }
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("numpy", "torch", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    names = ["numpy", "torch"] if args.workload == "all" else [args.workload]
    for name in names:
        try:
            result = run_workload(name, args.rounds, args.steps)
        except ImportError as exc:
            result = {"workload": name, "skipped": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
