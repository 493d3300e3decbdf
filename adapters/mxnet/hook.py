"""The MXNet Gluon hook: steps from the registered block's forward pre-hook.

What is captured, and when (docs/format.md 8.1 and 8.4):

* **Step boundary.** A step is one call of the registered top-level block: its forward
  pre-hook closes the previous step and begins the next (``init_step`` -1, so the first
  forward is step 0). Several forward calls per iteration count as several steps.
* **Parameters** (``weights``, ``biases``, anything else via ``save_all`` or regexes) are
  recorded in that pre-hook, so a step holds the values its forward pass used, before the
  optimizer updates them. Names are Gluon parameter names, e.g. ``dense0_weight``. A
  parameter whose shape Gluon has not inferred yet (deferred initialization, first step)
  is recorded right after the forward pass instead. Multi-device parameters are read from
  their first context.
* **Gradients** (``gradient/<param name>``) are recorded when the step closes, that is at
  the next forward pre-hook (or at :meth:`Hook.close` for the last step). By then the
  step's ``backward()`` has run and the values equal ``param.grad()`` after it, whether or
  not ``trainer.step`` ran (the update reads gradients, it does not change them).
  Caveat: with ``grad_req='add'``, zero the gradients after the forward pass of the next
  iteration, not before it, or the saved gradients are zeros.
* **Stopping.** After a live rule's ``StopTraining`` (:meth:`Hook.request_stop`), the next
  forward call of the registered block saves the closing step and raises
  :class:`~smdebug.exceptions.TrainingStopRequested` (as the PyTorch hook does).
* **Block tensors** are ``<block.name>_input_<i>`` / ``<block.name>_output_<i>``, where
  ``i`` counts the tensors the block received (or produced) in this step: 0 for a block
  with one input called once, 0 and 1 for a block called twice or given two tensors.
  A forward hook is attached only to blocks whose tensors some included collection
  wants (all blocks under ``save_all``; one block after ``add_block_tensors``).
* **Losses**: :meth:`Hook.register_loss` hooks a Gluon loss block; its output
  (``softmaxcrossentropyloss0_output_0``) falls in the default-saved ``losses`` collection.

Hybridized networks: MXNet runs a hybridized block as one cached graph and never calls
its children's hooks, so their inputs and outputs cannot be captured. Parameters,
gradients, the registered block's own inputs/outputs and the loss are unaffected. When
such child tensors are wanted, the hook says so once, in one warning.
"""
from __future__ import annotations

import re
import sys
from typing import Any, Dict, Iterator, List, Optional

import mxnet as mx
from mxnet import gluon

from smdebug.collections import PARAMETER_REGEXES, CollectionKeys, FrameworkProfile, describe_object
from smdebug.exceptions import ConfigError, TrainingStopRequested
from smdebug.capture.contract import Worker
from smdebug.hook import Hook as CoreHook
from smdebug.hook import takes_hook_arguments
from smdebug.hook import get_hook as core_get_hook
from smdebug.capture.fail_open import never_raises
from smdebug.logger import get_logger

from .backend import MXNetBackend

logger = get_logger("smdebug.mxnet")

GRADIENT_PREFIX = "gradient/"
INPUT, OUTPUT = "input", "output"


def block_tensor_regex(block_name: str, kind: str) -> str:
    """The regex matching every ``<block>_<kind>_<i>`` name of one block."""
    return rf"^{re.escape(block_name)}_{kind}_\d+$"


def _iter_arrays(value) -> Iterator[mx.nd.NDArray]:
    """The NDArrays in a block's arguments or result, depth first (None and others skipped)."""
    if isinstance(value, mx.nd.NDArray):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _iter_arrays(item)


def _children(block: gluon.Block) -> List[gluon.Block]:
    return list(getattr(block, "_children", {}).values())


def _is_hybridized(block: gluon.Block) -> bool:
    return isinstance(block, gluon.HybridBlock) and bool(getattr(block, "_active", False))


@takes_hook_arguments
class Hook(CoreHook):
    """Saves tensors of a Gluon training loop.

    Then::

        hook.register_block(net)            # the model: defines the steps
        hook.register_loss(loss_fn)         # optional: saves the loss
        hook.set_mode(smd.modes.TRAIN)      # optional: per-mode step counters

    See the module docstring for what is captured when.
    """

    framework = "mxnet"
    profile = FrameworkProfile(
        "mxnet",
        {**PARAMETER_REGEXES, CollectionKeys.LOSSES: (r".*loss._(?!input).*output",),
         CollectionKeys.INPUTS: (r"_input_\d+$",), CollectionKeys.OUTPUTS: (r"_output_\d+$",)},
        (CollectionKeys.LOSSES,),
        extra_collections=(CollectionKeys.SCALARS,),
    )

    def __init__(self, *args, **kwargs):
        # The adapter's own state first, then the session (which may call back into it).
        self.model: Optional[gluon.Block] = None
        self._losses: List[gluon.Block] = []
        self._extra_blocks: Dict[int, gluon.Block] = {}  # blocks named by add_block_tensors
        self._model_handles: list = []
        self._tensor_handles: Dict[int, Any] = {}  # id(block) -> forward-hook handle
        self._synced_key = None
        self._resolved_layer_requests = set()
        self._tensor_counts: Dict[str, int] = {}
        self._deferred_params: list = []
        self._warned_hybrid = False
        super().__init__(*args, **kwargs)

    # --- the adapter callbacks (smdebug.capture.contract.Adapter) -----------------------------------
    def make_backend(self):
        return MXNetBackend()

    def worker(self) -> Worker:
        """Horovod's rank and size when ``horovod.mxnet`` is imported and initialized."""
        hvd = sys.modules.get("horovod.mxnet")
        if hvd is not None:
            try:
                return Worker.numbered(int(hvd.rank()), int(hvd.size()))
            except Exception:  # noqa: BLE001 - imported but not initialized: single process
                pass
        return Worker.numbered(0, 1)

    def on_disabled(self, reason: str) -> None:
        self._detach_all()

    # --- registration --------------------------------------------------------------
    def register_hook(self, block: gluon.Block) -> None:
        """1.0.34's name for :meth:`register_block` (scripts and its zero-code-change patches call it)."""
        self.register_block(block)

    def register_block(self, block: gluon.Block) -> None:
        """Register the top-level Gluon block: each of its forward calls is one step.

        Register before ``hybridize()`` or after: both work, see the module docstring.
        Registering another block replaces the first as the step-defining model; a Gluon
        loss block is registered as a loss instead (:meth:`register_loss`), as in 1.0.34.
        """
        if not isinstance(block, gluon.Block):
            raise ConfigError(f"register_block expects a mxnet.gluon.Block, got {type(block).__name__}")
        if isinstance(block, gluon.loss.Loss):  # as in 1.0.34: a loss block saves its output, it is no model
            self.register_loss(block)
            return
        if self.model is block:
            return
        for handle in self._model_handles:
            handle.detach()
        self.model = block
        self._model_handles = [
            block.register_forward_pre_hook(self._on_model_forward_pre),
            block.register_forward_hook(self._on_model_forward_end),
        ]
        self._synced_key = None
        self._sync_tensor_hooks()

    register_module = register_block  # the PyTorch spelling, for portable scripts

    def register_loss(self, loss_block: gluon.Block) -> None:
        """Register a Gluon loss block so that its output is saved (``losses`` collection)."""
        if not isinstance(loss_block, gluon.Block):
            raise ConfigError(f"register_loss expects a mxnet.gluon loss Block, got {type(loss_block).__name__}")
        if all(b is not loss_block for b in self._losses):
            self._losses.append(loss_block)
            self._synced_key = None
            self._sync_tensor_hooks()

    # --- which blocks get a forward hook --------------------------------------------------
    def _all_blocks(self) -> List[gluon.Block]:
        seen, ordered = set(), []
        stack = ([self.model] if self.model is not None else []) + list(self._losses) + \
            list(self._extra_blocks.values())
        while stack:
            block = stack.pop()
            if id(block) in seen:
                continue
            seen.add(id(block))
            ordered.append(block)
            stack.extend(_children(block))
        return ordered

    def collection_object(self, collection, obj) -> None:
        """``coll.add(block)``: the block's outputs join the collection, which becomes included."""
        if not isinstance(obj, gluon.Block):
            raise ConfigError(
                f"cannot add {describe_object(obj)} to collection {collection.name!r}: add tensor names "
                "or regexes (strings) or a mxnet.gluon.Block (its outputs; coll.add_block_tensors(block, "
                "inputs=True) for inputs too); for a value you computed, hook.save_tensor('<name>', value, "
                f"{collection.name!r})")
        collection.add_block_tensors(obj)
        self.session.include(collection.name, expect=False)

    def _resolve_layer_requests(self) -> None:
        """Turn ``coll.add_block_tensors(block, ...)`` into name regexes on that collection."""
        for coll in list(self.session.collection_manager):
            for request in coll.layer_requests:
                key = (coll.name, id(request[0]), request[1], request[2])
                if key in self._resolved_layer_requests:
                    continue
                block, inputs, outputs = request
                if not isinstance(block, gluon.Block):
                    raise ConfigError(f"collection {coll.name!r}: add_block_tensors expects a mxnet.gluon.Block, "
                                      f"got {type(block).__name__}")
                self._resolved_layer_requests.add(key)
                self._extra_blocks[id(block)] = block
                if inputs:
                    coll.include(block_tensor_regex(block.name, INPUT))
                if outputs:
                    coll.include(block_tensor_regex(block.name, OUTPUT))

    def _block_wanted(self, block: gluon.Block) -> bool:
        """Whether an included collection matches this block's tensor names.

        Regexes are tried on the name of the block's first tensor (index 0).
        """
        included = [self.session.collection_manager.get(n) for n in self.session.include_collections]
        for kind in (INPUT, OUTPUT):
            prefix = f"{block.name}_{kind}_"
            for coll in included:
                if coll.matches(prefix + "0") or any(t.startswith(prefix) for t in coll.tensor_names):
                    return True
        return False

    def _sync_tensor_hooks(self) -> None:
        """Attach forward hooks to exactly the blocks whose tensors are wanted (config changes only)."""
        if self._sync_key() == self._synced_key:
            return
        self._resolve_layer_requests()  # may add regexes, i.e. change the key
        wanted = {id(b): b for b in self._all_blocks() if self._block_wanted(b)}
        for block_id in [i for i in self._tensor_handles if i not in wanted]:
            self._tensor_handles.pop(block_id).detach()
        for block_id, block in wanted.items():
            if block_id not in self._tensor_handles:
                self._tensor_handles[block_id] = block.register_forward_hook(self._on_block_forward_end)
        self._synced_key = self._sync_key()

    def _sync_key(self):
        session = self.session
        return (session.collection_manager.version, tuple(session.include_collections), id(self.model),
                len(self._losses))

    def _blind_blocks(self) -> List[gluon.Block]:
        """Hooked blocks whose hooks MXNet skips: descendants of a hybridized block."""
        blind, stack = [], [(b, False) for b in ([self.model] if self.model is not None else [])]
        while stack:
            block, inside_graph = stack.pop()
            if inside_graph and id(block) in self._tensor_handles:
                blind.append(block)
            stack.extend((c, inside_graph or _is_hybridized(block)) for c in _children(block))
        return blind

    def _warn_if_hybridized(self) -> None:
        if self._warned_hybrid:
            return
        blind = self._blind_blocks()
        if blind:
            self._warned_hybrid = True
            names = ", ".join(b.name for b in blind[:5]) + (", ..." if len(blind) > 5 else "")
            logger.warning(
                "smdebug: %d block(s) inside a hybridized block (%s) will not have their inputs/outputs saved: "
                "MXNet runs a hybridized block as one graph and does not call its children's hooks. Parameters, "
                "gradients, losses and the registered block's own inputs/outputs are still saved. To capture "
                "these, do not hybridize (or hybridize only the blocks whose tensors you do not need).",
                len(blind), names)

    # --- the framework's callbacks ---------------------------------------------------
    def _on_model_forward_pre(self, block, inputs) -> None:
        # A live rule's StopTraining (request_stop): the next forward of the model raises,
        # once the step before it is closed (outside never_raises, which would swallow it).
        if self.session.stop_reason is not None and block is self.model:
            self._close_step_before_stopping()
            raise TrainingStopRequested(f"smdebug stopped training: {self.session.stop_reason}")
        self._on_model_forward_begin(block, inputs)

    @never_raises("stopping")
    def _close_step_before_stopping(self) -> None:
        if self.session.step_open:
            self.end_step()  # its gradients too (on_step_end)

    @never_raises("forward pre-hook")
    def _on_model_forward_begin(self, block, inputs) -> None:
        if block is not self.model:
            return
        self._sync_tensor_hooks()  # a no-op unless collections changed
        self._tensor_counts.clear()
        self._deferred_params = []
        if self.begin_step():
            self._warn_if_hybridized()
            self._record_parameters()

    @never_raises("forward hook")
    def _on_model_forward_end(self, block, inputs, outputs) -> None:
        if self._deferred_params and self.session.saving_step:
            params, self._deferred_params = self._deferred_params, []
            for param in params:
                self.session.inbox.record(param.name, param.data(param.list_ctx()[0]))

    @never_raises("block forward hook")
    def _on_block_forward_end(self, block, inputs, outputs) -> None:
        if not self.session.saving_step:
            return
        for kind, values in ((INPUT, inputs), (OUTPUT, outputs)):
            base = f"{block.name}_{kind}_"
            for array in _iter_arrays(values):
                index = self._tensor_counts.get(base, 0)
                self._tensor_counts[base] = index + 1
                self.session.inbox.record(f"{base}{index}", array)

    # --- parameters and gradients ----------------------------------------------------
    def _parameters(self):
        return self.model.collect_params().values() if self.model is not None else ()

    def _record_parameters(self) -> None:
        for param in self._parameters():
            if not self.session.plans.wants(param.name):
                continue
            try:
                self.session.inbox.record(param.name, param.data(param.list_ctx()[0]))
            except gluon.parameter.DeferredInitializationError:
                self._deferred_params.append(param)  # its shape is known after this forward pass
            except RuntimeError as exc:  # not initialized at all: nothing to save
                logger.debug("smdebug: parameter %s not saved: %s", param.name, exc)

    def _record_gradients(self) -> None:
        if not (self.session.step_open and self.session.saving_step):
            return
        for param in self._parameters():
            name = GRADIENT_PREFIX + param.name
            if param.grad_req == "null" or not self.session.plans.wants(name):
                continue
            try:
                self.session.inbox.record(name, param.grad(param.list_ctx()[0]))
            except RuntimeError as exc:  # includes DeferredInitializationError: no backward ran yet
                logger.debug("smdebug: gradient of %s not saved: %s", param.name, exc)

    # --- lifecycle ---------------------------------------------------------------------
    def on_step_end(self) -> None:
        """The step's gradients: the backward pass has run by the time the step ends (the
        model's next forward, a stop, close)."""
        try:
            self._record_gradients()
        except Exception as exc:  # noqa: BLE001 - costs the gradients, not the step's other tensors
            logger.warning("smdebug: could not save the gradients of step %d: %s", self.session.global_step, exc)

    def on_close(self) -> None:
        """Detach from the blocks."""
        self._detach_all()

    def _detach_all(self) -> None:
        handles = self._model_handles + list(self._tensor_handles.values())
        for handle in handles:
            try:
                handle.detach()
            except Exception:  # noqa: BLE001 - the block may already be gone
                pass
        self._model_handles = []
        self._tensor_handles = {}


def get_hook(json_config_path: Optional[str] = None, create_if_not_exists: bool = False) -> Optional[Hook]:
    """This process's MXNet hook: the last one constructed, else one from the JSON config.

    With ``create_if_not_exists``, the hook is created from ``json_config_path`` (or
    ``SMDEBUG_CONFIG_FILE_PATH``); returns None when there is no such file or
    ``USE_SMDEBUG`` turns smdebug off.
    """
    return core_get_hook(Hook, json_config_path=json_config_path, create_if_not_exists=create_if_not_exists)
