"""Where a NaN or an infinity first appeared in a PyTorch step, for the flight recorder.

While the flight recorder keeps steps, every module of a registered model gets a forward
hook that notes, for each call, whether its output is finite, and (for inputs made in the
step's graph) a tensor hook that notes whether the gradient this module's backward produced
for that input is finite. Parameters' gradients get no note: they are in the gradients
collection, whose reductions the recorder checks anyway, and a note on each (a pass over
every weight's gradient) cost another 3-4% of a step on top of the notes above (6-layer
512-wide MLP, batch 512, CPU training-thread time; docs/performance.md). A note is a 0-d *device*
tensor, the sum of the values (finite exactly when they all are, :func:`_finite_note`):
nothing is read on the host while training runs.
At the end of the step the notes become one :class:`StepProbe`; the core asks it
(``locate()``) only for a step whose captured tensors were not finite, and only then are the
notes stacked and read: one host transfer, once per run.

The first note that is not finite, in execution order (the forward pass, then the backward
pass), names the module that *produced* the first non-finite value; the modules after it
only propagated it. An input that is not finite although no module produced it comes from
the code between modules (the parent module's own ``forward``) or from the data.
"""
from __future__ import annotations

import weakref
from typing import Dict, List, Optional, Tuple

import torch

from smdebug.logger import get_logger

from .models import tensor_leaves
from .sharded import is_dtensor

logger = get_logger("smdebug.pytorch")

_HALF = (torch.float16, torch.bfloat16)


def _finite_note(t: torch.Tensor) -> Optional[torch.Tensor]:
    """A 0-d tensor on ``t``'s device that is finite exactly when ``t`` is (None when the
    dtype cannot hold a NaN): its sum, which is NaN or infinite when any element is.

    A sum, not ``isfinite(t).all()``: one pass and no temporary, 10-30x cheaper on CPU
    (2 us against 36 us for 64x256 floats). Its one false alarm, finite values whose sum
    overflows, needs values near the dtype's limit (1e38 / numel for float32), a training
    going bad anyway; half floats are summed in float32 so that ordinary activations never
    overflow.
    """
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0 or t.is_meta:
        return None
    t = t.detach()  # records no graph (cheaper than entering no_grad for each note)
    if is_dtensor(t):
        # A sharded activation: this rank's part. Reading a DTensor's sum later would start a
        # collective on the one rank that fired.
        t = t.to_local()
    return t.sum(dtype=torch.float32) if t.dtype in _HALF else t.sum()




def _in(produced: Dict[int, "weakref.ref"], t: torch.Tensor) -> bool:
    ref = produced.get(id(t))
    return ref is not None and ref() is t


def _parent(path: str, root: str) -> str:
    return path.rpartition(".")[0] or root if path != root else root


class StepProbe:
    """One step's notes, in execution order: ``(phase, module, class, what)`` labels and their
    device sums (:func:`_finite_note`). :meth:`locate` reads them (the core calls it only for
    a step that fired)."""

    __slots__ = ("labels", "flags")

    def __init__(self, labels: List[Tuple[str, str, str, str]], flags: List[torch.Tensor]):
        self.labels, self.flags = labels, flags

    def locate(self) -> Optional[Dict[str, object]]:
        """The first non-finite note, or None: ``module`` (its path in the model, as in the
        tensor names), ``module_class``, ``phase`` (forward/backward), ``what`` (output i,
        input i of a submodule, gradient of ...), ``order`` (its rank among the step's notes)."""
        if not self.flags:
            return None
        by_device: Dict[torch.device, List[int]] = {}
        for i, flag in enumerate(self.flags):
            by_device.setdefault(flag.device, []).append(i)
        finite = [True] * len(self.flags)
        for indices in by_device.values():  # one stack and one transfer per device
            sums = torch.stack([self.flags[i].to(torch.complex128 if self.flags[i].is_complex() else torch.float64)
                                for i in indices])
            for i, ok in zip(indices, torch.isfinite(sums).cpu().tolist()):
                finite[i] = bool(ok)
        # Forward notes first, then backward ones: each list is in execution order.
        order = sorted(range(len(finite)), key=lambda i: (self.labels[i][0] != "forward", i))
        for rank, i in enumerate(order):
            if not finite[i]:
                phase, module, cls, what = self.labels[i]
                return {"module": module, "module_class": cls, "phase": phase, "what": what, "order": rank,
                        "notes_in_step": len(finite)}
        return None


class NonfiniteLocator:
    """Installs the notes' hooks on a model's modules and parameters; collects a step's notes."""

    def __init__(self):
        self._handles: list = []
        self._labels: List[Tuple[str, str, str, str]] = []
        self._flags: List[torch.Tensor] = []
        # Tensors a module returned in this step, by id, held weakly: an id alone may be that of
        # a freed tensor reused by a new one, and holding them would keep activations alive.
        self._produced: Dict[int, "weakref.ref"] = {}
        self._modules: set = set()
        #: set when a note failed: the hooks do nothing from then on (removed at the step's end)
        self.failed = False

    def fail(self, exc: BaseException) -> None:
        """A note could not be taken: one warning, no more notes (training goes on)."""
        if not self.failed:
            self.failed = True
            logger.warning("smdebug flight recorder: cannot check module tensors for NaN/Inf (%s: %s); it keeps "
                           "steps but will not name the module where a non-finite value appeared",
                           type(exc).__name__, exc)

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    def install(self, root_name: str, modules: List[Tuple[str, torch.nn.Module]]) -> None:
        """Hooks on ``modules`` (``(path, module)``, root included), each module once."""
        self_ref = weakref.ref(self)
        classes = {path: type(module).__name__ for path, module in modules}
        for path, module in modules:
            if id(module) in self._modules:
                continue
            self._modules.add(id(module))
            parent = _parent(path, root_name)
            self._handles.append(module.register_forward_hook(_forward_note(
                self_ref, (path, type(module).__name__), (parent, classes.get(parent, "?")))))

    def remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()
        self._modules.clear()
        self.take_probe()

    def note(self, phase: str, who: Tuple[str, str], what: str, t: torch.Tensor) -> None:
        """Note whether ``t`` is finite (as a device sum), with who produced it in which phase."""
        flag = _finite_note(t)
        if flag is not None:
            self._labels.append((phase, who[0], who[1], what))
            self._flags.append(flag)

    def take_probe(self) -> Optional[StepProbe]:
        """The notes of the step that ends, as a probe; the next step starts empty."""
        labels, flags = self._labels, self._flags
        self._labels, self._flags, self._produced = [], [], {}
        return StepProbe(labels, flags) if flags and not self.failed else None


def _forward_note(locator_ref, who: Tuple[str, str], parent: Tuple[str, str]):
    """The forward hook of one module; ``who`` and ``parent`` are (path, class name)."""
    path = who[0]

    def on_forward(module, args, output):
        locator = locator_ref()
        if locator is None or locator.failed:
            return
        try:
            note_call(locator, args, output)
        except Exception as exc:  # noqa: BLE001 - never into training
            locator.fail(exc)

    def note_call(locator, args, output):
        produced = locator._produced
        for i, t in enumerate(tensor_leaves(args, [])):
            if not _in(produced, t):
                # Not returned by a module this step: made by the parent's own code, or data.
                locator.note("forward", parent, f"input {i} of {path}", t)
            if t.grad_fn is not None and torch.is_grad_enabled():
                # Only tensors made in this step's graph: a hook on a leaf (a reused input that
                # requires grad) would stay on it, one more each step.
                t.register_hook(_grad_note(locator_ref, who, f"gradient of input {i}"))
        for i, t in enumerate(tensor_leaves(output, [])):
            if not _in(produced, t):  # else a container returning its last child's output: noted already
                produced[id(t)] = weakref.ref(t)
                locator.note("forward", who, f"output {i}", t)

    return on_forward


def _grad_note(locator_ref, who: Tuple[str, str], what: str):
    """A gradient hook noting ``who``'s (path, class name) gradient ``what``."""

    def on_grad(grad):
        locator = locator_ref()
        if locator is not None and grad is not None and not locator.failed:
            try:
                locator.note("backward", who, what, grad)
            except Exception as exc:  # noqa: BLE001 - never into training
                locator.fail(exc)
        return None

    return on_grad
