"""Two-process DDP training (gloo, CPU), run by test_pytorch_distributed.py.

``python ddp_train.py <dir_one> <dir_all> <port>``:

1. both ranks train 2 steps with ``include_workers="one"`` into ``dir_one`` and close;
2. both ranks train 3 steps with ``include_workers="all"`` into ``dir_all``; then rank 0
   alone runs 2 evaluation steps and exits without closing its hook (as if still
   running): no end-of-training marker, so steps 3 and 4 stay incomplete.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import smdebug.pytorch as smd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pt_helpers import batches, make_model


def train_steps(ddp, loss_fn, optimizer, data):
    for x, y in data:
        optimizer.zero_grad()
        loss_fn(ddp(x), y).backward()
        optimizer.step()


def worker(rank, dir_one, dir_all, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    model = make_model(seed=0)
    ddp = DistributedDataParallel(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = batches(5, seed=rank)  # each rank its own shard

    for out_dir, workers, n_steps in ((dir_one, "one", 2), (dir_all, "all", 3)):
        hook = smd.Hook(out_dir=out_dir, include_workers=workers, save_config=smd.SaveConfig(save_interval=1),
                        include_collections=["weights", "gradients", "losses"])
        hook.register_module(ddp)
        hook.register_loss(loss_fn)
        assert hook.worker_name == f"worker_{rank}" and hook.world_size == 2
        train_steps(ddp, loss_fn, optimizer, data[:n_steps])
        if workers == "one":
            hook.close()
            dist.barrier()
    dist.barrier()
    if rank == 0:
        ddp.eval()
        with torch.no_grad():  # no collective: rank 0 runs these steps alone
            for x, _ in batches(2, seed=9):
                ddp(x)
        hook.end_step()
        hook.flush()  # the step pipeline and the writer finish on their own threads
        dist.destroy_process_group()
        os._exit(0)  # no close(): no training_job_end.ts
    hook.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1], sys.argv[2], int(sys.argv[3])), nprocs=2, join=True)
