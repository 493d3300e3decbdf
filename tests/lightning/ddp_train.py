"""Two-process Lightning DDP (gloo, CPU) with the DebuggerCallback; run by test_lightning_ddp.py.

Lightning's DDP strategy starts rank 1 by running this script again. Each rank prints
its trainer's global step and rank as JSON.
Usage: python ddp_train.py OUT_DIR INCLUDE_WORKERS [STOP_AT]
With STOP_AT, rank 0 alone asks to stop at that optimizer step (as a rule firing on one
rank does); every rank must stop at the same step.
"""
import json
import os
import sys

import torch
from pytorch_lightning import Callback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lightning_helpers import TinyModule, loader, trainer
from smdebug.lightning import DebuggerCallback, SaveConfig

class RankZeroAsksToStop(Callback):
    def __init__(self, callback, at):
        self.callback, self.at = callback, at

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_rank == 0 and trainer.global_step == self.at and not self.callback.hook.stop_requested:
            self.callback.hook.request_stop("rank 0 alone asks (test)")


if __name__ == "__main__":
    out_dir, include_workers = sys.argv[1], sys.argv[2]
    stop_at = int(sys.argv[3]) if len(sys.argv) > 3 else None
    torch.manual_seed(0)
    callback = DebuggerCallback(out_dir=out_dir, include_workers=include_workers,
                                include_collections=["weights", "gradients", "losses"],
                                save_config=SaveConfig(save_interval=1))
    callbacks = [callback] if stop_at is None else [callback, RankZeroAsksToStop(callback, stop_at)]
    t = trainer(callbacks, strategy="ddp", devices=2, accumulate_grad_batches=2)
    t.fit(TinyModule(), loader(8 if stop_at is None else 48))
    callback.close()
    # A file per rank (in the working directory): the ranks' stdout lines may interleave.
    with open(f"report_{t.global_rank}.json", "w") as f:
        json.dump({"rank": t.global_rank, "global_step": t.global_step, "worker": callback.hook.worker_name}, f)
