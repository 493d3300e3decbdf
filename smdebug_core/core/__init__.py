"""smdebug 1.0.34's ``smdebug.core`` modules that user code imports (AWS's notebooks and the
original's TF2 tests): ``modes``, ``collection``, ``reduction_config``, ``save_config``. Each
re-exports this package's names; nothing here is a second copy (docs/migrating.md)."""
