"""A hook failure never stops training: one warning, the hook switches off, fit completes."""
import logging
import shutil

import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402

import smdebug.tensorflow as smd  # noqa: E402
from smdebug.tensorflow.backend import TFBackend  # noqa: E402
from smdebug.tensorflow.capture import GraphCapture, SpecializedFunction  # noqa: E402

from conftest import make_model  # noqa: E402



def fit(model, hook, data, extra_callbacks=()):
    x, y = data
    return model.fit(x, y, batch_size=2, epochs=2, validation_data=(x[:4], y[:4]),
                     callbacks=[hook, *extra_callbacks], verbose=0)


def test_out_dir_deleted_mid_fit(tmp_path, data, caplog, smdebug_warnings):
    out = tmp_path / "run"
    hook = smd.KerasHook(out_dir=out, save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights", "gradients"])

    class DeleteOutDir(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1 and out.exists():
                hook.flush(timeout=10)
                shutil.rmtree(out)

    with caplog.at_level(logging.WARNING, logger="smdebug"):
        history = fit(make_model(), hook, data, [DeleteOutDir()])
        hook.close()
    assert len(history.history["loss"]) == 2 and len(history.history["val_loss"]) == 2
    assert not hook.enabled
    warnings = smdebug_warnings()
    assert len(warnings) == 1 and "No such file or directory" in warnings[0].getMessage()
    assert not out.exists()


def test_exception_in_the_backend(tmp_path, data, caplog, monkeypatch, smdebug_warnings):
    def broken(self, requests):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(TFBackend, "materialize", broken)
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["weights"])
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        history = fit(make_model(), hook, data)
        hook.close()
    assert len(history.history["loss"]) == 2
    warnings = smdebug_warnings()
    assert len(warnings) == 1 and "injected failure" in warnings[0].getMessage()
    assert not hook.enabled


def test_exception_while_wrapping_a_compiled_step(tmp_path, data, caplog, monkeypatch, smdebug_warnings):
    def broken(self, key, named):
        raise ValueError("injected trace-time failure")

    monkeypatch.setattr(GraphCapture, "_add_graph_capture", broken)
    hook = smd.KerasHook(out_dir=tmp_path / "run", save_config=smd.SaveConfig(save_interval=1),
                         include_collections=["gradients", "layers"])
    model = make_model()
    with caplog.at_level(logging.WARNING, logger="smdebug"):
        history = fit(model, hook, data)
        # Disabled while tracing its own train function: Keras' function took over for the rest.
        assert not isinstance(model.train_function, SpecializedFunction)
        hook.close()
    assert len(history.history["loss"]) == 2
    warnings = smdebug_warnings()
    assert len(warnings) == 1 and "injected trace-time failure" in warnings[0].getMessage()
