"""smdebug 1.0.34's profiler is not part of smdebug-core (docs/migrating.md); only the helper
that training scripts import from it, ``smdebug.profiler.utils.str2bool``, is kept."""
