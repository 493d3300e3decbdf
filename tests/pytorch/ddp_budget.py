"""Two-process DDP training (gloo, CPU) with an overhead budget, run by test_overhead_budget.py.

``python ddp_budget.py <run_dir> <port>``: both ranks write (``include_workers="all"``) and save
weights and gradients every step under a budget of 5%. Rank 1 charges its budget 20 ms more
per step than it spends (as a slower rank would measure), so the two ranks' local costs
disagree; each rank writes its decisions to ``<run_dir>/decisions-<rank>.json``.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import smdebug.pytorch as smd

STEPS = 65
EXTRA_COST_RANK_1 = 0.02


def worker(rank, run_dir, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    ddp = DistributedDataParallel(model)
    hook = smd.Hook(out_dir=run_dir, include_workers="all", save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "losses"],
                    reduction_config=smd.ReductionConfig(reductions=["mean"], norms=["l2"]),
                    overhead_budget={"fraction": 0.05, "max_factor": 16})
    hook.register_module(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    budget = hook.session.budget
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = ddp(torch.randn(16, 4, generator=gen)).pow(2).mean()
        loss.backward()
        optimizer.step()
        if rank == 1:
            budget.charge(EXTRA_COST_RANK_1)  # this rank's own measurement says the hook costs more
    hook.close()
    with open(os.path.join(run_dir, f"decisions-{rank}.json"), "w") as fh:
        json.dump([{"step": d.global_step, "local": list(d.local), "agreed": list(d.agreed), "level": d.level}
                   for d in budget.history], fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], int(sys.argv[2])), nprocs=2, join=True)
