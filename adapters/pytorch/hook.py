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

A step is written whole or not at all: one cut short (Ctrl-C during its forward, backward or
optimizer step) is dropped at close (step_driver.py). The hook keeps registration and the
adapter callbacks; its step driver (step_driver.py) owns the step boundaries and calls the
participants that capture (module_capture.py, parameter_capture.py, optimizer_capture.py,
sharded_capture.py, router.py, nonfinite.py) at each step point.
"""
from __future__ import annotations

import functools
import os
import re
import sys
import warnings
import weakref
from typing import Optional, Tuple

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

from .backend import TorchBackend
from .models import RegisteredModels
from .participant import eager_forward_hook, remove_handles, weak_method
from .router import check_router_arguments, declared_routers
from .step_driver import TorchStepDriver

logger = get_logger("smdebug.pytorch")


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
        self._models = RegisteredModels()
        self._driver: Optional[TorchStepDriver] = None
        self._handles: list = []  # permanent: root pre-hooks, root/loss forward hooks, optimizer hooks
        self._optimizer_hooks_installed = False
        self._pending_params: list = []  # (collection name, parameter) added before their model
        super().__init__(*args, **kwargs)
        self._driver = driver = TorchStepDriver(self.session, self._models)
        # Sharded parameters (FSDP2/DTensor, FSDP v1 use_orig_params): reduced from their shards
        # with a fixed number of collectives per saved step (sharded_capture.py), apart from the plain ones.
        self._sharded = driver.sharded.capture

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

    def on_step_begin(self, saving: bool) -> None:
        if self._driver is not None:
            self._driver.begin(saving)

    def on_step_end(self) -> None:
        """What the step still holds: module tensors noted outside a registered model's
        forward, the flight recorder's probe, sharded statistics, an owned step's weights."""
        if self._driver is not None:
            self._driver.end()

    def on_step_failed(self) -> None:
        """No sharded collectives the other ranks may not reach; the failed step keeps the
        weights its forward used, for the flight recorder."""
        if self._driver is not None:
            self._driver.failed()

    def on_mode_change(self, mode) -> None:
        """A mode the user set overrides ``module.training`` from now on."""
        if self._driver is not None:
            self._driver.user_mode = mode

    def on_close(self) -> None:
        """The run's files are finished: remove every torch hook."""
        if not self._models.roots and self.session.global_step < 0 and self.step_owner is None \
                and not self.dry_run:
            # Steps begin at a registered module's forward: without one, nothing ran or was saved.
            logger.warning("smdebug: this PyTorch hook saved nothing: no module was registered and no step began. "
                           "Call hook.register_module(model) (and hook.register_loss(loss_fn)) before training, "
                           "or drive steps yourself with hook.begin_step() and hook.save_tensor(...)")
        self._detach()

    def _detach(self) -> None:
        remove_handles(self._handles)
        if self._driver is not None:
            self._driver.close()

    def close(self) -> None:
        """Write the last step (unless it was cut short: see step_driver.py), the collections
        file and the end-of-training marker."""
        if self._driver is not None:
            self._driver.drop_incomplete_step()
        super().close()

    @property
    def _step_driver(self) -> TorchStepDriver:
        """The step driver: None only while the base class builds the session, whose callbacks
        check for it; everything else runs once the hook is built."""
        assert self._driver is not None
        return self._driver

    # --- the step driver's state, as the hook showed it ---------------------------------------------
    @property
    def step_by_optimizer(self) -> bool:
        """Whether a TRAIN step is one optimizer step (an optimizer of the registered model is known)."""
        return self._step_driver.by_optimizer

    @property
    def step_owner(self) -> Optional[str]:
        """The integration (a trainer callback) that owns the step boundaries, see own_steps()."""
        return self._driver.owner if self._driver is not None else None

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
        self._step_driver.own_steps(owner)

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
        self._step_driver.capture_parameters(optimizer, wait_for_gradients)

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
        models, driver = self._models, self._step_driver
        if models.is_root(module):
            return
        inner, root_name = models.add_root(module)
        models.add_params(self._sharded.add_model(module, inner, root_name, models.param_ids))
        if self._pending_params:
            pending, self._pending_params = self._pending_params, []
            for coll_name, param in pending:
                self.collection_object(self.get_collection(coll_name), param)
        driver.parameters.install_zero_grad_fence(module)
        self._handles.append(module.register_forward_pre_hook(weak_method(self._on_root_forward_pre)))
        self._handles.append(module.register_forward_hook(self._root_forward_hook(root_name)))
        if driver.locator.locator is not None:
            self._install_locator(module, inner, root_name)
        self._install_optimizer_hooks()
        for gate, num_experts, top_k in declared_routers(inner):  # saved when "router" is included
            self._add_router(gate, num_experts, top_k)
        driver.modules.resolve_layer_requests()
        driver.sync_hooks()

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
        self.session.include(CollectionKeys.ROUTER, expect=False)

    def _add_router(self, module: torch.nn.Module, num_experts: int, top_k: int) -> None:
        routers = self._step_driver.routers.capture
        if routers.add(module, num_experts, top_k):
            self._handles.append(module.register_forward_hook(routers.forward_hook()))

    def _install_locator(self, outer: torch.nn.Module, inner: torch.nn.Module, root_name: str) -> None:
        """The flight recorder's notes on every module of a registered model, and a root hook
        that torch calls even when the forward raises (``always_call``)."""
        modules = [(path or root_name, sub) for path, sub in inner.named_modules()
                   if id(sub) not in self._models.compiled_module_ids]
        locator = self._step_driver.locator.locator
        assert locator is not None  # register_module installs it only with a flight recorder
        locator.install(root_name, modules)
        self._handles.append(outer.register_forward_hook(
            functools.partial(weak_method(self._on_root_forward_exit), root_name), always_call=True))

    def _on_root_forward_exit(self, root_name: str, module, args, output) -> None:
        """After every forward of a registered model; when the forward raised, torch calls it
        with no output from inside its ``except``: the flight recorder writes its steps."""
        if output is not None or self.session.recorder is None:
            return
        exc = sys.exc_info()[1]
        if isinstance(exc, Exception) and not isinstance(exc, TrainingStopRequested):
            self.dump_flight_recorder(f"{type(exc).__name__} in the forward of {root_name}: {exc}",
                                      trigger="exception")

    @property
    def registered_models(self) -> Tuple[torch.nn.Module, ...]:
        """The modules passed to ``register_module``, in order."""
        return tuple(outer for outer, _, _ in self._models.roots)

    def is_registered(self, module: torch.nn.Module) -> bool:
        """Whether ``module`` was passed to ``register_module`` or ``register_loss``."""
        return self._models.is_root(module) or self._models.is_loss(module)

    def register_loss(self, loss_module: torch.nn.Module) -> None:
        """Capture a loss module's output as ``<LossClass>_output_0`` (the ``losses`` collection).

        Any module computing a loss will do; its class name names the tensor.
        """
        if not isinstance(loss_module, torch.nn.Module):
            raise ConfigError(f"register_loss expects a torch.nn.Module, got {type(loss_module).__name__}")
        if self._models.is_loss(loss_module):
            return
        name = self._models.add_loss(loss_module)
        losses = self.get_collection(CollectionKeys.LOSSES)
        if not losses.matches(f"{name}_output_0"):  # a custom loss class without "Loss" in its name
            losses.include(rf"^{re.escape(name)}_output_\d+$")
        self._handles.append(loss_module.register_forward_hook(self._step_driver.modules.forward_hook(name)))
        if self._step_driver.budget.check is not None:  # with an overhead budget, checked for NaN/Inf every step
            self._handles.append(loss_module.register_forward_hook(self._step_driver.budget.loss_hook(name)))
        locator = self._step_driver.locator.locator
        if locator is not None:  # a loss that turns NaN (log of 0) is a module too
            locator.install(name, [(name, loss_module)])

    def register_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Count TRAIN steps by this optimizer's steps from now on (gradient accumulation).

        Optional: an optimizer that updates the registered model is recognised at its
        first ``step()``. Register it explicitly when accumulating gradients, so that the
        micro-batches before the first ``optimizer.step()`` also form one step.
        """
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"register_optimizer expects a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self._step_driver.register_optimizer(optimizer)
        self._install_optimizer_hooks()

    def _install_optimizer_hooks(self) -> None:
        if self._optimizer_hooks_installed:
            return
        self._optimizer_hooks_installed = True
        driver = self._step_driver
        self._handles.append(register_optimizer_step_pre_hook(weak_method(driver.optimizer_pre_step)))
        self._handles.append(register_optimizer_step_post_hook(weak_method(driver.optimizer_post_step)))

    # --- the torch callbacks of a registered model (the step driver decides what they mean) -----
    def _on_root_forward_pre(self, module, args) -> None:
        if not self.session.enabled:
            self._detach()  # disabled after an error: drop the hooks here, where torch is not iterating them
            return
        self._step_driver.forward_pre(module)

    def _root_forward_hook(self, root_name: str):
        """The end of a registered model's forward (held weakly: torch keeps it as long as the
        module lives)."""
        driver_ref = weakref.ref(self._step_driver)

        def capture(module, args, output):
            driver = driver_ref()
            if driver is not None:
                driver.forward_returned(root_name, args, output)

        return eager_forward_hook(capture)

    # --- torch objects in collections: coll.add(obj), hook.add_to_collection(name, obj) ------
    def collection_object(self, coll, obj) -> None:
        """Resolve a torch object added to a collection, which then becomes included.

        A module saves its outputs (``add_module_tensors``'s default); a parameter of a
        registered model (or one registered later) saves under its parameter name. A plain
        tensor has no name the hook could follow from step to step: ConfigError.
        """
        if isinstance(obj, torch.nn.Module):
            coll.add_module_tensors(obj)
            if self._models.known(obj):
                self._step_driver.modules.resolve_layer_requests()
            # else: named when a model holding it is registered (or, failing that, by its class at the first step)
        elif isinstance(obj, torch.nn.Parameter):
            name = self._models.param_named(obj) or self._sharded.param_named(obj)
            if name is None:
                self._pending_params.append((coll.name, obj))
            else:
                coll.add_tensor_name(name)
            self.session.include(coll.name, expect=False)
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


def get_hook(json_config_path: Optional[str] = None, create_if_not_exists: bool = False) -> Optional[Hook]:
    """This process's PyTorch hook: the last one constructed, else (optionally) one from the JSON config.

    Returns None when ``USE_SMDEBUG`` disables smdebug or, with ``create_if_not_exists``,
    when there is no config file (``SMDEBUG_CONFIG_FILE_PATH``).
    """
    return _core_get_hook(Hook, json_config_path=json_config_path, create_if_not_exists=create_if_not_exists)


__all__ = ["Hook", "TrainingStopRequested", "get_hook"]
