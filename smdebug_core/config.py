"""Configuration from the environment and from the JSON hook config file.

The JSON file (``SMDEBUG_CONFIG_FILE_PATH``, else SageMaker's default path) holds
``LocalPath``, ``HookParameters`` and ``CollectionConfigurations`` (docs/format.md 7).
Parsing turns it into keyword arguments for a Hook plus per-collection settings, with
every value checked: a malformed file fails at once with a message naming the key and
value; unknown keys are reported in one warning instead of being silently ignored.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .environment import on_sagemaker, parse_bool
from .layouts import LAYOUT_1034, LAYOUT_ENV
from .exceptions import ConfigError
from .flight_recorder_config import FlightRecorder
from .logger import get_logger
from .modes import ALL_MODES
from .reduction_config import ReductionConfig
from .save_config import SaveConfig, SaveConfigMode

logger = get_logger()

CONFIG_FILE_ENV = "SMDEBUG_CONFIG_FILE_PATH"
DEFAULT_CONFIG_FILE = "/opt/ml/input/config/debughookconfig.json"
DEFAULT_OUT_DIR = "/opt/ml/output/tensors"
TENSORBOARD_CONFIG_ENV = "TENSORBOARD_CONFIG_FILE_PATH"
DEFAULT_TENSORBOARD_CONFIG_FILE = "/opt/ml/input/config/tensorboardoutputconfig.json"
CHECKPOINT_CONFIG_ENV = "CHECKPOINT_CONFIG_FILE_PATH"
DEFAULT_CHECKPOINT_CONFIG_FILE = "/opt/ml/input/config/checkpointconfig.json"
METRICS_DIR_ENV = "SAGEMAKER_METRICS_DIRECTORY"

_SAVE_KEYS = ("save_interval", "start_step", "end_step", "save_steps")
_MODE_PREFIXES = {m.name.lower(): m for m in ALL_MODES}
_HOOK_KEYS = {
    *_SAVE_KEYS, "reductions", "save_raw_tensor", "save_shape", "save_all", "include_regex",
    "include_workers", "export_tensorboard", "tensorboard_dir", "dry_run", "save_histogram", "overwrite",
    "flight_recorder", "layout", "overhead_budget",
}
_COLLECTION_KEYS = {*_SAVE_KEYS, "include_regex", "save_histogram", "reductions", "save_raw_tensor", "save_shape"}
_TOP_KEYS = {"LocalPath", "S3OutputPath", "S3Path", "HookParameters", "CollectionConfigurations",
             "RuleConfigurations", "ProfilingParameters"}


def _comma_list(value, what: str) -> List[str]:
    if isinstance(value, list):
        if not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{what} must be a comma-separated string or a list of strings, got {value!r}")
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a comma-separated string, got {value!r}")
    return [v.strip() for v in value.split(",") if v.strip()]


def _save_fields(params: Dict[str, Any], where: str):
    """Base and per-mode SaveConfigMode fields from flat ``[mode.]key`` parameters."""
    base, per_mode = {}, {}
    for key, value in params.items():
        prefix, dot, name = key.partition(".")
        if dot and prefix in _MODE_PREFIXES and name in _SAVE_KEYS:
            per_mode.setdefault(_MODE_PREFIXES[prefix], {})[name] = value
        elif key in _SAVE_KEYS:
            base[key] = value
    try:
        base_cfg = SaveConfigMode(**base)
        mode_cfgs = {m: SaveConfigMode(**v) for m, v in per_mode.items()}
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return base_cfg, mode_cfgs


def _save_config_from(params: Dict[str, Any], where: str) -> Optional[SaveConfig]:
    base, modes = _save_fields(params, where)
    if base == SaveConfigMode() and not modes:
        return None
    cfg = SaveConfig(**base.fields())
    cfg.mode_save_configs.update(modes)
    cfg.fields_from_hook = True  # docs/format.md 7.2: a JSON collection's keys override the hook's per field
    return cfg


def _reduction_config_from(params: Dict[str, Any], where: str) -> Optional[ReductionConfig]:
    if "reductions" not in params:
        ignored = [k for k in ("save_raw_tensor", "save_shape") if k in params]
        if ignored:
            logger.warning("smdebug config %s: %s has no effect without 'reductions'", where, ", ".join(ignored))
        return None
    try:
        return ReductionConfig.from_string(
            ",".join(_comma_list(params["reductions"], f"{where}.reductions")),
            save_raw_tensor=parse_bool(params.get("save_raw_tensor", False), f"{where}.save_raw_tensor"),
            save_shape=parse_bool(params.get("save_shape", False), f"{where}.save_shape"),
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _unknown(params: Dict[str, Any], allowed: set) -> List[str]:
    out = []
    for key in params:
        prefix, dot, name = key.partition(".")
        if key in allowed or (dot and prefix in _MODE_PREFIXES and name in _SAVE_KEYS):
            continue
        out.append(key)
    return out


@dataclass
class CollectionSettings:
    """One entry of CollectionConfigurations, parsed."""

    name: str
    include_regex: List[str] = field(default_factory=list)
    save_histogram: Optional[bool] = None
    reduction_config: Optional[ReductionConfig] = None
    save_config: Optional[SaveConfig] = None


@dataclass
class HookSettings:
    """A parsed JSON hook config: Hook keyword arguments plus collection settings."""

    out_dir: str
    hook_kwargs: Dict[str, Any]
    collections: List[CollectionSettings]
    source: str

    def apply_collections(self, manager) -> List[str]:
        """Create/update the configured collections; returns their names (to include)."""
        names = []
        for cs in self.collections:
            coll = manager.get(cs.name)
            if cs.include_regex:
                coll.include(cs.include_regex)
            if cs.save_histogram is not None:
                coll.save_histogram = cs.save_histogram
            if cs.reduction_config is not None:
                coll.reduction_config = cs.reduction_config
            if cs.save_config is not None:
                coll.save_config = cs.save_config
            names.append(cs.name)
        return names


def config_file_path(explicit: Optional[str] = None) -> str:
    return explicit or os.environ.get(CONFIG_FILE_ENV) or DEFAULT_CONFIG_FILE


def load_json(raw, what: str):
    """``json.loads`` for untrusted input: any failure, deep nesting included, is a ConfigError."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ConfigError(f"{what} is nested too deeply to be a valid file") from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{what} is not valid JSON: {exc}") from None


def load_hook_settings(path: Optional[str] = None) -> HookSettings:
    """Read and validate a JSON hook config (``SMDEBUG_CONFIG_FILE_PATH`` by default).

    Raises FileNotFoundError when the file does not exist and ConfigError when it is
    malformed (the message names the key and the offending value).
    """
    explicit = path
    path = config_file_path(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        if explicit is None and not os.environ.get(CONFIG_FILE_ENV):
            raise FileNotFoundError(
                f"no hook config: {CONFIG_FILE_ENV} is not set and SageMaker's default {path} does not exist; "
                f"set {CONFIG_FILE_ENV}=/path/to/config.json or pass the path to create_from_json_file()"
            ) from None
        where = "given" if explicit is not None else f"named by {CONFIG_FILE_ENV}"
        raise FileNotFoundError(f"the hook config file {where}, {path}, does not exist") from None
    doc = load_json(raw, f"hook config {path}")
    if not isinstance(doc, dict):
        raise ConfigError(f"hook config {path} must be a JSON object, got {type(doc).__name__}")
    unknown_top = [k for k in doc if k not in _TOP_KEYS]

    out_dir = doc.get("LocalPath") or DEFAULT_OUT_DIR
    if not isinstance(out_dir, str):
        raise ConfigError(f"hook config {path}: LocalPath must be a string, got {out_dir!r}")
    if doc.get("S3OutputPath") or doc.get("S3Path"):
        # As on SageMaker, the platform uploads LocalPath. To have the hook upload the run
        # itself, LocalPath may be a URL (s3://..., smdebug_core/storage/remote.py).
        logger.info("smdebug config: S3OutputPath is uploaded by the platform; tensors are written to %s", out_dir)

    params = doc.get("HookParameters")
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise ConfigError(f"hook config {path}: HookParameters must be an object, got {params!r}")
    where = f"{path}: HookParameters"
    kwargs: Dict[str, Any] = {}
    save_config = _save_config_from(params, where)
    if save_config is not None:
        kwargs["save_config"] = save_config
    reduction_config = _reduction_config_from(params, where)
    if reduction_config is not None:
        kwargs["reduction_config"] = reduction_config
    for key in ("save_all", "export_tensorboard", "dry_run", "overwrite"):
        if key in params:
            kwargs[key] = parse_bool(params[key], f"{where}.{key}")
    if "include_regex" in params:
        kwargs["include_regex"] = _comma_list(params["include_regex"], f"{where}.include_regex")
    if "include_workers" in params:
        kwargs["include_workers"] = params["include_workers"]
    if params.get("flight_recorder") is not None:  # docs/flight_recorder.md
        kwargs["flight_recorder"] = FlightRecorder.coerce(params["flight_recorder"], f"{where}.flight_recorder")
    if params.get("tensorboard_dir"):
        if not isinstance(params["tensorboard_dir"], str):
            raise ConfigError(f"{where}.tensorboard_dir must be a path string, got {params['tensorboard_dir']!r}")
        kwargs["tensorboard_dir"] = params["tensorboard_dir"]
    if params.get("overhead_budget") is not None:  # checked with the other hook arguments (capture/budget.py)
        kwargs["overhead_budget"] = params["overhead_budget"]
    if params.get("layout") is not None:
        kwargs["layout"] = params["layout"]
    elif os.path.abspath(path) == DEFAULT_CONFIG_FILE and not os.environ.get(LAYOUT_ENV):
        # SageMaker's managed Debugger rules read this run with smdebug 1.0.34's reader.
        kwargs["layout"] = LAYOUT_1034
    unknown_hook = _unknown(params, _HOOK_KEYS)

    entries = doc.get("CollectionConfigurations")
    entries = [] if entries is None else entries
    if not isinstance(entries, list):
        raise ConfigError(f"hook config {path}: CollectionConfigurations must be a list, got {entries!r}")
    collections, unknown_coll = [], []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("CollectionName"), str) \
                or not entry["CollectionName"]:
            raise ConfigError(
                f"hook config {path}: CollectionConfigurations[{i}] needs a string CollectionName, got {entry!r}"
            )
        name = entry["CollectionName"]
        cparams = entry.get("CollectionParameters")
        cparams = {} if cparams is None else cparams
        if not isinstance(cparams, dict):
            raise ConfigError(f"hook config {path}: CollectionParameters of {name!r} must be an object")
        cwhere = f"{path}: collection {name!r}"
        cs = CollectionSettings(name=name)
        if "include_regex" in cparams:
            cs.include_regex = _comma_list(cparams["include_regex"], f"{cwhere}.include_regex")
        if "save_histogram" in cparams:
            cs.save_histogram = parse_bool(cparams["save_histogram"], f"{cwhere}.save_histogram")
        cs.reduction_config = _reduction_config_from(cparams, cwhere)
        cs.save_config = _save_config_from(cparams, cwhere)
        unknown_coll += [f"{name}.{k}" for k in _unknown(cparams, _COLLECTION_KEYS)]
        collections.append(cs)

    unknown = unknown_top + [f"HookParameters.{k}" for k in unknown_hook] + \
        [f"CollectionParameters {k}" for k in unknown_coll]
    if unknown:
        logger.warning("smdebug config %s: ignoring unknown keys: %s", path, ", ".join(unknown))
    return HookSettings(out_dir=out_dir, hook_kwargs=kwargs, collections=collections, source=path)


def _local_path_from(env_name: str, default_file: str) -> Optional[str]:
    path = os.environ.get(env_name) or default_file
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ConfigError(f"{env_name} file {path} cannot be read: {exc}") from None
    doc = load_json(raw, f"{env_name} file {path}")
    local = doc.get("LocalPath") if isinstance(doc, dict) else None
    if not isinstance(local, str) or not local:
        raise ConfigError(f"{env_name} file {path} needs a string LocalPath, got {doc!r}")
    return local


def resolve_tensorboard_dir(out_dir: str, tensorboard_dir: Optional[str], export_tensorboard: bool) -> Optional[str]:
    """Where TensorBoard files go, or None (docs/format.md 6)."""
    if on_sagemaker():
        return _local_path_from(TENSORBOARD_CONFIG_ENV, DEFAULT_TENSORBOARD_CONFIG_FILE)
    if tensorboard_dir:
        return tensorboard_dir
    if export_tensorboard:
        if os.environ.get(TENSORBOARD_CONFIG_ENV):
            configured = _local_path_from(TENSORBOARD_CONFIG_ENV, DEFAULT_TENSORBOARD_CONFIG_FILE)
            if configured:
                return configured
        return os.path.join(out_dir, "tensorboard")
    return None


def checkpoint_dir() -> Optional[str]:
    """The checkpoint directory of a (spot) job, where step counters are persisted."""
    if not os.environ.get(CHECKPOINT_CONFIG_ENV) and not on_sagemaker():
        return None
    return _local_path_from(CHECKPOINT_CONFIG_ENV, DEFAULT_CHECKPOINT_CONFIG_FILE)
