"""The "smdebug" logger.

As a library we add no handlers: warnings reach stderr through Python's last-resort
handler unless the application configures logging. ``SMDEBUG_LOG_LEVEL`` (debug, info,
warning, error, critical, off) sets the level; with info or debug, and no logging
configured by the application, those lines go to stderr too.
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
            if _LEVELS[level] < logging.WARNING and not logging.getLogger().handlers:
                # Asked for info or debug lines, which Python's last-resort handler drops:
                # they go to stderr, unless the application has configured logging itself.
                handler = logging.StreamHandler()
                handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
                root.addHandler(handler)
    return root if name == "smdebug" else root.getChild(name.split("smdebug.", 1)[-1])
