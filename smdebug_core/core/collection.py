"""smdebug 1.0.34's ``smdebug.core.collection``: the names of :mod:`smdebug.collections`."""
from ..collections import Collection, CollectionKeys

__all__ = ["Collection", "CollectionKeys"]
