"""FSDP2 training on CPU with gloo, run by test_fsdp2.py in 2 (or 4) processes.

``python fsdp2_train.py <out_base> <port> <world_size> <scenario>[,<scenario>...]``.

Each scenario trains a few steps with the hook and writes, next to the run, what the test
compares it with: ``reference_<rank>.json`` (every reduction of ``full_tensor()`` of every
weight and gradient, computed just before ``optimizer.step()``; where updates are saved,
of the update, full weight after minus before, and of each optimizer state tensor just
after it), ``full_<rank>.npz`` (the full tensors) and ``collectives_<rank>.json`` (the
hook's statistics collectives per step).

Scenarios: ``reductions`` (2 Linear layers, 4 parameters, uneven shards: one rank holds an
empty piece of a 1-row weight; 3 TRAIN steps, then an EVAL step), ``wide`` (20 layers, 40 parameters), ``full_one`` and
``full_all`` (full tensors, include_workers one/all), ``fsdp1`` and ``fsdp1_full_all`` (FSDP
v1 with ``use_orig_params=True``: flat pieces of parameters), ``fsdp1_flat`` (without it:
nothing to name, one warning), ``inplace`` (weights scaled in place between backward and
``optimizer.step()``), ``tp`` and ``tp_full_all`` (a DTensor parameter sharded along dim 1,
no FSDP), ``hsdp``, ``hsdp_full_one`` and ``hsdp_full_all`` (a 2D replicate x shard mesh:
2 processes as 2x1, 4 as 2x2), ``health`` (the ``reductions`` model with the health
reductions, weights set past the fp16/fp8 limits, to zero and below their smallest subnormals;
SGD with momentum: its updates and momentum buffers too), ``updates``, ``updates_full_one`` and ``updates_full_all``
(the ``reductions`` model trained by Adam: updates, ``exp_avg``, ``exp_avg_sq`` and ``step``,
whose full tensors around each step are written to ``full_<rank>.npz`` too), ``updates_only``
(the ``updates`` collection alone), ``updates_skipped`` (steps owned by the loop, as a trainer
integration does; step 1 skips ``optimizer.step()`` after ``capture_parameters``, as a gradient
scaler does on overflow), ``hsdp_updates`` and ``tp_updates`` (``updates`` on an HSDP mesh and
for the column-sharded DTensor) and ``fsdp1_updates`` (FSDP v1: updates; SGD with momentum).
"""
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.fsdp import fully_shard

import smdebug.pytorch as smd
from smdebug import reductions as ref

REDUCTIONS = ["min", "max", "mean", "std", "variance", "sum"]
NORMS = ["l1", "l2"]
HEALTH = list(ref.HEALTH_REDUCTIONS)
STEPS = 3


def make_model(layers):
    torch.manual_seed(0)
    sizes = [5] + [3] * (layers - 1) + [1]
    modules = []
    for i in range(layers):
        modules.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < layers - 1:
            modules.append(torch.nn.Tanh())
    return torch.nn.Sequential(*modules)


class ColumnSharded(torch.nn.Module):
    """A DTensor parameter without FSDP, sharded along its columns (as tensor parallelism does):
    a 5 x 7 weight, 4 columns on rank 0 and 3 on rank 1."""

    def __init__(self, mesh):
        super().__init__()
        torch.manual_seed(0)
        self.weight = torch.nn.Parameter(distribute_tensor(torch.randn(5, 7), mesh, [Shard(1)]))

    def forward(self, x):
        return (x @ self.weight.full_tensor()).sum(dim=1, keepdim=True)


def shard(model, mesh):
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_parameters(model):
    """``(name, full weight, full gradient)`` of every parameter (collectives: all ranks call it)."""
    if isinstance(model, FSDP):  # FSDP (v1): the full parameters exist inside this context only
        with FSDP.summon_full_params(model, with_grads=True):
            return [(name, p.detach().clone(), None if p.grad is None else p.grad.detach().clone())
                    for name, p in model.named_parameters()]
    return [(name, p.full_tensor().detach(), p.grad.full_tensor().detach()) for name, p in model.named_parameters()]


def reference(model, optimizer, rank, out, ops=REDUCTIONS + NORMS, around_step=False):
    """Record the full tensor of every weight and gradient before each optimizer step (and,
    ``around_step``, of its update and the optimizer's state after it)."""
    steps, full, before = [], {}, {}

    def note(values, step, key, tensor):
        whole = tensor.numpy().astype(np.float64)
        full[f"{step}|{key}"] = whole
        values[key] = {("abs_" if a else "") + op: float(ref.reduce(whole, op, a)) for op in ops for a in (False, True)}

    def pre_step(opt, args, kwargs):
        values = {}
        for name, weight, grad in full_parameters(model):
            before[name] = weight.clone()
            for key, tensor in ((f"Sequential_{name}", weight), (f"gradient/Sequential_{name}", grad)):
                note(values, len(steps), key, tensor)
        steps.append(values)

    def post_step(opt, args, kwargs):  # the update (in float32, as the hook) and the state, whole
        values, step = steps[-1], len(steps) - 1
        params = dict(model.named_parameters())
        for name, weight, _ in full_parameters(model):
            note(values, step, f"update/Sequential_{name}", weight - before[name])
            for key, value in (opt.state[params[name]] if name in params else {}).items():  # FSDP v1: other names
                whole = value.full_tensor() if hasattr(value, "full_tensor") else value
                note(values, step, f"optimizer/Sequential_{name}/{key}", whole.detach())

    optimizer.register_step_pre_hook(pre_step)
    if around_step:
        optimizer.register_step_post_hook(post_step)

    def weights_now():  # an EVAL step: its weights, no gradients
        steps.append({f"Sequential_{name}": {("abs_" if a else "") + op: float(ref.reduce(
            weight.numpy().astype(np.float64), op, a)) for op in ops
            for a in (False, True)} for name, weight, _ in full_parameters(model)})

    def save():
        with open(os.path.join(out, f"reference_{rank}.json"), "w") as f:
            json.dump(steps, f)
        np.savez(os.path.join(out, f"full_{rank}.npz"), **full)

    return save, weights_now


def run(scenario, out_base, rank, world):
    out = os.path.join(out_base, scenario)
    if world == 4 and scenario.startswith("hsdp"):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    elif scenario.startswith("hsdp"):
        mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,))
    if scenario.startswith("tp"):
        model = torch.nn.Sequential(ColumnSharded(mesh))
    elif scenario.startswith("fsdp1"):  # FSDP (v1), one flat parameter sharded over the ranks
        model = FSDP(make_model(2), use_orig_params=scenario != "fsdp1_flat", device_id=torch.device("cpu"))
    elif scenario == "health":
        model = make_model(2)
        with torch.no_grad():  # past the fp16/fp8 limits, zeros, below the smallest subnormals
            model[0].weight[0, :4] = torch.tensor([7e4, 500.0, 0.0, 1e-9])
            model[0].weight[2, 0] = 3e-41  # a float32 subnormal, below bf16's too
            model[2].bias.zero_()
        model = shard(model, mesh)
    else:
        model = shard(make_model(20 if scenario == "wide" else 2), mesh)
    full_values = "full" in scenario
    # the step's updates and the optimizer's state, sharded as their parameters
    around_step = scenario == "health" or "updates" in scenario
    # median cannot be exact from shards: refused for sharded tensors (one warning), the rest saved
    reduction_config = smd.ReductionConfig(save_raw_tensor=True) if full_values else smd.ReductionConfig(
        reductions=REDUCTIONS + (["median"] if scenario == "reductions" else []), abs_reductions=REDUCTIONS,
        norms=NORMS, abs_norms=NORMS)
    if scenario == "health":
        reduction_config = smd.ReductionConfig(reductions=HEALTH, abs_reductions=HEALTH)
    # flight: a flight recorder (on the chief only: the one rank that writes), nothing saved by the
    # save config; every rank must still take part in every step's statistics collectives
    flight = smd.FlightRecorder(steps=2) if scenario == "flight" else None
    hook = smd.Hook(out_dir=out, include_workers="all" if scenario.endswith("full_all") else "one",
                    save_config=smd.SaveConfig(save_interval=100 if flight else 1), reduction_config=reduction_config,
                    include_collections=["updates"] if scenario == "updates_only" else [
                        "weights", "biases", "gradients"] + (["updates", "optimizer_variables"] if around_step else []),
                    flight_recorder=flight)
    hook.register_module(model)
    owned = scenario == "updates_skipped"
    if owned:
        hook.own_steps("fsdp2_train")
    if "updates" in scenario and scenario != "fsdp1_updates":
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)  # exp_avg, exp_avg_sq, step
    else:  # the health scenario: a momentum buffer
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9 if around_step else 0.0)
    if scenario in ("fsdp1_flat", "flight"):  # nothing saved to compare (FSDP v1: no full gradients)
        save_reference = eval_reference = lambda: None
    else:
        save_reference, eval_reference = reference(model, optimizer, rank, out,
                                                   HEALTH if scenario == "health" else REDUCTIONS + NORMS, around_step)
    gen = torch.Generator().manual_seed(rank)  # each rank its own data
    collectives = []
    for step in range(STEPS):
        before = hook._sharded.groups.collectives
        if owned:
            hook.set_mode(smd.modes.TRAIN)
            hook.begin_step()
        x, y = torch.randn(4, 5, generator=gen), torch.randn(4, 1, generator=gen)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if scenario == "inplace":  # weights changed in place after the forward read them (not by the optimizer)
            with torch.no_grad():
                for param in model.parameters():
                    param.to_local().mul_(1.5)
        if scenario == "health":  # the gradients too, past the limits
            with torch.no_grad():
                for param in model.parameters():
                    param.grad.to_local().mul_(1e5)
        if owned:
            hook.capture_parameters(optimizer)
        if not (owned and step == 1):
            optimizer.step()
        if owned:
            hook.end_step()
        hook._sharded.fence_gradients()  # the step's exchange is issued on the step pipeline: wait for it
        collectives.append(hook._sharded.groups.collectives - before)
    if scenario == "reductions":  # an EVAL step: weights captured at its forward
        model.eval()
        eval_reference()
        with torch.no_grad():
            model(torch.randn(2, 5, generator=gen))
    hook.close()
    save_reference()
    with open(os.path.join(out, f"collectives_{rank}.json"), "w") as f:
        json.dump({"per_step": collectives, "parameters": len(list(model.parameters())),
                   "total": hook._sharded.groups.collectives}, f)
    dist.barrier()


def worker(rank, out_base, port, world, scenarios):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    for scenario in scenarios:
        run(scenario, out_base, rank, world)
    dist.destroy_process_group()


if __name__ == "__main__":
    base, port, world, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
    mp.spawn(worker, args=(base, port, world, names), nprocs=world)
