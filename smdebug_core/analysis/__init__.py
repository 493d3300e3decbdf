"""Analysis: reading runs (``trials``), judging them (``rules``), showing them (``plots``,
the ``smdebug`` command). It reads runs through :mod:`smdebug.storage` and never imports
:mod:`smdebug.capture`. ``smdebug.analysis.utils`` is smdebug 1.0.34's module path.
"""
