"""Run by the ORIGINAL smdebug 1.0.34's interpreter: what does its reader see in a run?

    $SMDEBUG_ORIGINAL_PYTHON tests/compat/original_dump_trial.py RUN_DIR OUT_JSON

Opens RUN_DIR with the original's ``create_trial`` and writes, as strict JSON (see
compat_json.py; no pickle): the steps of every mode, the mode and mode step of every
global step, the workers, the tensor names (all, per mode, per step, per collection),
the collections, and for every tensor, step and worker its value, shape and saved
reductions. Errors the reader raises are recorded in place of the value. It also reads
every event file with the original's low-level ``EventFileReader`` and its default
"minimal" record check, which requires the magic payload footer (docs/format.md 2.1).
"""
import os
import sys

import smdebug
from smdebug.core.modes import ModeKeys
from smdebug.core.tfevent.event_file_reader import EventFileReader, get_tensor_data
from smdebug.trials import create_trial

from compat_json import dumps, encode_array, encode_error, guarded

MODES = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT, ModeKeys.GLOBAL)


def _reductions(tensor, step, worker):
    saved = tensor.reduction_values(step, worker=worker)
    return {("abs_" if is_abs else "") + name: encode_array(v) for (name, is_abs), v in saved.items()}


def _tensor(tensor):
    steps = tensor.steps()
    entry = {"steps": {m.name: guarded(lambda m=m: tensor.steps(mode=m)) for m in MODES}, "at": {}}
    for g in steps:
        workers = sorted(tensor.workers(g))
        by_worker = {}
        for w in workers:
            by_worker[w] = {
                "value": guarded(lambda: encode_array(tensor.value(g, worker=w))),
                "shape": guarded(lambda: list(tensor.shape(g, worker=w))),
                "reductions": guarded(lambda: _reductions(tensor, g, w)),
            }
        entry["at"][str(g)] = {"workers": workers, "by_worker": by_worker}
    return entry


def _decode_problem(tensor_proto):
    """None if the original decodes the TensorProto, else the error it raises."""
    try:
        get_tensor_data(tensor_proto)
    except Exception as exc:  # noqa: BLE001
        return encode_error(exc)
    return None


def _event_files(run_dir):
    """Every event file read whole by the original's low-level reader, with its default check.

    Per record: [tag, event step, mode, mode step, decode error or None]. The records are
    framed and checked ("minimal": length CRC and magic payload footer) by the reader; a
    tensor the original cannot decode (its dtype) is reported per record, not per file.
    """
    out = {}
    events_dir = os.path.join(run_dir, "events")
    for root, _, files in os.walk(events_dir):
        for name in files:
            if not name.endswith(".tfevents"):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, run_dir).replace(os.sep, "/")
            reader = EventFileReader(fname=path)
            try:
                records = []
                for event in reader.read_events(check="minimal"):
                    for value in event.summary.value:
                        mode, mode_step = reader._get_mode_modestep(event.step, value.metadata.plugin_data)
                        problem = _decode_problem(value.tensor)
                        records.append([value.tag, int(event.step), mode.name, int(mode_step), problem])
                out[rel] = {"records": records}
            except Exception as exc:  # noqa: BLE001
                out[rel] = encode_error(exc)
    return out


def dump_trial(run_dir):
    """Everything the original reader reports about ``run_dir``, as a JSON-able dict."""
    trial = create_trial(run_dir)
    steps = trial.steps()
    doc = {
        "smdebug_version": smdebug.__version__,
        "workers": trial.workers(),
        "num_workers": trial.num_workers,
        "loaded_all_steps": bool(trial.loaded_all_steps),
        "steps": {m.name: trial.steps(mode=m) for m in MODES},
        "steps_incomplete_too": {m.name: trial.steps(mode=m, show_incomplete_steps=True) for m in MODES},
        "modes": sorted(m.name for m in trial.modes()),
        "mode_modestep": {str(g): [trial.mode(g).name, trial.mode_step(g)] for g in steps},
        "global_step": {
            m.name: {str(s): trial.global_step(m, s) for s in trial.steps(mode=m)} for m in MODES[:3]
        },
        "tensor_names": {
            m.name: guarded(lambda m=m: trial.tensor_names(mode=m)) for m in MODES
        },
        "tensor_names_by_step": {str(g): trial.tensor_names(step=g) for g in steps},
        "collections": {name: c.to_json_dict() for name, c in trial.collections().items()},
        "collection_tensor_names": {
            name: guarded(lambda name=name: trial.tensor_names(collection=name)) for name in trial.collections()
        },
        "tensors": {name: _tensor(trial.tensor(name)) for name in trial.tensor_names()},
        "event_files": _event_files(run_dir),
    }
    return doc


def main(argv):
    if len(argv) != 3:
        sys.exit(f"usage: {argv[0]} RUN_DIR OUT_JSON")
    doc = dump_trial(argv[1])
    with open(argv[2], "w") as fh:
        fh.write(dumps(doc))


if __name__ == "__main__":
    main(sys.argv)
