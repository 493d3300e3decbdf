"""What a user configures of the flight recorder (docs/flight_recorder.md): how many recent
steps of which collections to keep in memory, within how many bytes.

Configuration, like :mod:`.save_config`: checked at construction, read by the JSON config
(``HookParameters.flight_recorder``) and by the hook; the recorder itself is
:mod:`smdebug.capture.flight_recorder`.
"""
from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np

from .environment import parse_bool
from .exceptions import ConfigError

#: Defaults: 16 steps, 256 MiB, the collections that show a training going bad.
DEFAULT_STEPS = 16
DEFAULT_MAX_BYTES = 256 << 20
DEFAULT_COLLECTIONS = ("weights", "gradients", "losses")

class FlightRecorder:
    """Keep the last ``steps`` steps of ``collections`` in memory, within ``max_bytes``.

    Args:
        steps: how many of the most recent steps to keep (>= 1). Steps the hook saves
            anyway count towards them but take no memory.
        max_bytes: memory the kept steps may hold (bytes, > 0). When a new step would pass
            it, the oldest steps are dropped; a step larger than the whole budget is not kept
            (one warning).
        collections: names of the collections to keep (a name or a list). What is kept of
            them (reductions, full values, shapes) is what each collection's reduction config
            says; they are also saved as usual at their save config's steps.
        locate: also name the module where the first non-finite value appeared (the
            adapter notes each module's output and gradient every step: a cheap device
            sum each, read only when the recorder fires). False saves that cost.

    ``Hook(..., flight_recorder=FlightRecorder(steps=8, max_bytes=64 << 20))``. A dict with the
    same keys is accepted too (the JSON config's form).
    """

    __slots__ = ("steps", "max_bytes", "collections", "locate")

    def __init__(self, steps: int = DEFAULT_STEPS, max_bytes: int = DEFAULT_MAX_BYTES,
                 collections: Any = DEFAULT_COLLECTIONS, locate: bool = True):
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
            raise ConfigError(f"flight_recorder steps must be an integer >= 1 (how many recent steps to keep), "
                              f"got {steps!r}")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, np.integer)) or max_bytes <= 0:
            raise ConfigError(f"flight_recorder max_bytes must be a positive integer (the memory budget in bytes, "
                              f"e.g. 64 << 20 for 64 MiB), got {max_bytes!r}")
        if isinstance(collections, str):
            collections = [collections]
        if not isinstance(collections, (list, tuple)) or not collections or \
                not all(isinstance(c, str) and c.strip() for c in collections):
            raise ConfigError(f"flight_recorder collections must be a non-empty list of collection names, e.g. "
                              f"['weights', 'gradients', 'losses'], got {collections!r}")
        if not isinstance(locate, bool):
            raise ConfigError(f"flight_recorder locate must be True or False, got {locate!r}")
        self.locate = locate
        self.steps = int(steps)
        self.max_bytes = int(max_bytes)
        self.collections = tuple(dict.fromkeys(c.strip() for c in collections))

    @classmethod
    def coerce(cls, value, where: str = "flight_recorder") -> Optional["FlightRecorder"]:
        """None, a FlightRecorder, or a dict of its arguments (the JSON config) -> FlightRecorder."""
        if value is None or isinstance(value, FlightRecorder):
            return value
        if isinstance(value, str):  # SageMaker passes HookParameters values as strings
            try:
                value = json.loads(value)
            except ValueError:
                raise ConfigError(f"{where} must be an object such as {{\"steps\": 8, \"max_bytes\": 67108864, "
                                  f"\"collections\": [\"weights\", \"gradients\"]}}, got {value!r}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a smdebug.FlightRecorder or a dict with steps, max_bytes and "
                              f"collections, got {value!r}")
        unknown = sorted(set(value) - {"steps", "max_bytes", "collections", "locate"})
        if unknown:
            raise ConfigError(f"{where}: unknown keys {', '.join(unknown)} (known: steps, max_bytes, collections, "
                              "locate)")
        if isinstance(value.get("locate"), str):
            value = dict(value, locate=parse_bool(value["locate"], f"{where}.locate"))
        try:
            return cls(**value)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def __repr__(self):
        return (f"FlightRecorder(steps={self.steps}, max_bytes={self.max_bytes}, collections={list(self.collections)}, "
                f"locate={self.locate})")
