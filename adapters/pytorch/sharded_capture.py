"""The PyTorch hook's capture of sharded parameters: when, on which thread, and what is recorded.

:class:`ShardedCapture` is owned by :class:`smdebug.pytorch.Hook` and called at its step
points; the arithmetic, the process groups and the pieces' encoding are in
:mod:`smdebug.pytorch.sharded`. The schedule (docs/architecture.md, "Sharded parameters"):

* the first forward of a saved TRAIN step hands the sharded weights to the step pipeline,
  which computes their partials while the forward and backward run (:meth:`start_weights`);
* the optimizer's pre-step hook waits for them (the optimizer changes the weights next) and
  hands over the gradients' partials and the start of the step's ``all_gather``
  (:meth:`capture`); EVAL/PREDICT steps do this at their first forward, TRAIN steps without
  an optimizer step at their end;
* where the step saves ``updates`` or ``optimizer_variables``, the pre-step hook computes
  those partials and copies the parameters' pieces instead, and the optimizer's post-step
  hook adds the updates' and the optimizer state's pieces and starts the step's one
  ``all_gather`` (:meth:`after_step`);
* the end of the step waits for the exchange, combines, and records (:meth:`finish`, with
  :class:`.sharded_records.ShardedRecords`).

The pipeline runs jobs in submission order and every rank submits the same jobs, so the
collectives are issued in the same order on every rank, on groups of their own.
"""
from __future__ import annotations

import contextlib
from typing import Dict, List, NamedTuple, Tuple

import numpy as np
import torch
import torch.distributed as dist

from smdebug.collections import OPTIMIZER_STATE_PREFIX, UPDATE_PREFIX, CollectionKeys
from smdebug.logger import get_logger

from .optimizer_capture import copy_before, updates_in_place
from .sharded import (EXACT_REDUCTIONS, CollectiveFailed, Placement, ShardedParam, ShardGroups, columns_needed, combine_partials,
                      dtensor_shard_dims, clean_path, fsdp1_flat_params, inexact_reductions, is_dtensor, shard_partials)
from .sharded_records import ShardedRecords

logger = get_logger("smdebug.pytorch")


class _WeightsJob(NamedTuple):
    """The partials of a step's sharded weights, computed on the step pipeline since its forward."""

    step: int
    chosen: tuple  # indices of the weights, as select() chose them
    columns: tuple  # the partials computed
    ticket: object  # the pipeline's Ticket: its result is the partials
    pieces: list
    versions: list  # the pieces' version counters at hand-over


class _Exchange(NamedTuple):
    """A step's sharded statistics under way, from the capture point to the end of the step."""

    chosen: list  # (index into the sharded names or -1 (optimizer state), plan)
    tensors: list  # the parameters, gradients and optimizer state (an update: its parameter)
    pieces: list  # this rank's pieces of them (None: read by the weights' job, or missing)
    shapes: list  # their full shapes
    owners: list  # the ShardedParam of each
    by_group: dict  # shard group -> positions in chosen
    job: object  # the exchange job's Ticket, or its result (tuple or exception) when run here
    raw_wanted: list  # positions whose full tensors are saved


class _Pending(NamedTuple):
    """A TRAIN step's weights and gradients, reduced before its optimizer step, waiting for the
    step's updates and the optimizer's state: all are exchanged after it, in one collective."""

    before: _Exchange  # its job: the partials' Ticket, or the partials when computed here
    updates: list  # (index into the update names, plan) chosen
    copies: list  # this rank's pieces of those parameters before the step (None: missing)
    state: bool  # whether the optimizer's state is saved somewhere


class ShardedCapture:
    """The sharded parameters of a hook's registered models, and their capture step by step.

    ``session`` is the PyTorch hook's step session; this calls only its declared surface
    (``select_everywhere``, ``submit_work``, ``record_reduced``, ``record_planned``,
    ``note_placement``, ...).
    A failure turns off sharded capture alone, with one warning (:meth:`_guard`).
    """

    def __init__(self, session):
        self.session = session
        self.params: List[ShardedParam] = []
        self.names: Tuple[str, ...] = ()  # weights, gradients, then updates
        self.groups = ShardGroups()
        self._step = -1  # the global step whose sharded parameters were captured
        self._muted = False  # after a local failure: join the collectives, record nothing
        self.inflight = None  # a step's statistics being exchanged (_Exchange)
        self._pending = None  # a TRAIN step's statistics waiting for its optimizer step (_Pending)
        self._weights_job = None  # the weights' partials job of the step (_WeightsJob)
        self.records = ShardedRecords(session, self.groups)
        self._warned: set = set()

    def __bool__(self) -> bool:
        return bool(self.params)

    def param_named(self, obj):
        """The name of a registered sharded parameter, or None."""
        return next((s.name for s in self.params if s.param is obj), None)

    @property
    def unfinished(self) -> bool:
        """Whether statistics of the step are still to be exchanged or recorded (:meth:`finish`)."""
        return self.inflight is not None or self._pending is not None

    def fence_gradients(self) -> None:
        """Before gradients (or the optimizer's state) are written in place: wait until their
        partials were read."""
        for exchange in (self.inflight, self._pending and self._pending.before):
            if exchange is not None and hasattr(exchange.job, "wait"):
                exchange.job.wait()

    def add_model(self, outer: torch.nn.Module, inner: torch.nn.Module, root_name: str,
                  seen: set) -> List[Tuple[str, torch.nn.Parameter]]:
        """Take the sharded parameters of a registered model (``outer``, the module registered;
        ``inner``, the user's model inside its wrappers) and return its plain ones, named, for
        the hook's batched path. ``seen``: ids of parameters already registered (updated).
        The statistics' process groups are created here: every rank registers the same model,
        in the same order."""
        plain = []
        try:
            flat_v1 = fsdp1_flat_params(outer)  # the FSDP (v1) wrappers, the outermost included
        except ValueError as exc:
            logger.warning("smdebug: not saving the parameters of %s: %s", root_name, exc)
            flat_v1 = None
            skip_flat = True
        else:
            skip_flat = False
        added = False
        for pname, param in inner.named_parameters():
            if id(param) in seen:
                continue
            seen.add(id(param))
            name = f"{root_name}_{clean_path(pname)}"
            if skip_flat and pname.endswith("_flat_param"):
                continue
            try:
                sharded = self._classify(name, param, flat_v1)
            except CollectiveFailed as exc:  # the same for every parameter of that mesh: said once
                if str(exc) not in self._warned:
                    self._warned.add(str(exc))
                    logger.warning("smdebug: not saving the sharded parameters of %s: %s", root_name, exc)
                continue
            except Exception as exc:  # noqa: BLE001 - that parameter is not saved; training goes on
                logger.warning("smdebug: not saving sharded parameter %s: %s: %s", name, type(exc).__name__, exc)
                continue
            if sharded is None:
                plain.append((name, param))
            elif sharded is not False:
                self.params.append(sharded)
                added = True
        if added:
            weights = tuple(s.name for s in self.params)
            self.names = weights + tuple(f"gradient/{name}" for name in weights) + tuple(
                UPDATE_PREFIX + name for name in weights)
            self.records.forget_layouts()  # the names changed
            self._warn_inexact_reductions()
        return plain


    def _classify(self, name: str, param, flat_v1):
        """A :class:`ShardedParam` for a sharded ``param``, None for a plain one, False for one
        that cannot be saved (with one warning)."""
        if is_dtensor(param):
            dims, why = dtensor_shard_dims(param)
            if why is None and not (dist.is_available() and dist.is_initialized()):
                why = "torch.distributed is not initialized"
            if why is not None:
                logger.warning("smdebug: not saving DTensor parameter %s: %s", name, why)
                return False
            return ShardedParam(name, param, self.groups.ensure_mesh(param.device_mesh, dims))
        if flat_v1 is not None and id(param) in flat_v1:
            group, offset, shape = flat_v1[id(param)]
            ranks = dist.get_process_group_ranks(group)
            if len(ranks) != dist.get_world_size():
                # Each rank would need every other rank's group to create them collectively.
                logger.warning("smdebug: not saving FSDP (v1) parameter %s: it is sharded over a subset of the "
                               "ranks (hybrid sharding); use fully_shard (FSDP2) with a 2D mesh for HSDP", name)
                return False
            return ShardedParam(name, param, self.groups.ensure_ranks(sorted(ranks)),
                                flat=Placement(shape, flat_offset=offset))
        return None

    def _warn_inexact_reductions(self) -> None:
        """One warning for the reductions asked of collections that shard partials cannot give
        exactly (median, prod): sharded tensors are saved without them."""
        asked = set()
        for coll in self.session.collection_manager:
            config = coll.reduction_config or self.session.reduction_config
            asked.update(inexact_reductions(config.all_reductions()))
        if asked:
            logger.warning("smdebug: %s cannot be computed exactly from the shards of sharded parameters (FSDP/"
                           "DTensor) without gathering them; they are not saved for those tensors (the exact "
                           "ones are: %s, and their abs_ forms). Save full tensors to compute them in the Trial.",
                           ", ".join(sorted(asked)), ", ".join(sorted(EXACT_REDUCTIONS)))

    # --- sharded parameters: one pack of partials, one collective per shard group ---------------
    def due(self) -> bool:
        """Whether this step's sharded parameters are still to be reduced. The same answer on
        every rank (the save configuration and step counters are), whether this rank writes
        or not: all ranks take part in the collectives."""
        session = self.session
        return bool(self.params) and session.enabled and session.step_open and session.step_saves_somewhere \
            and self._step != session.global_step

    def capture(self, with_gradients: bool, reread_weights: bool = False, before_update: bool = False) -> None:
        """Reduce this step's sharded weights (and gradients) from their shards and record them.

        Called on the training thread at a point every rank reaches in the same order: the
        optimizer's pre-step hook in TRAIN steps (the end of the step if none came), the
        step's first forward in others (see docs/architecture.md); the work runs on the step
        pipeline, in order. One ``all_gather`` per shard group, however many parameters.
        ``before_update``: an optimizer step comes next; when the step's updates or optimizer
        state are saved, the exchange waits for it (:meth:`after_step`).
        A failure turns off sharded capture only (one warning); the rest of the hook goes on.
        A collective that a peer never joins gives up after ``sharded.COLLECTIVE_TIMEOUT``.
        """
        self._step = self.session.global_step
        if reread_weights:  # read at the forward, maybe updated since (no optimizer step): read them now
            self._weights_job = None
        with self._guard():
            self._start(with_gradients, before_update)
            if self.inflight is not None and self.inflight.raw_wanted:
                self._finish_now()  # full tensors: gathered from the pieces now, before they change

    def after_step(self, optimizer) -> None:
        """The optimizer's post-step hook (on every rank, saving or not): the step's updates and
        ``optimizer``'s state join the weights' and gradients' partials in the step's one
        exchange."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        with self._guard():
            self._exchange_after(pending, optimizer)
            if self.inflight is not None and self.inflight.raw_wanted:
                self._finish_now()

    def abandon(self) -> None:
        """This rank's step failed (an exception left it): start no more collectives for it,
        since the other ranks may never reach them. An exchange already started finishes (or
        times out) on the step pipeline; nothing of this step is recorded."""
        self._step = self.session.global_step
        self._weights_job = None
        self.inflight = self._pending = None

    @contextlib.contextmanager
    def _guard(self):
        """The fail-open policy of sharded capture: a failure turns it off alone (one warning)."""
        try:
            yield
        except CollectiveFailed as exc:  # the peers are gone or out of step: issue no more collectives
            logger.warning("smdebug: sharded parameters are not saved from step %d on: %s", self.session.global_step,
                           exc)
            self.params, self.names, self.inflight, self._pending = [], (), None, None
        except Exception as exc:  # noqa: BLE001 - record nothing more, but keep joining the peers' collectives
            logger.warning("smdebug: sharded parameters are not saved from step %d on: %s: %s",
                           self.session.global_step,
                           type(exc).__name__, exc)
            self._muted, self.inflight, self._pending = True, None, None

    def finish(self) -> None:
        """The end of a step: the statistics' exchange started at the capture point is waited
        for (it went on meanwhile), combined and recorded into the step."""
        with self._guard():
            pending, self._pending = self._pending, None
            if pending is not None:  # no optimizer step came (skipped): weights and gradients alone
                self._exchange_after(pending, None)
            self._finish_now()

    def start_weights(self) -> None:
        """The first forward of a TRAIN step: the weights' partials are computed on the step
        pipeline's worker while the forward and backward run (nothing changes the sharded
        weights before ``optimizer.step()``, whose pre-step hook waits for them)."""
        with self._guard():
            n = len(self.params)
            chosen = self.session.plans.select_everywhere(self.names[:n])
            if chosen and not self._muted:
                pieces = [self._piece(self.params[i], self.params[i].param, False) for i, _ in chosen]
                columns = self._partial_columns([plan for _, plan in chosen])
                versions = [None if p is None else p._version for p in pieces]
                ticket = self.session.submit_work("sharded weights' partials", self._safe_partials, pieces, columns)
                self._weights_job = _WeightsJob(self.session.global_step, tuple(i for i, _ in chosen), columns, ticket,
                                                    pieces, versions)

    def _safe_partials(self, pieces, columns) -> np.ndarray:
        """Partials of ``pieces``; rows of NaN if that fails (the collective still takes place)."""
        try:
            return shard_partials(pieces, self.session.backend, columns)
        except Exception as exc:  # noqa: BLE001 - still take part in the collectives (peers wait for them)
            self._warn("shard partials", f"{type(exc).__name__}: {exc}")
            return shard_partials([None] * len(pieces), self.session.backend)

    def _partial_columns(self, plans) -> Tuple[str, ...]:
        """The partials the saved reductions of ``plans`` need (the same on every rank)."""
        keys = {k for plan in plans for k in plan.reductions}
        return columns_needed(keys)

    def _start(self, with_gradients: bool, before_update: bool = False) -> None:
        """Partials of this rank's pieces and the start of their exchange, on the step pipeline's
        worker (the weights' since the step's forward: waited for here, before the optimizer
        changes them); :meth:`_finish_now` records the results at the end of the step.
        Full tensors wanted: all of it here, on the training thread. Updates or optimizer
        state saved (``before_update``): the exchange waits for the optimizer step (:meth:`_defer`)."""
        sharded = self.params
        n = len(sharded)
        chosen = self.session.plans.select_everywhere(self.names[:2 * n] if with_gradients else self.names[:n])
        weights_job, self._weights_job = self._weights_job, None
        changes = self._step_changes_wanted() if before_update else None
        if not chosen and changes is None:
            return
        muted = self._muted
        tensors, shapes, owners = [], [], []
        for i, _ in chosen:
            one = sharded[i % n]
            tensors.append(one.param if i < n else one.param.grad)
            shapes.append(one.full_shape)
            owners.append(one)
        weights_at = [pos for pos, (i, _) in enumerate(chosen) if i < n]
        raw_wanted = [pos for pos, (_, plan) in enumerate(chosen) if plan.raw]
        columns = self._partial_columns([plan for _, plan in chosen])
        if weights_job is not None and (raw_wanted or weights_job.step != self.session.global_step or
                                        weights_job.chosen != tuple(chosen[pos][0] for pos in weights_at) or
                                        weights_job.columns != columns or
                                        [None if p is None else p._version for p in weights_job.pieces]
                                        != weights_job.versions):
            # another step's, other plans, pieces needed whole, or weights changed in place since the
            # forward (not by the optimizer: it comes next): read them again
            weights_job = None
        pieces = []
        for pos, (i, _) in enumerate(chosen):
            known = weights_job is not None and i < n
            pieces.append(None if muted or known else self._piece(sharded[i % n], tensors[pos], i >= n))
        known = [(weights_job.ticket, weights_at)] if weights_job is not None else []
        if changes is not None:
            self._defer(_Exchange(chosen, tensors, pieces, shapes, owners, {}, None, raw_wanted), columns, known,
                        changes)
            return
        job = self._launch(_Exchange(chosen, tensors, pieces, shapes, owners, {}, None, raw_wanted), pieces,
                           columns, known)
        if not raw_wanted:
            # The fence: in a TRAIN step the optimizer changes the weights next (EVAL steps: nothing
            # changes them before the step ends, where the job is waited for).
            if known:
                known[0][0].wait()
            elif weights_at and with_gradients:
                job.wait()  # the weights are read by this job: wait until it read them

    def _launch(self, exchange: _Exchange, to_reduce, columns, known):
        """Start the step's exchange of ``exchange`` (``to_reduce``: the pieces whose partials
        are still to compute) and keep it in flight: here when full tensors are wanted (their
        pieces are encoded before anything changes them), else on the step pipeline's worker.
        Returns the job (its Ticket, or its result when run here)."""
        by_group = self._by_group(exchange.owners)
        args = (to_reduce, columns, known, by_group)
        job = self._pipeline_exchange(*args) if exchange.raw_wanted else \
            self.session.submit_work("sharded statistics", self._pipeline_exchange, *args)
        self.inflight = exchange._replace(by_group=by_group, job=job)
        return job

    @staticmethod
    def _by_group(owners) -> Dict[tuple, List[int]]:
        by_group: Dict[tuple, List[int]] = {}
        for pos, one in enumerate(owners):
            by_group.setdefault(one.group, []).append(pos)
        return by_group

    def _step_changes_wanted(self):
        """``(updates chosen, whether optimizer state is saved)`` where this step saves either
        somewhere, else None (the same answer on every rank)."""
        plans = self.session.plans
        updates = plans.select_everywhere(self.names[2 * len(self.params):])
        state = CollectionKeys.OPTIMIZER_VARIABLES in plans.everywhere
        return (updates, state) if updates or state else None

    def _defer(self, before: _Exchange, columns, known, changes) -> None:
        """Before the optimizer step: the weights' and gradients' partials (on the worker; here
        when full tensors are saved, with copies of the pieces saved whole, gathered after the
        step) and copies of the pieces of the parameters whose updates are saved."""
        updates, state = changes
        pieces = before.pieces
        if not before.chosen:  # updates or optimizer state only
            job = None
        elif before.raw_wanted:  # gathered after the step: copies (the optimizer changes the weights)
            for pos in before.raw_wanted:
                if pieces[pos] is not None:
                    pieces[pos] = pieces[pos].detach().clone()
            job = self._pipeline_partials(pieces, columns, known)
        else:
            job = self.session.submit_work("sharded partials before the update", self._pipeline_partials, pieces,
                                           columns, known)
            weights_at = [pos for pos, (i, _) in enumerate(before.chosen) if i < len(self.params)]
            if known:
                known[0][0].wait()
            elif weights_at:
                job.wait()  # the weights are read by this job: wait until it read them
        copies = []
        with torch.no_grad():
            for i, _ in updates:
                piece = None if self._muted else self.params[i].local(self.params[i].param)
                copies.append(None if piece is None else copy_before(piece))
        self._pending = _Pending(before._replace(job=job), list(updates), copies, state)

    def _exchange_after(self, pending: _Pending, optimizer) -> None:
        """After the optimizer step (``optimizer``; None: it did not come): the pieces of the
        updates and of the optimizer's state, and the exchange of the step's partials, all in
        one collective per shard group as before (every rank adds the same tensors: its
        optimizer holds the same state keys for each parameter)."""
        before = pending.before
        chosen, tensors, pieces = list(before.chosen), list(before.tensors), list(before.pieces)
        shapes, owners = list(before.shapes), list(before.owners)
        if optimizer is not None:
            stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
            n = len(self.params)
            for (i, plan), piece in zip(pending.updates, self._update_pieces(pending, stepped)):
                one = self.params[i]
                chosen.append((2 * n + i, plan))
                tensors.append(one.param)
                pieces.append(piece)
                shapes.append(one.full_shape)
                owners.append(one)
            if pending.state:
                for plan, one, value, piece in self._state_pieces(optimizer, stepped):
                    chosen.append((-1, plan))
                    tensors.append(value)
                    pieces.append(piece)
                    shapes.append(tuple(value.shape))
                    owners.append(one)
        if not chosen:
            return
        known_count = len(before.chosen)
        to_reduce = [None] * known_count + pieces[known_count:]
        columns = self._partial_columns([plan for _, plan in chosen[known_count:]])
        known = [(before.job, list(range(known_count)))] if known_count else []
        raw_wanted = [pos for pos, (_, plan) in enumerate(chosen) if plan.raw]
        # on the worker, waited for at the end of the step, before anything changes the optimizer's state
        self._launch(_Exchange(chosen, tensors, pieces, shapes, owners, {}, None, raw_wanted), to_reduce, columns,
                     known)

    def _update_pieces(self, pending: _Pending, stepped: set) -> list:
        """This rank's pieces of the step's updates, in place of the copies made before it: the
        parameters ``optimizer`` updates (``stepped``: their ids), None for the others."""
        owners = [self.params[i] for i, _ in pending.updates]
        pieces = [copy if id(one.param) in stepped else None for one, copy in zip(owners, pending.copies)]
        try:
            # empty pieces (a rank holding none of a small parameter) stay out of the fused calls
            todo = [(piece, one.local(one.param).detach()) for piece, one in zip(pieces, owners)
                    if piece is not None and piece.numel()]
            if todo:
                with torch.no_grad():
                    updates_in_place([piece for piece, _ in todo], [after for _, after in todo])
        except Exception as exc:  # noqa: BLE001 - the updates are left out; the exchange still takes place
            self._warn("update/", f"{type(exc).__name__}: {exc}")
            return [None] * len(owners)
        return pieces

    def _state_pieces(self, optimizer, stepped):
        """``(plan, owner, state tensor, this rank's piece)`` of the sharded optimizer state chosen;
        state a sharded parameter keeps whole (Adam's ``step``) is recorded as it is."""
        entries, whole = [], []
        for one in self.params:
            if id(one.param) not in stepped:
                continue
            if one.flat is not None:
                if optimizer.state.get(one.param):
                    self._warn("the optimizer state of FSDP (v1) parameters", "a rank holding none of a parameter "
                               "keeps no state for it; use fully_shard (FSDP2)")
                continue
            for key, value in optimizer.state.get(one.param, {}).items():
                if isinstance(value, torch.Tensor):
                    name = f"{OPTIMIZER_STATE_PREFIX}{one.name}/{key}"
                    if is_dtensor(value):
                        entries.append((name, one, value))
                    else:
                        whole.append((name, value))
        for name, value in whole:
            if self.session.plans.wants(name):
                self.session.inbox.record(name, value.detach().clone(), self.session.backend)
        names = tuple(name for name, _, _ in entries)
        for j, plan in self.session.plans.select_everywhere(names):
            name, one, value = entries[j]
            piece = None
            if not self._muted:
                if tuple(value.placements) == tuple(one.param.placements) and value.device_mesh == one.param.device_mesh:
                    piece = one.local(value)
                else:  # its pieces would not combine over the parameter's shard group
                    self._warn(name, f"it is laid out unlike its parameter ({tuple(value.placements)}, "
                                     f"{tuple(one.param.placements)})")
            yield plan, one, value, piece

    def _pipeline_partials(self, pieces, columns, known) -> np.ndarray:
        """Worker: the partials of ``pieces``, and those other jobs computed (``known``:
        ``(their Ticket or result, positions)``: the worker runs jobs in order, they are done)."""
        partials = self._safe_partials(pieces, columns)
        for source, positions in known:
            rows = source if isinstance(source, np.ndarray) else source.wait()
            partials[positions] = rows if rows is not None else np.nan
        return partials

    def _pipeline_exchange(self, pieces, columns, known, by_group):
        """Worker: all partials of the step (the weights' from their own job) and the start
        of one all_gather per shard group, in the same order on every rank (the pipeline runs
        jobs in order). Returns ``(partials, {group: Gathering})``, or the exception that
        stopped the exchange (raised on the training thread at the end of the step)."""
        try:
            partials = self._pipeline_partials(pieces, columns, known)
            started = {key: self.groups.all_gather(key, partials[positions])
                       for key, positions in by_group.items()}
            return partials, started
        except Exception as exc:  # noqa: BLE001 - reported on the training thread
            return exc

    def _finish_now(self) -> None:
        inflight, self.inflight = self.inflight, None
        if inflight is None:
            return
        chosen, tensors, pieces, shapes, owners, by_group, job, raw_wanted = inflight
        exchanged = job if isinstance(job, (tuple, Exception)) else job.wait()
        if exchanged is None:
            raise CollectiveFailed("the statistics job did not run (the step pipeline is closed)")
        if isinstance(exchanged, Exception):
            raise exchanged
        partials, started = exchanged
        combined = np.full_like(partials, np.nan)
        gathered: Dict[tuple, np.ndarray] = {}
        for key, positions in by_group.items():
            gathered[key] = started[key].result()
            combined[positions] = combine_partials(gathered[key])
        self.records.record(chosen, tensors, pieces, shapes, owners, by_group, gathered, combined, raw_wanted)

    def _piece(self, one: ShardedParam, tensor, is_grad: bool):
        """This rank's piece of a sharded parameter or gradient, or None (with one warning when
        it cannot be reduced exactly: a gradient laid out unlike its parameter)."""
        if tensor is None:
            if one.flat is not None and is_grad and one.param.numel() == 0:
                # FSDP v1 leaves .grad None where this rank holds none of the parameter: an empty piece
                return one.param.detach().reshape(-1)
            return None
        try:
            if is_dtensor(tensor) and is_grad and tuple(tensor.placements) != tuple(one.param.placements):
                self._warn(f"gradient/{one.name}", f"its placements {tuple(tensor.placements)} differ from its "
                                                           f"parameter's {tuple(one.param.placements)}")
                return None
            piece = one.local(tensor)
            if piece is None:
                self._warn(one.name, f"a {type(tensor).__name__} where a sharded tensor was expected")
            return piece
        except Exception as exc:  # noqa: BLE001 - one bad tensor costs that tensor
            self._warn(f"gradient/{one.name}" if is_grad else one.name, f"{type(exc).__name__}: {exc}")
            return None

    def _warn(self, name: str, why: str) -> None:
        if name not in self._warned:
            self._warned.add(name)
            logger.warning("smdebug: %s is not saved: %s (warned once)", name, why)
