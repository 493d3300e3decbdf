"""A broken output directory costs one warning; training always completes."""
import logging
import os
import shutil

import pytest

torch = pytest.importorskip("torch")

import smdebug.pytorch as smd  # noqa: E402
from pt_helpers import batches, make_model, train  # noqa: E402



def start(run_dir):
    model, loss_fn = make_model(), torch.nn.CrossEntropyLoss()
    hook = smd.Hook(out_dir=run_dir, save_config=smd.SaveConfig(save_interval=1), save_all=True)
    hook.register_module(model)
    hook.register_loss(loss_fn)
    return hook, model, loss_fn


def test_out_dir_removed_mid_run(run_dir, caplog, smdebug_warnings):
    hook, model, loss_fn = start(run_dir)
    completed = []
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        def after_step(i):
            completed.append(i)
            if i == 1:
                hook.flush()
                shutil.rmtree(run_dir)

        train(model, loss_fn, batches(6), after_step=after_step)
        hook.close()
    assert completed == list(range(6))
    assert not hook.enabled
    assert len(smdebug_warnings()) == 1, [r.getMessage() for r in smdebug_warnings()]
    assert not os.path.exists(run_dir)  # not silently recreated


def test_write_error_injected(run_dir, caplog, smdebug_warnings):
    hook, model, loss_fn = start(run_dir)
    for folder in ("events", "store"):  # neither layout's folder can be created: every write fails
        with open(os.path.join(run_dir, folder), "w"):
            pass
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        train(model, loss_fn, batches(4))
        hook.close()
    assert not hook.enabled
    assert len(smdebug_warnings()) == 1, [r.getMessage() for r in smdebug_warnings()]
    assert not os.path.exists(os.path.join(run_dir, "training_job_end.ts"))


@pytest.mark.parametrize("where", ["start_batch", "finish_batch"])  # training thread / pipeline worker
def test_error_inside_the_hook_disables_it_and_training_goes_on(run_dir, caplog, monkeypatch, where, smdebug_warnings):
    hook, model, loss_fn = start(run_dir)

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(hook.session.backend, where, broken)
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        train(model, loss_fn, batches(3))
        hook.close()
    assert not hook.enabled
    messages = [r.getMessage() for r in smdebug_warnings()]
    assert len(messages) == 1 and "injected" in messages[0]
    # Disabled hooks are removed at the next forward: nothing of smdebug runs any more.
    assert not model._forward_pre_hooks and not loss_fn._forward_hooks
