"""What each XGBoost collection holds, computed from a Booster with xgboost's public API.

Every function here returns ``{tensor name: numpy array}`` (names as in docs/format.md 8.4)
and touches only the values its caller asks for; the hook decides which collections are
worth computing at a given round. Nothing here knows about steps, plans or files.
"""
from __future__ import annotations

import json
import math
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from smdebug.capture.early_stopping import callbacks_beside

#: ``Booster.get_score`` importance types (all five since xgboost 0.81).
IMPORTANCE_TYPES = ("weight", "gain", "cover", "total_gain", "total_cover")
#: Columns of ``Booster.trees_to_dataframe()`` (xgboost 2.x and 3.x; "Category" since 1.6).
#: Used only to decide *whether* trees are wanted before building the table; the table's
#: actual columns are what gets saved.
TREE_COLUMNS = ("Tree", "Node", "ID", "Feature", "Split", "Yes", "No", "Missing", "Gain", "Cover", "Category")


def metric_name(dataset: str, metric: str) -> str:
    """``<dataset>-<metric>``, e.g. ``train-logloss`` (the original's metric tensor names)."""
    return f"{dataset}-{metric}"


def latest_metrics(evals_log) -> Dict[str, float]:
    """The latest value of every metric in an ``evals_log`` ({dataset: {metric: [values]}}).

    ``xgb.cv`` logs ``(mean, std)`` pairs; the mean is taken.
    """
    out = {}
    for dataset, metrics in evals_log.items():
        for metric, history in metrics.items():
            if not history:
                continue
            value = history[-1]
            if isinstance(value, (tuple, list)):
                value = value[0]
            out[metric_name(dataset, metric)] = float(value)
    return out


def _as_array(value) -> np.ndarray:
    """A hyperparameter value as a tensor: numbers as float64, anything else as one string."""
    if isinstance(value, (bool, np.bool_)):
        return np.array([float(value)])
    if isinstance(value, (int, float, np.integer, np.floating)):
        return np.array([float(value)])
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return np.array([value])
        # "nan"/"inf" spelled as words are settings, not numbers.
        return np.array([number]) if math.isfinite(number) else np.array([value])
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in value):
        return np.asarray(value, dtype=np.float64)
    return np.array([json.dumps(value) if isinstance(value, (list, tuple, dict)) else str(value)])


def hyperparameters(params: Dict[str, object]) -> Dict[str, np.ndarray]:
    """``hyperparameters/<k>`` for each entry of ``params``."""
    return {f"hyperparameters/{k}": _as_array(v) for k, v in params.items() if v is not None}


def booster_training_params(booster) -> Dict[str, str]:
    """The training parameters in effect, read from ``Booster.save_config()``.

    Takes every ``*_param`` section (learner, generic, booster, tree, objective
    parameters) except the ``*_model_param`` ones, which describe the fitted model
    (tree count, feature count), not a setting.
    """
    params: Dict[str, str] = {}

    def walk(node):
        if not isinstance(node, dict):
            return
        for key, value in node.items():
            if isinstance(value, dict):
                if key.endswith("_param") and not key.endswith("_model_param"):
                    params.update({k: v for k, v in value.items() if not isinstance(v, (dict, list))})
                else:
                    walk(value)

    walk(json.loads(booster.save_config()))
    return params


def feature_names(booster) -> List[str]:
    """The booster's feature names, or xgboost's defaults ``f0``, ``f1``, ..."""
    names = booster.feature_names
    if names:
        return list(names)
    return [f"f{i}" for i in range(booster.num_features())]


def importance_name(importance_type: str, feature: str) -> str:
    return f"feature_importance/{importance_type}/{feature}"


def feature_importance(booster, importance_types: Iterable[str]) -> Dict[str, np.ndarray]:
    """``feature_importance/<type>/<feature>`` for each of ``importance_types``: each
    feature's share of the type's total, as 1.0.34 saved them (they sum to 1 per type).

    ``get_score`` lists only features used in at least one split; the others have no
    importance and are not saved. (A linear booster has only ``weight``, one value per
    output, saved as given.)
    """
    out = {}
    for importance_type in importance_types:
        scores = booster.get_score(importance_type=importance_type)
        numbers = [v for v in scores.values() if np.ndim(v) == 0]
        total = float(sum(numbers)) if len(numbers) == len(scores) else 0.0
        for feature, score in scores.items():
            value = np.asarray(score, dtype=np.float64).reshape(-1)
            out[importance_name(importance_type, feature)] = value / total if total else value
    return out


def shap_contributions(booster, dmatrix) -> np.ndarray:
    """Per-sample SHAP values with the bias column last: (n, features + 1) or (n, outputs, features + 1)."""
    return booster.predict(dmatrix, pred_contribs=True)


def shap_tensors(contribs: np.ndarray, features: Sequence[str], full: bool, average: bool,
                 average_abs: bool = False) -> Dict[str, np.ndarray]:
    """``full_shap/<f>`` and ``average_shap/<f>`` for each feature and for ``bias``, as 1.0.34
    saved them: ``full_shap/<f>`` is the whole matrix of ``predict(pred_contribs=True)``
    (bias column last) under every name, ``average_shap/<f>`` the signed mean of column
    ``f`` over the samples (and outputs), which TreeSHAP makes close to 0 on the training
    data. ``average_abs_shap/<f>`` (ours, features only) is the mean absolute value, the
    usual global importance; one value per output for a multi-output model.
    """
    names = list(features) + ["bias"]
    if contribs.shape[-1] != len(names):
        raise ValueError(f"SHAP values have {contribs.shape[-1] - 1} features but the booster has {len(features)}")
    out = {}
    means = contribs.mean(axis=tuple(range(contribs.ndim - 1))) if average else None
    abs_means = np.abs(contribs).mean(axis=0) if average_abs else None
    for i, feature in enumerate(names):
        if full:
            out[f"full_shap/{feature}"] = contribs
        if means is not None:  # average asked for
            out[f"average_shap/{feature}"] = np.asarray([means[i]], dtype=np.float64)
        if abs_means is not None and i < len(features):  # average_abs asked for
            out[f"average_abs_shap/{feature}"] = np.asarray(abs_means[..., i], dtype=np.float64).reshape(-1)
    return out


def tree_tensors(booster) -> Dict[str, np.ndarray]:
    """``trees/<column>`` for each column of ``Booster.trees_to_dataframe()``.

    Numeric columns keep their dtype (NaN where a leaf has no split); text columns
    become 1-D string arrays with ``""`` for missing entries.
    """
    table = booster.trees_to_dataframe()
    out = {}
    for column in table.columns:
        series = table[column]
        if series.dtype.kind in "biuf":
            values = series.to_numpy()
        else:
            missing = series.isna().to_numpy()
            values = np.array(["" if gone else str(v) for v, gone in zip(series.tolist(), missing)], dtype=str)
        if values.size:
            out[f"trees/{column}"] = values
    return out


def split_xy(data) -> Tuple[object, Optional[object]]:
    """``(X, y)`` from a ``(X, y)`` pair; anything else is ``(data, None)``."""
    if isinstance(data, tuple) and len(data) == 2:
        return data[0], data[1]
    return data, None


def early_stopping_beside(callback) -> Optional[object]:
    """XGBoost's ``EarlyStopping`` in the same training's callback list as ``callback`` (the
    list xgboost's CallbackContainer holds: ``xgb.train(early_stopping_rounds=...)`` and the
    scikit-learn estimators append one), or None when training has no early stopping."""
    import xgboost as xgb

    kind = getattr(xgb.callback, "EarlyStopping", None)
    found = callbacks_beside(callback, kind) if kind is not None else []
    return found[0] if found else None


def early_stopping_record(stopping, booster, evals_log, last_round: int, step_offset: int) -> Optional[Dict]:
    """What ``stopping`` (an ``EarlyStopping``) did in a training that ended at ``last_round``:
    the record of ``Hook.record_early_stopping``; None when it never judged a round."""
    best = booster.attr("best_iteration") if hasattr(booster, "attr") else None
    if best is None or not evals_log:
        return None
    data = stopping.data or list(evals_log)[-1]
    metric = stopping.metric_name or list(evals_log.get(data, {}) or [""])[-1]
    best = int(best)
    score = booster.attr("best_score")
    return {"framework": "xgboost", "mechanism": "early_stopping_rounds", "monitor": metric_name(data, metric),
            "mode": "max" if stopping.maximize else "min", "patience": int(stopping.rounds),
            "best_step": best + step_offset, "best_pass": best,
            "best_value": float(score) if score is not None else None,
            "stopped_step": last_round + step_offset, "passes_after_best": last_round - best,
            "stopped": int(stopping.current_rounds) >= int(stopping.rounds)}
