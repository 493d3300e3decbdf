"""smdebug 1.0.34's ``smdebug.core.save_config``: the names of :mod:`smdebug.save_config`."""
from ..save_config import DEFAULT_SAVE_INTERVAL, SaveConfig, SaveConfigMode

#: 1.0.34's name of the default interval.
DEFAULT_SAVE_CONFIG_INTERVAL = DEFAULT_SAVE_INTERVAL

__all__ = ["DEFAULT_SAVE_CONFIG_INTERVAL", "SaveConfig", "SaveConfigMode"]
