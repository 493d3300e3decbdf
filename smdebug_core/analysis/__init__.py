"""Analysis: reading runs (``trials``), judging them (``rules``), showing them (``plots``,
the ``smdebug`` command), comparing them (``compare``, from :mod:`.comparison`). It reads
runs through :mod:`smdebug.storage` and never imports :mod:`smdebug.capture`.
``smdebug.analysis.utils`` is smdebug 1.0.34's module path.
"""

_COMPARISON = ("compare", "Comparison", "Divergence", "plot_comparison")


def __getattr__(name):
    # Loaded when first used: ``import smdebug.analysis.cli`` stays light.
    if name in _COMPARISON:
        from . import comparison

        return getattr(comparison, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_COMPARISON])
