"""Step sinks: the consumers of finished steps, behind one small protocol.

The session makes each saved step's records once (:class:`~.step_records.FinishedStep`, read-only)
and hands them to its sinks in order, on the step pipeline's worker. A sink may narrow what
the sinks after it see by returning a new step (the flight recorder keeps a step that only it
wanted, and lets the writer have its scalars alone; the writer's sink returns the step marked
written), never by changing the one it got. A new consumer is a new sink; the session's step
logic does not change.

* :class:`RecorderSink` - the flight recorder: keeps steps, fires on non-finite values;
* :class:`MetricLinesSink` - SageMaker metric lines;
* :class:`WriterSink` - the run's files (the writer thread writes them);
* :class:`DryRunSink` - a log line per step instead of files;
* :class:`StepCountersSink` - step counters kept across restarts (spot training);
* :class:`StepListeners` - live rules: they see a step's values after the sinks, outside the
  recorder's lock (a rule's action may fire the recorder while the step waits for it).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from typing import Callable, List, Optional, Protocol

from .. import config as cfg
from ..logger import get_logger
from ..storage.step_data import StepData
from .flight_recorder import Recorder, step_nbytes
from .step import StepValues
from .step_records import FinishedStep

logger = get_logger()


class StepSink(Protocol):
    """A consumer of finished steps. ``on_step`` runs on the step pipeline's worker, one step
    at a time in step order; it must not block on training. It returns the step the sinks
    after it get when that differs (a new :class:`FinishedStep`), else None."""

    def on_step(self, step: FinishedStep) -> Optional[FinishedStep]:
        ...


class RecorderSink:
    """The flight recorder's side of each step: keep it in the ring (a step the save config
    skips) or note that it was saved; fire when a value is NaN or Inf. First of the sinks."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder

    def on_step(self, step: FinishedStep) -> Optional[FinishedStep]:
        recorder, identity = self.recorder, step.identity
        if step.ring_only:
            # Kept whole (scalars too); now only the scalars are written, as without the recorder.
            kept = step.tensors + [(tag, array) for _, tag, array in step.timed]
            try:
                self._keep(step, kept)
            except Exception as exc:  # noqa: BLE001 - costs the recorder, not the hook: this step is written
                recorder.disable(f"keeping step {identity[0]}: {type(exc).__name__}: {exc}")
                return replace(step, ring_only=False, nonfinite=None)
            tensors_from, tb_from, metrics_from = step.scalars_from
            step = replace(step, tensors=step.tensors[tensors_from:], shapes=[], tb_scalars=step.tb_scalars[tb_from:],
                           tb_histograms=[], metrics=step.metrics[metrics_from:])
        else:
            recorder.keep_saved(identity, step.probe)
        if step.nonfinite:
            bad = step.nonfinite
            marker = recorder.fire("nonfinite", f"{bad[0]} holds NaN or Inf at step {identity[0]}", identity, bad,
                                   step.probe)
            if step.ring_only and marker is not None and identity[0] in marker["steps_written"]:
                step = replace(step, tensors=[], timed=[])  # its scalars were written with the kept step
        return step

    def _keep(self, step: FinishedStep, tensors: list) -> None:
        global_step, mode, mode_step = step.identity
        # Placements too: a kept piece of a sharded tensor is reassembled like a saved one.
        data = StepData(global_step=global_step, mode=mode, mode_step=mode_step, worker=step.worker,
                        tensors=tensors, shapes=step.shapes, wall_time=time.time(), placements=step.placements)
        self.recorder.keep(step.identity, data, step_nbytes(tensors, step.shapes), step.probe)


class MetricLinesSink:
    """SageMaker Metrics lines (``$SAGEMAKER_METRICS_DIRECTORY``): appended by the writer
    thread (training never waits on that file), or here when there is no writer (dry runs).
    A directory that cannot be written costs the lines (one warning), not the hook."""

    def __init__(self, writer=None):
        self.writer = writer
        self._failed = False

    def on_step(self, step: FinishedStep) -> None:
        directory = os.environ.get(cfg.METRICS_DIR_ENV)
        if not step.metrics or not directory or self._failed:
            return
        path = os.path.join(directory, f"smdebug_{os.getpid()}.json")
        lines = [json.dumps({"MetricName": name, "Value": value, "Timestamp": timestamp or time.time(),
                             "IterationNumber": step.identity[0]}) for name, value, timestamp in step.metrics]
        if self.writer is not None:
            for line in lines:
                self.writer.write_metric_line(path, line)
            return
        try:
            os.makedirs(directory, exist_ok=True)
            with open(path, "a", encoding="utf-8") as handle:
                handle.write("".join(line + "\n" for line in lines))
        except OSError as exc:
            self._failed = True
            logger.warning("smdebug: cannot write SageMaker metric lines to %s=%s (%s); tensors are still saved, "
                           "metric lines are not", cfg.METRICS_DIR_ENV, directory, exc.strerror or exc)


class WriterSink:
    """The step's files: its records to the writer (timed scalars as records of their own),
    then the collections file with the run's first saved step. A writer that has failed
    takes nothing more; ``on_failure`` reports it (the session then disables capture)."""

    def __init__(self, writer, on_failure: Callable[[str], None]):
        self.writer = writer
        self.on_failure = on_failure

    def on_step(self, step: FinishedStep) -> Optional[FinishedStep]:
        writer = self.writer
        if writer.failed is not None:
            self.on_failure(f"writer failed: {writer.failed}")
            return None
        global_step, mode, mode_step = step.identity
        timed = step.timed
        if step.tensors or step.shapes or not step.ring_only:  # a kept step may have nothing to write now
            writer.submit(StepData(
                global_step=global_step, mode=mode, mode_step=mode_step, worker=step.worker, tensors=step.tensors,
                shapes=step.shapes, tb_scalars=step.tb_scalars, tb_histograms=step.tb_histograms,
                wall_time=time.time(), placements=step.placements,
            ), publish=not timed)  # the step is complete: readers may see it as soon as it is on disk
        for i, (wall_time, tag, array) in enumerate(timed):  # same step, one record each with its time
            writer.submit(StepData(
                global_step=global_step, mode=mode, mode_step=mode_step, worker=step.worker, tensors=[(tag, array)],
                tb_scalars=[(tag, float(array.reshape(-1)[0]))] if array.size == 1 else [], wall_time=wall_time,
            ), publish=i == len(timed) - 1)
        if step.collections is not None:
            writer.write_collections(step.collections)
        return replace(step, written=True)


class DryRunSink:
    """``dry_run=True``: one log line per step saying what would be saved."""

    def on_step(self, step: FinishedStep) -> None:
        global_step, mode, mode_step = step.identity
        logger.info("dry run: step %d (%s %d) would save %d records", global_step, mode.name, mode_step,
                    len(step.tensors) + len(step.shapes))


class StepCountersSink:
    """After a step the writer took: its counters, so that a run killed later resumes after it."""

    def __init__(self, save: Callable[[tuple], None]):
        self.save = save

    def on_step(self, step: FinishedStep) -> None:
        if step.written and not step.ring_only:
            self.save(step.identity)


class StepListeners:
    """Callables given each saved step's :class:`~.step.StepValues` (live rules), after the
    sinks. A listener that raises is removed with one warning; ``close()`` closes those that
    can be (live rules finish their reports)."""

    def __init__(self):
        self._listeners: List[Callable[[StepValues], None]] = []

    def __bool__(self) -> bool:
        return bool(self._listeners)

    def add(self, listener) -> None:
        self._listeners.append(listener)

    def remove(self, listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def notify(self, values: Optional[StepValues]) -> None:
        if values is None:
            return
        for listener in list(self._listeners):
            try:
                listener(values)
            except Exception as exc:  # noqa: BLE001 - a listener's failure costs that listener
                logger.warning("smdebug: step listener %r failed and was removed: %s", listener, exc)
                self.remove(listener)

    def close(self) -> None:
        close_each(list(self._listeners), "step listener")


def close_each(items, what: str) -> None:
    """Close each of ``items`` that can be closed; a failure is one warning naming it (closing
    must not raise into training, nor keep the others open)."""
    for item in items:
        try:
            close = getattr(item, "close", None)
            if callable(close):
                close()
        except Exception as exc:  # noqa: BLE001 - one item's failure costs that item
            logger.warning("smdebug: %s %r failed to close: %s", what, item, exc)


class AddedSinks:
    """Sinks added by ``hook.add_sink`` (``smdebug.sinks.WandbSink``...): appended to the
    session's sinks, so they see each step after the run's own; ``close()`` closes those that
    can be, at the session's close (a sink's own close must wait boundedly)."""

    def __init__(self, sinks: list):
        self._sinks = sinks
        self._added: list = []

    def add(self, sink) -> None:
        self._sinks.append(sink)
        self._added.append(sink)

    def close(self) -> None:
        close_each(self._added, "sink")
