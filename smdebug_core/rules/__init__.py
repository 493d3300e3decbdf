"""smdebug 1.0.34's import path for rules: the names of :mod:`smdebug.analysis.rules`.

``from smdebug.rules import Rule, invoke_rule`` and the other names resolve there on first
use, so this package adds no second copy of any class.
"""
from ..analysis import rules as _rules


def __getattr__(name):
    return getattr(_rules, name)


def __dir__():
    return dir(_rules)


__all__ = list(_rules.__all__)
