"""Values from the environment: ``SMDEBUG_*`` variables and the strings that mean true or false.

Below every other module: the JSON config, the storage timeouts and the hook's on/off
switch all read the environment the same way.
"""
from __future__ import annotations

import os
from typing import Optional

from .exceptions import ConfigError

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f"}


def env_value(name: str, default: Optional[str] = None) -> Optional[str]:
    """Read ``SMDEBUG_<name>`` or ``<name>`` (both spellings exist in the wild)."""
    for key in (f"SMDEBUG_{name}", name):
        value = os.environ.get(key)
        if value is not None and value.strip() != "":
            return value.strip()
    return default


def env_int(name: str, default: int) -> int:
    value = env_value(name)
    if value is None:
        return default
    try:
        return int(float(value))
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} must be an integer") from None


def env_nonnegative_float(name: str, default: float, unit: str = "") -> float:
    """Environment variable ``name`` (exact spelling) as a number >= 0, ``default`` when unset;
    ConfigError (a ValueError) naming the variable and its value otherwise."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not a number{unit}") from None
    if not value >= 0:  # NaN too
        raise ConfigError(f"environment variable {name}={raw!r} must be >= 0")
    return value


def parse_bool(value, what: str) -> bool:
    """A JSON bool, or one of the usual strings ("true", "False", "1", ...)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(f"{what} must be true or false, got {value!r}")


def smdebug_enabled() -> bool:
    """False when ``USE_SMDEBUG`` says so (0/false/no/off). Unset means enabled."""
    value = os.environ.get("USE_SMDEBUG")
    if value is None or value.strip() == "":
        return True
    return parse_bool(value, "environment variable USE_SMDEBUG")


def on_sagemaker() -> bool:
    return bool(os.environ.get("TRAINING_JOB_NAME"))
