"""``no_refresh`` and ``refresh``: whether a trial lists its run directory again for new steps,
inside a block, as in smdebug 1.0.34."""
import contextlib
from typing import Iterable, Union

__all__ = ["no_refresh", "refresh"]


@contextlib.contextmanager
def no_refresh(trials: Union[object, Iterable[object]]):
    """Inside the block, ``trials`` (one Trial or several) do not look for new steps.

    Reads inside the block see the steps present when it began, so several reads of a
    run that is still training agree with each other and cost no directory listing.
    Each trial's ``dynamic_refresh`` is restored when the block ends.
    """
    with _dynamic_refresh(trials, False, "no_refresh") as given:
        yield given


@contextlib.contextmanager
def refresh(trials: Union[object, Iterable[object]]):
    """Inside the block, ``trials`` (one Trial or several) look for new steps at each read,
    as a trial does by default; for code that turned it off. Each trial's
    ``dynamic_refresh`` is restored when the block ends."""
    with _dynamic_refresh(trials, True, "refresh") as given:
        yield given


@contextlib.contextmanager
def _dynamic_refresh(trials, value: bool, what: str):
    from .trials import Trial

    given = trials
    if isinstance(trials, Trial):
        trials = [trials]
    else:
        try:
            trials = list(trials)
        except TypeError:
            raise TypeError(f"{what} takes a Trial or a list of Trials, got {trials!r}") from None
        for t in trials:
            if not isinstance(t, Trial):
                raise TypeError(f"{what} takes a Trial or a list of Trials; {t!r} is not a Trial "
                                "(open one with smdebug.trials.create_trial(path))")
    saved = [t.dynamic_refresh for t in trials]
    for t in trials:
        t.dynamic_refresh = value
    try:
        yield given
    finally:
        for t, was in zip(trials, saved):
            t.dynamic_refresh = was
