"""Capture for the Keras backends without TensorFlow's graph capture (torch, JAX).

The KerasHook's wrappers (optimizer ``apply``, layers' ``call``, ``compute_loss``...) offer
tensors here; they are recorded at once on saved steps, as numpy arrays.
"""
from __future__ import annotations

import sys
import weakref

from .base import logger


def is_traced(value) -> bool:
    """Whether ``value`` is a JAX tracer: a placeholder inside ``jax.jit``, with no values to copy."""
    jax_core = getattr(sys.modules.get("jax"), "core", None)
    tracer = getattr(jax_core, "Tracer", None)
    return tracer is not None and isinstance(value, tracer)


class EagerCapture:
    """Capture for Keras backends without TensorFlow's graph capture (torch, JAX): record at
    once, on saved steps. Under JAX, Keras compiles the train and predict steps with
    ``jax.jit`` (unless ``run_eagerly=True``): what the wrappers see there are tracers,
    which are skipped, with one warning per tensor name."""

    def __init__(self, hook):
        self._hook = weakref.proxy(hook)
        self._warned_traced: set = set()

    def offer(self, key, named) -> None:
        hook = self._hook
        if not (hook.session.enabled and hook.session.saving_step and hook._step_active):
            return
        for name, value in named:
            if value is None or not hook.session.plans.wants(name):
                continue
            if is_traced(value):
                if name not in self._warned_traced:
                    self._warned_traced.add(name)
                    logger.warning("smdebug: %s is computed inside a jax.jit-compiled step, where it has no values "
                                   "to save; it is not saved (compile the model with run_eagerly=True to save it)",
                                   name)
                continue
            hook.session.inbox.record(name, hook._host_or_tensor(value))

    def arm(self) -> None:
        pass

    def collect(self, extra=()) -> None:
        hook = self._hook
        for name, value in extra:  # tracked variables read when the step began
            hook.session.inbox.record(name, value)

    def disarm_all(self) -> None:
        pass
