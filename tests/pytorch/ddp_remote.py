"""Two-process DDP training (gloo, CPU) into one S3 prefix, run by test_pytorch_remote.py.

``python ddp_remote.py <url> <port> <steps>``: both ranks train with
``include_workers="all"`` into ``url`` (each through its own spool and uploader) and close;
rank 1 closes a little later, so the chief's end marker has to wait for its upload. The
endpoint comes from the environment (AWS_ENDPOINT_URL), as for any boto3 user.
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import smdebug.pytorch as smd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pt_helpers import batches, make_model


def worker(rank, url, port, steps):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    ddp = DistributedDataParallel(make_model(seed=0))
    loss_fn = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    hook = smd.Hook(out_dir=url, include_workers="all", save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["weights", "gradients", "losses"])
    hook.register_module(ddp)
    hook.register_loss(loss_fn)
    for x, y in batches(steps, seed=rank):
        optimizer.zero_grad()
        loss_fn(ddp(x), y).backward()
        optimizer.step()
    dist.barrier()
    if rank == 1:
        time.sleep(1.0)  # the chief closes first: its end marker must wait for this worker
    hook.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])), nprocs=2, join=True)
