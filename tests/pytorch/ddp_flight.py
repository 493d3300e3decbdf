"""Two-process DDP training (gloo, CPU) with the flight recorder, run by test_flight_recorder.py.

``python ddp_flight.py <run_dir> <port>``: both ranks write (``include_workers="all"``), save
every 100 steps and keep 3 steps; a module divides by ``K - step``, so both turn NaN at step K.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import smdebug.pytorch as smd

K = 4


class Divide(torch.nn.Module):
    denominator = 1.0

    def forward(self, x):
        return x / self.denominator


def worker(rank, run_dir, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), Divide(), torch.nn.Linear(8, 1))
    ddp = DistributedDataParallel(model)
    hook = smd.Hook(out_dir=run_dir, include_workers="all", save_config=smd.SaveConfig(save_interval=100),
                    reduction_config=smd.ReductionConfig(reductions=["mean"], norms=["l2"]),
                    flight_recorder=smd.FlightRecorder(steps=3))
    hook.register_module(ddp)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    for step in range(K + 2):
        model[1].denominator = float(K - step)
        optimizer.zero_grad()
        ddp(torch.randn(8, 4, generator=gen)).sum().backward()
        optimizer.step()
    hook.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], int(sys.argv[2])), nprocs=2, join=True)
