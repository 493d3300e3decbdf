"""smdebug for MXNet Gluon: ``import smdebug.mxnet as smd``.

``smd.Hook`` saves parameters, gradients, block inputs/outputs and losses of a Gluon
training loop (``hook.register_block(net)``, ``hook.register_loss(loss_fn)``); the
configuration classes are the core's own objects, re-exported here.
"""
from smdebug import create_trial, modes
from smdebug.collections import Collection, CollectionKeys
from smdebug.modes import ModeKeys
from smdebug.reduction_config import ReductionConfig
from smdebug.hook import del_hook, set_hook
from smdebug.save_config import SaveConfig, SaveConfigMode

from .backend import MXNetBackend
from .hook import Hook, TrainingStopRequested, get_hook

__all__ = [
    "Collection", "CollectionKeys", "Hook", "MXNetBackend", "ModeKeys", "ReductionConfig", "SaveConfig",
    "SaveConfigMode", "TrainingStopRequested", "create_trial", "del_hook", "get_hook", "modes", "set_hook",
]
