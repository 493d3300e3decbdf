"""Writing a run: the background :class:`RunWriter` and the TensorBoard writer.

The hook builds one :class:`StepData` per (global step, worker) and hands it to
:meth:`RunWriter.submit`; everything else happens on the writer's own thread.
"""
from ..step_data import StepData
from .run_writer import DEFAULT_MAX_PENDING_BYTES, RunWriter
from .tensorboard import TensorBoardWriter

__all__ = ["DEFAULT_MAX_PENDING_BYTES", "RunWriter", "StepData", "TensorBoardWriter"]
