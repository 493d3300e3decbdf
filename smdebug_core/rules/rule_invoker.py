"""smdebug 1.0.34's module for ``invoke_rule``: ``from smdebug.rules.rule_invoker import invoke_rule``."""
from ..analysis.rules.rule import invoke_rule

__all__ = ["invoke_rule"]
