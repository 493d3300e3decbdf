"""Zero-code-change for MXNet Gluon: attach the JSON-configured hook to an unmodified script.

Gluon has no global "training started" event, so :func:`instrument` wraps three
construction-time methods, each called a handful of times per run (never per step):

* ``gluon.Block.collect_params`` (which ``Block.initialize`` calls) and
  ``gluon.Block.load_parameters`` remember (weakly) the blocks whose parameters a script sets
  up or hands to a Trainer (``net.collect_params().initialize()`` included): the network is
  one of them;
* ``gluon.loss.Loss.__init__`` remembers every loss block (weakly), and registers it with the
  process's hook if there is one already;
* ``gluon.Trainer.__init__`` takes the hook from :func:`smdebug.mxnet.get_hook` (creating
  it from ``SMDEBUG_CONFIG_FILE_PATH`` unless the script made one itself), registers, as the
  model, the remembered block that owns the most of the trainer's parameters (the largest on
  a tie: the whole network rather than a re-initialized head), and the remembered losses.

The hook is created at the Trainer, not earlier: a script written for 1.0.34 that calls
``Hook.create_from_json_file()`` itself (and then ``set_mode``) before building its Trainer
keeps that hook as the only one.

Without a config file (or with ``USE_SMDEBUG=0``) nothing is attached. A script that
registers its own block keeps it. :func:`uninstrument` restores the originals; both
functions are idempotent.
"""
from __future__ import annotations

import functools
import weakref

from smdebug.capture.instrumentation import Instrumentor, configured_hook
from smdebug.logger import get_logger

logger = get_logger("smdebug.mxnet")

_candidates: "weakref.WeakSet" = weakref.WeakSet()
_losses: "weakref.WeakSet" = weakref.WeakSet()


class MXNetInstrumentor(Instrumentor):
    """Wraps Gluon's construction methods so that the configured hook attaches itself."""

    framework = "MXNet"
    distribution = "mxnet"
    supported = ((1, 9), (2,))

    def install(self) -> None:
        from mxnet import gluon

        targets = (
            (gluon.Block, "load_parameters", _wrap_remember_block),
            (gluon.Block, "collect_params", _wrap_remember_block),
            (gluon.Trainer, "__init__", _wrap_trainer_init),
            (gluon.loss.Loss, "__init__", _wrap_loss_init),
        )
        for owner, attr, wrap in targets:
            if attr in vars(owner):
                self.patches.replace(owner, attr, wrap)

    def remove(self) -> None:
        _candidates.clear()  # hooks already attached stay
        _losses.clear()


INSTRUMENTOR = MXNetInstrumentor()
instrument, uninstrument, is_instrumented = \
    INSTRUMENTOR.instrument, INSTRUMENTOR.uninstrument, INSTRUMENTOR.is_instrumented


def _wrap_remember_block(original):
    @functools.wraps(original)
    def remember(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        _candidates.add(self)
        return result

    return remember


def _wrap_trainer_init(original):
    @functools.wraps(original)
    def trainer_init(self, params, *args, **kwargs):
        original(self, params, *args, **kwargs)
        hook = _current_hook()
        if hook is None:
            return
        try:
            for loss_block in list(_losses):
                hook.register_loss(loss_block)  # idempotent: a script's own registration stays
            if hook.model is not None:
                return
            model = _owner_of(params)
            if model is None:
                logger.warning("smdebug: could not find the network that owns this Trainer's parameters; call "
                               "hook.register_block(net) (hook: smdebug.mxnet.get_hook()) to save tensors")
                return
            hook.register_block(model)
        except Exception as exc:  # noqa: BLE001 - never stop training for the debugger's sake
            logger.warning("smdebug: could not attach to the network (%s: %s)", type(exc).__name__, exc)

    return trainer_init


def _wrap_loss_init(original):
    @functools.wraps(original)
    def loss_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        # Subclasses call Loss.__init__ before setting their own attributes; registering
        # only keeps a reference, it does not use them. No hook is created here (see above).
        _losses.add(self)
        hook = _existing_hook()
        if hook is not None:
            try:
                hook.register_loss(self)
            except Exception as exc:  # noqa: BLE001 - the loss is optional: the rest is still captured
                logger.warning("smdebug: could not attach to the loss block (%s: %s)", type(exc).__name__, exc)

    return loss_init


def _owner_of(params):
    """The remembered block owning most of ``params`` (largest on a tie), or None."""
    if hasattr(params, "values"):
        params = list(params.values())
    names = {p.name for p in params}
    best, best_key = None, (0, 0)
    for block in list(_candidates):
        owned = {p.name for p in block.collect_params().values()}
        key = (len(names & owned), len(owned))
        if key[0] and key > best_key:
            best, best_key = block, key
    return best


def _existing_hook():
    """The process's hook if one exists (made by the script or at a Trainer), never a new one."""
    from .hook import get_hook

    try:
        return get_hook()
    except Exception:  # noqa: BLE001 - never stop training for the debugger's sake
        return None


def _current_hook():
    """The hook to attach, or None (see smdebug.capture.instrumentation.configured_hook)."""
    from .hook import get_hook

    return configured_hook(get_hook, "MXNet")
