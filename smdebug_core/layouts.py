"""The names of the two ways a run can be stored, and the setting that picks one.

``"store"`` (the default) is the run store of docs/format.md section 10; ``"smdebug-1.0.34"``
is the ``events/`` + ``index/`` layout of sections 1-3, the one smdebug 1.0.34 and SageMaker's
managed rules read. A setting, below storage: the hook arguments and the JSON config check it.
"""
#: The value of the ``layout`` hook argument, JSON config key and ``$SMDEBUG_LAYOUT``.
STORE_LAYOUT = "store"
LAYOUT_1034 = "smdebug-1.0.34"
LAYOUTS = (STORE_LAYOUT, LAYOUT_1034)
#: What a hook writes unless told otherwise.
DEFAULT_LAYOUT = STORE_LAYOUT
#: The environment variable that picks the layout where the hook is not told.
LAYOUT_ENV = "SMDEBUG_LAYOUT"


def resolve_layout(layout=None) -> str:
    """``layout``, else ``$SMDEBUG_LAYOUT``, else the default; ValueError naming the setting
    and the choices for anything else."""
    import os

    if layout is not None:
        return validate_layout(layout)
    try:
        return validate_layout(os.environ.get(LAYOUT_ENV) or DEFAULT_LAYOUT)
    except ValueError as exc:
        raise ValueError(f"${LAYOUT_ENV}: {exc}") from None


def validate_layout(layout) -> str:
    """``layout`` if it names a layout a hook can write, else ValueError naming the choices."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(repr(x) for x in LAYOUTS)}, got {layout!r}: "
                         f"{STORE_LAYOUT!r} (the default) writes the run store, {LAYOUT_1034!r} the files "
                         "smdebug 1.0.34 and SageMaker's managed rules read")
    return layout
