"""When to save: SaveConfig and its per-mode part, SaveConfigMode.

Semantics (the original library's, see docs/format.md 8.2):

* decisions are taken on the *mode step* of the current mode;
* a step is saved if it is in ``save_steps`` **or** if
  ``start_step <= step < end_step and step % save_interval == 0``
  (``save_steps`` is a union with the interval, ``end_step`` is exclusive, and
  the modulo is taken on the absolute step, not relative to ``start_step``);
* fields left as ``None`` are inherited from the same SaveConfig's base fields, then
  from the built-in defaults (interval 500, or the framework's own default such as
  XGBoost's 10); a collection's config takes from the hook's only the modes it leaves
  out (per mode, never per field), except where ``fields_from_hook`` is set.
"""
from __future__ import annotations

import bisect
from typing import Dict, Iterable, List, Optional

from .exceptions import ConfigError, loads_from_json
from .modes import ALL_MODES, ModeKeys

DEFAULT_SAVE_INTERVAL = 500
_FIELDS = ("save_interval", "start_step", "end_step", "save_steps")

def _check_int(field, value, minimum, allow_none=True):
    if value is None and allow_none:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{field} must be an integer, got {value!r}")
    if not isinstance(value, int):
        # Accept integral numpy scalars and numeric strings (JSON configs hold strings).
        try:
            as_int = int(str(value).strip()) if isinstance(value, str) else int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{field} must be an integer, got {value!r}") from None
        if isinstance(value, float) and value != as_int:
            raise ConfigError(f"{field} must be an integer, got {value!r}")
        value = as_int
    if value < minimum:
        raise ConfigError(f"{field} must be >= {minimum}, got {value!r}")
    return value


def _check_steps(value) -> Optional[List[int]]:
    if value is None:
        return None
    if isinstance(value, str):
        value = [v for v in (p.strip() for p in value.split(",")) if v]
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    try:
        items = list(value)
    except TypeError:
        raise ConfigError(f"save_steps must be a list of non-negative integers, got {value!r}") from None
    return sorted({_check_int("save_steps entry", v, 0, allow_none=False) for v in items})


_edits = 0


def _edited() -> None:
    """A field of a SaveConfigMode was set after construction (``coll.save_config.end_step = 0``)."""
    global _edits
    _edits += 1


def edits() -> int:
    """How many times save config fields were set in place in this process: hooks make their
    plans again when it changes (collections and their configs can change while training)."""
    return _edits


class SaveConfigMode:
    """How often to save in one mode. Any field left ``None`` is inherited.

    Args:
        save_interval: save every N mode steps (N >= 1).
        start_step: first mode step that may be saved by the interval rule.
        end_step: mode steps from here on are not saved by the interval rule (exclusive).
        save_steps: extra mode steps to save, in union with the interval rule.
    """

    __slots__ = ("_save_interval", "_start_step", "_end_step", "_save_steps", "_frozen_steps")

    def __init__(self, save_interval=None, start_step=None, end_step=None, save_steps=None):
        self._save_interval = _check_int("save_interval", save_interval, 1)
        self._start_step = _check_int("start_step", start_step, 0)
        self._end_step = _check_int("end_step", end_step, 0)
        self._save_steps = _check_steps(save_steps)
        self._frozen_steps = frozenset(self._save_steps or ())
        self._check_range()

    def _check_range(self):
        if self._end_step is not None and self._start_step is not None and self._end_step < self._start_step:
            raise ConfigError(
                f"end_step ({self._end_step}) must not be smaller than start_step ({self._start_step})"
            )

    # Properties, so that ``coll.save_config.end_step = 0`` validates too.
    @property
    def save_interval(self):
        return self._save_interval

    @save_interval.setter
    def save_interval(self, value):
        self._save_interval = _check_int("save_interval", value, 1)
        _edited()

    @property
    def start_step(self):
        return self._start_step

    @start_step.setter
    def start_step(self, value):
        self._start_step = _check_int("start_step", value, 0)
        self._check_range()
        _edited()

    @property
    def end_step(self):
        return self._end_step

    @end_step.setter
    def end_step(self, value):
        self._end_step = _check_int("end_step", value, 0)
        self._check_range()
        _edited()

    @property
    def save_steps(self):
        return self._save_steps

    @save_steps.setter
    def save_steps(self, value):
        self._save_steps = _check_steps(value)
        self._frozen_steps = frozenset(self._save_steps or ())
        _edited()

    def fields(self) -> dict:
        return {f: getattr(self, f) for f in _FIELDS}

    def filled_from(self, fallback: "SaveConfigMode") -> "SaveConfigMode":
        """A copy with every ``None`` field taken from ``fallback``."""
        mine, theirs = self.fields(), fallback.fields()
        return SaveConfigMode(**{f: mine[f] if mine[f] is not None else theirs[f] for f in _FIELDS})

    def should_save_step(self, step: int) -> bool:
        """Whether ``step`` (a mode step) is saved. Requires a fully resolved config."""
        if step in self._frozen_steps:
            return True
        start = self._start_step or 0
        end = self._end_step
        if step < start or (end is not None and step >= end):
            return False
        return step % (self._save_interval or DEFAULT_SAVE_INTERVAL) == 0

    def next_save_step(self, step: int) -> Optional[int]:
        """The first mode step from ``step`` on that :meth:`should_save_step` saves, or None
        when there is none (a hook skips the steps in between with one comparison each)."""
        explicit = self._save_steps or ()
        upcoming = explicit[bisect.bisect_left(explicit, step)] if explicit and step <= explicit[-1] else None
        interval = self._save_interval or DEFAULT_SAVE_INTERVAL
        first = max(step, self._start_step or 0)
        by_interval = -(-first // interval) * interval  # the first multiple of interval >= first
        if self._end_step is not None and by_interval >= self._end_step:
            by_interval = None
        found = [s for s in (upcoming, by_interval) if s is not None]
        return min(found) if found else None

    def to_json_dict(self) -> dict:
        return {
            "save_interval": self.save_interval,
            # None (inherited) stays None, so that a round trip keeps what is inherited.
            "save_steps": None if self.save_steps is None else list(self.save_steps),
            "start_step": self.start_step,
            "end_step": self.end_step,
        }

    @classmethod
    def from_json_dict(cls, data) -> "SaveConfigMode":
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ConfigError(f"a mode's save config must be an object, got {data!r}")
        return cls(**{f: data.get(f) for f in _FIELDS})

    # 1.0.34's names for the same round trip.
    def to_json(self) -> str:
        """This config as a JSON string; ``SaveConfigMode.from_json`` reads it back."""
        import json

        return json.dumps(self.to_json_dict())

    @classmethod
    def from_dict(cls, params, default_values: Optional[dict] = None) -> Optional["SaveConfigMode"]:
        """From a dict of fields; missing fields come from ``default_values`` (None stays None)."""
        if params is None:
            return None
        if not isinstance(params, dict) or (default_values is not None and not isinstance(default_values, dict)):
            raise ConfigError(f"SaveConfigMode.from_dict takes dicts of fields {_FIELDS}, got {params!r}, "
                              f"default_values={default_values!r}")
        return cls.from_json_dict({f: params.get(f, (default_values or {}).get(f)) for f in _FIELDS})

    @classmethod
    def from_json(cls, json_str) -> Optional["SaveConfigMode"]:
        return cls.from_dict(loads_from_json(json_str, "SaveConfigMode"))

    def __eq__(self, other):
        return isinstance(other, SaveConfigMode) and self.fields() == other.fields()

    def __repr__(self):
        set_fields = ", ".join(f"{k}={v!r}" for k, v in self.fields().items() if v is not None)
        return f"SaveConfigMode({set_fields})"


class SaveConfig:
    """How often to save, optionally per mode.

    ``SaveConfig(save_interval=100)`` saves mode steps 0, 100, 200, ... in every mode.
    ``SaveConfig(mode_save_configs={smd.modes.TRAIN: smd.SaveConfigMode(save_interval=1)})``
    configures modes separately; unspecified modes and fields use the defaults.
    The keyword fields set the base for every mode; per-mode values override them.
    """

    def __init__(
        self,
        mode_save_configs: Optional[Dict] = None,
        save_interval: Optional[int] = None,
        start_step: Optional[int] = None,
        end_step: Optional[int] = None,
        save_steps: Optional[Iterable[int]] = None,
    ):
        self.base = SaveConfigMode(save_interval, start_step, end_step, save_steps)
        # Whether unset fields come from the hook's config rather than the defaults (resolved()).
        self.fields_from_hook = False
        self.mode_save_configs: Dict[ModeKeys, SaveConfigMode] = {}
        if mode_save_configs is not None:
            if not isinstance(mode_save_configs, dict):
                raise ConfigError(
                    f"mode_save_configs must be a dict mapping modes to SaveConfigMode, got {mode_save_configs!r}"
                )
            for mode, cfg in mode_save_configs.items():
                mode = ModeKeys.parse(mode)
                if isinstance(cfg, dict):
                    cfg = SaveConfigMode(**cfg)
                elif cfg is None:
                    cfg = SaveConfigMode()
                elif not isinstance(cfg, SaveConfigMode):
                    raise ConfigError(f"save config for mode {mode.name} must be a SaveConfigMode, got {cfg!r}")
                self.mode_save_configs[mode] = cfg

    @classmethod
    def coerce(cls, value, what: str = "save_config") -> Optional["SaveConfig"]:
        """A SaveConfig from what a user may pass: None, a SaveConfig, or a dict of modes.

        A dict of SaveConfig fields (``{"save_interval": 10}``) is the usual slip: the
        message says what to write instead.
        """
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, SaveConfigMode):
            return cls(**value.fields())
        if not isinstance(value, dict):
            raise ConfigError(f"{what} must be a SaveConfig or a dict of modes (e.g. {{smd.modes.TRAIN: "
                              f"smd.SaveConfigMode(save_interval=10)}}), got {value!r}")
        fields = [k for k in value if isinstance(k, str) and k in _FIELDS]
        if fields:
            args = ", ".join(f"{k}={v!r}" for k, v in value.items())
            raise ConfigError(
                f"{what}={value!r}: a SaveConfig or a dict of modes is expected, and {', '.join(map(repr, fields))} "
                f"is a SaveConfig field, not a mode; write {what.split(' ')[0]}=SaveConfig({args})")
        try:
            return cls(mode_save_configs=value)
        except ValueError as exc:
            raise ConfigError(f"{what}={value!r}: a SaveConfig or a dict of modes (TRAIN, EVAL, PREDICT, GLOBAL) "
                              f"to SaveConfigMode is expected: {exc}") from None

    # Base fields as attributes: ``coll.save_config.end_step = 0`` disables a collection.
    save_interval = property(lambda self: self.base.save_interval,
                             lambda self, v: setattr(self.base, "save_interval", v))
    start_step = property(lambda self: self.base.start_step, lambda self, v: setattr(self.base, "start_step", v))
    end_step = property(lambda self: self.base.end_step, lambda self, v: setattr(self.base, "end_step", v))
    save_steps = property(lambda self: self.base.save_steps, lambda self, v: setattr(self.base, "save_steps", v))

    def get_save_config(self, mode) -> SaveConfigMode:
        """The (possibly partial) config of one mode: per-mode fields over base fields."""
        mode = ModeKeys.parse(mode)
        specific = self.mode_save_configs.get(mode)
        return specific.filled_from(self.base) if specific is not None else self.base.filled_from(SaveConfigMode())

    def resolved(self, parent: Optional["SaveConfig"] = None, default_interval: int = DEFAULT_SAVE_INTERVAL
                 ) -> "SaveConfig":
        """A SaveConfig with every mode and field set, as a collection's config is resolved
        against the hook's (``parent``): per mode, never per field (docs/format.md 8.2).

        A mode this config sets takes its unset fields from the base fields, then from the
        defaults, never from ``parent``: a collection's ``SaveConfig()`` saves at 0, 500, ...
        whatever the hook's interval. Only a mode left out of ``mode_save_configs`` (with no
        base fields given) is taken whole from ``parent``. A config marked ``fields_from_hook``
        (the JSON configuration's collection parameters, or fields set on a collection that had
        no config) takes each unset field from ``parent`` instead.
        """
        builtin = SaveConfigMode(save_interval=default_interval, start_step=0, end_step=None, save_steps=[])
        sets_every_mode = not self.mode_save_configs or self.base != SaveConfigMode()
        parent = parent.resolved(None, default_interval) if parent is not None else None
        modes = {}
        for mode in ALL_MODES:
            cfg = self.get_save_config(mode)
            if parent is not None:
                from_parent = parent.get_save_config(mode)
                if self.fields_from_hook:
                    cfg = cfg.filled_from(from_parent)
                elif not sets_every_mode and mode not in self.mode_save_configs:
                    cfg = from_parent
            modes[mode] = cfg.filled_from(builtin)
        return SaveConfig(mode_save_configs=modes)

    def should_save_step(self, mode, step: int) -> bool:
        """Whether mode step ``step`` of ``mode`` is saved (unset fields use the defaults)."""
        return self.get_save_config(mode).should_save_step(step)

    def to_json_dict(self) -> dict:
        return {mode.name: self.get_save_config(mode).to_json_dict() for mode in ALL_MODES}

    @classmethod
    def from_json_dict(cls, data) -> "SaveConfig":
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ConfigError(f"save_config must be an object keyed by mode name, got {data!r}")
        return cls(mode_save_configs={ModeKeys.parse(k): SaveConfigMode.from_json_dict(v) for k, v in data.items()})

    # 1.0.34's names for the same round trip.
    def to_json(self) -> str:
        """This config as a JSON string (one object per mode); ``SaveConfig.from_json`` reads it back."""
        import json

        return json.dumps(self.to_json_dict())

    @classmethod
    def from_dict(cls, params, default_values: Optional[dict] = None) -> Optional["SaveConfig"]:
        """From a dict of modes (names or ModeKeys) to SaveConfigMode or dicts of fields;
        fields a mode leaves out come from ``default_values``."""
        if params is None:
            return None
        if not isinstance(params, dict):
            raise ConfigError(f"SaveConfig.from_dict takes a dict of modes (e.g. {{'TRAIN': {{'save_interval': 10}}}}),"
                              f" got {params!r}")
        modes = {}
        for mode, value in params.items():
            if isinstance(value, dict) or value is None:
                value = SaveConfigMode.from_dict(value or {}, default_values)
            modes[ModeKeys.parse(mode)] = value
        return cls(mode_save_configs=modes)

    @classmethod
    def from_json(cls, json_str) -> Optional["SaveConfig"]:
        return cls.from_dict(loads_from_json(json_str, "SaveConfig"))

    @classmethod
    def from_save_config_mode(cls, save_config_mode: SaveConfigMode) -> "SaveConfig":
        """A SaveConfig using ``save_config_mode`` in every mode."""
        return cls(mode_save_configs={mode: save_config_mode for mode in ALL_MODES})

    def __eq__(self, other):
        return isinstance(other, SaveConfig) and all(
            self.get_save_config(m) == other.get_save_config(m) for m in ALL_MODES
        )

    def __repr__(self):
        parts = [repr(self.base)]
        parts += [f"{m.name}: {c!r}" for m, c in self.mode_save_configs.items()]
        return f"SaveConfig({', '.join(parts)})"
