"""What the PyTorch hook records of sharded parameters at the end of a step, once their
statistics were exchanged and combined (:class:`.sharded_capture.ShardedCapture` decides when):
the exact reductions of the full tensors as one block of reductions, and the full tensors saved
whole, gathered on the chief (``include_workers="one"``) or saved by each worker as its piece
with its placement (``"all"``)."""
from __future__ import annotations

import dataclasses
from typing import Dict

import numpy as np
import torch

from .backend import TorchSnapshot, plain_tensor
from .sharded import (EXACT_REDUCTIONS, ShardGroups, assemble, decode_pieces, encode_piece, encoded_size,
                      reductions_from_partials, reductions_table)


class ShardedRecords:
    """Records a step's sharded tensors in the session (its declared surface only)."""

    def __init__(self, session, groups: ShardGroups):
        self.session = session
        self.groups = groups
        self._blocks: Dict[tuple, tuple] = {}

    def forget_layouts(self) -> None:
        """The sharded names changed (a model registered): the blocks laid out are stale."""
        self._blocks.clear()

    def record(self, chosen, tensors, pieces, shapes, owners, by_group, gathered, combined, raw_wanted) -> None:
        """The end of a step: the combined statistics (``combined``: each tensor's partials of
        the full tensor) as one block of reductions, and the full tensors saved whole."""
        full = self._gather_full(tensors, pieces, owners, gathered, by_group, raw_wanted) if raw_wanted else {}
        # missing on some rank (no gradient yet, a frozen parameter), or empty: not saved; nor
        # what this rank does not save itself (every rank joins for what any rank saves)
        present = np.isfinite(combined[:, 0]) & (combined[:, 0] > 0)
        present &= np.fromiter((self.session.plans.plan_for(plan.name) is not None for _, plan in chosen), bool, len(chosen))
        for pos in raw_wanted:
            if not present[pos]:
                continue
            plan = chosen[pos][1]
            if isinstance(full.get(pos), tuple):
                self._record_piece(plan, full[pos], reductions_from_partials(combined[pos], [
                    k for k in plan.reductions if k[0] in EXACT_REDUCTIONS]))
            elif pos in full:
                self.session.inbox.record(plan.name, full[pos], self.session.backend)
        reduced = tuple(pos for pos, (_, plan) in enumerate(chosen) if present[pos] and not plan.raw)
        if not (reduced and self.session.saving_step):
            return
        key = (self.session.plans.version, tuple(plan.name for _, plan in chosen), reduced)
        laid_out = self._blocks.get(key)
        if laid_out is None:
            if len(self._blocks) > 16:
                self._blocks.clear()
            laid_out = self._blocks[key] = self._lay_out_block(chosen, shapes, reduced)
        block, by_keys = laid_out
        if len(by_keys) == 1:  # the usual case: every tensor saves the same reductions
            (keys, positions), = by_keys.items()
            values = reductions_table(combined[list(positions)], keys).ravel()
        else:
            per_position = {}
            for keys, positions in by_keys.items():
                for pos, row in zip(positions, reductions_table(combined[list(positions)], keys)):
                    per_position[pos] = row
            values = np.concatenate([per_position[pos] for pos in reduced])
        self.session.inbox.record_reduced(block, values)


    def _lay_out_block(self, chosen, shapes, reduced):
        """The ReducedBlock of the sharded tensors of ``reduced`` (positions in ``chosen``), each
        with the reductions exact from shards, and those positions by reductions asked."""
        entries, by_keys = [], {}
        for pos in reduced:
            plan = chosen[pos][1]
            keys = tuple(k for k in plan.reductions if k[0] in EXACT_REDUCTIONS)
            if keys != plan.reductions:
                plan = dataclasses.replace(plan, reductions=keys, reduction_tags=tuple(
                    tag for k, tag in zip(plan.reductions, plan.reduction_tags) if k[0] in EXACT_REDUCTIONS))
            entries.append((plan, shapes[pos]))
            by_keys.setdefault(keys, []).append(pos)
        return self.session.inbox.reduced_block(entries), by_keys


    def _gather_full(self, tensors, pieces, owners, gathered: Dict[tuple, np.ndarray], by_group,
                     raw_wanted) -> Dict[int, object]:
        """The sharded tensors saved whole, by position in ``chosen``.

        ``include_workers="one"``: the chief gathers only these (one ``gather`` over its shard
        group: other replicas of an HSDP mesh hold the same values and send nothing) and gets
        the full tensors. ``"all"``: each worker keeps its own piece, saved with its placement
        (see :meth:`_record_piece`). Pieces missing on any rank leave the tensor out.
        """
        wanted = set(raw_wanted)
        out: Dict[int, object] = {}
        for key, positions in by_group.items():
            mine = [(j, pos) for j, pos in enumerate(positions) if pos in wanted]
            if not mine:
                continue
            counts = gathered[key][..., 0]  # [ranks of the group, tensors]: each rank's piece size
            mine = [(j, pos) for j, pos in mine if np.isfinite(counts[:, j]).all()]
            if self.session.include_workers == "all":
                for _, pos in mine:
                    out[pos] = (pieces[pos], owners[pos].placement_of(tensors[pos]))
                continue
            ranks = self.groups.ranks(key)
            if 0 not in ranks or not mine:
                continue
            layouts, payload = [], []
            for j, pos in mine:
                placement = owners[pos].placement_of(tensors[pos])
                ndim = 1 if placement.flat_offset is not None else len(placement.global_shape)
                layouts.append((j, pos, ndim, pieces[pos].dtype, placement))
                payload.append(encode_piece(pieces[pos], placement))
            sizes = [sum(encoded_size(int(counts[r, j]), torch.empty((), dtype=dtype).element_size(), ndim)
                         for j, _, ndim, dtype, _ in layouts) for r in range(len(ranks))]
            received = self.groups.gather_bytes(key, np.concatenate(payload), sizes, dst_global_rank=0)
            if received is None:
                continue
            blocks: Dict[int, list] = {pos: [] for _, pos, _, _, _ in layouts}
            for r, data in enumerate(received):
                decoded = decode_pieces(data, [(ndim, dtype, int(counts[r, j])) for j, _, ndim, dtype, _ in layouts])
                for (_, pos, _, _, _), block in zip(layouts, decoded):
                    blocks[pos].append(block)
            for _, pos, _, dtype, placement in layouts:
                out[pos] = assemble(blocks[pos], placement.global_shape, dtype, placement.flat_offset is not None)
        return out


    def _record_piece(self, plan, piece_and_placement, exact_values) -> None:
        """``include_workers="all"``: this worker's piece of a full tensor, with its placement
        (written next to the record: docs/format.md) and the full tensor's exact reductions."""
        piece, placement = piece_and_placement
        keys = tuple(k for k in plan.reductions if k[0] in EXACT_REDUCTIONS)
        snap = TorchSnapshot(plain_tensor(piece).clone(), owned=True,
                             reduced=(keys, torch.tensor(exact_values, dtype=torch.float64)) if keys else None)
        if keys != plan.reductions:
            plan = dataclasses.replace(plan, reductions=keys, reduction_tags=tuple(
                tag for k, tag in zip(plan.reductions, plan.reduction_tags) if k[0] in EXACT_REDUCTIONS))
        if self.session.inbox.record_planned(plan, snap, self.session.backend):
            self.session.inbox.note_placement(plan.name, placement.as_json(piece.shape))
