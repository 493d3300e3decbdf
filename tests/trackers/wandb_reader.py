"""An offline W&B run read back: its .wandb file's records, parsed by wandb's own protobuf
(``wandb.proto.wandb_internal_pb2.Record``). wandb 0.2x's Python reader of that file
(``wandb.sdk.internal.datastore``) moved into its Go core; its framing, a LevelDB log behind a
7-byte W&B header (``:W&B``, 0xBEE1, version 0), is read here; each record is wandb's."""
import glob
import json
import os
import struct
import time

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path, timeout=15.0):
    """The file's records, once wandb has finished writing it: wandb's own process may still
    be flushing after ``run.finish()`` on a loaded machine, so a file that ends inside a
    record, or is still growing, is read again (for at most ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        with open(path, "rb") as fh:
            data = fh.read()
        parsed, complete = _parse(data)
        time.sleep(0.2)
        if complete and os.path.getsize(path) == len(data) or time.monotonic() > deadline:
            return parsed


def _parse(data):
    """``(records, whether the data ends on a record boundary)``."""
    from wandb.proto import wandb_internal_pb2

    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), "not a .wandb file"
    pos, pending, out = 7, b"", []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if length == 0 and kind == 0:
            pos += left
            continue
        if pos + HEADER + length > len(data):
            return out, False  # the last record is still being written
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out, not pending


def history(wandb_dir):
    """The history rows of the one offline run under ``wandb_dir``: key -> decoded value."""
    (path,) = glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb"))
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({"/".join(item.nested_key) or item.key: json.loads(item.value_json)
                         for item in record.history.item})
    return rows, os.path.dirname(path)
