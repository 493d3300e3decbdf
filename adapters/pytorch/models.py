"""What a PyTorch hook was given to watch: its registered models, their parameters and the
names of their modules, shared by the step's participants (step_driver.py).

Filled by the hook's registration (``register_module``, ``register_loss``); read by the
participants on every step. Names follow the hook's module docstring: parameters
``<RootClass>_<dotted name>``, gradients ``gradient/<same name>``, module tensors
``<module path>_output_<i>`` (the root module and loss modules: their class name).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from .sharded import clean_path, fsdp_classes, model_name



def unwrap(module: torch.nn.Module) -> torch.nn.Module:
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


def is_compiled(module: torch.nn.Module) -> bool:
    """Whether calls to ``module`` run through torch.compile (wrapper or ``module.compile()``)."""
    return (isinstance(getattr(module, "_orig_mod", None), torch.nn.Module)
            or getattr(module, "_compiled_call_impl", None) is not None)


def tensor_leaves(value, out: List[torch.Tensor]) -> List[torch.Tensor]:
    """Tensors in a module's inputs/outputs, depth first (tuples, lists, dicts, ModelOutput)."""
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            tensor_leaves(item, out)
    elif isinstance(value, dict):
        for item in value.values():
            tensor_leaves(item, out)
    return out


class RegisteredModels:
    """The registered models, losses and plain (unsharded) parameters of one hook."""

    def __init__(self):
        #: (the module the user passed, the unwrapped model, its name), in registration order
        self.roots: List[Tuple[torch.nn.Module, torch.nn.Module, str]] = []
        self.params: List[Tuple[str, torch.nn.Parameter]] = []
        self.param_names: Tuple[str, ...] = ()  # of params, and their gradients': looked up as one
        self.param_tensors: List[torch.nn.Parameter] = []  # of params, for C-level passes
        self.grad_names: Tuple[str, ...] = ()
        self.param_ids: set = set()
        self.names_by_id: Dict[int, str] = {}  # id(parameter) -> its name
        self.module_names: Dict[int, Tuple[torch.nn.Module, str]] = {}  # id -> (module, tensor-name prefix)
        self.compiled_module_ids: set = set()  # submodules of compiled roots: their hooks are unreliable
        self.losses: List[torch.nn.Module] = []
        self._parents: Dict[int, tuple] = {}  # id(module) -> (registered models then, its parent)

    def is_root(self, module: torch.nn.Module) -> bool:
        return any(outer is module for outer, _, _ in self.roots)

    def is_loss(self, module: torch.nn.Module) -> bool:
        return any(m is module for m in self.losses)

    def add_root(self, module: torch.nn.Module) -> Tuple[torch.nn.Module, str]:
        """Take a model: name its modules (wrappers looked through); returns (inner, its name)."""
        inner = unwrap(module)
        root_name = model_name(inner)
        compiled = is_compiled(module) or is_compiled(inner)
        self.roots.append((module, inner, root_name))
        if module is not inner:
            self.module_names[id(module)] = (module, root_name)
        fsdp_v1, _ = fsdp_classes()
        for path, sub in inner.named_modules():
            if fsdp_v1 is not None and isinstance(sub, fsdp_v1):
                continue  # its wrapped module takes the name (the path without wrapper segments)
            self.module_names[id(sub)] = (sub, clean_path(path) or root_name)
            if compiled and sub is not inner:
                self.compiled_module_ids.add(id(sub))
        return inner, root_name

    def add_params(self, params: List[Tuple[str, torch.nn.Parameter]]) -> None:
        """Plain parameters of a model just taken (sharded ones are the sharded capture's)."""
        self.params.extend(params)
        self.param_names = tuple(name for name, _ in self.params)
        self.param_tensors = [param for _, param in self.params]
        self.names_by_id = {id(param): name for name, param in self.params}
        self.grad_names = tuple(f"gradient/{name}" for name in self.param_names)

    def add_loss(self, loss_module: torch.nn.Module) -> str:
        name = model_name(loss_module)
        self.losses.append(loss_module)
        self.module_names[id(loss_module)] = (loss_module, name)
        return name

    def param_named(self, obj) -> Optional[str]:
        return next((n for n, p in self.params if p is obj), None)

    def permanent_ids(self) -> set:
        """Modules whose hooks stay for the whole run (registered models and losses)."""
        return {id(outer) for outer, _, _ in self.roots} | {id(inner) for _, inner, _ in self.roots} \
            | {id(m) for m in self.losses}

    def name_of(self, module: torch.nn.Module) -> str:
        known = self.module_names.get(id(module))
        if known is not None and known[0] is module:
            return known[1]
        name = model_name(module)
        self.module_names[id(module)] = (module, name)
        return name

    def known(self, module: torch.nn.Module) -> bool:
        known = self.module_names.get(id(module))
        return known is not None and known[0] is module

    def parent_of(self, module: torch.nn.Module) -> Optional[torch.nn.Module]:
        """The module of a registered model that holds ``module`` as a child, if any (looked up
        once per module and set of registered models)."""
        known = self._parents.get(id(module))
        if known is not None and known[0] == len(self.roots):
            return known[1]
        found = None
        for _, inner, _ in self.roots:
            for parent in inner.modules():
                if any(child is module for child in parent.children()):
                    found = parent
                    break
            if found is not None:
                break
        self._parents[id(module)] = (len(self.roots), found)
        return found
