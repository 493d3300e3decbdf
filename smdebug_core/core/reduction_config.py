"""smdebug 1.0.34's ``smdebug.core.reduction_config``: the names of :mod:`smdebug.reduction_config`."""
from ..reduction_config import ALLOWED_NORMS, ALLOWED_REDUCTIONS, ReductionConfig

__all__ = ["ALLOWED_NORMS", "ALLOWED_REDUCTIONS", "ReductionConfig"]
