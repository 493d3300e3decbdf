"""The PyTorch hook: module, loss and optimizer hooks that feed its step session.

What is a step
    A step starts at the forward pre-hook of a registered top-level module; the first
    forward pass is global step 0. Once an optimizer that updates the registered model's
    parameters is known (it has stepped once, or ``register_optimizer`` was called), a
    TRAIN step is one optimizer step instead: all forwards up to an ``optimizer.step()``
    (gradient accumulation, models called twice per iteration) belong to one step, and the
    next step starts at the first forward after it. EVAL and PREDICT steps are always one
    forward pass each. A step's data is written when the next step starts (or at close),
    so ``save_scalar`` after ``optimizer.step()`` lands in the step that just ran.

Mode
    ``set_mode`` when the user called it, otherwise ``module.training`` of the registered
    module at each forward: TRAIN or EVAL.

What is recorded, and when
    * Parameters ``<RootClass>_<dotted name>`` (``weights``, ``biases``): in a TRAIN step
      with a known optimizer, just before ``optimizer.step()`` (the values this step's
      forward pass used); otherwise at the start of the step.
    * Gradients ``gradient/<same name>``: just before ``optimizer.step()`` (``.grad`` after
      any accumulation, before the update); without a known optimizer, from a
      post-accumulate-grad hook on each parameter (``.grad`` once autograd finished with
      it, the last backward of the step wins). Frozen parameters have none.
    * Updates ``update/<same name>`` (``updates``): the value just after ``optimizer.step()``
      minus the value just before, and the optimizer's state ``optimizer/<same name>/<key>``
      (``optimizer_variables``) just after it; only around steps of an optimizer that updates
      a registered model (optimizer_capture.py; of sharded parameters, sharded_capture.py).
    * Module inputs/outputs ``<module path>_input_<i>`` / ``<module path>_output_<i>``
      (root module: its class name; loss modules: their class name). ``i`` counts the
      tensors a module produced in the step: a module called twice with one output gives
      ``_output_0`` and ``_output_1``; a tuple output gives one index per element. The
      values are those the module returned: they are copied when the registered model's
      forward returns (all at once), or at the module's return for a module whose tensors
      something changed in place later in the forward (``nn.ReLU(inplace=True)``).

Cost on steps that save nothing: one forward pre-hook on the root module that counts the
step, a forward hook on each registered loss that returns at once, and one check per
``optimizer.step()``. Hooks that capture tensors (submodule forward hooks, gradient hooks)
are installed only while steps save and removed when a step saves nothing.
"""
from __future__ import annotations

import collections
import functools
import itertools
import operator
import os
import re
import sys
import warnings
import weakref
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from smdebug.collections import (OPTIMIZER_STATE_REGEXES, OPTIMIZER_STEP_REGEXES, CollectionKeys, FrameworkProfile,
                                 describe_object)
from smdebug.exceptions import ConfigError, TrainingStopRequested
from smdebug.capture.contract import Worker
from smdebug.hook import Hook as CoreHook
from smdebug.hook import takes_hook_arguments
from smdebug.hook import get_hook as _core_get_hook
from smdebug.capture.fail_open import never_raises
from smdebug.logger import get_logger
from smdebug.modes import ModeKeys

from .backend import _VERSION, TorchBackend, tensor_leaves
from .nonfinite import NonfiniteLocator
from .optimizer_capture import OptimizerCapture
from .router import RouterCapture, check_router_arguments, declared_routers
from .sharded import clean_path, fsdp_classes, model_name
from .sharded_capture import ShardedCapture

logger = get_logger("smdebug.pytorch")

_GRAD = operator.attrgetter("grad")


def _pick(items: list, indices) -> list:
    """``[items[i] for i in indices]`` as one C-level pass."""
    return list(map(items.__getitem__, indices))


def _any_none(items: list) -> bool:
    return any(map(operator.is_, items, itertools.repeat(None)))

_TRAINING_MODES = (ModeKeys.TRAIN, ModeKeys.GLOBAL)
_compiler_disable = getattr(getattr(torch, "compiler", None), "disable", lambda fn: fn)
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)


def _unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The user's model inside DataParallel/DistributedDataParallel, FSDP (v1) and torch.compile
    wrappers (FSDP2 changes no structure: see :func:`.sharded.model_name`)."""
    fsdp_v1, _ = fsdp_classes()
    wrappers = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel) + \
        ((fsdp_v1,) if fsdp_v1 is not None else ())
    while True:
        if isinstance(getattr(module, "_orig_mod", None), torch.nn.Module):  # torch.compile(model)
            module = module._orig_mod
        elif isinstance(module, wrappers):
            module = module.module
        else:
            return module


def _is_compiled(module: torch.nn.Module) -> bool:
    """Whether calls to ``module`` run through torch.compile (wrapper or ``module.compile()``)."""
    return (isinstance(getattr(module, "_orig_mod", None), torch.nn.Module)
            or getattr(module, "_compiled_call_impl", None) is not None)




def _weak_method(method):
    """A torch callback that calls ``method`` while its object lives (the hook can be collected).

    torch.compile does not trace it: it runs eagerly, with a graph break, in a compiled region.
    """
    ref = weakref.WeakMethod(method)

    @_compiler_disable
    def call(*args, **kwargs):
        bound = ref()
        return None if bound is None else bound(*args, **kwargs)

    return call


@takes_hook_arguments
class Hook(CoreHook):
    """Saves tensors of a PyTorch model during training.

    ``hook = smd.Hook(out_dir=..., ...)`` then ``hook.register_module(model)`` and, for
    loss modules, ``hook.register_loss(criterion)``. See the module docstring for how
    steps, modes and tensor names are determined.
    """

    framework = "pytorch"
    profile = FrameworkProfile(
        "pytorch", {**OPTIMIZER_STEP_REGEXES, CollectionKeys.LOSSES: (r"[Ll]oss_(?!input).*output",),
                    CollectionKeys.ROUTER: (r"^router/",)},
        (CollectionKeys.LOSSES,),
        extra_collections=(CollectionKeys.SCALARS, CollectionKeys.INPUTS, CollectionKeys.OUTPUTS),
        on_demand=OPTIMIZER_STATE_REGEXES,
    )

    def __init__(self, *args, **kwargs):
        # The adapter's own state first: the session built next may call back into it.
        self._user_mode: Optional[ModeKeys] = None
        # Registered models: (the module the user passed, the unwrapped model, its name).
        self._roots: List[Tuple[torch.nn.Module, torch.nn.Module, str]] = []
        self._params: List[Tuple[str, torch.nn.Parameter]] = []
        self._param_names: Tuple[str, ...] = ()  # of _params, and their gradients': looked up as one
        self._param_tensors: List[torch.nn.Parameter] = []  # of _params, for C-level passes
        self._grad_names: Tuple[str, ...] = ()
        self._param_ids: set = set()
        self._module_names: Dict[int, Tuple[torch.nn.Module, str]] = {}  # id -> (module, tensor-name prefix)
        self._compiled_module_ids: set = set()  # submodules of compiled roots: their hooks are unreliable
        self._losses: List[torch.nn.Module] = []
        self._handles: list = []  # permanent: root pre-hooks, root/loss forward hooks, optimizer hooks
        self._capture_handles: list = []  # installed while steps save
        self._capture_key = None
        self._resolved_layer_version = -1
        self._resolved_layer_requests: set = set()
        self._optimizers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # optimizer -> (n groups, ours)
        self.step_by_optimizer = False
        self._params_captured = False
        # Batches handed to the step pipeline whose tensors may not change until waited for:
        # the weights of the open step (fenced before optimizer.step()), and the last saved
        # gradients with their parameters (fenced before anything can write into them).
        self._weights_batch = None
        self._grads_batch = None
        self._grads_held: Tuple[list, list] = ([], [])
        self._zero_grad_fences: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        # '<module>_output_' keys of a forward's noted tensors -> their names, when no module
        # tensor was numbered before in the step (the usual case): named once, not per step.
        self._deferred_names: Dict[tuple, tuple] = {}
        self._optimizer_stepped = False
        self._tensor_counts: Dict[str, int] = {}  # '<module>_output_' -> tensors named this step
        # Module tensors whose copy waits for the end of the root forward (see _offer), as
        # ('<module>_output_', tensor, its version counter when the module returned it).
        self._deferred: List[Tuple[str, torch.Tensor, int]] = []
        self._observed: List[Tuple[str, torch.Tensor, int]] = []  # copied at once, watched for in-place changes
        # '<module>_output_' -> its tensors were unchanged at the end of the forward when observed.
        self._deferrable: Dict[str, bool] = {}
        self._warned_changed: set = set()
        self._warned_compiled = False
        self._optimizer_hooks_installed = False
        self._pending_params: List[Tuple[str, torch.nn.Parameter]] = []  # added before their model
        #: The integration (a trainer callback) that owns the step boundaries, see own_steps().
        self.step_owner: Optional[str] = None
        super().__init__(*args, **kwargs)
        session = self._session
        # Flight recorder: notes where a NaN/Inf first appears in each step (nonfinite.py).
        self._locator = NonfiniteLocator() if session.recorder is not None and session.flight_recorder.locate \
            else None
        # Sharded parameters (FSDP2/DTensor, FSDP v1 use_orig_params): reduced from their shards
        # with a fixed number of collectives per saved step (sharded_capture.py), apart from _params.
        self._sharded = ShardedCapture(session)
        # update/<name> and optimizer/<name>/<state key> around each optimizer step (optimizer_capture.py).
        self._optimizer_capture = OptimizerCapture(session, session.backend)
        self._names_by_id: Dict[int, str] = {}
        # Mixture-of-experts routers (router.py): statistics of the step's routing.
        self._routers = RouterCapture(session, self._name_of, self._parent_of)
        self._parents: Dict[int, tuple] = {}  # id(module) -> (registered models then, its parent)

    # --- the adapter callbacks (smdebug.capture.contract.Adapter) ---------------------------------------
    def worker(self) -> Worker:
        if dist.is_available() and dist.is_initialized():
            return Worker.numbered(dist.get_rank(), dist.get_world_size())
        # Launchers (torchrun, torch.distributed.launch) set these before init_process_group.
        try:
            return Worker.numbered(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))
        except ValueError:
            return Worker.numbered(0, 1)

    def make_backend(self) -> TorchBackend:
        return TorchBackend()

    def on_step_end(self) -> None:
        """What the step still holds: module tensors noted outside a registered model's
        forward, the flight recorder's probe, sharded statistics, an owned step's weights."""
        if self._deferred or self._observed:  # module calls outside a registered model's forward
            self._copy_deferred_guarded()
        session = self._session
        locator = self._locator
        if locator is not None:
            session.set_step_probe(locator.take_probe())
            if not session.flight_recording and locator.installed:
                locator.remove()  # the recorder fired or was disabled: no more notes
                self._locator = None
        if self._sharded.due():  # a TRAIN step with no optimizer step (manual updates)
            self._sharded.capture(with_gradients=session.mode in _TRAINING_MODES, reread_weights=True)
        if self._sharded.unfinished:
            self._sharded.finish()
        if self._routers:
            self._routers.hand_over()
        if self.step_owner is not None and self._weights_batch is not None:
            # An owned step that ended without capture_parameters() (no optimizer update): keep its weights.
            self._fence_weights_guarded()

    def on_step_failed(self) -> None:
        """No sharded collectives the other ranks may not reach; the failed step keeps the
        weights its forward used, for the flight recorder."""
        self._sharded.abandon()
        self._optimizer_capture.forget()
        if self._session.flight_recording and self._session.step_open:
            self._fence_weights_guarded()

    def on_mode_change(self, mode) -> None:
        """A mode the user set overrides ``module.training`` from now on."""
        self._user_mode = mode

    @never_raises("filing the step's weights")
    def _fence_weights_guarded(self) -> None:
        self._fence_weights()

    @never_raises("copying module tensors")
    def _copy_deferred_guarded(self) -> None:
        self._copy_deferred()

    def on_step_begin(self, saving: bool) -> None:
        self._params_captured = False
        if self._tensor_counts:
            self._tensor_counts = {}
        if self.step_owner is not None:
            self._begin_owned_step()

    # --- integrations that own the step boundaries (trainer callbacks) ----------------------
    def own_steps(self, owner: str) -> None:
        """Hand the step boundaries to an integration for the rest of the run.

        For trainers whose loop the hook cannot see from module and optimizer hooks
        (Lightning runs the forward inside ``optimizer.step(closure)``; a Trainer's
        callbacks know the accumulation boundaries). From this call on the hook starts no
        step and sets no mode by itself, and raises no ``TrainingStopRequested`` in the
        forward pass. The owner calls ``set_mode(mode)`` and ``begin_step()`` when a step
        starts, :meth:`capture_parameters` just before the optimizer updates the weights,
        ``end_step()`` (optional: the next ``begin_step`` ends a step), and reads
        ``stop_requested`` to stop its trainer. Module outputs and losses are still
        captured by the module hooks. ``owner`` names the integration in logs.
        """
        if not isinstance(owner, str) or not owner:
            raise ConfigError(f"own_steps: owner must name the integration (a non-empty string), got {owner!r}")
        if self.step_owner is not None and self.step_owner != owner:
            raise ConfigError(f"own_steps: the steps of this hook are already owned by {self.step_owner}; "
                              f"{owner} cannot own them too (one integration per hook)")
        self.step_owner = owner
        # Gradients come from capture_parameters(), never from per-parameter hooks.
        self.step_by_optimizer = True
        self._sync_capture_hooks()

    @never_raises("capture_parameters")
    def capture_parameters(self, optimizer: Optional[torch.optim.Optimizer] = None,
                           wait_for_gradients: bool = False) -> None:
        """Hand over the registered models' weights and (accumulated) gradients now.

        Called by the step owner (see :meth:`own_steps`) right before ``optimizer``
        updates the weights; the values are those the step's forward and backward passes
        used. Does nothing in a step that saves nothing or outside TRAIN/GLOBAL mode.

        The gradients are read on the step pipeline's worker while training goes on.
        Trainers drop them after the update (``zero_grad()``, ``set_to_none=True``), which
        needs no wait; ``zero_grad(set_to_none=False)`` of ``optimizer`` or of a registered
        model waits for the read first. A gradient written into by other means before it
        was read is detected by its version counter and not saved for that step (one
        warning), never saved half-updated. ``wait_for_gradients``: read them before
        returning, for an owner whose trainer changes them in place before the update
        (gradient clipping after this point).
        """
        if optimizer is not None and isinstance(optimizer, torch.optim.Optimizer):
            self._install_zero_grad_fence(optimizer)
        if self._session.saving_step and self._session.step_open and self._session.mode in _TRAINING_MODES:
            self._capture_parameters(with_gradients=True)
        if self._session.mode in _TRAINING_MODES and self._sharded.due():  # every rank joins its collectives
            self._sharded.capture(with_gradients=True, before_update=True)
        if wait_for_gradients:  # plain and sharded gradients read before the owner changes them
            self._fence_gradients()

    def _begin_owned_step(self) -> None:
        if self._session.saving_step or self._capture_handles:
            self._sync_capture_hooks()
        if self._session.saving_step:
            # TRAIN: fenced and filed at capture_parameters(); otherwise nothing updates them.
            self._start_weights(file_now=self._session.mode not in _TRAINING_MODES)

    def on_close(self) -> None:
        """The run's files are finished: remove every torch hook."""
        if not self._roots and self._session.global_step < 0 and self.step_owner is None and not self.dry_run:
            # Steps begin at a registered module's forward: without one, nothing ran or was saved.
            logger.warning("smdebug: this PyTorch hook saved nothing: no module was registered and no step began. "
                           "Call hook.register_module(model) (and hook.register_loss(loss_fn)) before training, "
                           "or drive steps yourself with hook.begin_step() and hook.save_tensor(...)")
        self._remove_handles(self._capture_handles)
        self._remove_handles(self._handles)
        self._optimizer_capture.forget()
        if self._locator is not None:
            self._locator.remove()
            self._locator = None
        self._capture_key = None
        for owner, fence in list(self._zero_grad_fences.items()):
            if owner.__dict__.get("zero_grad") is fence:
                del owner.zero_grad  # the class's own zero_grad again
        self._zero_grad_fences = weakref.WeakKeyDictionary()
        # the run is over: let go of the last step's tensors
        self._weights_batch, self._grads_batch, self._grads_held = None, None, ([], [])

    # --- registration ----------------------------------------------------------------------
    def record_tensor_value(self, tensor_name: str, tensor_value: torch.Tensor) -> None:
        """Deprecated (already in 1.0.34): save the output of a function that is no module,
        such as ``F.mse_loss(...)``, as ``<tensor_name>_output_0`` in the collections whose
        regexes match that name (``losses`` for a name ending in ``loss``), as 1.0.34 did.
        Use ``hook.save_tensor(name, value, collections_to_write)`` instead."""
        warnings.warn("Hook.record_tensor_value is deprecated; use hook.save_tensor(tensor_name, tensor_value, "
                      "collections_to_write) instead (it saves the name as given, in the collections you name)",
                      DeprecationWarning, stacklevel=2)
        if not isinstance(tensor_value, torch.Tensor):
            raise ConfigError(f"record_tensor_value: tensor_value must be a torch.Tensor, got "
                              f"{type(tensor_value).__name__}; use hook.save_tensor for other values")
        self.record(f"{tensor_name}_output_0", tensor_value.detach())

    def register_module(self, module: torch.nn.Module) -> None:
        """Capture a model: its parameters, gradients, and the inputs/outputs collections ask for.

        Each forward call of ``module`` starts a step (see the module docstring for
        optimizer steps). DataParallel, DistributedDataParallel and torch.compile wrappers
        are looked through: tensor names are those of the wrapped model.
        """
        if not isinstance(module, torch.nn.Module):
            raise ConfigError(f"register_module expects a torch.nn.Module, got {type(module).__name__}")
        if any(outer is module for outer, _, _ in self._roots):
            return
        inner = _unwrap(module)
        root_name = model_name(inner)
        compiled = _is_compiled(module) or _is_compiled(inner)
        self._roots.append((module, inner, root_name))
        if module is not inner:
            self._module_names[id(module)] = (module, root_name)
        fsdp_v1, _ = fsdp_classes()
        for path, sub in inner.named_modules():
            if fsdp_v1 is not None and isinstance(sub, fsdp_v1):
                continue  # its wrapped module takes the name (the path without wrapper segments)
            self._module_names[id(sub)] = (sub, clean_path(path) or root_name)
            if compiled and sub is not inner:
                self._compiled_module_ids.add(id(sub))
        self._params.extend(self._sharded.add_model(module, inner, root_name, self._param_ids))
        self._param_names = tuple(name for name, _ in self._params)
        self._param_tensors = [param for _, param in self._params]
        self._names_by_id = {id(param): name for name, param in self._params}
        if self._pending_params:
            pending, self._pending_params = self._pending_params, []
            for coll_name, param in pending:
                self.collection_object(self.get_collection(coll_name), param)
        self._grad_names = tuple(f"gradient/{name}" for name in self._param_names)
        self._install_zero_grad_fence(module)
        self._handles.append(module.register_forward_pre_hook(_weak_method(self._on_root_forward_pre)))
        self._handles.append(module.register_forward_hook(self._forward_hook(root_name, flush=True)))
        if self._locator is not None:
            self._install_locator(module, inner, root_name)
        self._install_optimizer_hooks()
        for gate, num_experts, top_k in declared_routers(inner):  # saved when "router" is included
            self._add_router(gate, num_experts, top_k)
        self._resolve_layer_requests()
        self._sync_capture_hooks()

    register_hook = register_module  # the original library's name

    def register_router(self, module: torch.nn.Module, num_experts: int, top_k: int) -> None:
        """Save mixture-of-experts routing statistics of ``module``, whose output is the router
        logits ``[..., num_experts]``, each token going to its ``top_k`` experts: per step, the
        fraction of assignments per expert, their coefficient of variation, the router's
        entropy, and the fraction dropped when the module reports a capacity (router.py).
        Includes the ``router`` collection. Routers a model declares are found by
        ``register_module`` (router.py says which)."""
        check_router_arguments(module, num_experts, top_k)
        self._add_router(module, num_experts, top_k)
        self._session.include(CollectionKeys.ROUTER, expect=False)

    def _add_router(self, module: torch.nn.Module, num_experts: int, top_k: int) -> None:
        if self._routers.add(module, num_experts, top_k):
            self._handles.append(module.register_forward_hook(self._routers.forward_hook()))

    def _install_locator(self, outer: torch.nn.Module, inner: torch.nn.Module, root_name: str) -> None:
        """The flight recorder's notes on every module of a registered model, and a root hook
        that torch calls even when the forward raises (``always_call``)."""
        modules = [(path or root_name, sub) for path, sub in inner.named_modules()
                   if id(sub) not in self._compiled_module_ids]
        self._locator.install(root_name, modules)
        self._handles.append(outer.register_forward_hook(
            functools.partial(_weak_method(self._on_root_forward_exit), root_name), always_call=True))

    def _on_root_forward_exit(self, root_name: str, module, args, output) -> None:
        """After every forward of a registered model; when the forward raised, torch calls it
        with no output from inside its ``except``: the flight recorder writes its steps."""
        if output is not None or self._session.recorder is None:
            return
        exc = sys.exc_info()[1]
        if isinstance(exc, Exception) and not isinstance(exc, TrainingStopRequested):
            self.dump_flight_recorder(f"{type(exc).__name__} in the forward of {root_name}: {exc}",
                                      trigger="exception")

    @property
    def registered_models(self) -> Tuple[torch.nn.Module, ...]:
        """The modules passed to ``register_module``, in order."""
        return tuple(outer for outer, _, _ in self._roots)

    def is_registered(self, module: torch.nn.Module) -> bool:
        """Whether ``module`` was passed to ``register_module`` or ``register_loss``."""
        return any(outer is module for outer, _, _ in self._roots) or any(m is module for m in self._losses)

    def register_loss(self, loss_module: torch.nn.Module) -> None:
        """Capture a loss module's output as ``<LossClass>_output_0`` (the ``losses`` collection).

        Any module computing a loss will do; its class name names the tensor.
        """
        if not isinstance(loss_module, torch.nn.Module):
            raise ConfigError(f"register_loss expects a torch.nn.Module, got {type(loss_module).__name__}")
        if any(m is loss_module for m in self._losses):
            return
        name = model_name(loss_module)
        self._losses.append(loss_module)
        self._module_names[id(loss_module)] = (loss_module, name)
        losses = self.get_collection(CollectionKeys.LOSSES)
        if not losses.matches(f"{name}_output_0"):  # a custom loss class without "Loss" in its name
            losses.include(rf"^{re.escape(name)}_output_\d+$")
        self._handles.append(loss_module.register_forward_hook(self._forward_hook(name)))
        if self._locator is not None:  # a loss that turns NaN (log of 0) is a module too
            self._locator.install(name, [(name, loss_module)])

    def register_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Count TRAIN steps by this optimizer's steps from now on (gradient accumulation).

        Optional: an optimizer that updates the registered model is recognised at its
        first ``step()``. Register it explicitly when accumulating gradients, so that the
        micro-batches before the first ``optimizer.step()`` also form one step.
        """
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"register_optimizer expects a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self._optimizers[optimizer] = (len(optimizer.param_groups), True)
        self.step_by_optimizer = True
        self._install_optimizer_hooks()
        self._install_zero_grad_fence(optimizer)

    def _install_optimizer_hooks(self) -> None:
        if self._optimizer_hooks_installed:
            return
        self._optimizer_hooks_installed = True
        self._handles.append(register_optimizer_step_pre_hook(_weak_method(self._on_optimizer_pre_step)))
        self._handles.append(register_optimizer_step_post_hook(_weak_method(self._on_optimizer_post_step)))

    @staticmethod
    def _remove_handles(handles: list) -> None:
        while handles:
            handles.pop().remove()

    # --- torch objects in collections: coll.add(obj), hook.add_to_collection(name, obj) ------
    def collection_object(self, coll, obj) -> None:
        """Resolve a torch object added to a collection, which then becomes included.

        A module saves its outputs (``add_module_tensors``'s default); a parameter of a
        registered model (or one registered later) saves under its parameter name. A plain
        tensor has no name the hook could follow from step to step: ConfigError.
        """
        if isinstance(obj, torch.nn.Module):
            coll.add_module_tensors(obj)
            known = self._module_names.get(id(obj))
            if known is not None and known[0] is obj:
                self._resolve_layer_requests()
            # else: named when a model holding it is registered (or, failing that, by its class at the first step)
        elif isinstance(obj, torch.nn.Parameter):
            name = next((n for n, p in self._params if p is obj), None) or self._sharded.param_named(obj)
            if name is None:
                self._pending_params.append((coll.name, obj))
            else:
                coll.add_tensor_name(name)
            self._session.include(coll.name, expect=False)
        elif isinstance(obj, torch.Tensor):
            raise ConfigError(
                f"cannot add a tensor (shape {tuple(obj.shape)}) to collection {coll.name!r}: a plain tensor has "
                "no name the hook can follow from step to step. Save it each step with "
                f"hook.save_tensor('<name>', tensor, {coll.name!r}), or add the module that produces it "
                "(its outputs are saved) or a registered model's nn.Parameter")
        else:
            raise ConfigError(
                f"cannot add {describe_object(obj)} to collection {coll.name!r}: add tensor names or "
                "regexes (strings), a torch.nn.Module (its outputs; coll.add_module_tensors(module, inputs=True) "
                "for inputs too) or a registered model's nn.Parameter")

    # --- layer requests: coll.add_module_tensors(module, inputs, outputs) -------------------
    def _name_of(self, module: torch.nn.Module) -> str:
        known = self._module_names.get(id(module))
        if known is not None and known[0] is module:
            return known[1]
        name = model_name(module)
        self._module_names[id(module)] = (module, name)
        return name

    def _parent_of(self, module: torch.nn.Module) -> Optional[torch.nn.Module]:
        """The module of a registered model that holds ``module`` as a child, if any (looked up
        once per module and set of registered models)."""
        known = self._parents.get(id(module))
        if known is not None and known[0] == len(self._roots):
            return known[1]
        found = None
        for _, inner, _ in self._roots:
            for parent in inner.modules():
                if any(child is module for child in parent.children()):
                    found = parent
                    break
            if found is not None:
                break
        self._parents[id(module)] = (len(self._roots), found)
        return found

    def _resolve_layer_requests(self) -> None:
        """Turn ``add_module_tensors`` requests into name regexes of their collections."""
        manager = self._session.collection_manager
        if manager.version == self._resolved_layer_version:
            return
        for coll in list(manager):
            for module, inputs, outputs in coll.layer_requests:
                key = (coll.name, id(module), inputs, outputs)
                if key in self._resolved_layer_requests:
                    continue
                self._resolved_layer_requests.add(key)
                name = re.escape(self._name_of(module))
                if inputs:
                    coll.include(rf"^{name}_input_\d+$")
                if outputs:
                    coll.include(rf"^{name}_output_\d+$")
                # Asking for a module's tensors means wanting them saved.
                self._session.include(coll.name, expect=False)
        self._resolved_layer_version = manager.version

    # --- capture hooks, installed while steps save ----------------------------------------------
    def _sync_capture_hooks(self) -> None:
        """Install the hooks this step needs; keep them while consecutive steps need the same."""
        if not (self._session.saving_step and self._session.enabled):
            if self._capture_handles:
                self._remove_handles(self._capture_handles)
                self._capture_key = None
            return
        self._resolve_layer_requests()
        grads_by_hooks = self._session.mode in _TRAINING_MODES and not self.step_by_optimizer
        key = (self._session.plans.version, grads_by_hooks, len(self._module_names), len(self._params))
        if key == self._capture_key:
            return
        self._remove_handles(self._capture_handles)
        self._capture_key = key
        permanent = {id(outer) for outer, _, _ in self._roots} | {id(inner) for _, inner, _ in self._roots} \
            | {id(m) for m in self._losses}
        skipped = []
        for module_id, (module, name) in self._module_names.items():
            if module_id in permanent:
                continue
            want_inputs = self._session.plans.plan_for(f"{name}_input_0") is not None
            want_outputs = self._session.plans.plan_for(f"{name}_output_0") is not None
            if not (want_inputs or want_outputs):
                continue
            if module_id in self._compiled_module_ids:
                skipped.append(name)
                continue
            self._capture_handles.append(module.register_forward_hook(
                self._forward_hook(name, want_inputs, want_outputs)))
        if skipped and not self._warned_compiled:
            self._warned_compiled = True
            logger.warning(
                "smdebug: the model is compiled with torch.compile, so the inputs/outputs of its submodules (%s%s) "
                "cannot be captured: hooks inside a compiled graph are fixed when it is compiled and are not "
                "called for tensors that only exist inside the graph. Parameters, gradients, losses and the "
                "model's own inputs/outputs are saved. Register the uncompiled model to capture submodules.",
                ", ".join(skipped[:5]), ", ..." if len(skipped) > 5 else "")
        if grads_by_hooks:
            for name, param in self._params:
                if param.requires_grad and self._session.plans.plan_for(f"gradient/{name}") is not None:
                    self._capture_handles.append(param.register_post_accumulate_grad_hook(
                        functools.partial(_weak_method(self._on_grad_accumulated), f"gradient/{name}")))

    # --- torch callbacks (an error in one disables the hook, training goes on) --------------------
    def _on_root_forward_pre(self, module, args) -> None:
        if not self._session.enabled:
            # Disabled after an error: drop the hooks here, where torch is not iterating them.
            self._remove_handles(self._capture_handles)
            self._remove_handles(self._handles)
            if self._locator is not None:
                self._locator.remove()
                self._locator = None
            return
        if self.step_owner is not None:
            return  # steps, modes and stopping belong to the owner (own_steps)
        if self._session.stop_reason is not None:
            if self._session.step_open:
                self.end_step()
            raise TrainingStopRequested(f"smdebug stopped training: {self._session.stop_reason}")
        self._root_forward_pre(module)

    @never_raises("forward pre-hook")
    def _root_forward_pre(self, module) -> None:
        session = self._session
        mode = self._user_mode or (ModeKeys.TRAIN if module.training else ModeKeys.EVAL)
        if mode is not session.mode:
            session.set_mode(mode, by_user=False)  # module.training may change it back
        elif self.step_by_optimizer and mode in _TRAINING_MODES and session.step_open \
                and session.step_mode is mode and not self._optimizer_stepped:
            return  # the same optimizer step goes on (gradient accumulation, several forwards)
        self._optimizer_stepped = False
        self._fence_gradients(before_backward=True)
        self.begin_step()
        if self._sharded.due():
            if session.mode not in _TRAINING_MODES:  # no gradients, no optimizer step: all of it now
                self._sharded.capture(with_gradients=False)
            else:
                self._sharded.start_weights()
        if session.saving_step or self._capture_handles:
            self._sync_capture_hooks()
            if session.saving_step:
                # Weights are read on the pipeline's worker during this forward and backward;
                # in an optimizer step they are filed (and fenced) before optimizer.step().
                self._start_weights(file_now=not (self.step_by_optimizer and session.mode in _TRAINING_MODES))

    @never_raises("optimizer pre-step hook")
    def _on_optimizer_pre_step(self, optimizer, args, kwargs) -> None:
        session = self._session
        if not self._owns(optimizer):
            return
        if session.saving_step and session.step_open and session.step_mode in _TRAINING_MODES:
            self._optimizer_capture.before_step(optimizer, self._names_by_id)
        else:
            self._optimizer_capture.fence_state()
        if self.step_owner is not None:
            return
        if not self.step_by_optimizer:
            self.step_by_optimizer = True
            logger.debug("smdebug: %s updates the registered model; a TRAIN step is now one optimizer step",
                         type(optimizer).__name__)
            self._sync_capture_hooks()  # gradients are read here from now on
        if session.saving_step and session.step_open and session.step_mode in _TRAINING_MODES \
                and not self._optimizer_stepped:
            self._capture_parameters(with_gradients=True)
        else:
            self._fence_weights()
        if session.step_mode in _TRAINING_MODES and self._sharded.due():
            self._sharded.capture(with_gradients=True, before_update=True)

    @never_raises("optimizer post-step hook")
    def _on_optimizer_post_step(self, optimizer, args, kwargs) -> None:
        # The step is over; it is closed (written) when the next one begins, as without an
        # optimizer, so that save_scalar() calls after optimizer.step() land in this step.
        if not self._owns(optimizer):
            return
        session = self._session
        if session.saving_step and session.step_open and session.step_mode in _TRAINING_MODES:
            self._optimizer_capture.after_step(optimizer, self._names_by_id)
        if self._sharded.unfinished:  # every rank, saving or not: the step's sharded updates and state
            self._sharded.after_step(optimizer)
        if self.step_owner is None:
            self._optimizer_stepped = True

    def _owns(self, optimizer) -> bool:
        """Whether ``optimizer`` updates a parameter of a registered model (cached)."""
        groups = optimizer.param_groups
        known = self._optimizers.get(optimizer)
        if known is not None and known[0] == len(groups):
            return known[1]
        ours = any(id(p) in self._param_ids for group in groups for p in group["params"])
        self._optimizers[optimizer] = (len(groups), ours)
        if ours:
            self._install_zero_grad_fence(optimizer)
        return ours

    def _forward_hook(self, name: str, inputs: Optional[bool] = None, outputs: Optional[bool] = None,
                      flush: bool = False):
        """A forward hook recording ``name``'s inputs/outputs (None: whatever the plan asks for).

        ``flush``: the root module's hook, which ends the forward pass and copies the
        tensors its submodules produced (see :meth:`_offer`). The hook holds ``self``
        weakly (torch keeps it as long as the module lives) and runs eagerly, with a graph
        break, inside a torch.compile'd region. It is on the path of every captured module
        call: for the common case (one output tensor, known to stay unchanged until the
        forward ends) it only notes the tensor.
        """
        hook_ref = weakref.ref(self)
        key = f"{name}_output_"
        outputs_only = inputs is False and outputs is True and not flush

        def capture(module, args, output):
            hook = hook_ref()
            if hook is None or not hook._session.saving_step:
                return
            if outputs_only and type(output) is torch.Tensor and hook._deferrable.get(key) \
                    and not output.is_inference():  # inference tensors have no version counter
                hook._deferred.append((key, output, output._version))
            else:
                hook._on_module_forward(name, inputs, outputs, args, output, flush)

        captured_eagerly = _compiler_disable(capture)

        def on_forward(module, args, output):
            # Being traced by torch.compile (a model compiled after it was registered):
            # run eagerly, behind a graph break. Otherwise skip the compiler.disable
            # wrapper, which costs more than the capture itself.
            if _is_compiling():
                return captured_eagerly(module, args, output)
            return capture(module, args, output)

        return on_forward

    @never_raises("module forward hook")
    def _on_module_forward(self, name: str, want_inputs, want_outputs, inputs, outputs, flush: bool) -> None:
        if want_inputs or (want_inputs is None and self._session.plans.plan_for(f"{name}_input_0") is not None):
            self._offer(name + "_input_", inputs, defer=not flush)
        if want_outputs or (want_outputs is None and self._session.plans.plan_for(f"{name}_output_0") is not None):
            self._offer(name + "_output_", outputs, defer=not flush)
        if flush:
            self._copy_deferred()
            if self._weights_batch is not None and self._weights_batch[3]:
                self._fence_weights()  # no optimizer step to wait for: whatever updates them comes next

    def _offer(self, key: str, value, defer: bool = False) -> None:
        """Record the tensors of one module call (``key``: '<module>_output_' or '_input_').

        They are numbered on from the module's earlier calls in the step. With ``defer``,
        the tensors of a module whose tensors were left unchanged until the end of the
        forward pass when last observed are only noted, and copied together when the root
        module returns. Others are copied at once and, the first time, observed: if
        something changes them in place before the forward ends (``nn.ReLU(inplace=True)``
        after a Linear does), that module's tensors are always copied at once.
        """
        session = self._session
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

    def _copy_deferred(self) -> None:
        """The end of a forward pass: name the noted module tensors and copy them in one batch."""
        session = self._session
        if self._observed:
            changed = {key for key, tensor, version in self._observed if tensor._version != version}
            for key, _, _ in self._observed:
                self._deferrable[key] = key not in changed
            self._observed.clear()
        if not self._deferred:
            return
        deferred, self._deferred = self._deferred, []
        counts = self._tensor_counts
        keys, tensors, versions = zip(*deferred)  # C-level passes from here on (hundreds of tensors)
        names = self._deferred_names.get(keys) if not counts else None
        if names is not None and tuple(map(_VERSION, tensors)) == versions:
            counts.update(collections.Counter(keys))  # counts was empty: each key's calls in this forward
        else:
            names, tensors = self._name_deferred(deferred, keys)
        selection = session.plans.selection(names)
        session.inbox.record_batch(session.inbox.start_batch(selection, _pick(tensors, selection.indices), session.backend))

    def _name_deferred(self, deferred, keys: tuple) -> Tuple[tuple, list]:
        """Name the noted tensors of a forward, dropping those changed in place since their
        module returned them (with one warning each; that module is copied at once from now on)."""
        counts = self._tensor_counts
        cacheable = not counts
        names, tensors = [], []
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
                                   tname, self._session.global_step)
                continue
            names.append(tname)
            tensors.append(tensor)
        names = tuple(names)
        if cacheable:
            if len(self._deferred_names) > 64:
                self._deferred_names.clear()
            self._deferred_names[keys] = names
        return names, tensors

    def _on_grad_accumulated(self, name: str, param) -> None:
        if self._session.saving_step and self._session.enabled and param.grad is not None:
            self._session.inbox.record(name, param.grad, self._session.backend)

    def _start_weights(self, file_now: bool) -> None:
        """Hand this step's wanted parameters to the step pipeline (by reference).

        ``file_now``: file them into the step at once and fence them at the end of the
        forward pass (no known optimizer: whatever updates them comes after the forward).
        Otherwise they are fenced and filed before ``optimizer.step()``.
        """
        if self._params_captured:
            return
        self._params_captured = True
        selection = self._session.plans.selection(self._param_names)
        tensors = _pick(self._param_tensors, selection.indices)
        batch = self._session.inbox.start_batch(selection, tensors, self._session.backend)
        if batch is None:
            return
        self._weights_batch = (batch, tensors, list(map(_VERSION, tensors)), file_now)
        if file_now:
            self._session.inbox.record_batch(batch)

    def _fence_weights(self) -> None:
        """The weights handed over at the step's start are read; file them if not yet filed.

        Weights changed in place since then (by something other than the optimizer, which
        comes after this fence) are handed over again now, so the step keeps the values
        they have just before ``optimizer.step()``.
        """
        if self._weights_batch is None:
            return
        (batch, tensors, versions, filed), self._weights_batch = self._weights_batch, None
        batch.wait()
        if filed:
            return
        if list(map(_VERSION, tensors)) != versions:
            batch = self._session.inbox.start_batch(batch.selection, tensors, self._session.backend)
            batch.wait()
        self._session.inbox.record_batch(batch)

    def _capture_parameters(self, with_gradients: bool) -> None:
        """Before ``optimizer.step()``: fence and file the weights, hand over the gradients."""
        if not self._params_captured:
            self._start_weights(file_now=False)
        self._fence_weights()  # the optimizer changes them next
        if not with_gradients:
            return
        # C-level passes over the parameters (their Python loops cost the training thread
        # more than their work: docs/performance.md, "cold" code).
        params = self._param_tensors
        all_grads = list(map(_GRAD, params))
        if not _any_none(all_grads):
            names, held, grads = self._grad_names, params, all_grads
        else:
            having = [i for i, grad in enumerate(all_grads) if grad is not None]
            names = tuple(_pick(self._grad_names, having))
            held, grads = _pick(params, having), _pick(all_grads, having)
        selection = self._session.plans.selection(names)
        if not selection.plans:
            return
        held, grads = _pick(held, selection.indices), _pick(grads, selection.indices)
        self._session.discard(self._grads_held)  # last step's gradients, freed off this thread
        self._grads_batch = self._session.inbox.start_batch(selection, grads, self._session.backend)
        self._grads_held = (held, grads)
        self._session.inbox.record_batch(self._grads_batch)

    def _fence_gradients(self, before_backward: bool = False) -> None:
        """Wait until the last handed-over gradients were read, if they can change now.

        ``before_backward``: the next backward writes into a ``.grad`` that is still the
        tensor handed over (its gradients were not set to None), so wait; gradients set to
        None by ``zero_grad()`` are never written again and the worker may go on reading them
        while training goes on.
        """
        self._sharded.fence_gradients()  # sharded gradients' partials are read on the worker
        batch = self._grads_batch
        if batch is None:
            return
        if before_backward:
            held, grads = self._grads_held
            if not any(map(operator.is_, map(_GRAD, held), grads)):
                return
        self._session.discard(self._grads_held)
        self._grads_batch, self._grads_held = None, ([], [])
        batch.wait()

    def _install_zero_grad_fence(self, owner) -> None:
        """Make ``owner.zero_grad(set_to_none=False)`` (an optimizer's or a registered model's)
        wait for the handed-over gradients first: it zeroes them in place. The default,
        ``set_to_none=True``, only drops them and needs no wait. Undone at close."""
        if owner in self._zero_grad_fences or not callable(getattr(owner, "zero_grad", None)):
            return
        original = owner.zero_grad
        hook_ref = weakref.ref(self)

        @functools.wraps(original)
        def zero_grad(*args, **kwargs):
            hook = hook_ref()
            set_to_none = kwargs.get("set_to_none", args[0] if args else True)
            if hook is not None and not set_to_none:
                hook._fence_gradients()
            return original(*args, **kwargs)

        owner.zero_grad = zero_grad
        self._zero_grad_fences[owner] = zero_grad


def get_hook(json_config_path: Optional[str] = None, create_if_not_exists: bool = False) -> Optional[Hook]:
    """This process's PyTorch hook: the last one constructed, else (optionally) one from the JSON config.

    Returns None when ``USE_SMDEBUG`` disables smdebug or, with ``create_if_not_exists``,
    when there is no config file (``SMDEBUG_CONFIG_FILE_PATH``).
    """
    return _core_get_hook(Hook, json_config_path=json_config_path, create_if_not_exists=create_if_not_exists)


__all__ = ["Hook", "TrainingStopRequested", "get_hook"]
