"""The end-of-step read of a TensorFlow hook's capture sites (:mod:`.capture`): one cached
concrete function per configuration reads the armed stashes and counters and the tracked
tensors, and computes every reduction in the graph (:func:`.backend.reduction_matrix`)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from .backend import ReducedValue, compute_dtype, flat_caller, reducible, reduction_matrix, union_keys


class StepReader:
    """The end-of-step reads of one configuration (armed stashes, tracked tensors, plans).

    A concrete function takes the ``extra`` tensors, reads every counter and stash
    variable, and returns the counters and the reductions packed in one float64 vector,
    and the tensors the step needs whole (raw values; a tensor whose shape is only known
    at run time, reduced later by the backend). Calling it returns ``(counts, values)``:
    per variant its counter; per tensor (``extra`` then stashes) a ReducedValue, an eager
    tensor, or None when it is not saved.
    """

    def __init__(self, variants, extra, needs):
        self.needs = list(needs)
        specs = [(t.shape, t.dtype) for t in extra]
        for v in variants:
            specs += [(var.shape, var.dtype) for var in v.stash]
        self._n_counts = len(variants)
        # Per tensor: (reduction keys or None, whether the tensor is returned).
        self._layout = []
        reduced = []
        for index, (need, (shape, dtype)) in enumerate(zip(needs, specs)):
            if need is None:
                self._layout.append(None)
                continue
            keys, whole = need
            static = tuple(int(d) for d in shape) if shape.is_fully_defined() else None
            if keys and reducible(static, dtype):
                reduced.append(index)
                self._layout.append((keys, whole, static))
            else:  # the backend reduces it (if it can), as any recorded tensor
                self._layout.append((None, True, static))
        self._keys = union_keys(self._layout[i][0] for i in reduced)
        self._columns = {index: column for column, index in enumerate(reduced)}
        self._rows = {keys: [self._keys.index(k) for k in keys] for keys, _, _ in
                      (self._layout[i] for i in reduced)}
        returned = [i for i, entry in enumerate(self._layout) if entry is not None and entry[1]]
        self._returned = {index: position for position, index in enumerate(returned)}
        stash = [var for v in variants for var in v.stash]
        copies = [v.copies for v in variants]
        # Bound under its own name: the plan loop below rebinds ``keys`` before ``read`` is traced.
        n_extra, all_keys = len(extra), self._keys
        sizes = [int(np.prod(specs[i][0], dtype=np.int64)) for i in reduced]
        compute = compute_dtype(specs[i][1] for i in reduced)

        def read(tensors):
            values = list(tensors) + [var.read_value() for var in stash]
            packed = []
            if reduced:
                matrix = reduction_matrix([values[i] for i in reduced], sizes, all_keys, compute)
                packed.append(tf.reshape(matrix, [-1]))
            if copies:
                packed.append(tf.cast(tf.stack([c.read_value() for c in copies]), tf.float64))
            vector = tf.concat(packed, 0) if len(packed) > 1 else packed[0] if packed else tf.zeros([0], tf.float64)
            return [vector] + [values[i] for i in returned]

        # Per tensor, what __call__ does with the outputs: (output position or 0, column in
        # the reductions or None, rows of its keys or None for all of them, keys, shape).
        self._plan = []
        for index, entry in enumerate(self._layout):
            if entry is None:
                self._plan.append(None)
                continue
            keys, whole, static = entry
            position = 1 + self._returned[index] if whole else 0
            if keys is None:
                self._plan.append((position, None, None, None, static))
            else:
                rows = self._rows[keys]
                rows = None if rows == list(range(len(self._keys))) else np.asarray(rows)
                self._plan.append((position, self._columns[index], rows, keys, static))
        signature = [tf.TensorSpec(shape, dtype) for shape, dtype in specs[:n_extra]]
        self._call = flat_caller(tf.function(read, autograph=False).get_concrete_function(signature))

    def __call__(self, extra):
        outputs = self._call(extra)
        vector = outputs[0].numpy()  # the one transfer of the step's reductions and counters
        n_keys, n_reduced = len(self._keys), len(self._columns)
        columns = vector[:n_keys * n_reduced].reshape(n_keys, n_reduced).T  # one row per reduced tensor
        counts = vector[n_keys * n_reduced:].astype(np.int64).tolist()
        values = []
        for entry in self._plan:
            if entry is None:
                values.append(None)
                continue
            position, column, rows, keys, static = entry
            tensor = outputs[position] if position else None
            if column is None:
                values.append(tensor)
            else:
                got = columns[column] if rows is None else columns[column][rows]
                values.append(ReducedValue(tensor, static, dict(zip(keys, got))))
        return counts, values
