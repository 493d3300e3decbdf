"""Keras 3 on the JAX backend (tox env ``keras-jax``): KERAS_BACKEND is set before Keras is imported.
Skipped where JAX is not installed, or where Keras was already imported with another backend."""
import os

import pytest

os.environ["KERAS_BACKEND"] = "jax"
pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip(f"Keras already runs on {keras.backend.backend()!r} in this process", allow_module_level=True)
