"""One worker of a two-process job without collectives, run by test_pytorch_distributed.py.

``RANK=r WORLD_SIZE=2 python early_worker.py <out_dir> <steps> <done_file> [<wait_for_file>]``:
creates its hook (include_workers="all"), saves ``steps`` steps, flushes, creates
``done_file``, then (if given) waits for ``wait_for_file`` before it closes its hook.
``out_dir`` may be a URL; with ``EARLY_WORKER_OVERWRITE=1`` the hook has ``overwrite=True``;
with ``EARLY_WORKER_HOOK_AFTER=<file>`` the hook is made only once that file exists (a rank
started with the others that reaches its hook late).
"""
import os
import sys
import time

import torch

import smdebug.pytorch as smd


def _wait_for(path):
    deadline = time.monotonic() + 60
    while path and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def main(out_dir, steps, done_file, wait_for=None):
    _wait_for(os.environ.get("EARLY_WORKER_HOOK_AFTER"))
    hook = smd.Hook(out_dir=out_dir, include_workers="all", save_config=smd.SaveConfig(save_interval=1),
                    overwrite=os.environ.get("EARLY_WORKER_OVERWRITE") == "1")
    assert hook.world_size == 2 and hook.worker_name == f"worker_{os.environ['RANK']}"
    for step in range(int(steps)):
        hook.begin_step()
        hook.save_tensor("x", torch.full((2,), float(step + 10 * hook.rank)), "mine")
    hook.end_step()
    hook.session.writer.flush()
    open(done_file, "w").close()
    _wait_for(wait_for)
    hook.close()
    assert hook.enabled, "the hook was disabled"


if __name__ == "__main__":
    main(*sys.argv[1:])
