"""smdebug: capture, reduce and analyse tensors during training.

``import smdebug as smd`` gives the framework-agnostic API (configs, collections, modes,
the numpy ``Hook`` for custom loops, ``create_trial``); ``import smdebug.pytorch as smd``
(or ``tensorflow``, ``mxnet``, ``xgboost``) gives the same plus that framework's hook.
"""
from . import modes
from ._version import __version__
from .collections import Collection, CollectionKeys
from .hook import Hook, get_hook
from .modes import ModeKeys
from .reduction_config import ReductionConfig
from .save_config import SaveConfig, SaveConfigMode


def create_trial(path=None, *args, **kwargs):
    """Open a run directory for analysis; see :func:`smdebug.trials.create_trial`."""
    from .trials import create_trial as _create_trial  # the reader is loaded only when used

    return _create_trial(path, *args, **kwargs)


__all__ = [
    "Collection", "CollectionKeys", "Hook", "ModeKeys", "ReductionConfig", "SaveConfig", "SaveConfigMode",
    "create_trial", "get_hook", "modes", "__version__",
]
