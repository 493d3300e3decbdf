"""Training phases.

Every saved step belongs to one mode. The hook keeps a global step (counting every
step whatever the mode) and one step counter per mode, each starting at 0.
``smd.modes.TRAIN`` and ``smd.ModeKeys.TRAIN`` are the same object.
"""
import enum


class ModeKeys(enum.Enum):
    """The phase a step belongs to; values match the on-disk enum numbers."""

    TRAIN = 1
    EVAL = 2
    PREDICT = 3
    GLOBAL = 4

    # Members are singletons compared by identity: hash them by identity too, in C
    # (Enum's own __hash__ is Python code, and per-mode dicts are looked up at every step).
    __hash__ = object.__hash__

    @classmethod
    def parse(cls, value):
        """Accept a ModeKeys, its name in any case ("train"), or its number."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        allowed = ", ".join(m.name for m in cls)
        raise ValueError(f"unknown mode {value!r}; allowed: {allowed}")


TRAIN = ModeKeys.TRAIN
EVAL = ModeKeys.EVAL
PREDICT = ModeKeys.PREDICT
GLOBAL = ModeKeys.GLOBAL
ALL_MODES = (TRAIN, EVAL, PREDICT, GLOBAL)
