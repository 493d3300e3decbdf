"""``str2bool`` under 1.0.34's module path: training scripts parse their flags with it."""
from ..environment import parse_bool


def str2bool(value) -> bool:
    """``True``/``False`` as they are; a string such as ``"true"``, ``"0"``, ``"yes"`` as its
    truth value; anything else raises ValueError naming it (as 1.0.34's did)."""
    return parse_bool(value, "str2bool's argument")


__all__ = ["str2bool"]
