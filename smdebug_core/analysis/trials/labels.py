"""How a saved reduction is named in tables, series and the ``smdebug`` command."""


def reduction_label(op: str, is_abs: bool) -> str:
    """The ``reduction`` column's text for a reduction key: ``l2``, ``abs_max``..."""
    return f"abs_{op}" if is_abs else op
