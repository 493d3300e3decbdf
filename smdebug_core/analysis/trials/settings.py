"""A trial's settings from its arguments and the environment: defaults, the ``SMDEBUG_*``
variables, and the checks that refuse a bad value with a message naming it."""
import os
from typing import Optional, Tuple, Union

from ...storage.format.codec import DEFAULT_MAX_EXPANDED_ELEMENTS
from ...storage.format.layout import validate_step

RECORD_CHECKS = ("minimal", "full", "none")
DEFAULT_WAIT_TIMEOUT_S = 30.0
DEFAULT_POLL_INTERVAL_S = 0.5
DEFAULT_INCOMPLETE_STEP_WAIT_WINDOW = 1000


def env_number(names: Tuple[str, ...], default, parse):
    """First of ``names`` set in the environment, parsed; ``default`` if none is set."""
    for name in names:
        raw = os.environ.get(name)
        if raw is None or not raw.strip():
            continue
        try:
            value = parse(raw.strip())
        except ValueError:
            raise ValueError(f"environment variable {name}={raw!r} is not a valid number") from None
        if value < 0:
            raise ValueError(f"environment variable {name}={raw!r} must not be negative")
        return value
    return default


def validate_range_steps(range_steps):
    if range_steps is None:
        return None
    if not isinstance(range_steps, (tuple, list)) or len(range_steps) != 2:
        raise ValueError(f"range_steps must be a (begin, end) pair, got {range_steps!r}")
    begin, end = range_steps
    begin = None if begin is None else validate_step(begin, "range_steps begin")
    end = None if end is None else validate_step(end, "range_steps end")
    if begin is not None and end is not None and end <= begin:
        raise ValueError(f"range_steps end must be greater than begin, got {range_steps!r}")
    return (begin, end)


def record_check(check: Union[bool, str, None]) -> str:
    """``create_trial``'s ``check`` as one of :data:`RECORD_CHECKS`."""
    if check is True:
        return "full"
    if check is False or check is None:
        return "minimal"
    if check in RECORD_CHECKS:
        return check
    raise ValueError(f"check must be True, False or one of {RECORD_CHECKS}, got {check!r}")


def wait_timeout(value: Optional[float]) -> float:
    """Seconds to wait for files that should be there (None: $SMDEBUG_TRIAL_WAIT_TIMEOUT or 30)."""
    if value is None:
        value = env_number(("SMDEBUG_TRIAL_WAIT_TIMEOUT",), DEFAULT_WAIT_TIMEOUT_S, float)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
        raise ValueError(
            f"wait_timeout must be a non-negative number of seconds (math.inf: no limit), got {value!r}"
        )
    return float(value)


def max_expanded_elements(value: Optional[int]) -> int:
    """The most elements a record may expand to (None: $SMDEBUG_MAX_EXPANDED_ELEMENTS or 2**24)."""
    if value is None:
        value = env_number(("SMDEBUG_MAX_EXPANDED_ELEMENTS",), DEFAULT_MAX_EXPANDED_ELEMENTS, int)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"max_expanded_elements must be a non-negative integer, got {value!r}")
    return value


def incomplete_step_window() -> int:
    """How many incomplete steps are waited for (docs/format.md 5.3)."""
    window = env_number(
        ("SMDEBUG_INCOMPLETE_STEP_WAIT_WINDOW", "INCOMPLETE_STEP_WAIT_WINDOW"),
        DEFAULT_INCOMPLETE_STEP_WAIT_WINDOW,
        int,
    )
    return max(1, window)


def training_end_delay() -> float:
    """Seconds to wait after seeing the end marker before the last listing."""
    # The original always slept 1 s after seeing the end marker, "to let the last files
    # land". We check the marker *before* listing, and writers create it only after
    # every other file (docs/format.md 5.4), so that listing is already complete: no delay
    # unless one is asked for.
    return env_number(("SMDEBUG_TRAINING_END_DELAY_REFRESH", "TRAINING_END_DELAY_REFRESH"), 0.0, float)
