"""The PyTorch side of the overhead budget (smdebug_core/capture/budget.py): what the hook
costs the training thread, the ranks' agreement, and the per-step non-finite check.

* :func:`charged` marks a step driver's torch callback as the hook's time: the budget
  counts it (nested calls once). Nothing is timed without a budget.
* ``agree``: with several ranks, the element-wise maximum of the ranks' costs, one
  all-reduce of three float64 on a gloo group of the hook's own (made at the first decision
  step, which every rank reaches at the same global step).
* :class:`NonfiniteCheck`: the budget saves gradients and weights on fewer steps, so that a
  NaN or an infinity does not slip between two saved steps every TRAIN step gets one fused
  check: every gradient, weight and registered loss summed on the device into one number
  that is finite exactly when all of them are. On the CPU (:class:`_CpuLayout`) the
  parameters are summed without copying or reshaping each one: small ones stacked by shape,
  large ones alone, the grouping made once per parameter list; it is read at once (no device
  to wait for); on an accelerator it is copied to pinned host memory with
  an event and read once the event passed, a step or two later, naming its own step: no
  host sync. The first non-finite value found fires the flight recorder for its step
  (``session.report_nonfinite``), naming the module of the first non-finite tensor.
"""
from __future__ import annotations

import datetime
import functools
import math
import os
from collections import deque
from typing import Deque, List, Optional, Tuple

import torch
import torch.distributed as dist

from smdebug.logger import get_logger

from .models import RegisteredModels
from .module_capture import any_none, pick
from .participant import TRAINING_MODES, StepParticipant

logger = get_logger("smdebug.pytorch")

#: The longest a rank waits for the others at a decision step before it keeps its level.
AGREE_TIMEOUT = datetime.timedelta(seconds=120)
#: Elements concatenated into one sum on the CPU when some gradient is missing (a bounded temporary copy).
PIECE_NUMEL = 1 << 20
#: Parameters at least this large are summed alone on the CPU; smaller ones stacked by shape.
OWN_SUM_NUMEL = 1 << 15
#: Elements of one stack of small parameters on the CPU (its buffer is kept between steps).
STACK_NUMEL = 1 << 20
#: Non-finite tensors named in a report, at most.
MAX_NAMED = 20


def charged(method):
    """A step driver's torch callback whose time is the hook's (with a budget)."""
    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        budget = self.session.budget
        if budget is None:
            return method(self, *args, **kwargs)
        budget.enter()
        try:
            return method(self, *args, **kwargs)
        finally:
            budget.leave()

    return timed


def _fused_sum(tensors: List[torch.Tensor]) -> torch.Tensor:
    """One number, on the tensors' device, that is finite exactly when all of them are (short
    of an overflow of finite values near the dtype's limit): their sum. On the CPU the tensors
    are concatenated in pieces of at most :data:`PIECE_NUMEL` elements and each piece summed
    (a few calls instead of one per tensor: 0.3-1 ms where one per tensor cost 2-9 ms at 268
    small tensors); on an accelerator ``torch._foreach_norm`` is one fused kernel per dtype and
    copies nothing. Half floats are summed in float32."""
    if tensors[0].device.type != "cpu":
        norms = torch._foreach_norm(tensors, 1)
        return torch.stack([n.float() for n in norms]).sum() if any(n.dtype != torch.float32 for n in norms) \
            else torch.stack(norms).sum()
    sums, piece, numel = [], [], 0
    for t in tensors:
        piece.append(t.reshape(-1))
        numel += t.numel()
        if numel >= PIECE_NUMEL:
            sums.append(_piece_sum(piece))
            piece, numel = [], 0
    if piece:
        sums.append(_piece_sum(piece))
    return sums[0] if len(sums) == 1 else torch.stack(sums).sum()


class _CpuLayout:
    """How one parameter list is summed on the CPU: ``stacked`` chunks of indices of small
    parameters of one shape and dtype (one ``torch.stack`` into a buffer kept between steps
    and one sum each: no per-tensor reshape, no fresh pages), ``alone`` the large ones (a copy
    would cost more than a call each). Parameters that are neither floating point nor
    complex, or empty, are left out. A gradient has its parameter's shape and dtype (torch
    enforces it), so one layout serves both. Real values are summed in float32, complex ones
    in their own dtype (a cast to real would drop a NaN in the imaginary part)."""

    __slots__ = ("alone", "stacked", "_buffers")

    def __init__(self, params: List[torch.Tensor]):
        groups: dict = {}
        self.alone: List[Tuple[int, Optional[torch.dtype]]] = []  # (index, dtype of its sum)
        for i, param in enumerate(params):
            if not param.numel() or not (param.is_floating_point() or param.is_complex()):
                continue
            if param.numel() >= OWN_SUM_NUMEL:
                self.alone.append((i, _sum_dtype(param.dtype)))
            else:
                groups.setdefault((tuple(param.shape), param.dtype), []).append(i)
        #: ``(indices, shape, dtype)``: at most STACK_NUMEL elements a chunk
        self.stacked: List[Tuple[List[int], tuple, torch.dtype]] = []
        for (shape, dtype), members in groups.items():
            per_chunk = max(1, STACK_NUMEL // max(1, math.prod(shape)))
            self.stacked += [(members[k:k + per_chunk], shape, dtype) for k in range(0, len(members), per_chunk)]
        self._buffers: dict = {}  # dtype -> one flat buffer, reused by every chunk of that dtype

    def sums(self, tensors: List[torch.Tensor], out: List[torch.Tensor]) -> None:
        """Append the sums of ``tensors`` (gradients or weights, in the parameters' order) to ``out``."""
        for i, sum_dtype in self.alone:
            out.append(tensors[i].sum(dtype=sum_dtype))
        for members, shape, dtype in self.stacked:
            numel = len(members) * math.prod(shape)
            buffer = self._buffers.get(dtype)
            if buffer is None or buffer.numel() < numel:
                buffer = self._buffers[dtype] = torch.empty(max(numel, STACK_NUMEL), dtype=dtype)
            stacked = buffer[:numel].view((len(members),) + shape)
            torch.stack(pick(tensors, members), out=stacked)
            out.append(stacked.sum(dtype=_sum_dtype(dtype)))


def _sum_dtype(dtype: torch.dtype) -> Optional[torch.dtype]:
    return None if dtype.is_complex else torch.float32


def _piece_sum(piece: List[torch.Tensor]) -> torch.Tensor:
    joined = torch.cat(piece)
    return joined.sum(dtype=_sum_dtype(joined.dtype))


class _Pending:
    """One step's check waiting for its device value."""

    __slots__ = ("identity", "tensors", "names", "host", "event")

    def __init__(self, identity, tensors, names, host, event):
        self.identity, self.tensors, self.names, self.host, self.event = identity, tensors, names, host, event


class NonfiniteCheck:
    """The fused per-step check of the registered models' gradients, weights and losses (module docstring)."""

    def __init__(self, models: RegisteredModels):
        self.models = models
        self.losses: List[Tuple[str, torch.Tensor]] = []  # the open step's registered losses' outputs
        self.found = False  # one report per run: the flight recorder fires once
        #: ``(identity, names, where)`` of the non-finite values found, until reported
        self.reported: Optional[tuple] = None
        self._loss_names: set = set()
        self._pending: Deque[_Pending] = deque()
        self._layout: Optional[_CpuLayout] = None
        self._layout_of: Optional[tuple] = None  # the parameter names the layout was made for

    def note_loss(self, name: str, output) -> None:
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            self._loss_names.add(name)
            self.losses.append((name, output.detach()))

    def check(self, identity: tuple) -> None:
        """Queue the check of the open step (``identity``), read at once on the CPU."""
        losses, self.losses = self.losses, []
        params = self.models.param_tensors
        if params and params[0].device.type == "cpu" and all(loss.device.type == "cpu" for _, loss in losses):
            grads = [param.grad for param in params]
            if not any_none(grads):
                if not self._cpu_finite(params, grads, losses):
                    self._report(identity, *self._named(losses))
                return
        tensors, names = self._named(losses)
        if not tensors:
            return
        total = _fused_sum(tensors)
        if total.device.type == "cpu":
            if not torch.isfinite(total):
                self._report(identity, tensors, names)
            return
        host = torch.empty((), dtype=total.dtype, pin_memory=True)
        host.copy_(total, non_blocking=True)
        event = torch.cuda.Event() if total.device.type == "cuda" else None
        if event is not None:
            event.record()
        self._pending.append(_Pending(identity, tensors, names, host, event))

    def _cpu_finite(self, params: List[torch.Tensor], grads: List[torch.Tensor], losses) -> bool:
        """Whether every gradient, weight and loss on the CPU is finite: gradients and weights
        of one shape go into one stack (the layout is made for the gradients followed by the
        parameters, again when the registered parameters change)."""
        layout = self._layout
        if layout is None or self._layout_of is not self.models.param_names:
            layout = self._layout = _CpuLayout(params + params)
            self._layout_of = self.models.param_names
        sums: List[torch.Tensor] = [loss.sum(dtype=torch.float32) for _, loss in losses]
        with torch.no_grad():
            layout.sums(grads + params, sums)
        if not sums:
            return True
        return bool(torch.isfinite(torch.stack(sums).sum()))

    def _named(self, losses) -> Tuple[List[torch.Tensor], List[str]]:
        """The step's gradients, weights and losses that can hold NaN or Inf, with their names."""
        models = self.models
        tensors, names = [], []
        for param, grad_name in zip(models.param_tensors, models.grad_names):  # names made once per model
            if param.grad is not None:
                tensors.append(param.grad)
                names.append(grad_name)
        tensors += [param.detach() for param in models.param_tensors]
        names += models.param_names
        for name, loss in losses:
            tensors.append(loss)
            names.append(f"{name}_output_0")
        kept = [i for i, t in enumerate(tensors) if t.numel() and (t.is_floating_point() or t.is_complex())]
        return pick(tensors, kept), pick(names, kept)

    def poll(self) -> None:
        """Read the checks whose device values arrived, oldest first."""
        pending = self._pending
        while pending and (pending[0].event is None or pending[0].event.query()):
            entry = pending.popleft()
            if not self.found and not torch.isfinite(entry.host):
                self._report(entry.identity, entry.tensors, entry.names)

    def _report(self, identity: tuple, tensors: List[torch.Tensor], names: List[str]) -> None:
        self.found = True
        self._pending.clear()
        # Once per run, so a pass and a read per tensor are fine. A sum that overflowed from
        # finite values (near the dtype's limit) names no tensor: reported as the first.
        bad = [i for i, t in enumerate(tensors) if not bool(torch.isfinite(t).all())] or [0]
        self.reported = (identity, [names[i] for i in bad[:MAX_NAMED]], self._where(names[bad[0]]))

    def _where(self, name: str) -> dict:
        """The module of tensor ``name`` (a gradient, a weight or a loss), as the flight recorder names modules."""
        kind, what = ("backward", "gradient") if name.startswith("gradient/") else ("forward", "value")
        plain = name[len("gradient/"):] if kind == "backward" else name
        if plain.endswith("_output_0") and plain[:-len("_output_0")] in self._loss_names:
            return {"module": plain[:-len("_output_0")], "phase": "forward", "what": "output 0 (the loss)",
                    "check": "per-step"}
        module = plain
        for _, _, root_name in self.models.roots:
            if plain.startswith(root_name + "_"):
                module = plain[len(root_name) + 1:].rpartition(".")[0] or root_name
                break
        return {"module": module, "phase": kind, "what": f"{what} of {plain}", "check": "per-step"}


class BudgetParticipant(StepParticipant):
    """With an overhead budget: the non-finite check at each TRAIN step's update (or its end,
    without an optimizer), and the ranks' agreement on the hook's cost."""

    def __init__(self, session, models: RegisteredModels):
        super().__init__(session)
        budget = session.budget
        self.check: Optional[NonfiniteCheck] = NonfiniteCheck(models) if budget is not None else None
        self._checked = -1  # the global step last checked
        self._group = None
        if budget is not None:
            # CPU training uses every core: the hook's threads take them from it.
            budget.competition = 1.0 if not torch.cuda.is_available() else min(1.0, 1.0 / max(1, os.cpu_count() or 1))
            if session.world_size > 1:
                budget.agree = self._agree_max

    def _agree_max(self, values: List[float]) -> List[float]:
        if not (dist.is_available() and dist.is_initialized()):
            return values
        if self._group is None:
            self._group = dist.new_group(backend="gloo", timeout=AGREE_TIMEOUT)
        costs = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(costs, op=dist.ReduceOp.MAX, group=self._group)
        return costs.tolist()

    def loss_hook(self, name: str):
        """A forward hook on a registered loss: its output joins the step's check."""
        check = self.check

        def on_loss(module, args, output):
            if not check.found and self.session.enabled:
                check.note_loss(name, output)

        return on_loss

    def before_update(self, optimizer, step) -> None:
        self._check_step(step)

    def end(self, step) -> None:
        self._check_step(step)  # no optimizer step seen: the gradients are still there
        if self.check is not None:
            self.check.poll()
            self._report()

    def _check_step(self, step) -> None:
        check, session = self.check, self.session
        if check is None or check.found or session.step_mode not in TRAINING_MODES or not session.step_open \
                or self._checked == session.global_step:
            return
        self._checked = session.global_step
        try:
            with session.budget.timed():
                check.check((session.global_step, session.step_mode, session.mode_step))
        except Exception as exc:  # noqa: BLE001 - the check is the failing part: training and capture go on
            check.found = True
            logger.warning("smdebug overhead budget: the per-step non-finite check failed (%s: %s); it is off for "
                           "the rest of the run", type(exc).__name__, exc)
        self._report()

    def _report(self) -> None:
        check = self.check
        if check is None:
            return
        reported = check.reported
        if reported is not None:
            check.reported = None
            self.session.report_nonfinite(*reported)

    def failed(self) -> None:
        if self.check is not None:
            self.check.losses = []

    def close(self) -> None:
        if self.check is not None:
            self.check.found = True
            self.check.losses = []
