"""SessionHook: smdebug for ``tf.compat.v1`` graph training with ``MonitoredSession``.

Pass it in ``hooks=[hook]`` of ``tf.compat.v1.train.MonitoredSession`` (or
``MonitoredTrainingSession``). Each ``session.run`` is one step, in the hook's mode
(``hook.set_mode``; GLOBAL until set). When the graph is complete (``begin()``), the hook
finds, without user code:

* ``weights`` / ``biases``: the trainable variables (a variable whose own name contains
  ``bias`` is a bias), named by their TensorFlow name (``dense/kernel:0``);
* ``optimizer_variables``: the other variables an optimizer's update ops read (slots such
  as Adam's ``m``/``v``) and the global step;
* ``gradients``: the gradient each dense update op (``ApplyAdam``,
  ``ResourceApplyGradientDescent``...) applies to a variable, named
  ``gradients/<variable name without :0>Grad``; ``hook.wrap_optimizer(opt)`` adds the
  gradients of ``opt.compute_gradients`` (needed for sparse updates);
* ``losses``: the tensors of the ``tf.GraphKeys.LOSSES`` collection;
* tensors and variables added with ``coll.add(...)``, and graph tensors whose name matches
  the regex of an included collection (``include_regex``, ``save_all``).

On a saved step, variables are read in a separate run just before the step's run (so
they are the values the step used, before its update); gradients and losses are fetched
with the step's own run. Nothing is fetched on other steps.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional

import tensorflow as tf

from smdebug.collections import CollectionKeys
from smdebug.exceptions import ConfigError
from smdebug.hook import takes_hook_arguments

from . import naming
from .base import TFHookBase, logger

K = CollectionKeys
_GRADIENT_ARGS = ("grad", "delta")


def _global_step(variables):
    """The graph's global step: the GLOBAL_STEP collection's, else an integer variable named
    ``global_step``. Not ``tf.compat.v1.train.get_global_step()``: it looks the name up as a
    tensor, and a resource variable's ``global_step:0`` is its handle, which it refuses
    (``tf.Variable(17, name="global_step")`` after ``disable_eager_execution()``)."""
    listed = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.GLOBAL_STEP)
    if listed:
        return listed[0]
    for var in variables:
        if var.op.name == "global_step" and var.dtype.base_dtype.is_integer:
            return var
    return None


@takes_hook_arguments
class SessionHook(TFHookBase, tf.compat.v1.train.SessionRunHook):
    """Saves tensors of ``tf.compat.v1`` graph training; pass it to ``MonitoredSession``."""

    def __init__(self, *args, **kwargs):
        self._fetches: Dict[str, object] = {}  # name -> graph tensor fetched with the step's run
        self._variables: Dict[str, object] = {}  # name -> variable read before the step's run
        self._extra_gradients: List[tuple] = []  # (gradient, variable) from wrapped optimizers
        self._graph = None
        TFHookBase.__init__(self, *args, **kwargs)

    # --- discovery ------------------------------------------------------------------
    def wrap_optimizer(self, optimizer):
        """Record the gradients a ``tf.compat.v1.train.Optimizer`` computes; returns it."""
        if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
            raise ConfigError(f"SessionHook.wrap_optimizer takes a tf.compat.v1.train.Optimizer, got "
                              f"{type(optimizer).__name__}; for Keras 3 optimizers use smd.KerasHook.wrap_optimizer")
        original = optimizer.compute_gradients
        extra = self._extra_gradients

        def compute_gradients(*args, **kwargs):
            pairs = original(*args, **kwargs)
            extra.extend((g, v) for g, v in pairs if g is not None)
            return pairs

        optimizer.compute_gradients = compute_gradients
        return optimizer

    def begin(self):
        """Called by MonitoredSession when the graph is complete: find what can be saved."""
        if not self.session.enabled:
            return
        with self.guard("SessionHook.begin"):
            self._discover(tf.compat.v1.get_default_graph())

    def _discover(self, graph) -> None:
        self._graph = graph
        with graph.as_default():
            trainable = tf.compat.v1.trainable_variables()
            all_vars = tf.compat.v1.global_variables()
            losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
            global_step = _global_step(all_vars)
        by_handle = {}
        for var in all_vars:
            for op_name in _variable_op_names(var):
                by_handle[op_name] = var
        trainable_ids = {id(v) for v in trainable}
        for var in trainable:
            self._add_variable(var, K.BIASES if naming.is_bias(var) else K.WEIGHTS)
        # Update ops: the gradient they apply, and the optimizer state they read.
        gradients = []
        for op in graph.get_operations():
            if "Apply" not in op.type or "Sparse" in op.type:
                continue
            var = _variable_of_input(op.inputs[0], by_handle) if op.inputs else None
            if var is None:
                continue
            grad = _gradient_input(op)
            if grad is not None:
                gradients.append((grad, var))
            for tensor in op.inputs[1:]:
                slot = _variable_of_input(tensor, by_handle)
                if slot is not None and id(slot) not in trainable_ids:
                    self._add_variable(slot, K.OPTIMIZER_VARIABLES)
        if global_step is not None:
            self._add_variable(global_step, K.OPTIMIZER_VARIABLES)
        for grad, var in gradients + self._extra_gradients:
            if isinstance(grad, tf.IndexedSlices):
                grad = grad.values if grad.dense_shape is None else tf.convert_to_tensor(grad)
            self._add_fetch(naming.gradient_name(var), grad, K.GRADIENTS)
        for loss in losses:
            self._add_fetch(loss.name, loss, K.LOSSES)
        for coll in list(self.session.collection_manager):
            for obj in coll.framework_objects:
                if isinstance(obj, tf.Variable):
                    self._add_variable(obj, coll.name)
                elif isinstance(obj, tf.Operation):
                    for out in obj.outputs:
                        self._add_fetch(out.name, out, coll.name)
                elif isinstance(obj, tf.Tensor):
                    self._add_fetch(obj.name, obj, coll.name)
        self._add_regex_matches(graph)
        logger.debug("SessionHook found %d variables and %d tensors to offer", len(self._variables),
                     len(self._fetches))

    def _add_variable(self, var, collection: Optional[str]) -> None:
        name = var.name
        if name in self._variables:
            return
        if collection is not None and name not in self.session.collection_manager.get(collection).tensor_names:
            self.session.collection_manager.get(collection).add_tensor_name(name)
        self._variables[name] = var

    def _add_fetch(self, name: str, tensor, collection: Optional[str]) -> None:
        if collection is not None and name not in self.session.collection_manager.get(collection).tensor_names:
            self.session.collection_manager.get(collection).add_tensor_name(name)
        self._fetches.setdefault(name, tensor)

    def _add_regex_matches(self, graph) -> None:
        """Graph tensors matching the regex of an included collection (include_regex, save_all)."""
        included = set(self.session.include_collections)
        # Only regexes the user added: the profile's own (e.g. gradients' "^gradient") describe
        # the names this hook gives, not graph tensors such as "gradients/MatMul_grad/...".
        patterns = []
        for c in self.session.collection_manager:
            user = [r for r in c.include_regex if r not in self.profile.regexes.get(c.name, ())]
            if c.name in included and user:
                patterns += [re.compile(r) for r in user]
        if not patterns:
            return
        for op in graph.get_operations():
            if op.type in ("Const", "VarHandleOp", "VariableV2", "Placeholder", "NoOp", "Assign", "AssignVariableOp"):
                continue
            for out in op.outputs:
                if out.dtype == tf.resource or out.dtype._is_ref_dtype or out.name in self._fetches:
                    continue
                if any(p.search(out.name) for p in patterns):
                    self._fetches[out.name] = out

    # --- steps ----------------------------------------------------------------------
    def before_run(self, run_context):
        if not self.session.enabled:
            return None
        with self.guard("SessionHook.before_run"):
            return self._before_run(run_context)
        return None

    def _before_run(self, run_context):
        if not self.begin_step():
            return None
        state = {name: var for name, var in self._variables.items() if self.session.plans.wants(name)}
        if state:
            for name, value in run_context.session.run(state).items():
                self.session.inbox.record(name, value)
        fetches = {name: t for name, t in self._fetches.items() if self.session.plans.wants(name)}
        return tf.compat.v1.train.SessionRunArgs(fetches) if fetches else None

    def after_run(self, run_context, run_values):
        if not self.session.enabled:
            return
        with self.guard("SessionHook.after_run"):
            results = run_values.results
            if isinstance(results, dict):
                for name, value in results.items():
                    self.session.inbox.record(name, value)
            self.end_step()

    def end(self, session):
        """End of the MonitoredSession: publish what was saved (``close()`` ends the run)."""
        if self.session.enabled:
            self.end_step()
            self.session.publish()


#: smdebug 1.0.34's name for this hook (its local example runs it with ``MonitoredSession``);
#: ``tf.estimator`` itself is gone from TensorFlow 2.16+.
EstimatorHook = SessionHook


def _variable_op_names(var) -> List[str]:
    names = []
    handle = getattr(var, "handle", None)
    if handle is not None and hasattr(handle, "op"):
        names.append(handle.op.name)
    op = getattr(var, "op", None)
    if op is not None:
        names.append(op.name)
    return names


def _variable_of_input(tensor, by_handle):
    op = tensor.op
    while op.type in ("Identity", "ReadVariableOp") and op.inputs:
        op = op.inputs[0].op
    return by_handle.get(op.name)


def _gradient_input(op):
    """The input of an update op that carries the gradient (named ``grad`` or ``delta``)."""
    try:
        args = op.op_def.input_arg
    except Exception:  # noqa: BLE001 - an op without a readable definition has no gradient input
        return None
    for index, arg in enumerate(args):
        if arg.name in _GRADIENT_ARGS and not arg.number_attr and not arg.type_list_attr:
            return op.inputs[index] if index < len(op.inputs) else None
    return None
