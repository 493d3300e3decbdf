"""Two-process Trainer run under torchrun (gloo, CPU) with the DebuggerCallback; run by
test_transformers_ddp.py. Each rank prints its rank, global step and worker name as JSON.
Usage: torchrun --nproc_per_node 2 ddp_train.py OUT_DIR
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_helpers import make_trainer
from smdebug.transformers import DebuggerCallback, SaveConfig

if __name__ == "__main__":
    import pathlib

    out_dir = sys.argv[1]
    callback = DebuggerCallback(out_dir=out_dir, include_workers="all", include_collections=["gradients"],
                                save_config=SaveConfig(save_interval=1))
    trainer = make_trainer(pathlib.Path(out_dir).parent, [callback], train_n=32, gradient_accumulation_steps=2,
                           ddp_backend="gloo")
    trainer.train()
    callback.close()
    # A file per rank: the ranks' stdout lines may interleave.
    rank = trainer.args.process_index
    with open(f"report_{rank}.json", "w") as f:
        json.dump({"rank": rank, "global_step": trainer.state.global_step, "worker": callback.hook.worker_name}, f)
