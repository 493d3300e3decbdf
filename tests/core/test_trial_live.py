"""Reading a run while another process is still writing it."""
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from smdebug.exceptions import StepNotYetAvailable
from smdebug.modes import ModeKeys
from smdebug.trials import StepState, create_trial

# The child writes steps 0..first_batch-1, waits for a "go" file, writes the rest, closes.
WRITER_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    from smdebug.collections import CollectionManager
    from smdebug.modes import ModeKeys
    from smdebug.storage.writer import RunWriter, StepData

    out_dir, go_file, first_batch, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    writer = RunWriter(out_dir, "worker_0")
    writer.write_collections(CollectionManager().to_json_bytes(num_workers=1))
    for step in range(total):
        if step == first_batch:
            deadline = time.monotonic() + 60
            while not os.path.exists(go_file):
                if time.monotonic() > deadline:
                    sys.exit("parent never said go")
                time.sleep(0.02)
        value = np.full((64, 64), step, dtype=np.float32)
        writer.submit(StepData(step, ModeKeys.TRAIN, step, "worker_0", tensors=[("w", value), ("b", value[0])]))
        writer.flush(timeout=30)
    assert writer.close(timeout=30)
    """
)


@pytest.fixture
def writer_process(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER_SCRIPT)
    run, go = tmp_path / "run", tmp_path / "go"
    procs = []

    def start(first_batch, total):
        proc = subprocess.Popen([sys.executable, str(script), str(run), str(go), str(first_batch), str(total)])
        procs.append(proc)
        return str(run), str(go), proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def test_values_read_while_another_process_writes(writer_process):
    run, go, proc = writer_process(first_batch=3, total=6)
    trial = create_trial(run, wait_timeout=60)  # may open before the writer has written anything
    trial.wait_for_steps([2], timeout=60)
    assert proc.poll() is None  # still running, waiting for "go"
    assert trial.steps() == [0, 1, 2]
    assert not trial.training_ended()
    assert trial.has_passed_step(4) is StepState.NOT_YET_AVAILABLE
    with pytest.raises(StepNotYetAvailable):
        trial.tensor("w").value(4)
    np.testing.assert_array_equal(trial.tensor("w").value(2), np.full((64, 64), 2, np.float32))

    open(go, "wb").close()
    trial.wait_for_steps([5], timeout=60)
    deadline = time.monotonic() + 60
    while not trial.training_ended():
        assert time.monotonic() < deadline, "end marker never seen"
        time.sleep(0.05)
    assert proc.wait(timeout=60) == 0
    assert trial.steps() == list(range(6))
    values = trial.tensor("w").values()
    assert sorted(values) == list(range(6))
    for step, value in values.items():
        assert value.shape == (64, 64) and np.all(value == step)
    assert trial.steps(mode=ModeKeys.TRAIN) == list(range(6))


def test_concurrent_reads_never_see_partial_files(writer_process):
    run, go, proc = writer_process(first_batch=0, total=150)
    open(go, "wb").close()
    trial = create_trial(run, wait_timeout=60)
    seen_steps = 0
    deadline = time.monotonic() + 120
    while True:
        ended = trial.training_ended()
        if trial.has_tensor("b"):
            for step, value in trial.tensor("b").values().items():
                assert value.shape == (64,) and np.all(value == step)
            seen_steps = len(trial.steps())
        if ended:
            break
        assert time.monotonic() < deadline, "writer did not finish"
    assert proc.wait(timeout=60) == 0
    assert seen_steps == 150 and trial.steps() == list(range(150))
    assert os.path.exists(os.path.join(run, "training_job_end.ts"))


def test_a_new_trial_flushes_a_hook_of_this_process_once(tmp_path):
    """Opening a run that a hook of this process writes flushes that hook's ended steps
    once (before the collections are looked for), not again for the first read."""
    import smdebug as smd
    from smdebug.storage import open_runs

    run = str(tmp_path / "run")
    hook = smd.Hook(out_dir=run, save_config=smd.SaveConfig(save_interval=1))
    flushes = []

    class Counter:  # open_runs keeps weak references to bound methods
        def flush(self, timeout):
            flushes.append(timeout)

    counter = Counter()
    open_runs.register([run], counter.flush)
    try:
        for step in range(3):
            hook.begin_step()
            hook.save_scalar("loss", 1.0 / (step + 1))
        hook.begin_step()  # steps 0-2 have ended
        trial = create_trial(run)
        assert len(flushes) == 1
        assert trial.steps() == [0, 1, 2]
    finally:
        open_runs.unregister(counter.flush)
        hook.close()
