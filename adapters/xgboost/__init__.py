"""smdebug for XGBoost: ``import smdebug.xgboost as smd``.

``smd.Hook`` is an ``xgboost.callback.TrainingCallback``: pass it in ``callbacks=[hook]``
to ``xgb.train`` or to a scikit-learn estimator. Collections: ``metrics`` (saved by
default, every 10 rounds), ``hyperparameters``, ``predictions``, ``labels``,
``feature_importance``, ``average_shap``, ``full_shap``, ``trees``.
"""
from smdebug import create_trial, modes
from smdebug.collections import Collection, CollectionKeys
from smdebug.modes import ModeKeys
from smdebug.reduction_config import ReductionConfig
from smdebug.hook import del_hook, set_hook
from smdebug.save_config import SaveConfig, SaveConfigMode

from .hook import Hook, get_hook

__all__ = [
    "Collection", "CollectionKeys", "Hook", "ModeKeys", "ReductionConfig", "SaveConfig", "SaveConfigMode",
    "create_trial", "del_hook", "get_hook", "modes", "set_hook",
]
