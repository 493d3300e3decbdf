"""Collections: named groups of tensors, each with its own save and reduction config.

A tensor belongs to a collection when its name is in the collection's ``tensor_names``
or matches (``re.search``) one of its ``include_regex``. Membership is decided once per
tensor name and cached by the :class:`CollectionManager`; any change to a collection
invalidates the cache, so the per-step cost is a dictionary lookup.

Per-framework defaults (regexes, collections saved by default, default interval) are data:
a :class:`FrameworkProfile` that each adapter's hook declares (``Hook.profile``); the logic
is the same for every framework. The core's own is :data:`NUMPY_PROFILE`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Literal, Optional, overload, Set, Tuple

from .exceptions import ConfigError, CorruptCollectionsFile, loads_from_json
from .reduction_config import ReductionConfig
from .save_config import DEFAULT_SAVE_INTERVAL, SaveConfig


class CollectionKeys:
    """Names of the built-in collections."""

    ALL = "all"
    DEFAULT = "default"
    WEIGHTS = "weights"
    BIASES = "biases"
    GRADIENTS = "gradients"
    LOSSES = "losses"
    SCALARS = "scalars"
    METRICS = "metrics"
    INPUTS = "inputs"
    OUTPUTS = "outputs"
    LAYERS = "layers"
    SM_METRICS = "sm_metrics"
    SEARCHABLE_SCALARS = "searchable_scalars"
    OPTIMIZER_VARIABLES = "optimizer_variables"
    UPDATES = "updates"
    ROUTER = "router"
    TENSORFLOW_SUMMARIES = "tensorflow_summaries"
    # XGBoost
    HYPERPARAMETERS = "hyperparameters"
    PREDICTIONS = "predictions"
    LABELS = "labels"
    FEATURE_IMPORTANCE = "feature_importance"
    AVERAGE_SHAP = "average_shap"
    AVERAGE_ABS_SHAP = "average_abs_shap"  # ours: the mean |SHAP| (1.0.34's average_shap is signed)
    FULL_SHAP = "full_shap"
    TREES = "trees"


K = CollectionKeys
#: Single-valued collections: TensorBoard scalars, never reductions or histograms.
SCALAR_COLLECTIONS = frozenset({K.LOSSES, K.METRICS, K.SM_METRICS, K.FEATURE_IMPORTANCE, K.AVERAGE_SHAP,
                                K.AVERAGE_ABS_SHAP})
#: Collections always saved as the raw tensor with no reductions.
RAW_ONLY_COLLECTIONS = SCALAR_COLLECTIONS | {K.TENSORFLOW_SUMMARIES, K.SEARCHABLE_SCALARS, K.SCALARS}
#: Collections that only make sense while training: never saved in EVAL/PREDICT.
TRAIN_ONLY_COLLECTIONS = frozenset({K.GRADIENTS, K.OPTIMIZER_VARIABLES, K.UPDATES})


@dataclass(frozen=True)
class FrameworkProfile:
    """What differs between frameworks: default regexes, default-saved collections, naming."""

    name: str
    regexes: Dict[str, Tuple[str, ...]]
    default_included: Tuple[str, ...]
    default_save_interval: int = DEFAULT_SAVE_INTERVAL
    extra_collections: Tuple[str, ...] = ()
    #: Reduction tags name ``w`` for a tensor ``w:0`` (every framework but TensorFlow,
    #: whose tags keep the output index: docs/format.md).
    strip_output_index_in_reduction_tags: bool = True
    #: Collections that exist once asked for by name (then with these regexes), not before: a
    #: run that never asks for one lists none (PyTorch's ``optimizer_variables``: readers that
    #: tell TensorFlow runs by that collection keep telling them apart).
    on_demand: Dict[str, Tuple[str, ...]] = field(default_factory=dict)

    def collection_names(self) -> List[str]:
        names = [K.ALL, K.DEFAULT, *self.regexes, *self.default_included, *self.extra_collections]
        return list(dict.fromkeys(names))


#: Weights, biases and gradients by name, for frameworks whose parameter names say it.
PARAMETER_REGEXES = {
    K.WEIGHTS: (r"^(?!gradient).*weight",),
    K.BIASES: (r"^(?!gradient).*bias",),
    K.GRADIENTS: (r"^gradient",),
}

#: What an optimizer step did, for adapters that see it (PyTorch): ``update/<weight name>``, the
#: value just after the step minus just before, and ``optimizer/<weight name>/<state key>``,
#: the optimizer's state after it (docs/format.md 8.4).
UPDATE_PREFIX = "update/"
OPTIMIZER_STATE_PREFIX = "optimizer/"
#: :data:`PARAMETER_REGEXES` with those two collections (weights and biases leave their names out).
OPTIMIZER_STEP_REGEXES = {
    K.WEIGHTS: (r"^(?!gradient|update/|optimizer/).*weight",),
    K.BIASES: (r"^(?!gradient|update/|optimizer/).*bias",),
    K.GRADIENTS: (r"^gradient",),
    K.UPDATES: (r"^update/",),
}
#: ... and ``optimizer_variables``, a collection created when asked for (FrameworkProfile.on_demand).
OPTIMIZER_STATE_REGEXES: Dict[str, Tuple[str, ...]] = {K.OPTIMIZER_VARIABLES: (r"^optimizer/",)}

#: smd.Hook's (numpy arrays saved by hand); adapters declare their own.
NUMPY_PROFILE = FrameworkProfile(
    "numpy", {**PARAMETER_REGEXES, K.LOSSES: (r"[Ll]oss",)}, (K.LOSSES,), extra_collections=(K.SCALARS,)
)


def as_name_list(value, what: str) -> List[str]:
    """``value`` as a list of strings: one string is a one-item list, not its letters.

    Every argument that takes names or regexes (``include_collections``, ``include_regex``,
    ``tensor_names``, ``collections_to_write``, ...) goes through here, so that
    ``include_collections="weights"`` means ``["weights"]`` everywhere. None is an empty list.
    """
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (bytes, dict)) or not isinstance(value, Iterable):
        raise ConfigError(f"{what} must be a string or a list of strings, got {value!r}")
    items = list(value)
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"{what} must hold strings, got {item!r} in {value!r}")
    return items


def describe_object(obj) -> str:
    """A one-line description of ``obj`` for messages: its type and shape, or a short repr."""
    shape = getattr(obj, "shape", None)
    if shape is not None:
        return f"a {type(obj).__name__} of shape {tuple(shape)}"
    text = repr(obj)
    text = text if len(text) <= 60 and "\n" not in text else text.splitlines()[0][:57] + "..."
    return f"{type(obj).__name__} {text}"


try:  # the regex parser behind re.compile, to look at an untrusted pattern before using it
    from re import _parser as _sre_parse  # Python 3.11+
except ImportError:  # pragma: no cover - Python < 3.11
    import sre_parse as _sre_parse

#: Collections files come from the run directory and are untrusted; Python's backtracking
#: regex engine takes exponential time on nested quantifiers (``^(a+)+$``) and polynomial
#: time of a degree that grows with each unbounded quantifier (``.*.*.*x`` takes seconds
#: on a 1000-character name). Their regexes are checked before use (docs/reader_safety.md).
UNTRUSTED_REGEX_MAX_CHARS = 1000
#: At most this many unbounded quantifiers (``*``, ``+``, ``{n,}``) in an untrusted regex, a
#: last one with nothing after it not counted: matching stays at most cubic in the name.
UNTRUSTED_REGEX_MAX_UNBOUNDED = 2
_REPEATS = frozenset({"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"})
_BACKREFS = frozenset({"GROUPREF", "GROUPREF_EXISTS"})


def untrusted_regex_problem(regex: str) -> Optional[str]:
    """Why ``regex`` (from an untrusted file) may take super-polynomial or long polynomial
    time to match, or None when it is safe to run: no backreferences, no quantifier or
    alternation inside a repeated part, few unbounded quantifiers, a bounded length.
    Conservative: it refuses some harmless patterns, never runs the pattern."""
    if len(regex) > UNTRUSTED_REGEX_MAX_CHARS:
        return f"it is longer than {UNTRUSTED_REGEX_MAX_CHARS} characters"
    try:
        parsed = _sre_parse.parse(regex)
    except (re.error, RecursionError, OverflowError) as exc:
        return f"it does not parse ({exc})"
    unbounded = 0

    def walk(items, repeated: bool) -> Optional[str]:
        nonlocal unbounded
        for op, arg in items:
            name = str(op)
            if name in _BACKREFS:
                return "it uses a backreference"
            if name in _REPEATS:
                low, high, body = arg
                if repeated:
                    return "it has a quantifier inside a repeated part (nested quantifiers)"
                if high == _sre_parse.MAXREPEAT:
                    unbounded += 1
                problem = walk(body, repeated or high > 1)
            elif name == "BRANCH":
                if repeated:
                    return "it has an alternation inside a repeated part"
                problem = None
                for branch in arg[1]:
                    problem = problem or walk(branch, repeated)
            elif name == "SUBPATTERN":
                problem = walk(arg[-1], repeated)
            elif name in ("ASSERT", "ASSERT_NOT"):
                problem = walk(arg[1], repeated)
            elif name == "ATOMIC_GROUP":
                problem = walk(arg, repeated)
            else:
                problem = None
            if problem:
                return problem
        return None

    problem = walk(parsed, False)
    if problem:
        return problem
    last = list(parsed)[-1:] if len(parsed) else []
    if last and str(last[0][0]) in _REPEATS and last[0][1][1] == _sre_parse.MAXREPEAT:
        unbounded -= 1  # nothing after it can fail: it never backtracks
    if unbounded > UNTRUSTED_REGEX_MAX_UNBOUNDED:
        return (f"it has {unbounded} unbounded quantifiers (*, +, {{n,}}) before its end; "
                f"at most {UNTRUSTED_REGEX_MAX_UNBOUNDED} are run")
    return None


class _RefusedPattern:
    """Stands in for an untrusted regex that was not compiled: matching through it raises
    an error naming the collection and the regex (the rest of the run stays readable)."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message

    def search(self, _name):
        raise CorruptCollectionsFile(self.message)


def _compile(regex: str) -> "re.Pattern":
    if not isinstance(regex, str):
        raise ConfigError(f"include_regex entries must be strings, got {regex!r}")
    try:
        return re.compile(regex)
    except re.error as exc:
        raise ConfigError(f"invalid regex {regex!r} in include_regex: {exc}") from None


class Collection:
    """A named group of tensors with its own save and reduction configuration.

    Args:
        name: the collection's name, e.g. ``"weights"``.
        include_regex: regexes; tensors whose names match any (``re.search``) belong here.
        tensor_names: exact tensor names that belong here.
        reduction_config: overrides the hook's ReductionConfig for these tensors.
        save_config: overrides the hook's SaveConfig for these tensors.
        save_histogram: write TensorBoard histograms for these tensors (when TensorBoard is on).
    """

    def __init__(
        self,
        name: str,
        include_regex: Optional[Iterable[str]] = None,
        tensor_names: Optional[Iterable[str]] = None,
        reduction_config: Optional[ReductionConfig] = None,
        save_config: Optional[SaveConfig] = None,
        save_histogram: bool = True,
    ):
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a collection name must be a non-empty string, got {name!r}")
        self.name = name
        self._on_change: Callable[[], None] = lambda: None
        self._regexes: List[str] = []
        self._patterns: List["re.Pattern"] = []
        self._tensor_names: set = set()
        # Framework objects (modules, layers, blocks, tf.Variables) an adapter resolves to names.
        self.layer_requests: List[Tuple[object, bool, bool]] = []
        self.framework_objects: List[object] = []
        self._on_object: Optional[Callable[["Collection", object], None]] = None
        self.include(include_regex or [])
        for t in as_name_list(tensor_names, "tensor_names"):
            self.add_tensor_name(t)
        self.reduction_config = reduction_config
        self.save_config = save_config
        self.save_histogram = save_histogram

    # --- configuration properties ----------------------------------------------------
    @property
    def include_regex(self) -> Tuple[str, ...]:
        """The regexes (read-only tuple; assign a list or call ``include()`` to change)."""
        return tuple(self._regexes)

    @include_regex.setter
    def include_regex(self, regexes):
        self._regexes, self._patterns = [], []
        self.include(regexes or [])

    @property
    def tensor_names(self) -> Set[str]:
        """Exact tensor names: a copy, a ``set`` as in 1.0.34 (assign a list or call
        ``add_tensor_name()`` to change them)."""
        return set(self._tensor_names)

    @tensor_names.setter
    def tensor_names(self, names):
        self._tensor_names = set()
        for n in as_name_list(names, "tensor_names"):
            self.add_tensor_name(n)
        self._on_change()

    @property
    def reduction_config(self) -> Optional[ReductionConfig]:
        return self._reduction_config

    @reduction_config.setter
    def reduction_config(self, value):
        if value is not None and not isinstance(value, ReductionConfig):
            raise ConfigError(f"reduction_config must be a ReductionConfig or None, got {value!r}")
        self._reduction_config = value
        self._on_change()

    @property
    def save_config(self) -> SaveConfig:
        """The collection's SaveConfig. Unset fields inherit the hook's.

        Always returns an object, so ``coll.save_config.end_step = 0`` works (it
        switches the collection off).
        """
        if self._save_config is None:
            # Fields set on it later (``end_step = 0``) override the hook's; the rest stay the hook's.
            self._save_config = SaveConfig()
            self._save_config.fields_from_hook = True
        return self._save_config

    @save_config.setter
    def save_config(self, value):
        self._save_config = SaveConfig.coerce(value, f"save_config of collection {self.name!r}")
        self._on_change()

    @property
    def save_histogram(self) -> bool:
        return self._save_histogram

    @save_histogram.setter
    def save_histogram(self, value):
        if not isinstance(value, bool):
            raise ConfigError(f"save_histogram must be True or False, got {value!r}")
        self._save_histogram = value
        self._on_change()

    # --- membership ----------------------------------------------------------------
    def include(self, regex) -> None:
        """Add a regex or a list of regexes; matching tensors join this collection."""
        for r in as_name_list(regex, "include_regex"):
            pattern = _compile(r)
            if r not in self._regexes:
                self._regexes.append(r)
                self._patterns.append(pattern)
        self._on_change()

    def add_tensor_name(self, name: str) -> None:
        """Add one exact tensor name."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"tensor names must be non-empty strings, got {name!r}")
        if name not in self._tensor_names:
            self._tensor_names.add(name)
            self._on_change()

    def add(self, arg) -> None:
        """Add tensor names (strings) or framework objects (a tf.Variable, a torch module...).

        Framework objects go to the adapter of the hook that owns this collection, which
        resolves them to names or raises ConfigError saying what to use instead; without
        one (a collection made on its own) they are kept in ``framework_objects``.
        """
        items = arg if isinstance(arg, (list, tuple, set, frozenset)) else [arg]
        for item in items:
            if isinstance(item, str):
                self.add_tensor_name(item)
            elif self._on_object is not None:
                self._on_object(self, item)
            else:
                self.framework_objects.append(item)
        self._on_change()

    def add_layer_tensors(self, layer, inputs: bool = False, outputs: bool = True) -> None:
        """Save the inputs and/or outputs of a layer (PyTorch module, Keras layer, Gluon block).

        The adapter that owns the layer's framework names its tensors and attaches the
        capture when the model is registered with the hook.
        """
        if not (inputs or outputs):
            raise ConfigError("add_layer_tensors needs inputs=True or outputs=True (both are False)")
        self.layer_requests.append((layer, bool(inputs), bool(outputs)))
        self._on_change()

    # The seeds give one name per framework for the same operation.
    add_module_tensors = add_layer_tensors  # PyTorch
    add_block_tensors = add_layer_tensors  # MXNet Gluon
    add_keras_layer = add_layer_tensors  # tf.keras

    def has_regex_or_names(self) -> bool:
        return bool(self._regexes or self._tensor_names or self.layer_requests or self.framework_objects)

    def matches(self, tensor_name: str) -> bool:
        """Whether ``tensor_name`` belongs to this collection."""
        return tensor_name in self._tensor_names or any(p.search(tensor_name) for p in self._patterns)

    # --- serialization (the collections file, docs/format.md 4.2) ----------------------------
    def to_json_dict(self) -> dict:
        return {
            "name": self.name,
            "include_regex": list(self._regexes),
            "tensor_names": sorted(self._tensor_names),
            "reduction_config": self._reduction_config.to_json_dict() if self._reduction_config else None,
            "save_config": self._save_config.to_json_dict() if self._save_config is not None else None,
            "save_histogram": self._save_histogram,
        }

    @classmethod
    def from_json_dict(cls, data: dict, untrusted: bool = False) -> "Collection":
        """A collection from its collections-file entry. ``untrusted``: the regexes come
        from a file (a run directory): one that could match slowly is not compiled, and
        matching through this collection raises CorruptCollectionsFile naming it."""
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ConfigError(f"a collection entry must be an object with a string 'name', got {data!r}")
        regexes = data.get("include_regex") or []
        names = data.get("tensor_names") or []
        if not isinstance(regexes, list) or not isinstance(names, list):
            raise ConfigError(f"collection {data['name']!r}: include_regex and tensor_names must be lists")
        hist = data.get("save_histogram", True)
        coll = cls(
            data["name"],
            include_regex=None if untrusted else regexes,
            tensor_names=names,
            reduction_config=ReductionConfig.from_json_dict(data.get("reduction_config")),
            save_config=SaveConfig.from_json_dict(data.get("save_config")) if data.get("save_config") else None,
            save_histogram=hist if isinstance(hist, bool) else True,
        )
        if untrusted:
            for r in regexes:
                problem = untrusted_regex_problem(r) if isinstance(r, str) else None
                if problem is None:
                    coll.include(r)
                elif r not in coll._regexes:
                    # Kept as written (include_regex shows the file's content), never compiled.
                    coll._regexes.append(r)
                    coll._patterns.append(_RefusedPattern(
                        f"collection {coll.name!r}: regex {r!r} of the collections file is not run: {problem} "
                        "(it could take too long to match; see docs/reader_safety.md)"))
        return coll

    # 1.0.34's names for the same round trip.
    def to_json(self) -> str:
        """This collection as a JSON string; ``Collection.from_json`` reads it back."""
        return json.dumps(self.to_json_dict())

    @classmethod
    def from_dict(cls, params: dict) -> "Collection":
        """From ``to_json_dict()``'s form (1.0.34's collections-file entry)."""
        return cls.from_json_dict(params)

    @classmethod
    def from_json(cls, json_str) -> "Collection":
        return cls.from_json_dict(loads_from_json(json_str, "Collection"))

    def __eq__(self, other):
        # As in 1.0.34: equal when configured alike (a round trip through JSON compares equal).
        if not isinstance(other, Collection):
            return NotImplemented
        return self.to_json_dict() == other.to_json_dict()

    def __hash__(self):
        return hash(self.name)

    def __repr__(self):
        return (f"Collection(name={self.name!r}, include_regex={list(self._regexes)}, "
                f"tensor_names={sorted(self._tensor_names)}, save_histogram={self._save_histogram})")


class CollectionManager:
    """All collections of a hook (or a trial), with cached name -> collections matching."""

    def __init__(self, profile: Optional[FrameworkProfile] = None):
        self.collections: Dict[str, Collection] = {}
        self.version = 0
        self._membership: Dict[str, Tuple[Collection, ...]] = {}
        #: Called with each collection added after construction (a hook that includes
        #: ``all`` includes it too).
        self.on_new_collection: Optional[Callable[[Collection], None]] = None
        #: ``(collection, obj)`` for framework objects given to ``Collection.add`` (set by adapters).
        self.object_handler: Optional[Callable[[Collection, object], None]] = None
        self._on_demand = profile.on_demand if profile is not None else {}
        if profile is not None:
            for name in profile.collection_names():
                self.add(Collection(name, include_regex=profile.regexes.get(name, ())))

    def _changed(self) -> None:
        self.version += 1
        self._membership.clear()

    def add(self, collection) -> Collection:
        """Add (or replace) a collection; a name adds an empty one unless it exists (as in 1.0.34)."""
        if isinstance(collection, str):
            return self.get(collection)
        if not isinstance(collection, Collection):
            raise ConfigError(f"CollectionManager.add takes a Collection or a collection name, got {collection!r}")
        collection._on_change = self._changed
        collection._on_object = self._object
        new = collection.name not in self.collections
        self.collections[collection.name] = collection
        self._changed()
        if new and self.on_new_collection is not None:
            self.on_new_collection(collection)
        return collection

    def _object(self, collection: Collection, obj) -> None:
        if self.object_handler is not None:
            self.object_handler(collection, obj)
        else:
            collection.framework_objects.append(obj)

    @overload
    def get(self, name: str, create: Literal[True] = True) -> Collection: ...

    @overload
    def get(self, name: str, create: bool) -> Optional[Collection]: ...

    def get(self, name: str, create: bool = True) -> Optional[Collection]:
        """The named collection, created empty on first use (unless ``create=False``)."""
        coll = self.collections.get(name)
        if coll is None and create:
            coll = self.add(Collection(name, include_regex=self._on_demand.get(name, ())))
        return coll

    def __getitem__(self, name):
        return self.collections[name]

    # --- 1.0.34's names ------------------------------------------------------------------
    def create_collection(self, name: str) -> Collection:
        """Create the empty collection ``name`` if it does not exist; returns it."""
        return self.get(name)

    def get_collections(self) -> Dict[str, Collection]:
        return self.collections

    def to_json_dict(self, num_workers: int = 1) -> dict:
        """The collections-file document (docs/format.md 4.2)."""
        return json.loads(self.to_json_bytes(num_workers))

    def export(self, out_dir, filename: Optional[str] = None, num_workers: int = 1) -> str:
        """Write the collections file. ``export(out_dir, filename)`` writes
        ``out_dir/collections/000000000/filename`` as 1.0.34 did (``filename`` is
        ``"<worker>_collections.json"`` for a run directory the Trial reads);
        ``export(path)`` writes the file ``path``. Returns the path written."""
        import os

        path = os.fspath(out_dir)
        if filename is not None:
            path = os.path.join(path, "collections", "000000000", filename)
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(self.to_json_bytes(num_workers))
        return path

    @classmethod
    def load(cls, filename) -> "CollectionManager":
        """Read a collections file written by :meth:`export` (or by a hook)."""
        with open(filename, "rb") as fh:
            return cls.from_json(fh.read())[0]

    @classmethod
    def load_from_string(cls, s) -> "CollectionManager":
        return cls.from_json(s)[0]

    def __eq__(self, other):
        if not isinstance(other, CollectionManager):
            return NotImplemented
        return self.collections == other.collections

    __hash__ = object.__hash__  # managers are mutable holders, hashed by identity

    def __contains__(self, name):
        return name in self.collections

    def __iter__(self):
        return iter(self.collections.values())

    def __len__(self):
        return len(self.collections)

    def collections_for(self, tensor_name: str) -> Tuple[Collection, ...]:
        """Collections containing ``tensor_name``; matched once per name, then cached."""
        hit = self._membership.get(tensor_name)
        if hit is None:
            hit = tuple(c for c in self.collections.values() if c.matches(tensor_name))
            self._membership[tensor_name] = hit
        return hit

    def to_json_bytes(self, num_workers: int, entry=None) -> bytes:
        """The collections file (docs/format.md 4.3). ``entry(name, collection)`` gives each
        collection's object (a hook's resolved configs); by default, as configured."""
        entry = entry or (lambda name, collection: collection.to_json_dict())
        doc = {
            "collections": {name: entry(name, c) for name, c in sorted(self.collections.items())},
            "_meta": {"num_workers": int(num_workers)},
        }
        return json.dumps(doc).encode()

    @classmethod
    def from_json(cls, data, untrusted: bool = False) -> Tuple["CollectionManager", int]:
        """Parse a collections file; returns ``(manager, num_workers)``. Its structure is
        always checked; with ``untrusted`` (a file of a run directory, not the user's own
        config) regexes that could match too slowly are not run either
        (:meth:`Collection.from_json_dict`)."""
        try:
            doc = json.loads(data)
        except RecursionError:
            raise ConfigError("collections file is nested too deeply to be valid") from None
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"collections file is not valid JSON: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("collections", {}), dict):
            raise ConfigError("collections file must be an object with a 'collections' object")
        meta = doc.get("_meta") or {}
        raw = meta.get("num_workers", 1) if isinstance(meta, dict) else 1
        # An integer (or its decimal string); not 2.5 read as 2, nor true as 1.
        if isinstance(raw, bool) or not isinstance(raw, (int, str)) or (isinstance(raw, str) and not raw.isdigit()):
            raise ConfigError(f"collections file: _meta.num_workers must be an integer, got {raw!r}")
        num_workers = int(raw)
        if num_workers < 1:
            raise ConfigError(f"collections file: _meta.num_workers must be >= 1, got {num_workers}")
        manager = cls()
        for name, entry in doc.get("collections", {}).items():
            if isinstance(entry, dict):
                entry = {"name": name, **entry}
            manager.add(Collection.from_json_dict(entry, untrusted))
        return manager, num_workers
