"""Sharded parameters: exact reductions of full tensors from their shards, at a fixed traffic.

A parameter of an FSDP2 model (``torch.distributed.fsdp.fully_shard``), any ``DTensor``
parameter, or an original parameter of an FSDP (v1) model built with
``use_orig_params=True`` lives on each worker as a piece (its *shard*) of a full tensor
that no worker holds. Its reductions are those of the full tensor, computed without
gathering it:

1. each worker reduces its own shards to a fixed row of float64 partials
   (:data:`PARTIAL_COLUMNS`, the columns of :mod:`smdebug.reduction_columns` in their
   travelling form: count, sum, sum of |x|, sum of squares, min, max, min/max of |x|, and the
   sums of squared deviations ``M2`` of x and |x| about the shard's mean; only the columns
   the saved reductions need; for the health reductions, counts and the finite elements'
   moment sums up to the 4th), all shards of the step in one call of the backend's
   ``partial_columns`` (:func:`shard_partials`), then one copy to the host;
2. the rows of every sharded tensor of the step are packed into one float64 array and
   exchanged with **one** ``all_gather`` per shard group (:class:`ShardGroups`), whatever
   the number of parameters: the collective count of a saved step is fixed;
3. every worker combines the gathered rows (:func:`combine_partials`, which is
   :func:`smdebug.reduction_columns.combine`): sums add up, extrema take the extremum, and
   variances use Chan et al.'s pairwise update ``M2 = sum(M2_i + n_i (mean_i - mean)^2)``,
   stable where ``E[x^2] - mean^2`` cancels (the 3rd and 4th moment sums by its extension),
   and finishes them with the one finisher (:func:`reductions_table`).

Only the mesh dimensions a tensor is *sharded* over are gathered: under HSDP (a 2D mesh,
replicate x shard) every replica holds the same values, and gathering over the replicate
dimension would count each element once per replica.

Reductions that cannot be combined exactly from such partials (``median``, ``prod``) are
not computed for sharded tensors (:data:`EXACT_REDUCTIONS`; one warning at
``register_module``).

Collectives run on a dedicated gloo process group per shard group, created collectively
when the model is registered, and are issued in step order on the step pipeline, from
points every rank reaches in the same order (docs/architecture.md, "Sharded parameters"):
they never interleave with training's own collectives on training's process groups.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import torch
import torch.distributed as dist

from smdebug import reductions as reference
from smdebug.reduction_columns import columns_for, combine, finish_table, to_sums, to_variances
from smdebug.reduction_config import reduction_label

ReductionKey = Tuple[str, bool]

#: The health reductions' partials (counts, finite elements' means and moment sums:
#: :data:`smdebug.reductions.HEALTH_COLUMNS`), prefixed ``h:``; ``count`` is shared.
_HEALTH_PARTIALS = tuple("h:" + c for c in reference.HEALTH_COLUMNS if c != "count")
#: The partials of one shard, one float64 each, in this order.
PARTIAL_COLUMNS = ("count", "sum", "sum_abs", "sum_sq", "min", "max", "min_abs", "max_abs", "m2",
                   "m2_abs") + _HEALTH_PARTIALS
_COL = {name: i for i, name in enumerate(PARTIAL_COLUMNS)}
#: Reductions computed exactly from shard partials (and their ``abs_`` forms).
EXACT_REDUCTIONS = frozenset({"min", "max", "mean", "std", "variance", "sum", "l1", "l2"}
                             | set(reference.HEALTH_REDUCTIONS))
#: How long a worker waits in a statistics collective for the others before it gives up (one
#: warning, sharded capture off): a peer that stopped capturing must not stall training forever.
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)


class CollectiveFailed(RuntimeError):
    """A statistics collective failed or timed out (a peer stopped taking part)."""


def inexact_reductions(keys: Sequence[ReductionKey]) -> List[str]:
    """Names of the reductions in ``keys`` that shard partials cannot give exactly."""
    return [reduction_label(op, is_abs) for op, is_abs in keys if op not in EXACT_REDUCTIONS]


# --------------------------------------------------------------------------- names
def fsdp_classes() -> tuple:
    """(FSDP v1 wrapper class, FSDP2 module mixin), each None where torch lacks it."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - torch built without distributed
        FullyShardedDataParallel = None
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch before FSDP2
        FSDPModule = None
    return FullyShardedDataParallel, FSDPModule


#: Path segments FSDP v1 and activation checkpointing insert between a model and its
#: submodules: left out of tensor names, as DDP's ``module.`` is.
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module")


def clean_path(path: str) -> str:
    """A parameter or module path without wrapper segments (``_fsdp_wrapped_module.0.weight``
    -> ``0.weight``)."""
    if "_wrapped_module" not in path:
        return path
    return ".".join(part for part in path.split(".") if part not in _WRAPPER_SEGMENTS)


def model_name(module: torch.nn.Module) -> str:
    """The class name of the user's module: ``fully_shard`` (FSDP2) swaps a module's class for a
    generated subclass ``FSDP<Class>``; the user's class names the tensors, as without FSDP."""
    _, fsdp_module = fsdp_classes()
    cls = type(module)
    if fsdp_module is not None and isinstance(module, fsdp_module):
        for base in cls.__mro__[1:]:
            if not issubclass(base, fsdp_module):
                return base.__name__
    return cls.__name__


# --------------------------------------------------------------------------- what a shard is
@dataclass(frozen=True)
class Placement:
    """Where a worker's shard lies in the full tensor: a block ``offsets`` .. ``offsets + local
    shape`` of a tensor of ``global_shape`` (DTensor ``Shard`` placements), or, for a flat
    shard (FSDP v1's flattened parameters), elements ``flat_offset`` .. ``+ numel`` of the
    flattened full tensor."""

    global_shape: Tuple[int, ...]
    offsets: Optional[Tuple[int, ...]] = None
    flat_offset: Optional[int] = None

    def as_json(self, local_shape) -> dict:
        out: Dict[str, object] = {"global_shape": list(self.global_shape),
                                  "local_shape": [int(s) for s in local_shape]}
        if self.offsets is not None:
            out["offsets"] = list(self.offsets)
        if self.flat_offset is not None:
            out["flat_offset"] = int(self.flat_offset)
        return out


_DTENSOR_CLASSES: Dict[type, bool] = {}


def is_dtensor(value) -> bool:
    """Whether ``value`` is a ``torch.distributed.tensor.DTensor`` (without importing it when
    torch.distributed is unavailable); answered once per class."""
    cls = type(value)
    known = _DTENSOR_CLASSES.get(cls)
    if known is None:
        known = _DTENSOR_CLASSES[cls] = any(
            base.__name__ == "DTensor" and base.__module__.startswith("torch.distributed") for base in cls.__mro__)
    return known


def dtensor_shard_dims(tensor) -> Tuple[Tuple[int, ...], Optional[str]]:
    """``(mesh dims the tensor is sharded over, why it cannot be reduced exactly or None)``."""
    dims = []
    for i, placement in enumerate(tensor.placements):
        if placement.is_shard():
            dims.append(i)
        elif placement.is_partial():
            return (), "it holds partial sums (a Partial placement): its values are not known until reduced"
    return tuple(dims), None


def dtensor_placement(tensor) -> Placement:
    """The block of the full tensor this worker's ``to_local()`` holds."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offsets = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    return Placement(tuple(tensor.shape), offsets=tuple(int(o) for o in offsets))


# --------------------------------------------------------------------------- dedicated groups
class ShardGroups:
    """Dedicated gloo process groups for the statistics' collectives, one per shard group.

    A mesh and the dims a tensor is sharded over split the mesh's ranks into groups (the
    ranks that hold the pieces of one copy of the tensor); every rank must create every
    group, in the same order (``dist.new_group`` is collective), so groups are made while
    the model is registered, from the mesh alone. ``collectives`` counts the collectives
    issued (tests check that it does not grow with the number of parameters).
    """

    def __init__(self):
        self._groups: Dict[tuple, Optional[object]] = {}  # key -> this rank's group (None: alone)
        self._rows: Dict[tuple, Tuple[int, ...]] = {}  # key -> the global ranks of this rank's group
        self._failed: Dict[tuple, str] = {}  # key -> why its groups could not be made (not tried again)
        self.collectives = 0

    @staticmethod
    def key_for_mesh(mesh, shard_dims: Tuple[int, ...]) -> tuple:
        ranks = mesh.mesh
        return ("mesh", tuple(ranks.shape), tuple(ranks.flatten().tolist()), shard_dims)

    def ensure_mesh(self, mesh, shard_dims: Tuple[int, ...]) -> tuple:
        """The key of the shard groups of ``mesh`` over ``shard_dims`` (made on first use)."""
        key = self.key_for_mesh(mesh, shard_dims)
        if key in self._failed:
            raise CollectiveFailed(self._failed[key])
        if key not in self._groups:
            ranks = mesh.mesh
            others = [d for d in range(ranks.dim()) if d not in shard_dims]
            size = 1
            for d in shard_dims:
                size *= ranks.shape[d]
            rows = ranks.permute(*others, *shard_dims).reshape(-1, size).tolist() if shard_dims else []
            self._groups[key], self._rows[key] = self._make_or_remember(key, rows)
        return key

    def ensure_ranks(self, ranks: Sequence[int]) -> tuple:
        """The key of one explicit group (FSDP v1: its process group's ranks). Its members
        create it together (local synchronization: other ranks need not take part)."""
        key = ("ranks", tuple(ranks))
        if key in self._failed:
            raise CollectiveFailed(self._failed[key])
        if key not in self._groups:
            self._groups[key], self._rows[key] = self._make_or_remember(key, [list(ranks)])
        return key

    def _make_or_remember(self, key: tuple, rows: List[List[int]]):
        try:
            return self._make(rows)
        except Exception as exc:  # remembered: the next parameter of this mesh does not wait again
            self._failed[key] = (f"cannot create the statistics' process group ({type(exc).__name__}: {exc}); "
                                 "register_module must be called on every rank of a sharded model, in the same order")
            raise CollectiveFailed(self._failed[key]) from exc

    @staticmethod
    def _make(rows: List[List[int]]):
        """``(this rank's group or None when it is alone, its global ranks)``."""
        me = dist.get_rank()
        mine = None
        my_row: Tuple[int, ...] = (me,)
        for row in rows:
            if me in row:
                my_row = tuple(sorted(row))  # group ranks follow the global ranks' order
            if len(row) < 2 or me not in row:
                continue  # a group of one rank exchanges nothing; another row's members make theirs
            # Only the row's members take part: ranks whose meshes differ (pipeline stages)
            # never wait on groups they are not in.
            mine = dist.new_group(ranks=row, backend="gloo", timeout=COLLECTIVE_TIMEOUT,
                                  use_local_synchronization=True)
        return mine, my_row

    def ranks(self, key: tuple) -> Tuple[int, ...]:
        """The global ranks of this rank's group of ``key``, in group-rank order."""
        return self._rows[key]

    def all_gather(self, key: tuple, packed: np.ndarray) -> "Gathering":
        """Start gathering every rank's ``packed`` over this rank's group of ``key``; the
        result (``[ranks of the group, *packed.shape]``) comes from :meth:`Gathering.result`.
        Asynchronous: the exchange goes on (gloo's threads) while training does."""
        group = self._groups.get(key)
        if group is None:
            return Gathering(packed[None], None)
        local = torch.from_numpy(np.ascontiguousarray(packed, dtype=np.float64))
        out = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        self.collectives += 1
        try:
            work = dist.all_gather(out, local, group=group, async_op=True)
        except Exception as exc:  # the caller stops issuing collectives
            raise CollectiveFailed(f"all_gather of shard statistics: {type(exc).__name__}: {exc}") from exc
        return Gathering(out, work)

    def gather_bytes(self, key: tuple, payload: np.ndarray, sizes: Sequence[int], dst_global_rank: int = 0):
        """Each rank's ``payload`` (uint8, ``sizes[r]`` bytes on group rank ``r``) on global rank
        ``dst_global_rank`` (a member), as a list per group rank; None elsewhere. One collective."""
        group = self._groups.get(key)
        if group is None:
            return [payload]
        dst_group_rank = self._rows[key].index(dst_global_rank)
        width = max(max(sizes), 1)
        buffer = torch.zeros(width, dtype=torch.uint8)
        buffer[:payload.size] = torch.from_numpy(payload)
        me = dist.get_rank(group)
        out = [torch.empty(width, dtype=torch.uint8) for _ in sizes] if me == dst_group_rank else None
        self.collectives += 1
        try:
            dist.gather(buffer, out, dst=dst_global_rank, group=group)
        except Exception as exc:  # the caller stops issuing collectives
            raise CollectiveFailed(f"gather of full tensors: {type(exc).__name__}: {exc}") from exc
        if out is None:
            return None
        return [o[:n].numpy() for o, n in zip(out, sizes)]



class Gathering:
    """An all_gather under way (or done: a group of one rank)."""

    __slots__ = ("_out", "_work")

    def __init__(self, out, work):
        self._out, self._work = out, work

    def result(self) -> np.ndarray:
        """Wait for it (at most :data:`COLLECTIVE_TIMEOUT`): ``[ranks of the group, ...]``."""
        if self._work is None:
            return self._out
        try:
            self._work.wait()
        except Exception as exc:  # the caller stops issuing collectives
            raise CollectiveFailed(f"all_gather of shard statistics: {type(exc).__name__}: {exc}") from exc
        self._out, self._work = torch.stack(self._out).numpy(), None
        return self._out


# --------------------------------------------------------------------------- partials
#: The column of :mod:`smdebug.reduction_columns` (in :func:`~smdebug.reduction_columns.to_sums`
#: form) each partials column carries.
_CORE_NAMES = {name: {"m2": "dev2", "m2_abs": "dev2_abs"}.get(name, name[2:] if name.startswith("h:") else name)
               for name in PARTIAL_COLUMNS}
_WIRE_NAMES = {core: name for name, core in _CORE_NAMES.items()}


def columns_needed(keys) -> Tuple[str, ...]:
    """The partials columns the reductions ``keys`` need (the others are left NaN): each
    costs passes over every shard, so only what is saved is computed."""
    need: Set[Optional[str]] = {"sum"}  # the means of the variance's combination (None: no wire name)
    for core in columns_for(tuple(keys), combinable=True):
        need.add(_WIRE_NAMES.get({"var": "dev2", "var_abs": "dev2_abs"}.get(core, core)))
    if "m2" in need:
        need.add("sum_sq")  # free with the variance: the sums it comes from hold both
    return tuple(name for name in PARTIAL_COLUMNS if name in need and name != "count")


def shard_partials(shards: Sequence[Optional[torch.Tensor]], backend,
                   columns: Sequence[str] = PARTIAL_COLUMNS[1:]) -> np.ndarray:
    """``[len(shards), len(PARTIAL_COLUMNS)]`` float64 partials of each shard: ``count`` and
    ``columns`` (:func:`columns_needed`; the others NaN); a row of NaN for a missing shard
    (``None``).

    The shards' columns come from ``backend.partial_columns`` (the PyTorch
    :class:`~smdebug.pytorch.backend.TorchBackend`: sums, norms and variances accumulated in
    float64, two passes where one would cancel, min/max exact, one transfer to the host).
    ``M2`` is the variance times the count. An empty shard (a worker may hold none of a small
    tensor) has count 0, sums 0, M2 0 and extrema ``+inf``/``-inf``, the neutral elements of
    the combination.
    """
    out = np.full((len(shards), len(PARTIAL_COLUMNS)), np.nan)
    present = [i for i, s in enumerate(shards) if s is not None]
    if not present:
        return out
    wire = [c for c in columns if c != "count"]
    needed = ("count",) + tuple(dict.fromkeys({"dev2": "var", "dev2_abs": "var_abs"}.get(_CORE_NAMES[c], _CORE_NAMES[c])
                                              for c in wire))
    tensors = [s.detach() for s in shards if s is not None]  # those of ``present``
    count = np.array([t.numel() for t in tensors], dtype=np.float64)
    rows = out[present]
    rows[:, _COL["count"]] = count
    neutral = {"min": np.inf, "max": -np.inf, "min_abs": np.inf, "max_abs": -np.inf}
    rows[:, [_COL[c] for c in wire]] = np.array([neutral.get(c, 0.0) for c in wire])  # empty shards keep these
    nonempty = np.flatnonzero(count > 0)
    if len(nonempty) and wire:
        table = backend.partial_columns([tensors[i] for i in nonempty], needed)
        sums = to_sums({c: table[:, j] for j, c in enumerate(needed)})
        rows[np.ix_(nonempty, np.array([_COL[c] for c in wire]))] = np.stack([sums[_CORE_NAMES[c]] for c in wire], axis=1)
    out[present] = rows
    return out


def combine_partials(gathered: np.ndarray) -> np.ndarray:
    """The partials of the full tensors from those of their shards: ``gathered`` is
    ``[shards, tensors, columns]``; a tensor missing on any shard comes out NaN
    (:func:`smdebug.reduction_columns.combine`; columns no shard computed stay NaN)."""
    pieces = {_CORE_NAMES[name]: gathered[..., j] for j, name in enumerate(PARTIAL_COLUMNS)
              if name == "count" or not np.isnan(gathered[..., j]).all()}
    whole = combine(pieces)
    out = np.full(gathered.shape[1:], np.nan)
    for j, name in enumerate(PARTIAL_COLUMNS):
        if _CORE_NAMES[name] in whole:
            out[:, j] = whole[_CORE_NAMES[name]]
    return out


def reductions_table(rows: np.ndarray, keys: Sequence[ReductionKey]) -> np.ndarray:
    """``[len(rows), len(keys)]``: the ``keys`` reductions of full tensors from their combined
    partials rows (:func:`smdebug.reduction_columns.finish_table`)."""
    for op, _ in keys:
        if op not in EXACT_REDUCTIONS:
            raise ValueError(f"{op!r} cannot be computed exactly from shards")
    columns = to_variances({_CORE_NAMES[name]: rows[:, j] for j, name in enumerate(PARTIAL_COLUMNS)})
    return finish_table(columns, keys)


def reductions_from_partials(row: np.ndarray, keys: Sequence[ReductionKey]) -> List[np.float64]:
    """The ``keys`` reductions of one full tensor from its combined partials row."""
    return list(reductions_table(row[None], keys)[0])


# --------------------------------------------------------------------------- parameters
class ShardedParam:
    """One sharded parameter of a registered model, as the hook tracks it."""

    __slots__ = ("name", "param", "group", "flat")

    def __init__(self, name: str, param, group: tuple, flat: Optional[Placement] = None):
        self.name = name
        self.param = param
        self.group = group
        #: FSDP v1: the placement of a flat shard (the parameter is a plain tensor view)
        self.flat = flat

    def local(self, tensor):
        """The worker's piece of ``tensor`` (this parameter or its gradient), or None."""
        if tensor is None:
            return None
        if self.flat is not None:
            return tensor.reshape(-1)
        if is_dtensor(tensor):
            # The local tensor itself: to_local() is an autograd function (microseconds per
            # parameter and step); the attribute is read where there is one.
            local = getattr(tensor, "_local_tensor", None)
            return local if isinstance(local, torch.Tensor) else tensor.to_local()
        return None

    @property
    def full_shape(self) -> Tuple[int, ...]:
        """The shape of the full tensor."""
        return self.flat.global_shape if self.flat is not None else tuple(self.param.shape)

    def placement_of(self, tensor) -> Optional[Placement]:
        if self.flat is not None:
            return self.flat
        return dtensor_placement(tensor) if is_dtensor(tensor) else None


def fsdp1_flat_params(module: torch.nn.Module):
    """FSDP (v1) ``use_orig_params=True``: ``{id(original parameter): (process group, flat offset
    in its full tensor, full shape)}`` for the parameters whose shard this rank holds in part or
    whole, from each flat parameter's shard metadata; ``None`` if the model has no FSDP v1
    wrapper; raises ``ValueError`` (with why) when the layout is one we do not read."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    except ImportError:  # pragma: no cover - torch without FSDP
        return None
    wrappers = [m for m in module.modules() if isinstance(m, FSDP)]
    if not wrappers:
        return None
    out = {}
    for wrapper in wrappers:
        handle = getattr(wrapper, "_handle", None)
        if handle is None:
            continue
        if not getattr(handle, "_use_orig_params", False):
            raise ValueError("the model is wrapped in FSDP (v1) without use_orig_params=True: its parameters are "
                             "flattened FlatParameters with no per-parameter names; build it with "
                             "FullyShardedDataParallel(..., use_orig_params=True), or use fully_shard (FSDP2)")
        flat = handle.flat_param
        for param, info, shape in zip(flat._params, flat._shard_param_infos, flat._shapes):
            offset = int(info.intra_param_start_idx) if info.in_shard else 0
            out[id(param)] = (handle.process_group, offset, tuple(shape))
    return out


# --------------------------------------------------------------------------- full tensors
def encode_piece(piece: torch.Tensor, placement: Placement) -> np.ndarray:
    """A shard as bytes: its block's offsets and shape (int64, one of each per dimension of the
    full tensor, or of its flattening for a flat shard), then its values, bit-exact."""
    offsets, shape = piece_block(piece, placement)
    header = np.asarray(list(offsets) + list(shape), dtype=np.int64).view(np.uint8)
    values = piece.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
    return np.concatenate([header, values])


def piece_block(piece: torch.Tensor, placement: Placement) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """``(offsets, shape)`` of a shard's block in the full tensor (a flat shard: in its flattening)."""
    if placement.flat_offset is not None:
        return (int(placement.flat_offset),), (int(piece.numel()),)
    assert placement.offsets is not None  # a placement has block offsets or a flat offset
    return tuple(placement.offsets), tuple(int(s) for s in piece.shape)


def encoded_size(numel: int, itemsize: int, placement_ndim: int) -> int:
    return 16 * placement_ndim + numel * itemsize


def assemble(parts: Sequence[Tuple[Tuple[int, ...], Tuple[int, ...], torch.Tensor]], global_shape, dtype,
             flat: bool) -> torch.Tensor:
    """The full tensor from ``(offsets, shape, values)`` blocks (offsets into the flattened
    tensor when ``flat``); elements no block covers stay NaN (floats) or 0, so a missing piece
    shows rather than hides."""
    full = torch.zeros(tuple(global_shape), dtype=dtype)
    if full.is_floating_point() or full.is_complex():
        full.fill_(float("nan"))
    target = full.reshape(-1) if flat else full
    for offsets, shape, values in parts:
        if not all(shape):
            continue
        target[tuple(slice(o, o + n) for o, n in zip(offsets, shape))] = values.reshape(shape)
    return full


def decode_pieces(data: np.ndarray, layouts: Sequence[Tuple[int, torch.dtype, int]]):
    """Split one rank's bytes (:func:`encode_piece`, concatenated) into ``(offsets, shape,
    tensor)`` per ``layouts`` item ``(header ndim, dtype, numel)``."""
    out, at = [], 0
    for ndim, dtype, numel in layouts:
        header = data[at:at + 16 * ndim].view(np.int64)
        at += 16 * ndim
        size = numel * torch.empty((), dtype=dtype).element_size()
        raw = torch.from_numpy(data[at:at + size].copy())
        at += size
        values = raw.view(dtype) if size else torch.empty(0, dtype=dtype)
        out.append((tuple(int(v) for v in header[:ndim]), tuple(int(v) for v in header[ndim:]), values))
    return out
