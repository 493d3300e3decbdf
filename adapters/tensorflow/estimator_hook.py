"""EstimatorHook: kept so that old scripts fail with a clear message.

``tf.estimator`` was removed in TensorFlow 2.16. Constructing this hook raises
:class:`~smdebug.exceptions.ConfigError` naming the replacements.
"""
from smdebug.exceptions import ConfigError

ESTIMATOR_REMOVED = (
    "smd.EstimatorHook cannot be used: tf.estimator no longer exists in TensorFlow 2.16 and later. "
    "Use smd.KerasHook as a callback of model.fit/evaluate/predict, or hook.wrap_tape(tf.GradientTape()) "
    "(with hook.wrap_optimizer(optimizer)) in a custom training loop; for tf.compat.v1 graph code run "
    "with MonitoredSession, use smd.SessionHook."
)


class EstimatorHook:
    """Placeholder for the original ``smd.EstimatorHook``; constructing it raises ConfigError."""

    def __init__(self, *args, **kwargs):
        raise ConfigError(ESTIMATOR_REMOVED)

    @classmethod
    def create_from_json_file(cls, *args, **kwargs):
        raise ConfigError(ESTIMATOR_REMOVED)
