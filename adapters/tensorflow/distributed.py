"""Who this process is in a TensorFlow job: rank, world size and worker name (docs/format.md 1.2).

* Horovod (``horovod.tensorflow`` initialized): ``worker_<rank>``.
* Parameter-server / multi-worker jobs described by ``TF_CONFIG``: ``<task type>_<index>``
  (``chief_0``, ``worker_1``); the chief is the ``chief`` task, or ``worker`` 0 without one.
* ``tf.distribute.MirroredStrategy`` (one process, several devices): the worker is named
  after the device, serialized (``/`` -> ``_``, ``:`` -> ``-``). The hook saves the first
  replica's values (``include_workers="one"``), named after the lexically first device.
* Otherwise: ``worker_0`` of 1.

Nothing here imports TensorFlow: an already-imported Horovod is asked, and a strategy is
only looked at when one is handed in.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Optional

from smdebug.capture.contract import Worker
from smdebug.exceptions import ConfigError
from smdebug.storage.format.layout import serialize_worker_name

#: Task types that train (and write); ``ps`` and ``evaluator`` tasks do not count as workers.
_TRAINING_TASKS = ("chief", "worker")


def from_environment() -> Worker:
    """The identity from Horovod or ``TF_CONFIG``; ``worker_0`` of 1 when neither applies."""
    identity = _horovod_identity()
    if identity is not None:
        return identity
    identity = _tf_config_identity(os.environ.get("TF_CONFIG"))
    if identity is not None:
        return identity
    return Worker(0, 1, "worker_0")


def _horovod_identity() -> Optional[Worker]:
    for module_name in ("horovod.tensorflow", "horovod.tensorflow.keras"):
        hvd = sys.modules.get(module_name)
        if hvd is None:
            continue
        try:
            if hvd.is_initialized():
                rank, size = int(hvd.rank()), int(hvd.size())
                return Worker(rank, size, f"worker_{rank}")
        except Exception:  # noqa: BLE001 - a half-initialized Horovod is "no Horovod"
            return None
    return None


def _tf_config_identity(raw: Optional[str]) -> Optional[Worker]:
    """Parse ``TF_CONFIG``; None when it is unset or names no cluster."""
    if not raw or not raw.strip():
        return None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"environment variable TF_CONFIG is not valid JSON: {exc}") from None
    cluster = doc.get("cluster") if isinstance(doc, dict) else None
    task = doc.get("task") if isinstance(doc, dict) else None
    if not cluster or not isinstance(cluster, dict) or not isinstance(task, dict):
        return None
    task_type, index = task.get("type"), task.get("index", 0)
    if not isinstance(task_type, str) or not isinstance(index, int):
        raise ConfigError(f"TF_CONFIG task must have a string 'type' and an integer 'index', got {task!r}")
    ordered = [(t, i) for t in _TRAINING_TASKS for i in range(len(cluster.get(t) or []))]
    world_size = max(len(ordered), 1)
    rank = ordered.index((task_type, index)) if (task_type, index) in ordered else world_size
    return Worker(rank, world_size, f"{task_type}_{index}")


def mirrored_devices(strategy) -> Optional[list]:
    """The devices of a single-process multi-device strategy (MirroredStrategy), else None."""
    if strategy is None:
        return None
    if "Mirrored" not in type(strategy).__name__:
        return None
    try:
        devices = list(strategy.extended.worker_devices)
    except Exception:  # noqa: BLE001 - devices unreadable: treated as one worker
        return None
    return devices if len(devices) > 1 else None


def mirrored_identity(strategy) -> Optional[Worker]:
    """Identity for a MirroredStrategy: the lexically first device is the chief (docs/format.md 1.2)."""
    devices = mirrored_devices(strategy)
    if not devices:
        return None
    first = sorted(devices)[0]
    return Worker(0, len(devices), serialize_worker_name(first))
