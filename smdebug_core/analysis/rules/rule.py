"""The Rule base class and ``invoke_rule``, which runs rules over the steps of a run.

Writing a rule::

    from smdebug.rules import Rule, Required, invoke_rule

    class GradientTooLarge(Rule):
        def __init__(self, base_trial=None, threshold=10.0):
            super().__init__(base_trial)
            self.threshold = float(threshold)

        def required_tensors(self, step):          # fetched in one batch before invoke_at_step
            return [Required(collections="gradients", reductions=[("mean", True)])]

        def invoke_at_step(self, step):
            for name in self.view.tensor_names(collection="gradients"):
                if self.view.reduction(name, "mean", abs=True) > self.threshold:
                    self.note(f"{name} is too large", tensor=name)
                    return True
            return False

    invoke_rule(GradientTooLarge(create_trial("runs/exp1")))       # over a saved (or running) run
    hook.add_rule(GradientTooLarge(), actions=StopTraining())      # live, inside training

``self.view`` (a :class:`~smdebug.analysis.rules.views.StepView`) serves the step's data in both
cases. Rules written for the original library, which read ``self.base_trial`` directly,
still work with ``invoke_rule`` (not live: a live rule has no trial).

Rules keep whatever history they need in their own attributes: they see the steps of a run
in order, exactly once each.
"""
from __future__ import annotations

import bisect
import contextlib
import inspect
import os
import re
import time
from typing import Dict, Iterable, List, Optional, Sequence

from ...exceptions import (
    ConfigError,
    CorruptRecord,
    NoMoreData,
    RuleEvaluationConditionMet,
    StepNotYetAvailable,
    StepUnavailable,
    TensorUnavailable,
    TensorUnavailableForStep,
    UnsafeRunFile,
)
from ...logger import get_logger
from ...modes import ModeKeys
from .actions import Action, RuleEvent, as_actions
from .report import RuleReport, to_jsonable
from .req_tensors import RequiredTensors
from .views import BulkSteps, Required, StepView, TrialStepView

logger = get_logger("smdebug.rules")

#: Exceptions meaning "the data this step needs is not there": the step is skipped, not an error.
DATA_MISSING = (TensorUnavailable, TensorUnavailableForStep, StepUnavailable, StepNotYetAvailable, NoMoreData)
#: Exceptions meaning "this step's data is there but cannot be read" (a damaged or refused
#: file, permissions): the step is skipped, and the report keeps the error (one bad file
#: costs its step, not the evaluation of the rest of the run).
DATA_UNREADABLE = (CorruptRecord, UnsafeRunFile, OSError)
DEFAULT_POLL_INTERVAL_S = 0.5
_STEP_IN_TEXT = re.compile(r"^step \d+ has |,? at step \d+")


def as_trial(trial):
    """A Trial from a Trial or a run directory path (None stays None)."""
    if trial is None:
        return None
    if isinstance(trial, (str, os.PathLike)):
        from ..trials import create_trial

        return create_trial(os.fspath(trial))
    for attr in ("steps", "tensor", "tensor_names"):
        if not hasattr(trial, attr):
            raise TypeError(f"expected a Trial (from smdebug.trials.create_trial) or a run directory, got {trial!r}")
    return trial


class _NoTrial:
    """``base_trial`` of a live rule: explains why there is none instead of failing obscurely."""

    def __init__(self, rule_name: str):
        self._rule_name = rule_name

    def __getattr__(self, item):
        raise AttributeError(
            f"rule {self._rule_name} runs live inside the training process and has no base_trial; "
            f"read the step's data through self.view (tensor_names, value, reduction, saved_reductions)"
        )

    def __bool__(self):
        return False


class _Note:
    __slots__ = ("message", "details", "measure")

    def __init__(self, message: str, details: dict, measure: Optional[float] = None):
        self.message, self.details, self.measure = message, details, measure


class Rule:
    """Base class of every rule.

    Args:
        base_trial: the Trial (or run directory) the rule analyses; None for a rule that will
            run live through ``hook.add_rule``.
        other_trials: further trials the rule compares with (e.g. SimilarAcrossRuns).
        actions: what to do when the rule fires (see :mod:`smdebug.analysis.rules.actions`); added to
            the actions given to ``invoke_rule`` / ``hook.add_rule``.
        name: the rule's name in reports and messages (default: the class name).
        action_str: smdebug 1.0.34's actions: ``""``, an action name (``"StopTraining"``) or
            its JSON (``'{"name": "StopTraining"}'`` or a list of those). SageMaker's
            ``email``/``sms`` notifications are not sent here (a warning says so). May be
            given second, positionally, as in 1.0.34's ``Rule(base_trial, action_str)``.

    Subclasses implement :meth:`invoke_at_step` and usually :meth:`required_tensors`.
    Rules written for 1.0.34 that fill ``self.req_tensors`` in ``set_required_tensors(step)``
    work unchanged.
    Store each constructor parameter in an attribute of the same name: the report lists
    them as the rule's parameters.
    """

    _NOT_PARAMETERS = frozenset({"self", "base_trial", "other_trials", "other_trial", "actions", "name",
                                 "action_str"})
    #: Which ``measure`` of a firing (see :meth:`note`) is the worst: "max" or "min".
    worst = "max"
    #: What ``measure`` is, for summaries ("" when the rule gives none).
    measure_name = ""

    def __init__(self, base_trial=None, other_trials=None, actions=None, name: Optional[str] = None,
                 action_str: Optional[str] = None):
        if isinstance(other_trials, str) and not os.path.exists(other_trials):
            # 1.0.34's order: Rule(base_trial, action_str, other_trials); an existing run
            # directory given second is still other_trials.
            action_str, other_trials = other_trials, None
            items = actions if isinstance(actions, (list, tuple)) else [actions]
            if actions is not None and all(hasattr(t, "tensor_names") for t in items):
                other_trials, actions = actions, None  # the third positional: 1.0.34's other_trials
        self.base_trial = as_trial(base_trial)
        if other_trials is not None and not isinstance(other_trials, (list, tuple)):
            other_trials = [other_trials]
        self.other_trials = [as_trial(t) for t in (other_trials or [])]
        self.trials = ([self.base_trial] if self.base_trial is not None else []) + self.other_trials
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f"a rule name must be a non-empty string, got {name!r}")
        self.rule_name = name or type(self).__name__
        self.actions: List[Action] = as_actions(actions) + _actions_from_action_str(action_str, self.rule_name)
        self.action_str = action_str or ""
        self.logger = logger
        #: 1.0.34's API: tensors declared by ``set_required_tensors(step)``.
        self.req_tensors = RequiredTensors(self.base_trial, self.other_trials)
        #: The current step's data (set before required_tensors and invoke_at_step).
        self.view: Optional[StepView] = None
        #: Views of the same step in ``other_trials`` (None where that trial lacks the step).
        self.other_views: List[Optional[StepView]] = []
        self.report: Optional[RuleReport] = None
        #: The report entry of the latest firing ({} before the first).
        self.last_violation: dict = {}
        self.live = False
        self._notes: List[_Note] = []
        self._warned: set = set()
        self._step_without_data = False
        self._step_reads = 0  # tensors this step's evaluation declared it reads (reads())
        self._step_unavailable = 0  # of them, those the step could not supply (unavailable())
        self._req_missing = None  # (step, error) when set_required_tensors lacked a tensor

    def __repr__(self):
        params = ", ".join(f"{k}={v!r}" for k, v in self.parameters().items())
        return f"{self.rule_name}({params})"

    # --- what subclasses implement ----------------------------------------------------------
    def required_tensors(self, step: int) -> Iterable[Required]:
        """What to fetch before :meth:`invoke_at_step` (``self.view`` is already set).

        Return Required entries; whatever is not declared is still readable, one read
        at a time. Live rules do not call this (the data is already in memory).
        The default runs 1.0.34's ``set_required_tensors(step)`` and asks for the values of
        what it put in ``self.req_tensors``.
        """
        if type(self).set_required_tensors is Rule.set_required_tensors:
            return ()
        self.req_tensors.clear()
        self._req_missing = None
        try:
            self.set_required_tensors(step)
        except DATA_MISSING as exc:
            # As in 1.0.34: a declared tensor the step lacks skips the step for this rule.
            self._req_missing = (step, exc)
            raise
        names = tuple(name for trial in self.trials for name in self.req_tensors.get_names(trial))
        return (Required(names=names, value=True),) if names else ()

    def set_required_tensors(self, step: int) -> None:
        """1.0.34's way to declare what a step needs: ``self.req_tensors.add(name, steps=[step])``
        (``should_match_regex=True`` for a regex, ``trial=`` for one of ``other_trials``).
        Read them in :meth:`invoke_at_step` with ``self.req_tensors.get()`` or the trial."""

    def invoke_at_step(self, step: int) -> bool:
        """Evaluate the rule at global ``step``; True when the condition holds."""
        raise NotImplementedError(f"{type(self).__name__} must implement invoke_at_step(step)")

    def check_idle(self, idle_seconds: float) -> bool:
        """Called while no new step has arrived for ``idle_seconds``; True fires the rule."""
        return False

    # --- helpers for subclasses ---------------------------------------------------------------
    def note(self, message: str, measure: Optional[float] = None, **details) -> None:
        """Explain a firing: the message and details go into the report and to actions.

        ``measure``: one number saying how bad it is (see ``worst`` and ``measure_name``),
        which summaries use to name the worst firing.
        """
        self._notes.append(_Note(str(message), details, None if measure is None else float(measure)))

    def handled(self, message: str) -> None:
        """Report a condition that held but that the run dealt with itself (early stopping
        ended training in time): a "handled" entry of the report, not a firing."""
        if self.report is not None:
            self.report.handled(self.view.step if self.view is not None else -1, message)

    def streak_start(self, key, holds: bool) -> Optional[int]:
        """The first step of the current run of evaluated steps at which the condition on
        ``key`` (a tensor name, a layer) held; None when it does not hold at this step."""
        starts = self.__dict__.setdefault("_streaks", {})
        if not holds:
            starts.pop(key, None)
            return None
        return starts.setdefault(key, self.view.step if self.view is not None else -1)

    def end_streaks(self, keys) -> None:
        """``streak_start(key, False)`` for each of ``keys`` (nothing to do while none is open)."""
        starts = self.__dict__.get("_streaks")
        for key in keys if starts else ():
            starts.pop(key, None)

    def saved_elsewhere(self, what: str, collection=None, regex=None) -> str:
        """Why a step has no ``what``: saved at other steps (how often), or not saved at all.

        Only a rule reading a saved run can tell (a live rule sees one step at a time)."""
        view = self.view
        names = view.run_tensor_names(collection=collection, regex=regex) if view is not None else []
        catalog = view.catalog() if names else None
        if catalog is None or names[0] not in catalog:
            return f"no {what} saved in this run (is the collection included?)"
        parts = []
        for mode, saved in catalog[names[0]].saved.items():
            if mode is not ModeKeys.GLOBAL:
                every = f", every {saved.interval}" if saved.regular and saved.interval > 1 else ""
                parts.append(f"{saved.count} {mode.name} steps{every}")
        return f"{what} saved at other steps ({', '.join(parts)}; e.g. {names[0]})"

    def unavailable(self, count: int = 1) -> None:
        """Count tensors the rule wanted but the step could not supply (shown in the report)."""
        self._step_unavailable += count
        if self.report is not None:
            self.report.unavailable(count)

    #: What the rule needs of each tensor it reads, for the report of steps that had none of it.
    reads_what = "the values or reductions it needs"

    def reads(self, names: List[str]) -> List[str]:
        """Declare the tensors this step's evaluation reads, and return them.

        When every one of them turns out :meth:`unavailable` (saved at this step, but not
        with what the rule reads: other reductions, no full values), the step counts as one
        without data, not as an evaluated one, and the report says what was missing.
        """
        self._step_reads = len(names)
        return names

    def warn_once(self, key, message: str, *args) -> None:
        """Log a warning the first time ``key`` is seen (and record it in the report)."""
        if key not in self._warned:
            self._warned.add(key)
            self.logger.warning("smdebug rule %s: " + message, self.rule_name, *args)
            if self.report is not None:
                self.report.notice(message % args if args else message)

    def no_data(self, message: str, *args) -> None:
        """Note (once, at info level, and in the report) that the run lacks what the rule reads.

        The current step then counts as a step without data, not as an evaluated one.
        """
        self._step_without_data = True
        if ("no-data", message) not in self._warned:  # once per kind of missing data
            self._warned.add(("no-data", message))
            self.logger.info("smdebug rule %s: " + message, self.rule_name, *args)
            if self.report is not None:
                # The report counts such steps; its notice says what is missing, not where first.
                text = message % args if args else message
                self.report.notice(_STEP_IN_TEXT.sub("", text))

    def parameters(self) -> Dict[str, object]:
        """The constructor parameters and their values (for reports)."""
        out = {}
        try:
            signature = inspect.signature(type(self).__init__)
        except (TypeError, ValueError):
            return out
        for pname, param in signature.parameters.items():
            if pname in self._NOT_PARAMETERS or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            if hasattr(self, pname):
                out[pname] = getattr(self, pname)
        return out

    # --- evaluation (used by invoke_rule, live evaluation and invoke) ----------------------------
    def _start_report(self, run_dir: Optional[str], path: Optional[str], live: bool = False) -> RuleReport:
        cls = type(self)
        self.report = RuleReport(self.rule_name, f"{cls.__module__}.{cls.__qualname__}",
                                 to_jsonable(self.parameters()), run_dir, path, live=live)
        self.report.write(force=True)
        return self.report

    def _evaluate(self, view: StepView, other_views: Sequence[Optional[StepView]] = (),
                  extra_actions: Sequence[Action] = (), hook=None) -> bool:
        """Run invoke_at_step on ``view``; record the outcome and run actions. Returns fired."""
        self._begin_step(view, other_views)
        try:
            missing, self._req_missing = self._req_missing, None
            if missing is not None and missing[0] == view.step:
                raise missing[1]
            fired = bool(self.invoke_at_step(view.step))
        except DATA_MISSING as exc:
            self.logger.debug("rule %s skipped step %d: %s", self.rule_name, view.step, exc)
            if self.report is not None:
                self.report.no_data(view.mode)
            return False
        except DATA_UNREADABLE as exc:
            self.warn_once(("unreadable", type(exc)), "step %d skipped: %s", view.step, exc)
            if self.report is not None:
                self.report.error(f"step {view.step} skipped: {exc}")
                self.report.no_data(view.mode)
            return False
        self._account(view, fired)
        if fired:
            self._fire(view.step, view.mode, view.mode_step, view.source, extra_actions, hook)
        return fired

    def _account(self, view: StepView, fired: bool) -> None:
        """Count the step in the report: evaluated, or without data."""
        if not fired and self._step_reads and self._step_unavailable >= self._step_reads:
            self.no_data("step %d has %d tensors to read but none with %s", view.step, self._step_reads,
                         self.reads_what)
        if self.report is not None:
            if self._step_without_data and not fired:
                self.report.no_data(view.mode)
            else:
                self.report.datapoint(view.step)

    def settle_step(self, columns) -> bool:
        """A shortcut over a saved run: when ``columns`` (a chunk of the run's reductions and
        one-element values, :class:`~.step_columns.ChunkColumns`) show that the step does not
        fire, apply what :meth:`invoke_at_step` would have done and return True; else change
        nothing and return False (the default): the step is then evaluated as usual."""
        return False

    def _begin_step(self, view: StepView, other_views: Sequence[Optional[StepView]] = ()) -> None:
        self.view, self.other_views, self._notes = view, list(other_views), []  # notes and counts afresh
        self._step_without_data, self._step_reads, self._step_unavailable = False, 0, 0

    def _settle(self, view: StepView, columns) -> bool:
        if self.other_trials or type(self).settle_step is Rule.settle_step:
            return False
        self._begin_step(view)
        if not self.settle_step(columns):
            return False
        self._account(view, False)
        return True

    def _fire(self, step: int, mode: ModeKeys, mode_step: int, run_dir: str, extra_actions: Sequence[Action] = (),
              hook=None) -> dict:
        notes, self._notes = self._notes, []
        message = "; ".join(n.message for n in notes) or f"{self.rule_name} condition met"
        details: dict = {key: value for n in notes for key, value in n.details.items()}
        measures = [n.measure for n in notes if n.measure is not None]
        measure = (min if self.worst == "min" else max)(measures) if measures else None
        entry = {"step": step, "mode": mode.name, "mode_step": mode_step, "message": message, "details": details}
        if self.report is not None:
            entry = self.report.violation(step, mode, mode_step, message, details, measure, self.worst)
        self.last_violation = entry
        event = RuleEvent(self.rule_name, step, mode, mode_step, message, run_dir, details, hook)
        for action in list(self.actions) + list(extra_actions):
            try:
                result = action(event)
            except Exception as exc:  # noqa: BLE001 - one failing action must not stop the others
                result = f"failed: {type(exc).__name__}: {exc}"
                self.logger.warning("smdebug rule %s: action %s failed: %s", self.rule_name, action.name, exc)
                if self.report is not None:
                    self.report.error(f"action {action.name} at step {step}: {type(exc).__name__}: {exc}")
            if self.report is not None:
                self.report.action(step, action.name, result)
        return entry

    def invoke(self, step: int) -> None:
        """Evaluate one global step of ``base_trial`` (waiting for it); raises
        RuleEvaluationConditionMet when the condition holds (the original library's API)."""
        if not self.base_trial:
            raise ValueError(f"rule {self.rule_name} has no base_trial to read step {step} from")
        if self.report is None:
            self._start_report(self.base_trial.path, None)  # in memory: nothing is written into the run
        self.base_trial.wait_for_steps([step])
        others = [_other_view(t, step, follow=True, timeout=None) for t in self.other_trials]
        with _no_refresh(self.trials):
            view = TrialStepView(self.base_trial, step)
            self.view, self.other_views = view, others
            _prefetch(view, others, self.required_tensors(step))
            fired = self._evaluate(view, others)
        if fired:
            raise RuleEvaluationConditionMet(self.rule_name, step)


def _actions_from_action_str(action_str, rule_name: str) -> List[Action]:
    """The actions of a 1.0.34 ``action_str`` (see :class:`Rule`)."""
    if action_str is None or (isinstance(action_str, str) and not action_str.strip()):
        return []
    if not isinstance(action_str, str):
        raise ConfigError(f"action_str must be a string (an action name or its JSON), got {action_str!r}")
    import json

    try:
        spec = json.loads(action_str)
    except ValueError:
        spec = action_str.strip()  # a bare name such as "StopTraining"
    items = spec if isinstance(spec, list) else [spec]
    names = []
    for item in items:
        name = item.get("name") if isinstance(item, dict) else item
        if not isinstance(name, str):
            raise ConfigError(f"action_str {action_str!r}: each action needs a string 'name' (e.g. "
                              "'{\"name\": \"StopTraining\"}')")
        if name.strip().lower() in ("email", "sms"):
            logger.warning("smdebug rule %s: action %r of action_str is a SageMaker notification, not sent by "
                           "smdebug-core; use a Callback action to notify", rule_name, name)
            continue
        names.append(name)
    try:
        return as_actions(names)
    except ConfigError as exc:
        if os.sep in action_str:
            raise ConfigError(f"{exc}. action_str {action_str!r} looks like a path: a run directory given as "
                              "other_trials must exist (or pass other_trials=[...] by keyword)") from None
        raise


def _prefetch(view: StepView, others: Sequence[Optional[StepView]], requirements) -> None:
    requirements = list(requirements or ())
    for target in [view, *others]:
        if target is None:
            continue
        try:
            target.prefetch(requirements)
        except DATA_MISSING + DATA_UNREADABLE:
            pass  # missing or unreadable: each rule meets it when it reads, and skips the step


@contextlib.contextmanager
def _no_refresh(trials):
    """Keep the trials' view fixed while a step is evaluated: every rule sees the same data,
    and reads do not list the run directory again (the Trial's ``dynamic_refresh``)."""
    trials = [t for t in trials if t is not None and hasattr(t, "dynamic_refresh")]
    saved = [t.dynamic_refresh for t in trials]
    for t in trials:
        t.dynamic_refresh = False
    try:
        yield
    finally:
        for t, value in zip(trials, saved):
            t.dynamic_refresh = value


def _other_view(trial, step: int, follow: bool, timeout: Optional[float]) -> Optional[TrialStepView]:
    """The view of ``step`` in a comparison trial, or None when that trial does not have it."""
    from ..trials import StepState

    state = trial.has_passed_step(step)
    if state is StepState.NOT_YET_AVAILABLE and follow:
        try:
            trial.wait_for_steps([step], timeout=timeout)
            state = StepState.AVAILABLE
        except DATA_MISSING:
            return None
    if state is not StepState.AVAILABLE:
        return None
    try:
        return TrialStepView(trial, step)
    except DATA_MISSING:
        return None


# ---------------------------------------------------------------------------------------------
def run_rules(
    rules: Sequence[Rule],
    start_step: int = 0,
    end_step: Optional[int] = None,
    raise_eval_cond: bool = False,
    *,
    actions=None,
    report_paths: Optional[Dict[int, Optional[str]]] = None,
    follow: bool = True,
    poll_interval: Optional[float] = None,
    idle_timeout: Optional[float] = None,
    on_step=None,
    on_fire=None,
    progress: bool = False,
) -> None:
    """Evaluate several rules sharing one base trial, reading each step once for all of them.

    See :func:`invoke_rule` for the arguments; ``report_paths`` maps ``id(rule)`` to a report
    path (missing or None: in memory only), ``on_step(step)``
    is called after each step, ``on_fire(rule, step, message)`` after each firing.
    """
    if not rules:
        raise ValueError("run_rules needs at least one rule")
    trial = rules[0].base_trial
    for rule in rules:
        if not isinstance(rule, Rule):
            raise TypeError(f"expected a Rule, got {rule!r}")
        if not rule.base_trial:
            raise ValueError(f"rule {rule.rule_name} has no base_trial: construct it with the trial to analyse "
                             "(for live evaluation inside training use hook.add_rule)")
        if rule.base_trial is not trial:
            raise ValueError("rules evaluated together must share one base_trial object")
    for what, value in (("start_step", start_step), ("end_step", end_step)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    if start_step is None:
        start_step = 0
    if end_step is not None and end_step <= start_step:
        raise ValueError(f"end_step ({end_step}) must be greater than start_step ({start_step})")
    poll = DEFAULT_POLL_INTERVAL_S if poll_interval is None else float(poll_interval)
    if not poll > 0:
        raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
    if idle_timeout is not None and not float(idle_timeout) >= 0:
        raise ValueError(f"idle_timeout must be >= 0 seconds or None, got {idle_timeout!r}")
    if idle_timeout is None and end_step is not None:
        # The original returns when the steps up to end_step never come (a run that stopped
        # early without its end marker): wait for them as long as create_trial waits for a run.
        idle_timeout = getattr(trial, "wait_timeout", None)
    extra = as_actions(actions)
    report_paths = report_paths or {}  # a rule not in it keeps its report in memory only
    for rule in rules:
        path = report_paths.get(id(rule))
        rule._start_report(trial.path, path)

    bar = _progress_bar(progress)
    next_step = start_step
    last_new = time.monotonic()
    last_evaluated: Optional[StepView] = None
    logger.info("rules %s: evaluating %s from step %d", ", ".join(r.rule_name for r in rules), trial.path,
                start_step)
    try:
        while True:
            ended = trial.training_ended()  # looked at before listing: then the listing is complete
            steps = trial.steps()
            todo = steps[bisect.bisect_left(steps, next_step):]
            if end_step is not None:
                todo = todo[:bisect.bisect_left(todo, end_step)]
            if bar is not None:
                bar.total = (bar.n + len(todo))
                bar.refresh()
            bulk = BulkSteps(trial, todo) if len(todo) > 1 and hasattr(trial, "to_table") else None
            for step in todo:
                view = _evaluate_step(rules, trial, step, extra, raise_eval_cond, follow, idle_timeout, on_fire,
                                      bulk)
                last_evaluated = view
                next_step = step + 1
                if bar is not None:
                    bar.update(1)
                if on_step is not None:
                    on_step(step)
            if todo:
                last_new = time.monotonic()
            if end_step is not None and steps and steps[-1] >= end_step:
                break  # a complete step at or past end_step: every step before it is complete too
            if ended or not follow:
                break
            idle = time.monotonic() - last_new
            for rule in rules:
                if rule.check_idle(idle):
                    _fire_idle(rule, last_evaluated, trial.path, extra, raise_eval_cond, on_fire)
            if idle_timeout is not None and idle >= idle_timeout:
                logger.warning("rules: no new step in %s for %.0f s (idle_timeout%s); stopping", trial.path, idle,
                               "" if end_step is None else f"; the run has no step {end_step - 1} yet and no "
                               "end-of-training marker. Pass idle_timeout or set SMDEBUG_TRIAL_WAIT_TIMEOUT to wait "
                               "longer")
                break
            time.sleep(poll)
    finally:
        if bar is not None:
            bar.close()
        for rule in rules:
            rule.report.finish()


def _evaluate_step(rules, trial, step, extra, raise_eval_cond, follow, idle_timeout, on_fire, bulk=None) -> StepView:
    others_by_rule = {id(rule): [_other_view(t, step, follow, idle_timeout) for t in rule.other_trials]
                      for rule in rules}
    all_trials = {id(t): t for rule in rules for t in rule.trials}
    fired_rules = []
    with _no_refresh(all_trials.values()):
        view = TrialStepView(trial, step, bulk)
        # Rules whose outcome the bulk columns show are done; the others read the step. (Not
        # with raise_eval_cond: a firing there ends the step before the rules after it.)
        columns = bulk.columns(step) if bulk is not None and not raise_eval_cond else None
        if columns is not None:
            rules = [rule for rule in rules if not rule._settle(view, columns)]
        requirements = []
        for rule in rules:
            others = others_by_rule[id(rule)]
            rule.view, rule.other_views = view, others
            try:
                wanted = list(rule.required_tensors(step) or ())
            except DATA_MISSING:
                wanted = []
            requirements.extend(wanted)
            _prefetch(None, others, wanted)
        _prefetch(view, (), requirements)  # one batch for all rules of the step
        for rule in rules:
            if rule._evaluate(view, others_by_rule[id(rule)], extra):
                fired_rules.append(rule)
                if on_fire is not None:
                    on_fire(rule, step, rule.last_violation.get("message", ""))
                if raise_eval_cond:
                    break
    if raise_eval_cond and fired_rules:
        raise RuleEvaluationConditionMet(fired_rules[0].rule_name, step)
    return view


def _fire_idle(rule, last_view, run_dir, extra, raise_eval_cond, on_fire) -> None:
    step = last_view.step if last_view is not None else -1
    mode = last_view.mode if last_view is not None else ModeKeys.GLOBAL
    mode_step = last_view.mode_step if last_view is not None else -1
    entry = rule._fire(step, mode, mode_step, run_dir, extra)
    if on_fire is not None:
        on_fire(rule, step, entry.get("message", ""))
    if raise_eval_cond:
        raise RuleEvaluationConditionMet(rule.rule_name, step)


def _progress_bar(progress: bool):
    if not progress:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a declared dependency
        return None
    return tqdm(total=0, desc="steps", unit="step", dynamic_ncols=True)


def invoke_rule(
    rule: Rule,
    start_step: int = 0,
    end_step: Optional[int] = None,
    raise_eval_cond: bool = False,
    *,
    actions=None,
    report_path: Optional[str] = None,
    follow: bool = True,
    poll_interval: Optional[float] = None,
    idle_timeout: Optional[float] = None,
    progress: bool = False,
) -> RuleReport:
    """Evaluate ``rule`` over the saved steps of its ``base_trial``, in order, each once.

    Args:
        rule: a Rule constructed with the trial to analyse.
        start_step, end_step: global steps ``start_step <= step < end_step`` (end_step None:
            until training ends).
        raise_eval_cond: raise RuleEvaluationConditionMet(rule_name, step) at the first step
            where the rule fires (after recording it and running the actions); otherwise
            every firing is recorded and evaluation goes on.
        actions: actions run when the rule fires, in addition to the rule's own.
        report_path: where to write the JSON report (see :mod:`smdebug.analysis.rules.report`);
            None (the default): keep it in memory only (``rule.report``), so that reading a
            run writes nothing into it; ``default_report_path(run, name)`` is the usual place.
        follow: while training is still running, wait for new steps (polling every
            ``poll_interval`` seconds, default 0.5) until the end-of-training marker appears;
            False evaluates the steps present now and returns.
        idle_timeout: stop following after this many seconds without a new step (None: wait
            for the end of training however long it takes; with ``end_step``, None waits the
            trial's ``wait_timeout``, 30 s by default or ``SMDEBUG_TRIAL_WAIT_TIMEOUT``, so a run
            whose last step is below ``end_step`` and that never ends returns, as in 1.0.34).
        progress: show a tqdm progress bar over steps.

    Returns the rule's :class:`RuleReport` (also ``rule.report``).
    """
    paths = {id(rule): report_path}
    run_rules([rule], start_step, end_step, raise_eval_cond, actions=actions, report_paths=paths, follow=follow,
              poll_interval=poll_interval, idle_timeout=idle_timeout, progress=progress)
    return rule.report
