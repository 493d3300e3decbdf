"""The XGBoost hook: a ``smdebug.Hook`` that is also an ``xgboost.callback.TrainingCallback``.

Pass it in ``callbacks=[hook]`` to ``xgb.train`` / ``xgb.cv`` or to a scikit-learn
estimator (``XGBClassifier(callbacks=[hook])``). Each boosting round is one step: the
round number, in the hook's current mode (GLOBAL unless ``set_mode`` says otherwise). A
hook reused for another training continues after its last step. With ``xgb.cv`` only the
metrics (the mean over folds) are saved.

What a round costs: on rounds the save configuration skips, the hook does one
``begin_step`` and nothing else. On saved rounds it records the metrics from
``evals_log`` and computes each of the other collections (SHAP values, trees, feature
importance, predictions, hyperparameters) only when at least one of its tensor names is
in the step's plan, and not at all on a worker that writes nothing
(``include_workers="one"`` and not the chief).

The step of the last round stays open after ``after_iteration`` so that a callback
placed after the hook can add tensors to the same round; ``after_training`` ends it and
flushes. The hook stays usable for another training; ``hook.close()`` (or interpreter
exit) writes the end-of-training marker. When a rule's action calls ``request_stop``,
``after_iteration`` tells xgboost to stop after the current round.

Values, as 1.0.34 saved them: metrics and hyperparameters are float64 arrays of one
element (non-numeric hyperparameters one-element string arrays); feature importances are
each feature's share of its type's total; ``full_shap/<f>`` is the whole
``predict(pred_contribs=True)`` matrix (bias column last) under every feature's name, and
``average_shap/<f>`` the signed mean of column ``f`` over the rows of ``train_data``.
``full_shap/bias`` and ``average_shap/bias`` are in no collection but ``all``. Ours:
``average_abs_shap/<f>``, the mean absolute SHAP value (the usual global importance).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import numpy as np
import xgboost as xgb
from xgboost.callback import TrainingCallback

from smdebug.collections import CollectionKeys, FrameworkProfile
from smdebug.exceptions import ConfigError
from smdebug.capture.contract import Worker
from smdebug.hook import Hook as CoreHook
from smdebug.hook import takes_hook_arguments
from smdebug.hook import get_hook as _core_get_hook
from smdebug.logger import get_logger

from . import _collect

logger = get_logger("smdebug.xgboost")
K = CollectionKeys


def _check_data(value, what: str, labels_required: bool) -> None:
    """Fail fast on a data argument the hook could not use later."""
    if value is None or isinstance(value, xgb.DMatrix):
        return
    if isinstance(value, (str, bytes)) or hasattr(value, "__fspath__"):
        raise ConfigError(f"{what} must be an xgboost.DMatrix or an (X, y) pair, got the path {value!r}; "
                          "load the file into a DMatrix first")
    if isinstance(value, tuple):
        if len(value) != 2 or value[0] is None:
            raise ConfigError(f"{what} must be an xgboost.DMatrix or an (X, y) pair, got a tuple of "
                              f"{len(value)} item(s)")
        if labels_required and value[1] is None:
            raise ConfigError(f"{what} needs labels: give (X, y) with y not None")
        return
    if labels_required:
        raise ConfigError(f"{what} must be an xgboost.DMatrix or an (X, y) pair (labels are needed), got "
                          f"{type(value).__name__}")
    if not hasattr(value, "shape"):
        raise ConfigError(f"{what} must be an xgboost.DMatrix, an (X, y) pair or a 2-D array, got "
                          f"{type(value).__name__}")


#: The collections each computation of a round fills (Hook._compute's ``what``).
_COMPUTED_INTO = {"shap": (K.FULL_SHAP, K.AVERAGE_SHAP, K.AVERAGE_ABS_SHAP),
                  "predictions": (K.PREDICTIONS, K.LABELS)}


@takes_hook_arguments
class Hook(CoreHook, TrainingCallback):
    """Saves XGBoost metrics, hyperparameters, predictions, feature importance, SHAP values and trees.

    The default save interval is 10 rounds and the collection saved by default is ``metrics``.

    Args (XGBoost's own, keyword-only, after the hook arguments below):
        hyperparameters: dict saved as ``hyperparameters/<key>`` (numbers as float arrays,
            anything else as a one-element string array). When None, none are saved, as
            in 1.0.34 (one line says so when the collection is included).
        train_data: data for the SHAP collections (``full_shap``, ``average_shap``, ``average_abs_shap``): an
            ``xgboost.DMatrix``, an ``(X, y)`` pair, or ``X`` alone.
        validation_data: data for ``predictions`` and ``labels``: a ``DMatrix`` with
            labels or an ``(X, y)`` pair.
    """

    framework = "xgboost"
    profile = FrameworkProfile(
        "xgboost",
        {
            # The [a-zA-z] ranges are the original's and are kept for identical matching.
            CollectionKeys.HYPERPARAMETERS: (r"^hyperparameters/.*$",),
            CollectionKeys.METRICS: (r"^[a-zA-z]+-[a-zA-z0-9]+$",),
            CollectionKeys.LOSSES: (r"^[a-zA-z]+-.+(?<!(auc|map))$",),
            CollectionKeys.PREDICTIONS: (r"^predictions$",),
            CollectionKeys.LABELS: (r"^labels$",),
            CollectionKeys.FEATURE_IMPORTANCE: (r"^feature_importance/.*",),
            CollectionKeys.AVERAGE_SHAP: (r"^average_shap/.*[^/bias]$",),
            CollectionKeys.FULL_SHAP: (r"^full_shap/.*[^/bias]$",),
            CollectionKeys.TREES: (r"^trees/.*",),
        },
        (CollectionKeys.METRICS,),
        default_save_interval=10,
        # Ours, not 1.0.34's: it exists once asked for by name, so save_all ("all" includes
        # every collection) and the collections file stay as 1.0.34 had them.
        on_demand={CollectionKeys.AVERAGE_ABS_SHAP: (r"^average_abs_shap/",)},
    )

    def __init__(self, *args, hyperparameters: Optional[Dict[str, object]] = None, train_data=None,
                 validation_data=None, **kwargs):
        if hyperparameters is not None and not isinstance(hyperparameters, dict):
            raise ConfigError(f"hyperparameters must be a dict of name -> value, got {hyperparameters!r}")
        _check_data(train_data, "train_data", labels_required=False)
        _check_data(validation_data, "validation_data", labels_required=True)
        TrainingCallback.__init__(self)
        # The adapter's own state first, then the session (which may call back into it).
        self.hyperparameters = dict(hyperparameters) if hyperparameters is not None else None
        self._train_data = train_data
        self._validation_data = validation_data
        # Which of "train"/"validation" came from an instrumented ``xgb.train`` call (and are
        # replaced at the next call) rather than from the user.
        self._adopted: set = set()
        self._dmatrices: Dict[str, xgb.DMatrix] = {}
        self._labels: Optional[np.ndarray] = None
        self._step_offset = 0
        self._early_stopping = None  # xgboost's EarlyStopping of the current training, if any
        self._last_round: Optional[int] = None
        self._evals_log = None
        self._names: Optional[Dict[str, List[str]]] = None
        self._failed: set = set()
        self._seen_metrics: set = set()
        super().__init__(*args, **kwargs)

    # --- data ---------------------------------------------------------------------------
    @property
    def train_data(self):
        """Data for the SHAP collections (DMatrix, (X, y) or X), or None."""
        return self._train_data

    @train_data.setter
    def train_data(self, value):
        _check_data(value, "train_data", labels_required=False)
        self._train_data = value
        self._dmatrices.pop("train", None)
        self._adopted.discard("train")

    @property
    def validation_data(self):
        """Data for ``predictions`` and ``labels`` (DMatrix or (X, y)), or None."""
        return self._validation_data

    @validation_data.setter
    def validation_data(self, value):
        _check_data(value, "validation_data", labels_required=True)
        self._validation_data = value
        self._dmatrices.pop("validation", None)
        self._labels = None
        self._adopted.discard("validation")

    def _adopt_training_data(self, dtrain, evals) -> None:
        """Zero-code-change: use the data of an ``xgb.train`` call where none was given.

        SHAP values are computed on ``dtrain``; predictions on the last evaluation set
        that is not ``dtrain`` (the one early stopping watches).
        """
        if self._train_data is None or "train" in self._adopted:
            self._train_data = dtrain
            self._dmatrices.pop("train", None)
            self._adopted.add("train")
        if self._validation_data is None or "validation" in self._adopted:
            self._validation_data = next((d for d, _ in reversed(list(evals or ())) if d is not dtrain), None)
            self._dmatrices.pop("validation", None)
            self._labels = None
            self._adopted.add("validation")

    def _dmatrix(self, which: str, booster) -> Optional[xgb.DMatrix]:
        if which in self._dmatrices:
            return self._dmatrices[which]
        data = self._train_data if which == "train" else self._validation_data
        if data is None:
            return None
        if isinstance(data, xgb.DMatrix):
            matrix = data
        else:
            features, labels = _collect.split_xy(data)
            matrix = xgb.DMatrix(features, label=labels)
            # A model trained on a DataFrame has feature names that plain arrays lack.
            if matrix.feature_names is None and booster.feature_names:
                matrix.feature_names = booster.feature_names
        self._dmatrices[which] = matrix
        return matrix

    # --- framework integration --------------------------------------------------------
    def worker(self) -> Worker:
        """Rank and world size from xgboost's collective communicator, when it is running."""
        try:
            collective = getattr(xgb, "collective", None)
            if collective is None:  # xgboost < 2.0
                collective = getattr(xgb, "rabit", None)
            if collective is not None and collective.is_distributed():
                return Worker.numbered(int(collective.get_rank()), int(collective.get_world_size()))
        except Exception as exc:  # noqa: BLE001 - a broken communicator must not stop training
            logger.warning("smdebug: could not read the xgboost rank (%s); assuming a single worker", exc)
        return Worker.numbered(0, 1)

    def __deepcopy__(self, memo):
        # scikit-learn's clone() deep-copies estimator parameters, callbacks included. A hook
        # owns a run directory and a writer thread: a copy would be a second writer of the
        # same run, so the copy is the hook itself.
        return self

    def __copy__(self):
        return self

    def __reduce__(self):
        # Pickling an estimator (joblib.dump(model)) pickles its callbacks. The writer thread
        # cannot travel, so the hook pickles as an inert stand-in that says so if trained with.
        return DetachedHook, (self.out_dir,)

    def before_training(self, model):
        """Continue step numbering after the hook's last step when it is reused."""
        if self.session.enabled:
            self._step_offset = self.session.global_step + 1 if self.session.global_step >= 0 else 0
            self._names = None
            with self.guard("before_training"):
                self._early_stopping = _collect.early_stopping_beside(self)
                self._last_round = None
        return model

    def after_iteration(self, model, epoch: int, evals_log) -> bool:
        """One boosting round = one step. Returns True (stop training) only when a rule's
        action asked for it (:meth:`request_stop`)."""
        if self.session.enabled:
            self._last_round, self._evals_log = epoch, evals_log
            with self.guard("after_iteration"):
                if self.begin_step(epoch + self._step_offset):
                    self._record_round(model, evals_log)
        return self.session.stop_requested

    def after_training(self, model):
        """End the last step and hand everything to the writer; the hook stays open."""
        if self.session.enabled:
            self.end_step()
            with self.guard("after_training"):
                self._record_early_stopping(model)
                self.flush(timeout=60)
        return model

    def _record_early_stopping(self, model) -> None:
        """Early stopping is part of the run: what it monitored and where it stopped (the
        rules judge that metric and know the stop was intended)."""
        stopping = self._early_stopping
        if stopping is None or self._last_round is None or not isinstance(model, xgb.Booster):
            return
        record = _collect.early_stopping_record(stopping, model, self._evals_log, self._last_round, self._step_offset)
        if record is not None:
            self.record_early_stopping(**record)

    # --- one saved round --------------------------------------------------------------
    def _record_round(self, model, evals_log) -> None:
        self._record_metrics(evals_log)
        if not isinstance(model, xgb.Booster):
            return  # xgb.cv hands over its folds: only the (mean) metrics apply
        names = self._tensor_names(model)
        wanted = {group: self._saves_any(group_names) for group, group_names in names.items()}
        # Not a 1.0.34 collection: save_all ("all") does not bring it, naming it does.
        wanted["average_abs_shap"] = K.AVERAGE_ABS_SHAP in self.session.saving_collections
        if wanted["hyperparameters"]:
            self._compute("hyperparameters", self._hyperparameter_tensors, model)
        if wanted["validation"] and self._validation_data is not None:
            self._compute("predictions", self._validation_tensors, model)
        importance_types = [t for t in _collect.IMPORTANCE_TYPES if wanted[f"feature_importance/{t}"]]
        if importance_types:
            self._compute("feature_importance", _collect.feature_importance, model, importance_types)
        if (wanted["full_shap"] or wanted["average_shap"] or wanted["average_abs_shap"]) and \
                self._train_data is not None:
            self._compute("shap", self._shap_tensors, model, wanted["full_shap"], wanted["average_shap"],
                          wanted["average_abs_shap"])
        if wanted["trees"]:
            self._compute("trees", _collect.tree_tensors, model)

    def _record_metrics(self, evals_log) -> None:
        metrics = _collect.latest_metrics(evals_log)
        new = [n for n in metrics if n not in self._seen_metrics]
        if new:
            # Names like "validation_0-logloss" or "valid-ndcg@5" miss the original regexes:
            # metrics all, losses as that regex would (names ending in auc or map are scores).
            self._claim(K.METRICS, new)
            self._claim(K.LOSSES, [n for n in new if not n.endswith(("auc", "map"))])
            self._seen_metrics.update(new)
        for name, value in metrics.items():
            self.record(name, np.array([value], dtype=np.float64))

    def _compute(self, what: str, compute: Callable[..., Dict[str, np.ndarray]], *args) -> None:
        """Run one collection's computation; a failure skips that collection, not the others."""
        if what in self._failed:
            return
        try:
            tensors = compute(*args)
        except Exception as exc:  # noqa: BLE001 - one collection must not stop training or the rest
            self._failed.add(what)
            logger.warning("smdebug: could not compute %s at step %d (%s: %s); it is skipped for the rest of "
                           "this run, other collections are still saved", what, self.session.global_step,
                           type(exc).__name__, exc)
            for collection in _COMPUTED_INTO.get(what, (what,)):  # said once: no "matched nothing" as well
                self.session.nothing_to_save(collection, f"computing {what} failed")
            return
        for name, value in tensors.items():
            self.record(name, value)

    def _tensor_names(self, booster) -> Dict[str, List[str]]:
        """Every tensor name this training can produce, by group; built once per training."""
        if self._names is not None:
            return self._names
        features = _collect.feature_names(booster)
        settings = _collect.booster_training_params(booster)
        # A linear booster has no trees and only the "weight" importance.
        linear = settings.get("booster") == "gblinear"
        if linear:
            self.session.nothing_to_save(K.TREES, "a gblinear booster has no trees")
        if self.hyperparameters is None:
            self.session.nothing_to_save(
                K.HYPERPARAMETERS, "pass hyperparameters={...} to the Hook to save them (the booster's own settings "
                "are in booster.save_config())")
        # "bias" (the SHAP base value) is in no SHAP collection, as in 1.0.34: saved under save_all.
        shap_names = features + ["bias"]
        names = {
            "hyperparameters": [f"hyperparameters/{k}" for k in self.hyperparameters or {}],
            "validation": ["predictions", "labels"],
            "full_shap": [f"full_shap/{f}" for f in shap_names],
            "average_shap": [f"average_shap/{f}" for f in shap_names],
            "average_abs_shap": [f"average_abs_shap/{f}" for f in features],
            "trees": [] if linear else [f"trees/{c}" for c in _collect.TREE_COLUMNS],
        }
        for t in _collect.IMPORTANCE_TYPES:
            names[f"feature_importance/{t}"] = [] if linear and t != "weight" else \
                [_collect.importance_name(t, f) for f in features]
        # The original regexes miss some valid names (average_shap/full_shap end in
        # "[^/bias]$", which drops any feature ending in b, i, a or s): list those names
        # in their collection so membership is exact.
        self._claim(K.FULL_SHAP, names["full_shap"][:-1])
        self._claim(K.AVERAGE_SHAP, names["average_shap"][:-1])
        self._names = names
        return names

    def _saves_any(self, names) -> bool:
        """Whether a collection saved at this step holds one of ``names``. Asked of the
        collections, not of the plans: a name the hook asks a plan for counts as seen and
        would be listed in the collections file though never saved (a feature no tree uses)."""
        saving = self.session.saving_collections
        manager = self.session.collection_manager
        return any(c.name in saving for name in names for c in manager.collections_for(name))

    def _claim(self, collection: str, names) -> None:
        """Add to ``collection`` the names its regexes miss (only when it is saved at all)."""
        if collection not in self.session.include_collections:
            return
        coll = self.session.collection_manager.get(collection)
        for name in names:
            if not coll.matches(name):
                coll.add_tensor_name(name)

    def _hyperparameter_tensors(self, booster) -> Dict[str, np.ndarray]:
        return _collect.hyperparameters(self.hyperparameters or {})

    def _validation_tensors(self, booster) -> Dict[str, np.ndarray]:
        matrix = self._dmatrix("validation", booster)
        assert matrix is not None  # asked for only when there is validation data
        out = {}
        if self.session.plans.plan_for("predictions") is not None:
            out["predictions"] = booster.predict(matrix)
        if self.session.plans.plan_for("labels") is not None:
            if self._labels is None:
                self._labels = matrix.get_label()
            out["labels"] = self._labels
        return out

    def _shap_tensors(self, booster, full: bool, average: bool, average_abs: bool) -> Dict[str, np.ndarray]:
        contribs = _collect.shap_contributions(booster, self._dmatrix("train", booster))
        return _collect.shap_tensors(contribs, _collect.feature_names(booster), full, average, average_abs)


class DetachedHook(TrainingCallback):
    """What an smdebug hook becomes when pickled (with the estimator that holds it, say).

    It records nothing: training with it logs one warning. Create a new
    ``smd.Hook`` in the process that trains.
    """

    def __init__(self, out_dir: str):
        super().__init__()
        self.out_dir = out_dir
        self._warned = False

    def before_training(self, model):
        if not self._warned:
            self._warned = True
            logger.warning("smdebug: this XGBoost hook (out_dir %s) was unpickled from another process and "
                           "records nothing; create a new smdebug.xgboost.Hook to capture this training",
                           self.out_dir)
        return model

    def __repr__(self):
        return f"<DetachedHook out_dir={self.out_dir!r} (unpickled: records nothing)>"


def get_hook(json_config_path: Optional[str] = None, create_if_not_exists: bool = False) -> Optional[Hook]:
    """This process's XGBoost hook: the last one constructed, else (optionally) one from the JSON config.

    Returns None when ``USE_SMDEBUG`` disables smdebug or there is no config file.
    """
    return _core_get_hook(Hook, json_config_path=json_config_path, create_if_not_exists=create_if_not_exists)
