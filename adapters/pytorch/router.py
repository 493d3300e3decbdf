"""Mixture-of-experts routing statistics: the ``router`` collection.

``hook.register_router(module, num_experts, top_k)`` names a module whose output is the
router's logits, ``[..., num_experts]`` (the first such tensor of a tuple output). At each
saved TRAIN or EVAL step, over all the module's calls in the step (gradient accumulation,
several forwards), the hook saves, under ``router/<module name>/``:

* ``expert_fraction``: ``[num_experts]``, the fraction of the step's token-to-expert
  assignments each expert received (the top ``top_k`` softmax probabilities of each token);
  they sum to 1;
* ``load_cv``: the coefficient of variation of the assignment counts over the experts
  (population std / mean): 0 when perfectly balanced;
* ``entropy``: the mean over tokens of the entropy of the router's softmax distribution, in
  nats (``log(num_experts)`` at most);
* ``dropped_fraction``: only when the module reports its capacity, the fraction of
  assignments beyond it (an expert takes at most ``capacity`` assignments per call, the
  rest are dropped). Capacity: ``expert_capacity`` (assignments per expert and call) or
  ``capacity_factor`` (``ceil(capacity_factor * tokens * top_k / num_experts)``), an
  attribute of the router module or of the module that holds it in a registered model.

Automatic detection (at ``register_module``): a submodule with integer ``num_experts`` and
``top_k`` attributes and a child ``gate`` that is an ``nn.Linear`` with ``num_experts``
outputs is a router block whose ``gate`` gives the logits (the convention of Hugging Face
Mixtral, Qwen2-MoE, OLMoE and of the tests' MoE). Other layouts (Megatron-LM, DeepSpeed MoE,
torchtitan) declare their router with ``register_router``. Detected routers are saved when
the ``router`` collection is included; ``register_router`` includes it.

Cost: on saving steps only, a softmax, a top-k and a scatter-add per call on the logits'
device, accumulated there; the statistics cross to the host with the step's other tensors
(no host sync of their own). A failure warns once and turns the router's capture off.
"""
from __future__ import annotations

import math
import weakref
from typing import Callable, Dict, Optional

import torch

from smdebug.exceptions import ConfigError
from smdebug.logger import get_logger

logger = get_logger("smdebug.pytorch")

ROUTER_PREFIX = "router/"
STATISTICS = ("expert_fraction", "load_cv", "entropy", "dropped_fraction")


def check_router_arguments(module, num_experts, top_k) -> None:
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"register_router expects the torch.nn.Module that outputs the router logits, "
                          f"got {type(module).__name__}")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 2:
        raise ConfigError(f"register_router: num_experts must be an int of at least 2 (the logits' last "
                          f"dimension), got {num_experts!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
        raise ConfigError(f"register_router: top_k must be an int from 1 to num_experts={num_experts} "
                          f"(experts each token is sent to), got {top_k!r}")


def declared_routers(model: torch.nn.Module):
    """``(gate module, num_experts, top_k)`` of the router blocks ``model`` declares (module docstring)."""
    for block in model.modules():
        experts, top_k, gate = getattr(block, "num_experts", None), getattr(block, "top_k", None), \
            getattr(block, "gate", None)
        if isinstance(experts, int) and isinstance(top_k, int) and isinstance(gate, torch.nn.Linear) \
                and gate.out_features == experts and 1 <= top_k <= experts:
            yield gate, experts, top_k


def _capacity(modules, assignments: int, num_experts: int) -> Optional[int]:
    for module in modules:
        capacity = getattr(module, "expert_capacity", None)
        if isinstance(capacity, int) and not isinstance(capacity, bool):
            return capacity
        factor = getattr(module, "capacity_factor", None)
        if isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 0:
            return math.ceil(factor * assignments / num_experts)
    return None


class _Router:
    __slots__ = ("module", "num_experts", "top_k", "counts", "entropy", "tokens", "dropped", "capacity_known")
    counts: Optional[torch.Tensor]  # None until the step's first call, as are the two below
    entropy: Optional[torch.Tensor]
    dropped: Optional[torch.Tensor]

    def __init__(self, module, num_experts: int, top_k: int):
        self.module = weakref.ref(module)
        self.num_experts, self.top_k = num_experts, top_k
        self.reset()

    def reset(self) -> None:
        self.counts = self.entropy = self.dropped = None
        self.tokens = 0
        self.capacity_known = True

    def add(self, logits: torch.Tensor, modules) -> None:
        """One call's logits, accumulated on their device (no host sync)."""
        flat = logits.detach().reshape(-1, self.num_experts).float()
        tokens = flat.shape[0]
        if tokens == 0:
            return
        log_p = torch.log_softmax(flat, dim=-1)
        entropy = -(log_p.exp() * log_p).sum()
        chosen = log_p.topk(self.top_k, dim=-1).indices.reshape(-1)
        counts = torch.zeros(self.num_experts, dtype=torch.float64, device=flat.device)
        counts.index_add_(0, chosen, torch.ones(chosen.shape, dtype=torch.float64, device=flat.device))
        capacity = _capacity(modules, tokens * self.top_k, self.num_experts)
        if capacity is None:
            self.capacity_known = False
        elif self.capacity_known:
            dropped = (counts - capacity).clamp_(min=0).sum()
            self.dropped = dropped if self.dropped is None else self.dropped + dropped
        self.counts = counts if self.counts is None else self.counts + counts
        entropy = entropy.double()
        self.entropy = entropy if self.entropy is None else self.entropy + entropy
        self.tokens += tokens

    def statistics(self) -> Dict[str, torch.Tensor]:
        counts, entropy = self.counts, self.entropy
        assert counts is not None and entropy is not None  # end() asks only a router that saw a call
        total = counts.sum()
        out = {"expert_fraction": counts / total, "load_cv": counts.std(unbiased=False) / counts.mean(),
               "entropy": entropy / self.tokens}
        if self.capacity_known and self.dropped is not None:
            out["dropped_fraction"] = self.dropped / total
        return out


class RouterCapture:
    """The routers of one hook (module docstring)."""

    def __init__(self, session, name_of: Callable[[torch.nn.Module], str],
                 parent_of: Callable[[torch.nn.Module], Optional[torch.nn.Module]]):
        self.session = session
        self._name_of, self._parent_of = name_of, parent_of
        self._routers: Dict[int, _Router] = {}
        self._failed = False

    def __bool__(self) -> bool:
        return bool(self._routers)

    def add(self, module: torch.nn.Module, num_experts: int, top_k: int) -> bool:
        """Watch ``module``; False if it already is (the first declaration stands)."""
        if id(module) in self._routers:
            return False
        self._routers[id(module)] = _Router(module, num_experts, top_k)
        return True

    def forward_hook(self):
        capture_ref = weakref.ref(self)

        def on_forward(module, args, output):
            capture = capture_ref()
            if capture is not None and not capture._failed and capture.session.saving_step:
                capture._on_forward(module, output)

        return on_forward

    def _fail(self, exc: Exception) -> None:
        self._failed = True
        logger.warning("smdebug: saving router statistics failed (%s: %s); they are off for the rest of the run, "
                       "the rest of the capture goes on", type(exc).__name__, exc)

    def _on_forward(self, module, output) -> None:
        router = self._routers.get(id(module))
        if router is None:
            return
        try:
            outputs = (output,) if isinstance(output, torch.Tensor) else tuple(output)
            logits = next((t for t in outputs if isinstance(t, torch.Tensor) and t.dim() >= 1
                           and t.shape[-1] == router.num_experts), None)
            if logits is None:
                raise ValueError(f"{self._name_of(module)} returned no tensor whose last dimension is "
                                 f"num_experts={router.num_experts} (the router logits)")
            parent = self._parent_of(module)
            with torch.no_grad():
                router.add(logits, (module,) if parent is None else (module, parent))
        except Exception as exc:  # noqa: BLE001 - router statistics off, training goes on
            self._fail(exc)

    def hand_over(self) -> None:
        """End of a step: record each router's statistics of the step, then start over."""
        session = self.session
        for router in self._routers.values():
            if router.counts is None or self._failed:
                router.reset()
                continue
            try:
                module = router.module()
                if module is not None and session.saving_step:
                    prefix = f"{ROUTER_PREFIX}{self._name_of(module)}/"
                    with torch.no_grad():
                        stats = router.statistics()
                    session.inbox.record_many([(prefix + k, v) for k, v in stats.items()], session.backend)
            except Exception as exc:  # noqa: BLE001 - router statistics off, training goes on
                self._fail(exc)
            router.reset()
