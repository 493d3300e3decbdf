"""Exceptions raised by smdebug. Names follow the original library's where it had one."""


class SMDebugError(Exception):
    """Base class for every error smdebug raises on purpose."""


class ConfigError(SMDebugError, ValueError):
    """Bad user input to a hook, config object or JSON config file."""


class OutDirError(SMDebugError):
    """The output directory cannot be used (exists with a run in it, unwritable, ...)."""


class TensorUnavailable(SMDebugError):
    """No such tensor in the trial."""


class TensorUnavailableForStep(SMDebugError):
    """The tensor exists but was not saved (raw) at that step."""

    def __init__(self, tname, step, mode=None, has_reductions=False, hint=""):
        self.tname, self.step, self.mode = tname, step, mode
        msg = f"value of tensor {tname!r} is not available for step {step}"
        if mode is not None:
            msg += f" (mode {getattr(mode, 'name', mode)})"
        if has_reductions:
            msg += "; only reductions were saved for this step: use reduction_value()"
        super().__init__(msg + hint)


class ShapeUnavailableForStep(SMDebugError):
    """Neither a shape nor a value of the tensor was saved at that step."""

    def __init__(self, tname, step, mode=None):
        self.tname, self.step, self.mode = tname, step, mode
        super().__init__(f"shape of tensor {tname!r} is not available for step {step}")


class StepUnavailable(SMDebugError):
    """The step was never saved and will not be (training ended or step skipped)."""


class StepNotYetAvailable(SMDebugError):
    """The step may still be written: training has not ended."""


class MissingCollectionFiles(SMDebugError):
    """The trial directory has no collections file (and the wait for one ran out)."""


class RunNotFound(MissingCollectionFiles, FileNotFoundError):
    """The trial path does not exist, or holds runs in subdirectories rather than being one."""


class IndexReaderException(SMDebugError):
    """An index file is corrupt or does not follow the format."""


class CorruptRecord(SMDebugError):
    """A record's bytes fail their CRC or do not decode."""


class UnsafeRunFile(SMDebugError):
    """A file of a run directory that the reader refuses to read: not a regular file (a
    FIFO, a device, a socket), a symbolic link that leaves the run directory or loops, or
    larger than the format allows (docs/reader_safety.md). Readers report it through the
    error of what they were reading (IndexReaderException, CorruptCollectionsFile,
    CorruptRecord) or skip the file with a warning."""


class NoMoreData(SMDebugError):
    """Raised while waiting for steps when training ended before they appeared."""


class TrainingStopRequested(SMDebugError):
    """Raised at a step boundary once a rule (or a stop-request file) asked to stop training.

    For frameworks with no callback that can end the user's loop (PyTorch): the next step
    refuses to start, after the step that just ended is written. Catch it to end training
    your own way; ``hook.stop_reason`` holds the reason.
    """


class RuleEvaluationConditionMet(SMDebugError):
    """A rule's condition held at a step."""

    def __init__(self, rule_name, step, end_of_rule=False):
        self.rule_name, self.step, self.end_of_rule = rule_name, step, end_of_rule
        super().__init__(f"Evaluation of the rule {rule_name} at step {step} resulted in the condition being met")


class InvalidWorker(SMDebugError, ValueError):
    """A trial query named a worker that has no data for that tensor and step."""


class CorruptCollectionsFile(SMDebugError):
    """A collections file of a run does not parse or does not follow the format."""


class MissingEventFile(TensorUnavailableForStep):
    """An index file points at an event file that does not exist (and did not appear)."""

    def __init__(self, tname, step, mode, path):
        super().__init__(tname, step, mode)
        self.path = path
        self.args = (f"{self.args[0]}: its event file {path} does not exist",)


class ReductionUnavailableForStep(TensorUnavailableForStep):
    """A reduction was not saved and the raw value to compute it from was not saved either."""

    def __init__(self, tname, step, mode, reduction, saved):
        super().__init__(tname, step, mode)
        self.reduction = reduction
        saved_text = ", ".join(f"{'abs_' if a else ''}{n}" for n, a in sorted(saved)) or "none"
        name, is_abs = reduction
        self.args = (
            f"reduction {'abs_' if is_abs else ''}{name} of tensor {tname!r} is not available for step {step}: "
            f"it was not saved and neither was the raw value to compute it from (saved reductions: {saved_text})",
        )


def loads_from_json(text, what: str):
    """``json.loads`` for the ``from_json`` classmethods of the config objects: a wrong type
    or invalid JSON is a ConfigError naming the class (``what``) and the text."""
    import json

    if not isinstance(text, (str, bytes, bytearray)):
        raise ConfigError(f"{what}.from_json takes a JSON string (from to_json()), got {type(text).__name__}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{what}.from_json: not valid JSON ({exc}): {text[:200]!r}") from None


class MixedRunLayouts(SMDebugError, ValueError):
    """A run directory holds both the run store (``store/``) and smdebug 1.0.34's ``index/``
    or ``events/``: a trial reads one layout."""

