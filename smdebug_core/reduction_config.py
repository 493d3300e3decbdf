"""What to save of a tensor: reductions, norms, the raw tensor, its shape.

Reductions are computed in the training process (on the framework's device, batched)
and stored as their own records tagged ``smdebug/reductions/[abs_]<op>/<tensor>``.

Definitions are the same for every framework (the original library's differed per
framework): ``std``/``variance`` are population statistics (ddof 0), and ``l1``/``l2``
are norms of the flattened tensor.
"""
from __future__ import annotations

import functools

import re
from typing import Iterable, List, Optional, Tuple

from .exceptions import ConfigError, loads_from_json
from .reductions import NORMS, NOT_IN_ORIGINAL, REDUCTIONS

ALLOWED_REDUCTIONS = REDUCTIONS
ALLOWED_NORMS = NORMS
# The original reader rejects a collections file whose "reductions" names one of these, so
# they are written under EXTRA_REDUCTIONS_KEY, which it ignores.
_NOT_IN_ORIGINAL = NOT_IN_ORIGINAL
EXTRA_REDUCTIONS_KEY = "extra_reductions"
REDUCTION_TAG_PREFIX = "smdebug/reductions/"


def _check_names(field: str, values, allowed) -> List[str]:
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    try:
        names = list(values)
    except TypeError:
        raise ConfigError(f"{field} must be a list of names from {list(allowed)}, got {values!r}") from None
    for name in names:
        if name not in allowed:
            raise ConfigError(f"unknown {field[:-1]} {name!r} in {field}; allowed: {', '.join(allowed)}")
    # Keep the user's order, drop duplicates.
    return list(dict.fromkeys(names))


def _check_bool(field: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{field} must be True or False, got {value!r}")
    return value


class ReductionConfig:
    """Which reductions of a tensor to save, and whether to save the tensor itself.

    Args:
        reductions: any of min, max, median, mean, std, variance, sum, prod, and the health
            reductions nonfinite, zero_fraction, kurtosis, overflow_<t> and underflow_<t> for
            t in fp16, bf16, fp8_e4m3, fp8_e5m2 (docs/format.md, section 8.3).
        abs_reductions: the same, computed on the absolute value of the tensor.
        norms: any of l1, l2 (norms of the flattened tensor).
        abs_norms: the same, on the absolute value.
        save_raw_tensor: also save the full tensor.
        save_shape: save the tensor's shape (cheap; kept in the index only).
    """

    def __init__(
        self,
        reductions: Optional[Iterable[str]] = None,
        abs_reductions: Optional[Iterable[str]] = None,
        norms: Optional[Iterable[str]] = None,
        abs_norms: Optional[Iterable[str]] = None,
        save_raw_tensor: bool = False,
        save_shape: bool = False,
    ):
        self.reductions = _check_names("reductions", reductions, ALLOWED_REDUCTIONS)
        self.abs_reductions = _check_names("abs_reductions", abs_reductions, ALLOWED_REDUCTIONS)
        self.norms = _check_names("norms", norms, ALLOWED_NORMS)
        self.abs_norms = _check_names("abs_norms", abs_norms, ALLOWED_NORMS)
        self.save_raw_tensor = _check_bool("save_raw_tensor", save_raw_tensor)
        self.save_shape = _check_bool("save_shape", save_shape)

    def all_reductions(self) -> List[Tuple[str, bool]]:
        """Every requested reduction as ``(name, abs)``, in the order records are written."""
        return (
            [(r, False) for r in self.reductions]
            + [(n, False) for n in self.norms]
            + [(r, True) for r in self.abs_reductions]
            + [(n, True) for n in self.abs_norms]
        )

    @property
    def has_reductions(self) -> bool:
        return bool(self.reductions or self.abs_reductions or self.norms or self.abs_norms)

    # --- the comma-string form used by JSON configs and collections files -------------
    @classmethod
    def from_string(cls, text: str, save_raw_tensor: bool = False, save_shape: bool = False) -> "ReductionConfig":
        """Parse ``"min,max,abs_mean,l2_norm"``.

        A norm may be written ``l2_norm`` (the original library's spelling, which it
        requires) or ``l2`` (the spelling of its documentation); both are accepted.
        """
        if not isinstance(text, str):
            raise ConfigError(f"reductions must be a comma-separated string, got {text!r}")
        buckets = {"reductions": [], "abs_reductions": [], "norms": [], "abs_norms": []}
        allowed_words = ", ".join(
            list(ALLOWED_REDUCTIONS) + [f"{n}_norm" for n in ALLOWED_NORMS]
            + ["abs_<any of these>"]
        )
        for item in (p.strip() for p in text.split(",")):
            if not item:
                continue
            word, is_abs = split_reduction_label(item)
            if word.endswith("_norm") and word[: -len("_norm")] in ALLOWED_NORMS:
                word = word[: -len("_norm")]  # only l1_norm/l2_norm: "median_norm" is no "median"
            if word in ALLOWED_NORMS:
                buckets["abs_norms" if is_abs else "norms"].append(word)
            elif word in ALLOWED_REDUCTIONS:
                buckets["abs_reductions" if is_abs else "reductions"].append(word)
            else:
                raise ConfigError(f"unknown reduction {item!r} in {text!r}; allowed: {allowed_words}")
        return cls(save_raw_tensor=save_raw_tensor, save_shape=save_shape, **buckets)

    def to_string(self) -> str:
        """The comma-string form, in the original's order (plain, norms, abs, abs norms)."""
        return ",".join(self._words())

    def _words(self) -> List[str]:
        return (
            list(self.reductions)
            + [f"{n}_norm" for n in self.norms]
            + [f"abs_{r}" for r in self.abs_reductions]
            + [f"abs_{n}_norm" for n in self.abs_norms]
        )

    def to_json_dict(self) -> dict:
        """The collections-file form; readable by the original smdebug too."""
        words = self._words()
        extra = [w for w in words if w.replace("abs_", "", 1) in _NOT_IN_ORIGINAL]
        doc = {
            "save_raw_tensor": self.save_raw_tensor,
            "reductions": ",".join(w for w in words if w not in extra),
            "save_shape": self.save_shape,
        }
        if extra:
            doc[EXTRA_REDUCTIONS_KEY] = ",".join(extra)
        return doc

    @classmethod
    def from_json_dict(cls, data) -> Optional["ReductionConfig"]:
        if data is None:
            return None
        if not isinstance(data, dict):
            raise ConfigError(f"reduction_config must be an object, got {data!r}")
        words = [data.get("reductions") or "", data.get(EXTRA_REDUCTIONS_KEY) or ""]
        if not all(isinstance(w, str) for w in words):
            raise ConfigError(f"reduction_config reductions must be comma-separated strings, got {data!r}")
        return cls.from_string(
            ",".join(w for w in words if w),
            save_raw_tensor=bool(data.get("save_raw_tensor", False)),
            save_shape=bool(data.get("save_shape", False)),
        )

    # 1.0.34's names for the same round trip.
    def to_json(self) -> str:
        """This config as a JSON string; ``ReductionConfig.from_json`` reads it back."""
        import json

        return json.dumps(self.to_json_dict())

    @classmethod
    def from_dict(cls, params) -> Optional["ReductionConfig"]:
        """From ``to_json_dict()``'s form, or 1.0.34's keyword form (``{"norms": ["l2"], ...}``)."""
        if isinstance(params, dict) and "reductions" not in params and EXTRA_REDUCTIONS_KEY not in params:
            allowed = ("reductions", "abs_reductions", "norms", "abs_norms", "save_raw_tensor", "save_shape")
            unknown = [k for k in params if k not in allowed]
            if unknown:
                raise ConfigError(f"ReductionConfig.from_dict: unknown keys {unknown}; allowed: {', '.join(allowed)}")
            return cls(**params)
        return cls.from_json_dict(params)

    @classmethod
    def from_json(cls, json_str) -> Optional["ReductionConfig"]:
        return cls.from_dict(loads_from_json(json_str, "ReductionConfig"))

    def __eq__(self, other):
        return isinstance(other, ReductionConfig) and self.to_json_dict() == other.to_json_dict()

    def __repr__(self):
        return (
            f"ReductionConfig(reductions={self.reductions}, abs_reductions={self.abs_reductions}, "
            f"norms={self.norms}, abs_norms={self.abs_norms}, save_raw_tensor={self.save_raw_tensor}, "
            f"save_shape={self.save_shape})"
        )


def reduction_label(op: str, is_abs: bool) -> str:
    """A reduction key's name: ``l2``, ``abs_max``... (the ``reduction`` column, record names)."""
    return f"abs_{op}" if is_abs else op


def split_reduction_label(label: str) -> Tuple[str, bool]:
    """``"abs_max"`` -> ``("max", True)``, ``"l2"`` -> ``("l2", False)``: :func:`reduction_label` undone."""
    return (label[4:], True) if label.startswith("abs_") else (label, False)


@functools.lru_cache(maxsize=1 << 16)  # the same few tags at every saved step
def reduction_tag(tensor_name: str, reduction: str, is_abs: bool, strip_output_index: bool = True) -> str:
    """The record name of a reduction, e.g. ``smdebug/reductions/abs_l2/fc.weight``.

    Like the original, every framework but TensorFlow drops ``:<digits>`` suffixes.
    """
    body = f"{reduction_label(reduction, is_abs)}/{tensor_name}"
    if strip_output_index:
        body = _strip_output_index(body)
    return REDUCTION_TAG_PREFIX + body


def parse_reduction_tag(tag: str) -> Optional[Tuple[str, bool, str]]:
    """``(reduction, abs, tensor_name)`` for a reduction record name, else None."""
    pos = tag.find(REDUCTION_TAG_PREFIX)
    if pos < 0:
        return None
    rest = tag[pos + len(REDUCTION_TAG_PREFIX):]
    op, sep, tensor = rest.partition("/")
    if not sep:
        return None
    op, is_abs = split_reduction_label(op)
    return op, is_abs, tensor


_OUTPUT_INDEX = re.compile(r":\d+")


def _strip_output_index(text: str) -> str:
    return _OUTPUT_INDEX.sub("", text)
