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

``--offline``: the default rules (``smdebug rules RUN``, progress bar on stderr) over a saved
run of ``--run-steps`` (10,000) steps of ``--tensors`` (100) tensors, 50 gradients and 50
weights of 64 values saved as min, max, mean, abs mean and L2 norm, and the loss: the seconds
to open the run and to evaluate the rules, best of ``--repeat`` (the run is written once into
``--dir`` and reused):

    python benchmarks/bench_rules.py --offline --dir /tmp/rules10k
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


def write_offline_run(out_dir: str, steps: int, tensors: int) -> None:
    import smdebug as smd

    hook = smd.Hook(out_dir=out_dir, save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["gradients", "weights", "losses"],
                    reduction_config=smd.ReductionConfig(reductions=["min", "max", "mean"], abs_reductions=["mean"],
                                                         norms=["l2"]))
    hook.get_collection("losses").include("^loss$")
    rng = np.random.default_rng(0)
    half = tensors // 2
    grads = [rng.standard_normal(64).astype(np.float32) * 0.01 for _ in range(half)]
    weights = [rng.standard_normal(64).astype(np.float32) for _ in range(half)]
    for step in range(steps):
        hook.begin_step()
        for i in range(half):
            hook.record(f"gradient/layer{i}.weight", grads[i])
            hook.record(f"layer{i}.weight", weights[i])
        hook.record("loss", np.float32(1.0 / (1 + 0.01 * step) + 0.01 * rng.standard_normal()))
    hook.close()


def run_offline(out_dir: str, steps: int, tensors: int, repeat: int) -> dict:
    """Seconds to open the run and to evaluate the default rules over it (best of ``repeat``)."""
    import sys

    from smdebug.analysis.rules.builtin import choose_rules, make_rule
    from smdebug.analysis.rules.rule import run_rules
    from smdebug.trials import create_trial

    if not os.path.exists(os.path.join(out_dir, "training_job_end.ts")):
        shutil.rmtree(out_dir, ignore_errors=True)
        write_offline_run(out_dir, steps, tensors)
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        trial = create_trial(out_dir, progress=False)
        t1 = time.perf_counter()
        names, _, _ = choose_rules(trial)
        rules = [make_rule(name, trial) for name in names]
        run_rules(rules, follow=False, progress=sys.stderr.isatty())
        t2 = time.perf_counter()
        fired = [r.rule_name for r in rules if r.report.triggered]
        if best is None or t2 - t1 < best["rules_s"]:
            best = {"open_s": round(t1 - t0, 2), "rules_s": round(t2 - t1, 2), "rules": names, "fired": fired}
    return {"workload": "offline", "steps": len(trial.steps()), "tensors": len(trial.tensor_names()), **best}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("numpy", "torch", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--offline", action="store_true", help="time the default rules over a saved run instead")
    parser.add_argument("--run-steps", type=int, default=10_000)
    parser.add_argument("--tensors", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", help="where to write the --offline run (reused when complete)")
    args = parser.parse_args(argv)
    if args.offline:
        out_dir = args.dir or os.path.join(tempfile.mkdtemp(prefix="smdebug_rules_offline_"), "run")
        print(json.dumps(run_offline(out_dir, args.run_steps, args.tensors, args.repeat)), flush=True)
        return
    names = ["numpy", "torch"] if args.workload == "all" else [args.workload]
    for name in names:
        try:
            result = run_workload(name, args.rounds, args.steps)
        except ImportError as exc:
            result = {"workload": name, "skipped": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
