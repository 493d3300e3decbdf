"""The writer's outputs beside the run's data: TensorBoard summaries and metric lines.

Their failures cost only themselves: a TensorBoard error turns TensorBoard output off, a
metric file that cannot be written loses its lines, and the run's ``events/`` and
``index/`` files go on. Used by the writer thread only.
"""
import logging
import os

from ..step_data import iter_records
from .tensorboard import TensorBoardWriter, reduction_scalars

logger = logging.getLogger(__name__)


class TensorBoardOutput:
    """A step's TensorBoard scalars and histograms, and its saved reductions as scalars too
    (docs/format.md 6), under ``tensorboard_dir``; off after its first I/O error."""

    def __init__(self, tensorboard_dir):
        self.tensorboard_dir = tensorboard_dir
        self._writer = TensorBoardWriter(tensorboard_dir)

    def write_step(self, step):
        if self._writer is None:
            return
        reductions = reduction_scalars(iter_records(step.tensors))
        if not (step.tb_scalars or step.tb_histograms or reductions):
            return
        try:
            scalars = list(step.tb_scalars) + reductions if reductions else step.tb_scalars
            # Each mode is its own TensorBoard run, stepped by the mode's own step.
            self._writer.write_summaries(
                step.mode, step.global_step, scalars, step.tb_histograms, wall_time=step.wall_time,
                event_step=step.mode_step,
            )
        except OSError as exc:
            self._disable(exc)
        except Exception as exc:  # noqa: BLE001 - a bad value must not stop tensor saving
            logger.warning("smdebug skipped TensorBoard summaries of step %d: %s: %s",
                           step.global_step, type(exc).__name__, exc)

    def flush(self):
        if self._writer is not None:
            try:
                self._writer.flush()
            except OSError as exc:
                self._disable(exc)

    def close(self):
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError as exc:
                self._disable(exc)
            self._writer = None

    def abandon(self):
        """Close without a word (the writer failed and said so)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except OSError:
                pass

    def _disable(self, exc):
        logger.warning(
            "smdebug stops writing TensorBoard files to %s: %s: %s", self.tensorboard_dir, type(exc).__name__, exc
        )
        self.abandon()


class MetricLines:
    """Appends lines to text files outside the run directory (one warning per path that fails)."""

    def __init__(self):
        self._ready = set()  # paths whose directory exists (made at the first line)
        self._warned = set()

    def append(self, path, line):
        # Metric files live outside out_dir; losing them must not stop tensor saving.
        try:
            if path not in self._ready:
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                self._ready.add(path)
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(f"{line}\n")
        except OSError as exc:
            if path not in self._warned:
                self._warned.add(path)
                logger.warning("smdebug cannot append metrics to %s: %s: %s", path, type(exc).__name__, exc)
