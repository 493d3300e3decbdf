"""Module inputs and outputs: ``<module path>_input_<i>`` / ``<module path>_output_<i>``.

A participant of the PyTorch step driver (participant.py). ``i`` counts the tensors a module
produced in the step. The values are those the module returned: they are copied when the
registered model's forward returns (all at once, one batch), or at the module's return for a
module whose tensors something changed in place later in the forward
(``nn.ReLU(inplace=True)``). Forward hooks on submodules are installed only while steps save.

A forward's noted tensors are handed over whole or not at all: the list of noted tensors and
the step's counts change only once their batch is filed, so a ``KeyboardInterrupt`` that lands
in the middle leaves them to be handed over again, under the same names, when the step ends.
"""
from __future__ import annotations

import collections
import itertools
import operator
import re
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from smdebug.capture.fail_open import never_raises
from smdebug.logger import get_logger

from .backend import _VERSION
from .models import RegisteredModels, tensor_leaves
from .participant import StepParticipant, eager_forward_hook, remove_handles

logger = get_logger("smdebug.pytorch")


def pick(items: Sequence, indices) -> list:
    """``[items[i] for i in indices]`` as one C-level pass."""
    return list(map(items.__getitem__, indices))


def any_none(items: list) -> bool:
    return any(map(operator.is_, items, itertools.repeat(None)))


class ModuleOutputs(StepParticipant):
    """The registered models' module tensors of each saved step (module docstring)."""

    def __init__(self, session, models: RegisteredModels):
        super().__init__(session)
        self.models = models
        self._handles: list = []  # submodule forward hooks, installed while steps save
        self._key: Optional[Tuple[int, int]] = None  # (plans version, modules named) the hooks were chosen for
        self._resolved_layer_version = -1
        self._resolved_layer_requests: set = set()
        # '<module>_output_' keys of a forward's noted tensors -> their names, when no module
        # tensor was numbered before in the step (the usual case): named once, not per step.
        self._deferred_names: Dict[tuple, tuple] = {}
        self._tensor_counts: Dict[str, int] = {}  # '<module>_output_' -> tensors named this step
        # Module tensors whose copy waits for the end of the root forward (see offer), as
        # ('<module>_output_', tensor, its version counter when the module returned it).
        self._deferred: List[Tuple[str, torch.Tensor, int]] = []
        self._observed: List[Tuple[str, torch.Tensor, int]] = []  # copied at once, watched for in-place changes
        # '<module>_output_' -> its tensors were unchanged at the end of the forward when observed.
        self._deferrable: Dict[str, bool] = {}
        self._warned_changed: set = set()
        self._warned_compiled = False

    # --- the step points ---------------------------------------------------------------------
    def begin(self, step) -> None:
        if self._tensor_counts:
            self._tensor_counts = {}
        if step.armed and (step.saving or self._handles):
            self.sync_hooks()

    def end(self, step) -> None:
        if self._deferred or self._observed:  # module calls outside a registered model's forward
            self._copy_deferred_guarded()

    def close(self) -> None:
        remove_handles(self._handles)
        self._key = None

    @never_raises("copying module tensors")
    def _copy_deferred_guarded(self) -> None:
        self.copy_deferred()

    # --- forward hooks -------------------------------------------------------------------------
    def forward_hook(self, name: str, inputs: Optional[bool] = None, outputs: Optional[bool] = None):
        """A forward hook recording ``name``'s inputs/outputs (None: whatever the plan asks for).

        It holds the participant weakly (torch keeps it as long as the module lives) and runs
        eagerly, with a graph break, inside a torch.compile'd region. It is on the path of
        every captured module call: for the common case (one output tensor, known to stay
        unchanged until the forward ends) it only notes the tensor.
        """
        ref = weakref.ref(self)
        key = f"{name}_output_"
        outputs_only = inputs is False and outputs is True

        def capture(module, args, output):
            me = ref()
            if me is None or not me.session.saving_step:
                return
            if outputs_only and type(output) is torch.Tensor and me._deferrable.get(key) \
                    and not output.is_inference():  # inference tensors have no version counter
                me._deferred.append((key, output, output._version))
            else:
                me.on_module_forward(name, inputs, outputs, args, output)

        return eager_forward_hook(capture)

    @never_raises("module forward hook")
    def on_module_forward(self, name: str, want_inputs, want_outputs, inputs, outputs, root: bool = False) -> None:
        """A module returned: offer its inputs/outputs. ``root``: a registered model's forward
        ended, so the tensors its submodules produced are named and copied now."""
        plans = self.session.plans
        if want_inputs or (want_inputs is None and plans.plan_for(f"{name}_input_0") is not None):
            self._offer(name + "_input_", inputs, defer=not root)
        if want_outputs or (want_outputs is None and plans.plan_for(f"{name}_output_0") is not None):
            self._offer(name + "_output_", outputs, defer=not root)
        if root:
            self.copy_deferred()

    def _offer(self, key: str, value, defer: bool = False) -> None:
        """Record the tensors of one module call (``key``: '<module>_output_' or '_input_').

        They are numbered on from the module's earlier calls in the step. With ``defer``,
        the tensors of a module whose tensors were left unchanged until the end of the
        forward pass when last observed are only noted, and copied together when the root
        module returns. Others are copied at once and, the first time, observed: if
        something changes them in place before the forward ends (``nn.ReLU(inplace=True)``
        after a Linear does), that module's tensors are always copied at once.
        """
        session = self.session
        tensors = (value,) if isinstance(value, torch.Tensor) else tensor_leaves(value, [])
        if not tensors:
            return
        # Inference-mode tensors have no version counter to watch: they are copied at once.
        deferrable = self._deferrable.get(key) if defer and not tensors[0].is_inference() else False
        if deferrable and not any(t.is_inference() for t in tensors):
            self._deferred.extend((key, tensor, tensor._version) for tensor in tensors)
            return
        first = self._tensor_counts.get(key, 0)
        self._tensor_counts[key] = first + len(tensors)
        for i, tensor in enumerate(tensors, first):
            tname = f"{key}{i}"
            if session.inbox.record(tname, tensor, session.backend) and deferrable is None and not tensor.is_inference():
                self._observed.append((key, tensor, tensor._version))

    def copy_deferred(self) -> None:
        """The end of a forward pass: name the noted module tensors and copy them in one batch.

        The noted tensors and the counts change only once the batch is filed (module docstring)."""
        session = self.session
        if self._observed:
            changed = {key for key, tensor, version in self._observed if tensor._version != version}
            for key, _, _ in self._observed:
                self._deferrable[key] = key not in changed
            self._observed.clear()
        deferred = self._deferred
        if not deferred:
            return
        tensors: Sequence  # those noted, then those kept by _name_deferred
        keys, tensors, versions = zip(*deferred)  # C-level passes from here on (hundreds of tensors)
        names = self._deferred_names.get(keys) if not self._tensor_counts else None
        if names is not None and tuple(map(_VERSION, tensors)) == versions:
            counts: Dict[str, int] = collections.Counter(keys)  # no counts yet: each key's calls in this forward
        else:
            names, tensors, counts = self._name_deferred(deferred, keys)
        selection = session.plans.selection(names)
        session.inbox.record_batch(session.inbox.start_batch(selection, pick(tensors, selection.indices),
                                                             session.backend))
        self._tensor_counts, self._deferred = counts, []  # filed: from here on they are the step's

    def _name_deferred(self, deferred, keys: tuple) -> Tuple[tuple, list, Dict[str, int]]:
        """Name the noted tensors of a forward, dropping those changed in place since their
        module returned them (with one warning each; that module is copied at once from now
        on). Returns the names, the tensors and the step's counts once they are filed."""
        counts = dict(self._tensor_counts)
        cacheable = not counts
        names: List[str] = []
        tensors = []
        for key, tensor, version in deferred:
            i = counts.get(key, 0)
            counts[key] = i + 1
            tname = f"{key}{i}"
            if tensor._version != version:
                # Its value at the module's return is gone: say so, and copy it at once from now on.
                cacheable = False
                self._deferrable[key] = False
                if tname not in self._warned_changed:
                    self._warned_changed.add(tname)
                    logger.warning("smdebug: %s was changed in place after its module returned it, so it is not "
                                   "saved at step %d; it is copied as soon as it is produced from now on",
                                   tname, self.session.global_step)
                continue
            names.append(tname)
            tensors.append(tensor)
        named = tuple(names)
        if cacheable:
            if len(self._deferred_names) > 64:
                self._deferred_names.clear()
            self._deferred_names[keys] = named
        return named, tensors, counts

    # --- which modules are hooked ----------------------------------------------------------------
    def sync_hooks(self) -> None:
        """Install the submodule hooks this step needs; keep them while consecutive steps need the same."""
        session = self.session
        if not (session.saving_step and session.enabled):
            if self._handles:
                self.close()
            return
        self.resolve_layer_requests()
        models = self.models
        key = (session.plans.version, len(models.module_names))
        if key == self._key:
            return
        remove_handles(self._handles)
        self._key = key
        permanent = models.permanent_ids()
        skipped = []
        for module_id, (module, name) in models.module_names.items():
            if module_id in permanent:
                continue
            want_inputs = session.plans.plan_for(f"{name}_input_0") is not None
            want_outputs = session.plans.plan_for(f"{name}_output_0") is not None
            if not (want_inputs or want_outputs):
                continue
            if module_id in models.compiled_module_ids:
                skipped.append(name)
                continue
            self._handles.append(module.register_forward_hook(self.forward_hook(name, want_inputs, want_outputs)))
        if skipped and not self._warned_compiled:
            self._warned_compiled = True
            logger.warning(
                "smdebug: the model is compiled with torch.compile, so the inputs/outputs of its submodules (%s%s) "
                "cannot be captured: hooks inside a compiled graph are fixed when it is compiled and are not "
                "called for tensors that only exist inside the graph. Parameters, gradients, losses and the "
                "model's own inputs/outputs are saved. Register the uncompiled model to capture submodules.",
                ", ".join(skipped[:5]), ", ..." if len(skipped) > 5 else "")

    def resolve_layer_requests(self) -> None:
        """Turn ``coll.add_module_tensors(module, inputs, outputs)`` requests into name regexes
        of their collections."""
        session = self.session
        manager = session.collection_manager
        if manager.version == self._resolved_layer_version:
            return
        for coll in list(manager):
            for module, inputs, outputs in coll.layer_requests:
                key = (coll.name, id(module), inputs, outputs)
                if key in self._resolved_layer_requests:
                    continue
                self._resolved_layer_requests.add(key)
                name = re.escape(self.models.name_of(module))
                if inputs:
                    coll.include(rf"^{name}_input_\d+$")
                if outputs:
                    coll.include(rf"^{name}_output_\d+$")
                # Asking for a module's tensors means wanting them saved.
                session.include(coll.name, expect=False)
        self._resolved_layer_version = manager.version
