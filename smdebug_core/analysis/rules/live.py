"""Rules evaluated inside the training process, on the values the hook has just saved.

``hook.add_rule(rule, actions=...)`` calls :func:`attach_rule`. The hook hands every saved
step's host values (``StepValues``: tensors and reductions, already computed for the writer)
to a step listener; the listener queues them for one background thread per hook, which
evaluates every attached rule on a :class:`~smdebug.analysis.rules.views.LiveStepView`. Nothing is
read back from disk and nothing is copied from the device again.

How far evaluation may fall behind training is ``max_lag_steps`` (saved steps):

* ``0``: the listener waits until the step it just handed over has been evaluated, so a
  StopTraining action is seen by the adapter at the very next step boundary (the triggering
  step is the last one that completes). The default when an action stops training. Since
  the training thread waits anyway, a step is evaluated on the training thread itself when
  nothing is queued (sparing two thread switches, about 0.1 ms).
* ``1`` (default otherwise): evaluation of step N overlaps step N+1; the listener waits
  only when the previous step is still being evaluated. A stop then lands one step later.
* ``None``: never wait (steps queue up; memory grows if rules are slower than training).

A failing rule is logged once and detached; it never breaks training.
"""
from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

from ...exceptions import ConfigError
from ...logger import get_logger
from ...modes import ModeKeys
from .actions import as_actions, stops_training
from .report import RuleReport, default_report_path
from .rule import Rule, _NoTrial, _other_view
from .views import LiveStepView

logger = get_logger("smdebug.rules")

#: Longest the training thread waits for a lagging evaluation before it gives up waiting (s).
DEFAULT_WAIT_TIMEOUT_S = 60.0
#: How often the evaluation thread checks time-based rules (StalledTrainingRule) when idle.
_IDLE_CHECK_S = 1.0

_runners: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_runners_lock = threading.Lock()


class LiveRule:
    """A rule attached to a hook (returned by ``hook.add_rule``).

    ``report`` is the rule's :class:`RuleReport`; ``triggered`` and ``violation_steps`` read
    it. :meth:`wait` blocks until every step handed over so far has been evaluated;
    :meth:`close` also finishes the report (``hook.close()`` does it for every attached rule).
    """

    def __init__(self, runner: "_LiveRunner", rule: Rule, actions, max_lag_steps: Optional[int]):
        self._runner = runner
        self.rule = rule
        self.actions = actions
        self.max_lag_steps = max_lag_steps
        self.active = True
        self.error: Optional[str] = None

    @property
    def report(self) -> RuleReport:
        return self.rule.report

    @property
    def triggered(self) -> int:
        return self.rule.report.triggered

    @property
    def violation_steps(self) -> List[int]:
        return self.rule.report.violation_steps

    @property
    def results(self) -> dict:
        """The report as a dict (see :mod:`smdebug.analysis.rules.report`)."""
        return self.rule.report.to_dict()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until the steps handed over so far are evaluated; False if ``timeout`` ran out."""
        return self._runner.wait(timeout)

    def close(self, timeout: Optional[float] = DEFAULT_WAIT_TIMEOUT_S) -> None:
        """Evaluate what is queued, detach the rule and write its final report."""
        self._runner.wait(timeout)
        self._runner.detach(self)

    def __repr__(self):
        state = "active" if self.active else f"detached ({self.error})" if self.error else "detached"
        return f"<LiveRule {self.rule.rule_name} {state} triggered={self.triggered}>"


class _LiveRunner:
    """One per hook: the step listener, the queue and the evaluation thread for its rules."""

    def __init__(self, hook):
        self._hook_ref = weakref.ref(hook)
        self.source = hook.out_dir
        self.rules: List[LiveRule] = []
        self._cond = threading.Condition()
        self._queue: Deque[Tuple[object, Dict[str, object], Dict[str, frozenset]]] = deque()
        self._submitted = 0
        self._done = 0
        self._closed = False
        self._collections: Dict[str, object] = {}
        self._collections_version = None
        self._membership: Dict[str, frozenset] = {}
        self._last_values = None
        self._last_step_time = time.monotonic()
        self._warned_lag = False
        # Rules are evaluated one step at a time, on the evaluation thread or (lag 0) inline.
        self._eval_lock = threading.Lock()
        self._waiters = 0
        self._thread = threading.Thread(target=self._run, name="smdebug-live-rules", daemon=True)
        self._thread.start()
        hook.add_step_listener(self)
        atexit.register(_close_at_exit, weakref.ref(self))

    # --- configuration ---------------------------------------------------------------------
    def add(self, live_rule: LiveRule) -> None:
        with self._cond:
            self.rules.append(live_rule)

    def detach(self, live_rule: LiveRule) -> None:
        with self._cond:
            if live_rule in self.rules:
                self.rules.remove(live_rule)
        live_rule.active = False
        live_rule.rule.report.finish()
        if not self.rules:
            self.close()

    def _lag(self) -> Optional[int]:
        lags = [r.max_lag_steps for r in self.rules if r.active]
        if not lags or all(lag is None for lag in lags):
            return None
        return min(lag for lag in lags if lag is not None)

    # --- the training thread's side ------------------------------------------------------------
    def __call__(self, values) -> None:
        """The step listener: queue the step, then wait if evaluation lags too far behind."""
        hook = self._hook_ref()
        if hook is None:
            return
        manager = hook.collection_manager
        with self._cond:
            if self._closed:
                return
            if manager.version != self._collections_version:
                # Snapshot on the training thread (where collections change), rarely.
                self._collections = dict(manager.collections)
                self._collections_version = manager.version
                self._membership = {}
            lag = self._lag()
            item = (values, self._collections, self._membership)
            # With lag 0 the training thread waits for the result anyway: when nothing is queued
            # and the thread is idle, evaluate right here and spare two thread switches.
            inline = lag == 0 and not self._queue and self._done == self._submitted
            self._submitted += 1
            if not inline:
                self._queue.append(item)
                self._cond.notify_all()
        if inline:
            try:
                self._evaluate(*item)
            finally:
                with self._cond:
                    self._done += 1
                    if self._waiters:  # only wake someone blocked in wait(); the rule thread need not run
                        self._cond.notify_all()
            return
        with self._cond:
            if lag is None:
                return
            target = self._submitted - lag
            deadline = time.monotonic() + DEFAULT_WAIT_TIMEOUT_S
            while self._done < target and not self._closed and self._thread.is_alive():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if not self._warned_lag:
                        self._warned_lag = True
                        logger.warning("smdebug: live rule evaluation is %d steps behind after waiting %.0f s; "
                                       "training goes on without waiting", self._submitted - self._done,
                                       DEFAULT_WAIT_TIMEOUT_S)
                    return
                self._cond.wait(remaining)

    def wait(self, timeout: Optional[float] = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._submitted
            self._waiters += 1
            try:
                while self._done < target and self._thread.is_alive():
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                return self._done >= target
            finally:
                self._waiters -= 1

    def close(self, timeout: Optional[float] = DEFAULT_WAIT_TIMEOUT_S) -> None:
        """Finish queued steps, stop the thread, finish every report. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        hook = self._hook_ref()
        if hook is not None:
            hook.remove_step_listener(self)
        with _runners_lock:
            if hook is not None and _runners.get(hook) is self:
                del _runners[hook]
        for live_rule in list(self.rules):
            live_rule.active = False
            live_rule.rule.report.finish()

    # --- the evaluation thread ------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    timed_out = not self._cond.wait(_IDLE_CHECK_S)
                    if timed_out and not self._queue:
                        break
                if not self._queue:
                    if self._closed:
                        return
                    item = None
                else:
                    item = self._queue.popleft()
            if item is None:
                self._check_idle()
                continue
            try:
                self._evaluate(*item)
            finally:
                with self._cond:
                    self._done += 1
                    self._cond.notify_all()

    def _evaluate(self, values, collections, membership) -> None:
        with self._eval_lock:
            self._evaluate_locked(values, collections, membership)

    def _evaluate_locked(self, values, collections, membership) -> None:
        self._last_values = values
        self._last_step_time = time.monotonic()
        view = LiveStepView(values, collections, membership, self.source)
        hook = self._hook_ref()
        for live_rule in list(self.rules):
            if not live_rule.active:
                continue
            rule = live_rule.rule
            try:
                others = [_other_view(t, view.step, follow=False, timeout=0) for t in rule.other_trials]
                rule._evaluate(view, others, live_rule.actions, hook=hook)
            except Exception as exc:  # noqa: BLE001 - a rule's bug must not break training
                self._fail(live_rule, exc, view.step)

    def _check_idle(self) -> None:
        idle = time.monotonic() - self._last_step_time
        values = self._last_values
        hook = self._hook_ref()
        for live_rule in list(self.rules):
            rule = live_rule.rule
            if not live_rule.active or type(rule).check_idle is Rule.check_idle:
                continue
            try:
                with self._eval_lock:
                    if rule.check_idle(idle):
                        step = values.global_step if values is not None else -1
                        mode = values.mode if values is not None else ModeKeys.GLOBAL
                        mode_step = values.mode_step if values is not None else -1
                        rule._fire(step, mode, mode_step, self.source, live_rule.actions, hook)
            except Exception as exc:  # noqa: BLE001 - a rule's failure costs that rule, reported in its report
                self._fail(live_rule, exc, None)

    def _fail(self, live_rule: LiveRule, exc: Exception, step) -> None:
        live_rule.active = False
        live_rule.error = f"{type(exc).__name__}: {exc}"
        where = f" at step {step}" if step is not None else ""
        logger.warning("smdebug: live rule %s failed%s and was detached (training continues): %s",
                       live_rule.rule.rule_name, where, live_rule.error)
        live_rule.rule.report.error(f"failed{where}: {live_rule.error}")


def _close_at_exit(runner_ref) -> None:
    """At interpreter exit: close the hook first (its last step reaches the rules), then the rules."""
    runner = runner_ref()
    if runner is None or runner._closed:
        return
    hook = runner._hook_ref()
    if hook is not None:
        try:
            hook.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
    runner.close(timeout=10)


def attach_rule(hook, rule: Rule, actions=None, *, max_lag_steps="auto", report_path: Optional[str] = "",
                ) -> LiveRule:
    """Evaluate ``rule`` on every step ``hook`` saves, in a background thread.

    Args:
        hook: an ``smdebug`` hook (any framework).
        rule: a Rule instance (constructed without a trial, e.g. ``VanishingGradient()``); it
            reads ``self.view``. A rule instance can be attached once.
        actions: run when the rule fires (e.g. ``StopTraining()``), with the rule's own.
        max_lag_steps: how many saved steps evaluation may lag behind training (see the
            module docstring); "auto": 0 when an action stops training, else 1.
        report_path: the JSON report's path; default ``<out_dir>/rule_reports/<rule>.json``
            (hooks that write files), None: in memory only (``.report``).

    Returns a :class:`LiveRule`.
    """
    if not isinstance(rule, Rule):
        raise ConfigError(f"add_rule needs a Rule instance (e.g. smdebug.rules.VanishingGradient()), got {rule!r}")
    if rule.live:
        raise ConfigError(f"rule {rule.rule_name} is already attached to a hook; create another instance")
    actions = as_actions(actions)
    if max_lag_steps == "auto":
        max_lag_steps = 0 if stops_training(actions + rule.actions) else 1
    if max_lag_steps is not None and (isinstance(max_lag_steps, bool) or not isinstance(max_lag_steps, int)
                                      or max_lag_steps < 0):
        raise ConfigError(f"max_lag_steps must be an integer >= 0, None or 'auto', got {max_lag_steps!r}")
    if report_path == "":
        report_path = (default_report_path(hook.out_dir, rule.rule_name, hook.worker_name)
                       if getattr(hook, "writes_files", False) else None)
    rule.live = True
    if rule.base_trial is None:
        rule.base_trial = _NoTrial(rule.rule_name)
    rule._start_report(hook.out_dir, report_path, live=True)
    with _runners_lock:
        runner = _runners.get(hook)
        if runner is None or runner._closed:
            runner = _runners[hook] = _LiveRunner(hook)
    live_rule = LiveRule(runner, rule, actions, max_lag_steps)
    runner.add(live_rule)
    logger.info("smdebug: live rule %s attached to %s (max_lag_steps=%s)", rule.rule_name, hook.out_dir,
                max_lag_steps)
    return live_rule


def close_live_rules(hook, timeout: Optional[float] = DEFAULT_WAIT_TIMEOUT_S) -> None:
    """Evaluate what is queued and finish the reports of every rule attached to ``hook``.

    For ``Hook.close()`` to call after its last step.
    """
    with _runners_lock:
        runner = _runners.get(hook)
    if runner is not None:
        runner.close(timeout)
