"""Helpers for analysing runs, under the module names of smdebug 1.0.34 (``smdebug.analysis.utils``)."""
