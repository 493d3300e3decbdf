"""Checking and converting built-in rule parameters.

SageMaker passes every rule parameter as a string and the CLI does too, so each converter
accepts the Python value or its string form, and fails fast naming the parameter, the bad
value and what is allowed.
"""
from __future__ import annotations

import ast
import math
import re
from typing import Optional, Tuple

from ...exceptions import ConfigError
from ...modes import ModeKeys


def _fail(rule: str, param: str, value, allowed: str):
    raise ConfigError(f"{rule}: {param}={value!r} is not valid; {allowed}")


def str_list(rule: str, param: str, value) -> Tuple[str, ...]:
    """None, a comma-separated string, or a list of strings -> a tuple of non-empty strings."""
    if value is None:
        return ()
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        _fail(rule, param, value, "expected a list of strings or a comma-separated string")
    out = []
    for item in items:
        if not isinstance(item, str):
            _fail(rule, param, value, "expected a list of strings or a comma-separated string")
        if item.strip():
            out.append(item.strip())
    return tuple(out)


def regex_list(rule: str, param: str, value) -> Tuple[str, ...]:
    """Like str_list, each entry compiled once to check it."""
    patterns = str_list(rule, param, value)
    for p in patterns:
        try:
            re.compile(p)
        except re.error as exc:
            _fail(rule, param, value, f"{p!r} is not a valid regular expression ({exc})")
    return patterns


def number(rule: str, param: str, value, *, minimum: Optional[float] = None, maximum: Optional[float] = None,
           exclusive_minimum: bool = False, allow_none: bool = False, integer: bool = False):
    """A float (or int with ``integer``) from a number or its string form, range-checked."""
    if value is None:
        if allow_none:
            return None
        _fail(rule, param, value, "a number is required")
    if isinstance(value, bool):
        _fail(rule, param, value, "expected a number, not a boolean")
    if isinstance(value, str):
        text = value.strip()
        if allow_none and text.lower() in ("none", "null", ""):
            return None
        try:
            value = float(text)
        except ValueError:
            _fail(rule, param, value, "expected a number")
    try:
        result = float(value)
    except (TypeError, ValueError):
        _fail(rule, param, value, "expected a number")
    if math.isnan(result):
        _fail(rule, param, value, "expected a number, not NaN")
    if integer:
        if not result.is_integer():
            _fail(rule, param, value, "expected a whole number")
        result = int(result)
    bounds = []
    if minimum is not None:
        bounds.append(f"{'>' if exclusive_minimum else '>='} {minimum:g}")
        if result < minimum or (exclusive_minimum and result == minimum):
            _fail(rule, param, value, f"it must be {' and '.join(bounds)}")
    if maximum is not None:
        bounds.append(f"<= {maximum:g}")
        if result > maximum:
            _fail(rule, param, value, f"it must be {' and '.join(bounds)}")
    return result


def boolean(rule: str, param: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    _fail(rule, param, value, "expected True or False")


def number_pair(rule: str, param: str, value) -> Tuple[float, float]:
    """``(low, high)`` from a pair or a string like ``"(-9.5, 9.5)"`` / ``"-9.5,9.5"``; low < high."""
    if isinstance(value, str):
        text = value.strip()
        try:
            parsed = ast.literal_eval(text if text.startswith(("(", "[")) else f"({text})")
        except (ValueError, SyntaxError):
            _fail(rule, param, value, "expected two numbers (low, high)")
        value = parsed
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        _fail(rule, param, value, "expected two numbers (low, high)")
    low = number(rule, param, value[0])
    high = number(rule, param, value[1])
    if not low < high:
        _fail(rule, param, value, "low must be smaller than high")
    return (low, high)


def mode(rule: str, param: str, value) -> Optional[ModeKeys]:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    try:
        return ModeKeys.parse(value.strip() if isinstance(value, str) else value)
    except (ValueError, KeyError, TypeError, AttributeError):
        _fail(rule, param, value, "expected one of TRAIN, EVAL, PREDICT, GLOBAL")
