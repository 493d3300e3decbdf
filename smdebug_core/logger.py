"""The "smdebug" logger.

As a library we add no handlers: warnings reach stderr through Python's last-resort
handler unless the application configures logging. ``SMDEBUG_LOG_LEVEL`` (debug, info,
warning, error, critical, off) sets the level.
"""
import logging
import os

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR, "critical": logging.CRITICAL, "off": logging.CRITICAL + 10}


def get_logger(name: str = "smdebug") -> logging.Logger:
    """The library's logger (or a child of it), its level taken once from the environment."""
    root = logging.getLogger("smdebug")
    if not getattr(root, "_smdebug_configured", False):
        root._smdebug_configured = True
        level = os.environ.get("SMDEBUG_LOG_LEVEL", "").strip().lower()
        if level in _LEVELS:
            root.setLevel(_LEVELS[level])
    return root if name == "smdebug" else root.getChild(name.split("smdebug.", 1)[-1])
