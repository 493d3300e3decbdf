"""What happens when a rule fires: stop training, log a message, call your function.

Pass actions to ``hook.add_rule(rule, actions=[...])``, to ``invoke_rule(rule, actions=...)``
or to a rule's constructor (``actions=``). Each action is called with a :class:`RuleEvent`
every time the rule's condition holds at a step. Plain callables are accepted and wrapped in
:class:`Callback`; the strings ``"stoptraining"`` and ``"log"`` name the two built-in actions.

:class:`StopTraining` in the training process (a live rule) calls ``hook.request_stop``; the
framework adapter then ends training at its next step boundary. Out of process
(``invoke_rule`` or ``smdebug-rules`` following a run) it writes the stop-request file
described in :mod:`smdebug.storage.stop_request`, which the training hook polls.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ...exceptions import ConfigError
from ...logger import get_logger
from ...modes import ModeKeys
from ...storage.stop_request import write_stop_request

logger = get_logger("smdebug.rules")

_TEMPLATE_FIELDS = ("rule", "step", "mode", "mode_step", "message", "run_dir")


@dataclass
class RuleEvent:
    """One firing of a rule, as actions see it.

    ``hook`` is the training process's hook for a live rule, None when the rule reads a run
    from another process (``run_dir`` is then the run it reads).
    """

    rule: str
    step: int
    mode: ModeKeys
    mode_step: int
    message: str
    run_dir: str
    details: Dict[str, Any] = field(default_factory=dict)
    hook: Optional[object] = None

    def fields(self) -> Dict[str, Any]:
        return {"rule": self.rule, "step": self.step, "mode": self.mode.name, "mode_step": self.mode_step,
                "message": self.message, "run_dir": self.run_dir}


def _check_template(template: Optional[str], what: str) -> Optional[str]:
    if template is None:
        return None
    if not isinstance(template, str):
        raise ConfigError(f"{what} must be a format string, got {template!r}")
    try:
        template.format(**{k: "" for k in _TEMPLATE_FIELDS})
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(f"{what} {template!r} is not a valid template ({exc}); it may use "
                          f"{', '.join('{' + k + '}' for k in _TEMPLATE_FIELDS)}") from None
    return template


class Action:
    """Base class: ``__call__(event)`` does the work and returns a short note for the report."""

    def __call__(self, event: RuleEvent) -> str:
        raise NotImplementedError

    @property
    def name(self) -> str:
        return type(self).__name__

    def __repr__(self):
        return f"{self.name}()"


class StopTraining(Action):
    """Stop the training run the rule watches.

    Args:
        reason: a template for the stop reason (fields: {rule}, {step}, {mode}, {mode_step},
            {message}, {run_dir}); default "<rule> fired at step <step>: <message>".

    Live: ``hook.request_stop(reason)`` (the adapter stops at the next step boundary).
    Out of process: writes ``<run_dir>/smdebug_stop_request.json`` (see stop_protocol).
    Requests once; later firings are noted but do nothing.
    """

    def __init__(self, reason: Optional[str] = None):
        self.reason = _check_template(reason, "StopTraining reason")
        self.requested = False

    def __call__(self, event: RuleEvent) -> str:
        if self.requested:
            return "stop already requested"
        if self.reason is not None:
            reason = self.reason.format(**event.fields())
        else:
            reason = f"{event.rule} fired at step {event.step}: {event.message}"
        if event.hook is not None:
            event.hook.request_stop(reason)
            self.requested = True
            return "requested the hook to stop training"
        path = write_stop_request(event.run_dir, reason, rule=event.rule, step=event.step)
        self.requested = True
        logger.warning("smdebug: rule %s asked the training run to stop (%s)", event.rule, path)
        return f"wrote stop request {path}"


class LogMessage(Action):
    """Log a message through the ``smdebug.rules`` logger.

    Args:
        level: "debug", "info", "warning" (default) or "error".
        message: a template (fields as for StopTraining); default
            "rule <rule> fired at step <step> (<mode> <mode_step>): <message>".
    """

    _LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}

    def __init__(self, level: str = "warning", message: Optional[str] = None):
        if level not in self._LEVELS:
            raise ConfigError(f"LogMessage level must be one of {', '.join(self._LEVELS)}, got {level!r}")
        self.level = level
        self.message = _check_template(message, "LogMessage message")

    def __call__(self, event: RuleEvent) -> str:
        if self.message is not None:
            text = self.message.format(**event.fields())
        else:
            text = (f"rule {event.rule} fired at step {event.step} ({event.mode.name} {event.mode_step}): "
                    f"{event.message}")
        logger.log(self._LEVELS[self.level], "%s", text)
        return "logged"


class Callback(Action):
    """Call ``fn(event)`` with the :class:`RuleEvent`.

    For a live rule it runs where the rule is evaluated: the hook's rule thread, or the
    training thread itself with ``max_lag_steps=0``; an exception it raises is logged and
    recorded in the report, never propagated.
    """

    def __init__(self, fn: Callable[[RuleEvent], Any]):
        if not callable(fn):
            raise ConfigError(f"Callback needs a callable, got {fn!r}")
        self.fn = fn

    @property
    def name(self) -> str:
        return f"Callback({getattr(self.fn, '__qualname__', type(self.fn).__name__)})"

    def __call__(self, event: RuleEvent) -> str:
        result = self.fn(event)
        return "called" if result is None else f"called: {result!r}"[:200]


class DumpFlightRecorder(Action):
    """Write the hook's flight recorder (the last steps it kept in memory) and its marker
    (docs/flight_recorder.md), naming this rule as the trigger.

    Live only: a rule following a run from another process has no recorder to write (the
    firing is noted in the report). Writes once; later firings are noted but do nothing.
    """

    def __call__(self, event: RuleEvent) -> str:
        hook = event.hook
        if hook is None or not hasattr(hook, "dump_flight_recorder"):
            return "no flight recorder here (the rule does not run in the training process)"
        marker = hook.dump_flight_recorder(f"rule {event.rule} fired at step {event.step}: {event.message}",
                                           trigger="rule")
        if marker is None:
            return "flight recorder not on, or already written"
        return f"flight recorder wrote steps {marker['steps_written']}"


_BY_NAME = {"stoptraining": StopTraining, "stop_training": StopTraining, "stop": StopTraining,
            "log": LogMessage, "logmessage": LogMessage, "log_message": LogMessage,
            "dumpflightrecorder": DumpFlightRecorder, "flight_recorder": DumpFlightRecorder,
            "flightrecorder": DumpFlightRecorder}


def as_actions(actions) -> List[Action]:
    """Normalize ``actions`` (None, one action, a callable, a name, or a list of them)."""
    if actions is None:
        return []
    items = actions if isinstance(actions, (list, tuple)) else [actions]
    out: List[Action] = []
    for item in items:
        if isinstance(item, Action):
            out.append(item)
        elif isinstance(item, str):
            cls = _BY_NAME.get(item.strip().lower())
            if cls is None:
                raise ConfigError(f"unknown action {item!r}; named actions: stoptraining, log, flight_recorder "
                                  "(or pass an Action instance or a callable)")
            out.append(cls())
        elif isinstance(item, type) and issubclass(item, Action):
            out.append(item())
        elif callable(item):
            out.append(Callback(item))
        else:
            raise ConfigError(f"an action must be an Action, a callable or a name, got {item!r}")
    return out


def stops_training(actions: List[Action]) -> bool:
    return any(isinstance(a, StopTraining) for a in actions)
