"""Zero-code-change for PyTorch: find the model and the losses of an unmodified script.

:func:`instrument` (called by :mod:`smdebug.capture.zero_code_change` right after ``import
torch``) adds two global module hooks with public torch APIs
(``torch.nn.modules.module.register_module_forward_pre_hook`` /
``register_module_forward_hook``). They watch which module is called outside any other
module:

* the first such module that has parameters and is not a loss becomes the registered
  model (wrappers such as DistributedDataParallel are looked through for names);
  parameterless modules called on their own (torchvision v2 transforms, for example) are
  passed over;
* every ``torch.nn.modules.loss._Loss`` called that way becomes a registered loss.

The hook is created at that first forward pass, from the JSON config
(``smdebug.pytorch.get_hook(create_if_not_exists=True)``); the optimizer is found by the
hook's own ``optimizer.step()`` hooks. Once the model has started its second step, every
loss module of the first iteration has been seen and the global hooks are removed:
from then on only the registered model's and losses' own hooks run.

A hook whose steps a trainer integration owns (``Hook.own_steps``: the Lightning and
Transformers callbacks, added by their own instrumentors) is left to it: the global hooks
are removed at the first top-level forward that finds it.

Losses computed with functions (``F.cross_entropy``) rather than modules are not seen.
Nothing is done inside DataLoader worker processes (they only prepare data), and a
script that registered its model with a hook itself keeps that registration.
"""
from __future__ import annotations

import threading
from typing import Optional

import torch
from torch.nn.modules.loss import _Loss
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from smdebug.capture.instrumentation import Instrumentor, configured_hook
from smdebug.logger import get_logger

logger = get_logger("smdebug.pytorch")


class _State:
    def __init__(self):
        self.handles = []
        self.depth = threading.local()
        self.hook = None
        self.model: Optional[torch.nn.Module] = None
        self.gave_up = False


_state: Optional[_State] = None


class PyTorchInstrumentor(Instrumentor):
    """Global module hooks that find the model and the losses (no attribute is replaced)."""

    framework = "PyTorch"
    distribution = "torch"
    supported = ((2, 0), None)

    def is_instrumented(self) -> bool:
        return _state is not None

    def install(self) -> None:
        global _state
        _state = _State()
        _state.handles.append(register_module_forward_pre_hook(_on_forward_pre))
        _state.handles.append(register_module_forward_hook(_on_forward, always_call=True))

    def remove(self) -> None:
        """Remove the global hooks and close the hook created here (with its module hooks)."""
        global _state
        state, _state = _state, None
        if state is None:
            return
        _remove_global_hooks(state)
        if state.hook is not None:
            state.hook.close()


INSTRUMENTOR = PyTorchInstrumentor()
instrument, uninstrument, is_instrumented = \
    INSTRUMENTOR.instrument, INSTRUMENTOR.uninstrument, INSTRUMENTOR.is_instrumented


def current_hook():
    """The hook zero-code-change created, or None (not yet, disabled, or no config)."""
    return _state.hook if _state is not None else None


def _remove_global_hooks(state: _State) -> None:
    while state.handles:
        state.handles.pop().remove()


def _depth(state: _State) -> int:
    return getattr(state.depth, "value", 0)


@torch.compiler.disable
def _on_forward_pre(module, args) -> None:
    state = _state
    if state is None:
        return
    depth = _depth(state)
    state.depth.value = depth + 1
    if depth or state.gave_up:
        return
    try:
        _on_top_level_forward(state, module, args)
    except Exception as exc:  # noqa: BLE001 - never break the user's forward pass
        state.gave_up = True
        _remove_global_hooks(state)
        logger.warning("smdebug: zero-code-change stops instrumenting PyTorch: %s: %s", type(exc).__name__, exc)


@torch.compiler.disable
def _on_forward(module, args, output) -> None:
    state = _state
    if state is not None:
        state.depth.value = max(_depth(state) - 1, 0)


def _on_top_level_forward(state: _State, module: torch.nn.Module, args) -> None:
    if torch.utils.data.get_worker_info() is not None:  # a DataLoader worker: no model here
        state.gave_up = True
        _remove_global_hooks(state)
        return
    is_loss = isinstance(module, _Loss)
    if state.model is None and not is_loss and next(module.parameters(), None) is None:
        return  # a parameterless module called on its own (a transform): not the model
    if state.hook is None:
        from .hook import get_hook

        state.hook = configured_hook(get_hook, "PyTorch")
        if state.hook is None:  # USE_SMDEBUG=0, no config file or a bad one (warned): nothing to do, ever
            state.gave_up = True
            _remove_global_hooks(state)
            return
    hook = state.hook
    if hook.step_owner is not None:
        # A trainer integration (smdebug.lightning, smdebug.transformers) drives this hook
        # and registered its model: one hook, one set of steps. Stop watching.
        state.gave_up = True
        _remove_global_hooks(state)
        return
    if is_loss:
        hook.register_loss(module)
        return
    if state.model is None:
        if hook.registered_models:  # the script registered its model itself
            state.model = hook.registered_models[0]
            return
        state.model = module
        hook.register_module(module)
        # torch collected this call's pre-hooks before ours ran: start the step ourselves.
        hook._on_root_forward_pre(module, args)
        logger.info("smdebug: zero-code-change registered %s as the model", type(module).__name__)
    elif module is state.model and hook.global_step >= 1:
        # The first iteration is over: its loss modules are registered. Stop watching.
        _remove_global_hooks(state)
