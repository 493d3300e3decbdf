"""smdebug 1.0.34's module for ``Rule``: ``from smdebug.rules.rule import Rule``."""
from ..analysis.rules.rule import Rule, invoke_rule

__all__ = ["Rule", "invoke_rule"]
