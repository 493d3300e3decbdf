"""Zero code change for the unified ``lightning`` package (``import lightning as L``): the
same as :mod:`._instrument` for ``lightning.pytorch.Trainer``, which is a class of its own
(the entry point names ``lightning.pytorch``, imported when the script uses it)."""
from __future__ import annotations

from ._instrument import LightningInstrumentor


class UnifiedLightningInstrumentor(LightningInstrumentor):
    distribution = "lightning"
    package = "lightning.pytorch"


INSTRUMENTOR = UnifiedLightningInstrumentor()
instrument, uninstrument, is_instrumented = \
    INSTRUMENTOR.instrument, INSTRUMENTOR.uninstrument, INSTRUMENTOR.is_instrumented
