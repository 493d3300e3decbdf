"""Step sinks you add to a hook: what it saves, forwarded to the W&B or MLflow run you use.

    import smdebug as smd
    hook.add_sink(smd.sinks.WandbSink())    # the active wandb run (else wandb.init())
    hook.add_sink(smd.sinks.MlflowSink())   # the active MLflow run (else one created)

At each saved step the sink gets the step's scalars (losses, metrics, ``save_scalar``) and the
reductions of the chosen collections, grouped as :mod:`smdebug.trackers` describes. It is a
consumer behind the session's step-sink protocol (``on_step``), and it never blocks training:
``on_step`` only puts the step's numbers on a bounded queue; a daemon thread of its own sends
them in batches. A slow or failing tracking server costs one warning and dropped points,
counted in :attr:`TrackerSink.counts`, never a stall; :meth:`TrackerSink.close` (called by
``hook.close()``) waits at most ``close_timeout`` seconds for what is queued.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Optional

import numpy as np

from .logger import get_logger
from .reduction_config import REDUCTION_TAG_PREFIX
from .tracker_pacing import DEFAULT_COST_BUDGET, Pacing
from .trackers import MLFLOW_MAX_SERIES, MlflowDestination, StepPoints, TagParser, WandbDestination

logger = get_logger()

__all__ = ["TrackerSink", "WandbSink", "MlflowSink"]

_STOP = object()


class TrackerSink:
    """A step sink sending to a tracker ``destination`` (``open``/``send``/``close``) from a
    daemon thread. ``max_queue``: steps waiting at most (more are dropped, counted);
    ``batch_steps``: steps sent together at most; ``close_timeout``: seconds ``close`` waits;
    ``cost_budget``: the share of the time between steps that sending may cost (default 0.02;
    None: every step is sent, whatever it costs): past it, steps go in bins of 2, 4... steps,
    each sending the steps where a scalar is at its minimum or maximum, with every layer's
    most extreme statistic of the bin (:mod:`smdebug.tracker_pacing`)."""

    tool = "a tracker"

    def __init__(self, destination, *, max_queue: int = 1000, batch_steps: int = 64, close_timeout: float = 10.0,
                 cost_budget: Optional[float] = DEFAULT_COST_BUDGET):
        self.destination = destination
        self._pacing = Pacing(cost_budget, getattr(destination, "helper_cost", 0.0))
        self.batch_steps = int(batch_steps)
        self.close_timeout = float(close_timeout)
        self._queue: "queue.Queue" = queue.Queue(maxsize=int(max_queue))
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._waiting = 0  # steps queued and not yet handled (sent, dropped or failed)
        self._counts = {"steps": 0, "sent": 0, "dropped": 0, "failed_calls": 0}
        self._warned = False
        self._closed = False
        self._in_flight = 0  # points handed to the tool and not yet answered
        self._abandoned = False  # close() gave up waiting: what comes back later is not counted again
        self._parse = TagParser()
        self._thread = threading.Thread(target=self._run, name=f"smdebug-{type(self).__name__}", daemon=True)
        self._thread.start()

    @property
    def counts(self) -> dict:
        """``steps`` queued, points ``sent`` and ``dropped`` (a full queue, a failed call, the
        close timeout, the series cap), ``failed_calls``, ``dropped_series`` (names),
        ``folded`` (values not sent at their own step: see :mod:`smdebug.tracker_pacing`) and
        ``every`` (the steps per bin the pacing uses now; 1: every step is sent)."""
        with self._lock:
            out = dict(self._counts)
        out["dropped_series"] = len(self.destination.dropped_series)
        out["folded"], out["every"] = self._pacing.folded, self._pacing.every
        return out

    # --- the step-sink protocol (the step pipeline's worker, sometimes the training thread) ---
    def on_step(self, step) -> None:
        points = self._points(step)
        if not len(points):
            return
        if self._closed:
            self._drop(len(points), "the sink is closed")
            return
        try:
            self._queue.put_nowait(points)
        except queue.Full:
            self._drop(len(points), f"{self._queue.maxsize} steps are waiting for {self.tool}")
        else:
            with self._lock:
                self._counts["steps"] += 1
                self._waiting += 1

    def wait_idle(self, timeout: Optional[float] = None) -> bool:
        """Wait until every step queued so far has been handled (sent, dropped and counted, or
        held in the pacing's open bin, which goes out when the bin is full or at close);
        False when ``timeout`` seconds passed first. Training never calls it; benchmarks and
        tests that read the tool's run do."""
        with self._idle:
            return self._idle.wait_for(lambda: self._waiting == 0 or not self._thread.is_alive(), timeout)

    def _points(self, step) -> StepPoints:
        """The step's numbers, copied (nothing of the step is kept: its raw tensors may be big)."""
        global_step, mode, _ = step.identity
        points = StepPoints(global_step, mode.name, arrived=time.monotonic())
        scalars = points.scalars
        scalars += step.tb_scalars
        for _, tag, array in step.timed:
            if array.size == 1:
                scalars.append((tag, float(array.reshape(-1)[0])))
        for item in step.tensors:
            if not isinstance(item, tuple):  # a ScalarRun: reductions of a batch of tensors
                values = np.asarray(item.values, dtype=np.float64)
                for stat, tensors, positions in self._parse.groups(item.tags):
                    points.add_stats(stat, tensors, values[positions])
                continue
            tag, value = item
            parsed = self._parse(tag) if tag.startswith(REDUCTION_TAG_PREFIX) and getattr(value, "size", 1) == 1 \
                else None
            if parsed is not None:
                points.add_stats(parsed[0], (parsed[1],), [float(value)])
        return points

    # --- the sink's thread --------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            stop = item is _STOP  # then the pacing's open bin still goes out
            batch = [] if stop else [item]
            while not stop and len(batch) < self.batch_steps:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    stop = True
                    break
                batch.append(more)
            started = time.thread_time()
            handled, batch = len(batch), self._pacing.thin(batch, final=stop)
            n = self._in_flight = sum(len(p) for p in batch)
            try:
                left_out = self.destination.send(batch) if batch else 0
            except Exception as exc:  # noqa: BLE001 - a tracker's failure costs its points, not training
                with self._lock:
                    self._counts["failed_calls"] += 1
                if not self._abandoned:
                    self._drop(n, f"{type(exc).__name__}: {exc}")
            else:
                with self._lock:
                    if not self._abandoned:
                        self._counts["sent"] += n - left_out
                        self._counts["dropped"] += left_out
            self._in_flight = 0
            self._pacing.measured(handled, time.thread_time() - started)
            with self._idle:
                self._waiting -= handled
                self._idle.notify_all()
            if stop:
                return

    def _drop(self, n: int, why: str) -> None:
        with self._lock:
            self._counts["dropped"] += n
            warn, self._warned = not self._warned, True
        if warn:
            logger.warning("smdebug: values not sent to %s (%s); training goes on, and these points and later ones "
                           "that cannot be sent are dropped and counted in the sink's .counts (warned once)",
                           self.tool, why)

    def close(self, timeout: Optional[float] = None) -> bool:
        """Send what is queued, waiting at most ``timeout`` (default ``close_timeout``) seconds;
        then end the tool's run if the sink started it. Returns whether everything was handled."""
        if self._closed:
            return not self._thread.is_alive()
        self._closed = True
        timeout = self.close_timeout if timeout is None else timeout
        try:
            self._queue.put(_STOP, timeout=max(timeout, 0.01))
        except queue.Full:
            pass
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._abandoned = True
            left = self._in_flight
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    left += len(item)
            self._drop(left, f"{self.tool} did not take the queued values within {timeout:.0f} s at close")
            return False
        try:
            self.destination.close()
        except Exception as exc:  # noqa: BLE001 - closing must not raise into training
            logger.warning("smdebug: could not end the %s run: %s", self.tool, exc)
        return True


class WandbSink(TrackerSink):
    """Forwards the hook's values to W&B: ``hook.add_sink(smd.sinks.WandbSink())``.

    The run is ``wandb.run`` (call ``wandb.init`` first as usual), else one the sink starts
    on its thread with ``wandb.init(**init_kwargs)`` and finishes at ``hook.close()``.
    ``grouped``: each statistic's per-layer values at a step as one ``"histogram"`` (default)
    or ``"table"`` (tensor names kept; costs more); ``"series"`` logs one series per layer."""

    tool = "W&B"

    def __init__(self, grouped: str = "histogram", run=None, init_kwargs: Optional[dict] = None, **kwargs):
        super().__init__(WandbDestination(grouped=grouped, run=run, init_kwargs=init_kwargs), **kwargs)


class MlflowSink(TrackerSink):
    """Forwards the hook's values to MLflow: ``hook.add_sink(smd.sinks.MlflowSink())``.

    The run is ``run_id``, else the active run (``mlflow.start_run()``), else one the sink
    creates on its thread (in ``$MLFLOW_EXPERIMENT_NAME``, else the default experiment) and
    ends at ``hook.close()``. Per-layer statistics are metrics
    ``smdebug/reductions/<statistic>/<tensor>``, at most ``max_series`` of them (200)."""

    tool = "MLflow"

    def __init__(self, run_id: Optional[str] = None, max_series: int = MLFLOW_MAX_SERIES,
                 run_name: Optional[str] = None, **kwargs):
        super().__init__(MlflowDestination(run_id=run_id, max_series=max_series, run_name=run_name), **kwargs)
