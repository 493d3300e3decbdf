"""smdebug 1.0.34's ``smdebug.core.modes``: the names of :mod:`smdebug.modes`."""
from ..modes import ALL_MODES, EVAL, GLOBAL, PREDICT, TRAIN, ModeKeys

#: 1.0.34's names for the modes and their names.
ALLOWED_MODES = list(ALL_MODES)
ALLOWED_MODE_NAMES = [mode.name for mode in ALL_MODES]


def str_to_mode_keys(mode_str: str) -> ModeKeys:
    """``"TRAIN"`` -> ``ModeKeys.TRAIN`` (1.0.34's helper; :meth:`ModeKeys.parse` names the allowed values)."""
    return ModeKeys.parse(mode_str)


__all__ = ["ALLOWED_MODES", "ALLOWED_MODE_NAMES", "EVAL", "GLOBAL", "ModeKeys", "PREDICT", "TRAIN", "str_to_mode_keys"]
