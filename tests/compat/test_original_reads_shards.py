"""The ORIGINAL smdebug 1.0.34 reads a run whose workers saved pieces of sharded tensors.

Each worker of an FSDP run with ``include_workers="all"`` saves its own piece of a full
tensor, and the piece's place in the full tensor goes to an extra top-level key of the
step's index file (``shard_placements``, docs/format.md 3.3). The original must read every
worker's piece as an ordinary tensor; our Trial reassembles the full tensor. Written here
with the numpy hook and ``note_placement`` (what the PyTorch adapter calls), so the test
needs no torch in either environment.
"""
import numpy as np

import smdebug as smd
from compat_json import decode_array
from compat_runner import load_json, ranked_hook, run_original
from smdebug.trials import create_trial

FULL = np.arange(15, dtype=np.float32).reshape(3, 5)
PIECES = {0: (FULL[:2], [0, 0]), 1: (FULL[2:], [2, 0])}



def test_original_reads_each_workers_piece_and_we_reassemble_the_full_tensor(original_python, tmp_path):
    run_dir = tmp_path / "run"
    for rank, (piece, offsets) in PIECES.items():
        hook = ranked_hook(rank, out_dir=str(run_dir), include_workers="all",
                          save_config=smd.SaveConfig(save_interval=1))
        assert hook.begin_step()
        hook.save_tensor("w", piece, "weights")
        hook.session.inbox.note_placement("w", {"global_shape": [3, 5], "local_shape": list(piece.shape), "offsets": offsets})
        hook.close()
    dump = tmp_path / "original_reads.json"
    run_original(original_python, "original_dump_trial.py", run_dir, dump, cwd=tmp_path)
    got = load_json(dump)["tensors"]["w"]["at"]["0"]
    assert got["workers"] == ["worker_0", "worker_1"]
    for rank, (piece, _) in PIECES.items():
        np.testing.assert_array_equal(decode_array(got["by_worker"][f"worker_{rank}"]["value"]), piece)
    ours = create_trial(str(run_dir)).tensor("w")
    np.testing.assert_array_equal(ours.value(0), FULL)
    np.testing.assert_array_equal(ours.value(0, worker="worker_1"), FULL[2:])
