"""Zero-code-change entry for ``import keras``: the same instrumentation as :mod:`._instrument`.

It exists because the bootstrap runs each instrumentor module once, and ``import keras``
imports TensorFlow before Keras is usable: the TensorFlow trigger then waits for this one.
"""
from ._instrument import instrument, is_instrumented, uninstrument

__all__ = ["instrument", "is_instrumented", "uninstrument"]
