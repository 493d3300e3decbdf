"""Runs on S3, against moto's S3 server on loopback (started here, in a process of its own).

(a) **uploads**: a hook writes ``--steps`` saved steps to ``s3://``; prints the bytes the
    writer published into the spool, the bytes uploaded and stored, and the PUT requests
    per saved step (each object written once: bytes uploaded = bytes stored).
(b) **training overhead**: two hooks in one process, one with an ``s3://`` out_dir and one
    with a local one, each beside its own copy of a small numpy "training step"
    (``--work-ms`` of matrix products); the two loops run interleaved in blocks of
    ``--block`` steps, and the medians of the per-step times are compared with a third,
    unhooked copy. Both hooks close (and the S3 one finishes its upload) after the loop;
    that time is reported apart.
(c) **reading**: a 1,000-step run (``--read-steps``, ``--tensors`` tensors a step) is
    uploaded, then ``create_trial(url)`` + ``steps()`` + every tensor's ``values()``
    is timed in a fresh process. With ``--smdebug-python PATH`` (an interpreter with the
    original smdebug 1.0.34 and boto3), its S3 trial does the same and the ratio is printed.

    python benchmarks/bench_s3.py
    python benchmarks/bench_s3.py --only b --interval 10     # (b) saving every 10th step
    python benchmarks/bench_s3.py --only c --smdebug-python $(benchmarks/original_env.sh)

Moto (started in a process of its own) is a Python server, slower per request than S3 and
sharing this machine's cores with the benchmark: the figures are for comparing, not for sizing.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

_READ_OURS = r"""
import json, sys, time
from smdebug.trials import create_trial
t0 = time.perf_counter()
trial = create_trial(sys.argv[1], progress=False)
steps = trial.steps()
t_open = time.perf_counter() - t0
t0 = time.perf_counter()
count = 0
for name in trial.tensor_names():
    count += len(trial.tensor(name).values(progress=False))
t_read = time.perf_counter() - t0
s = trial.stats
print(json.dumps({"open_s": t_open, "read_s": t_read, "steps": len(steps), "values": count,
                  "list_requests": s["list_requests"], "get_requests": s["get_requests"]}))
"""

_READ_ORIGINAL = r"""
import json, sys, time
from smdebug.trials import create_trial
t0 = time.perf_counter()
trial = create_trial(sys.argv[1])
steps = trial.steps()
t_open = time.perf_counter() - t0
t0 = time.perf_counter()
count = 0
for name in trial.tensor_names():
    t = trial.tensor(name)
    count += len([t.value(s) for s in t.steps()])
t_read = time.perf_counter() - t0
print(json.dumps({"open_s": t_open, "read_s": t_read, "steps": len(steps), "values": count}))
"""


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_endpoint():
    """moto's S3 server in its own process (as S3 would be: not competing for this one's GIL)."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="testing",
                      AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    import boto3

    client = boto3.client("s3")
    deadline = time.monotonic() + 60
    while True:
        try:
            client.create_bucket(Bucket="bench")
            return server
        except Exception:  # not listening yet
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise
            time.sleep(0.2)


def _stored_bytes(prefix):
    import boto3

    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix=prefix)
    objs = [o for p in pages for o in p.get("Contents", ())]
    return sum(o["Size"] for o in objs), len(objs)


def _write_run(url, steps, tensors, size):
    import smdebug as smd

    hook = smd.Hook(out_dir=url, save_config=smd.SaveConfig(save_interval=1))
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(size).astype(np.float32) for _ in range(tensors)]
    for _ in range(steps):
        hook.begin_step()
        for i, a in enumerate(arrays):
            hook.save_tensor(f"t{i}", a, "weights")
        hook.end_step()
    uploader = hook.session.writer.uploader
    t0 = time.perf_counter()
    hook.close()
    return uploader.stats, time.perf_counter() - t0


def _cpu_seconds(pid):
    """User + system CPU seconds of process ``pid`` so far (Linux /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def bench_uploads(args, endpoint_pid=None):
    stats, close_s = _write_run("s3://bench/a", args.steps, args.tensors, args.size)
    stored, objects = _stored_bytes("a/")
    sent = stats["bytes"]
    print(f"(a) {args.steps} saved steps, {args.tensors} tensors of {args.size} float32: published "
          f"{stats['bytes_published']} B into the spool, uploaded {sent} B, stored {stored} B in {objects} "
          f"objects; not re-sent (collections rewritten at close) {stats['bytes_not_resent']} B; "
          f"PUT requests {stats['put_requests']} = {stats['put_requests'] / args.steps:.3f} per saved step; "
          f"failed attempts {stats['failed_attempts']}; close waited {close_s:.2f} s")
    assert sent == stored, "bytes uploaded differ from bytes stored"
    assert sent + stats["bytes_not_resent"] == stats["bytes_published"]
    # The uploader's own CPU in this process (request signing, HTTP, s3fs's event loop): a
    # local run's directory is a valid spool; smdebug-sync's code uploads it with nothing else running.
    import smdebug as smd
    from smdebug.storage.uploader import sync_spool

    spool = tempfile.mkdtemp(prefix="bench_s3_sync_")
    hook = smd.Hook(out_dir=os.path.join(spool, "run"), save_config=smd.SaveConfig(save_interval=1))
    for _ in range(args.steps):
        hook.begin_step()
        hook.save_tensor("t0", np.zeros(args.size, dtype=np.float32), "weights")
        hook.end_step()
    hook.close()
    objects = 2 * args.steps + 2
    server0 = _cpu_seconds(endpoint_pid) if endpoint_pid else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    assert sync_spool(os.path.join(spool, "run"), "s3://bench/a-sync")
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    server = _cpu_seconds(endpoint_pid) - server0 if server0 is not None else None
    print(f"(a) uploading {objects} objects alone: {wall:.2f} s, this process's CPU {cpu:.2f} s = "
          f"{cpu / objects * 1000:.2f} ms per PUT"
          + (f"; the endpoint's CPU {server / objects * 1000:.2f} ms per PUT" if server is not None else ""))


def bench_overhead(args, endpoint_pid=None):
    import smdebug as smd

    rng = np.random.default_rng(1)
    mats = {k: rng.standard_normal((args.dim, args.dim)) for k in ("none", "local", "s3")}
    weights = [rng.standard_normal(args.size).astype(np.float32) for _ in range(args.tensors)]
    tmp = tempfile.mkdtemp(prefix="bench_s3_local_")
    hooks = {
        "local": smd.Hook(out_dir=os.path.join(tmp, "run"), save_config=smd.SaveConfig(save_interval=args.interval)),
        "s3": smd.Hook(out_dir="s3://bench/b", save_config=smd.SaveConfig(save_interval=args.interval)),
    }
    # How many products make --work-ms of "training" (timed after a warm-up).
    for _ in range(50):
        mats["none"] @ mats["none"]
    t0 = time.perf_counter()
    for _ in range(50):
        mats["none"] @ mats["none"]
    reps = max(1, round(args.work_ms / ((time.perf_counter() - t0) / 50 * 1000)))
    times = {k: [] for k in mats}

    def step(kind):
        t0 = time.perf_counter()
        hook = hooks.get(kind)
        if hook is not None:
            hook.begin_step()
        m = mats[kind]
        for _ in range(reps):
            m @ m
        if hook is not None:
            for i, w in enumerate(weights):
                hook.save_tensor(f"t{i}", w, "weights")
            hook.end_step()
        times[kind].append(time.perf_counter() - t0)

    # Who else uses the cores while the s3 hook saves: the endpoint and the upload process.
    upload_proc = getattr(getattr(hooks["s3"]._session.writer, "uploader", None), "_proc", None)
    others = {"endpoint": endpoint_pid, "upload process": getattr(upload_proc, "pid", None)}
    cpu0 = {name: _cpu_seconds(pid) if pid else None for name, pid in others.items()}
    wall0 = time.perf_counter()
    kinds = ("none", "local", "s3")
    for block in range(args.blocks):
        # Each kind takes each place in the round in turn: what runs first after a switch pays for it.
        for kind in kinds[block % 3:] + kinds[:block % 3]:
            for _ in range(args.block):
                step(kind)
    loop_s = time.perf_counter() - wall0
    s3_steps = args.blocks * args.block
    used = {name: _cpu_seconds(pid) - cpu0[name] for name, pid in others.items()
            if pid and cpu0[name] is not None and _cpu_seconds(pid) is not None}
    closes = {}
    for kind, hook in hooks.items():
        t0 = time.perf_counter()
        hook.close()
        closes[kind] = time.perf_counter() - t0
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    mean = {k: statistics.fmean(v) * 1000 for k, v in times.items()}
    print(f"(b) {args.blocks}x{args.block} steps each, interleaved, {reps} products of {args.dim}x{args.dim} a step, "
          f"{args.tensors} tensors saved every {args.interval} step(s): median step ms none {med['none']:.3f}, local {med['local']:.3f}, "
          f"s3 {med['s3']:.3f}; s3/local {med['s3'] / med['local']:.3f}x, local/none {med['local'] / med['none']:.3f}x; "
          f"means (every step's cost, the saving ones included) s3/local {mean['s3'] / mean['local']:.3f}x, "
          f"local/none {mean['local'] / mean['none']:.3f}x; "
          f"close: local {closes['local']:.2f} s, s3 (waits for the upload) {closes['s3']:.2f} s")
    if used:
        print(f"    other processes' CPU during the loop ({loop_s:.1f} s, {os.cpu_count()} cores), per s3 step: "
              + ", ".join(f"{name} {cpu / s3_steps * 1000:.2f} ms" for name, cpu in used.items())
              + f" (the s3 step itself: {med['s3']:.2f} ms)")


def bench_read(args):
    url = "s3://bench/c"
    t0 = time.perf_counter()
    _write_run(url, args.read_steps, args.tensors, args.size)
    print(f"(c) wrote and uploaded {args.read_steps} steps in {time.perf_counter() - t0:.1f} s")
    env = dict(os.environ)
    done = subprocess.run([sys.executable, "-c", _READ_OURS, url], capture_output=True, text=True, env=env,
                          timeout=1800)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    ours = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"(c) ours: open + steps() {ours['open_s']:.2f} s, every tensor's values {ours['read_s']:.2f} s "
          f"({ours['values']} values, {ours['list_requests']} list and {ours['get_requests']} GET requests)")
    if args.smdebug_python:
        env_orig = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env_orig["SMDEBUG_TRAINING_END_DELAY_REFRESH"] = "0"
        env_orig["SMDEBUG_LOG_LEVEL"] = "error"
        done = subprocess.run([args.smdebug_python, "-c", _READ_ORIGINAL, url], capture_output=True, text=True,
                              env=env_orig, timeout=3600, cwd=tempfile.gettempdir())
        if done.returncode != 0:
            print("(c) original failed:", done.stderr[-2000:])
            return
        orig = json.loads(done.stdout.strip().splitlines()[-1])
        total_o, total = orig["open_s"] + orig["read_s"], ours["open_s"] + ours["read_s"]
        print(f"(c) original 1.0.34: open + steps() {orig['open_s']:.2f} s, values {orig['read_s']:.2f} s "
              f"({orig['values']} values); ours is {total_o / total:.1f}x faster in total")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["a", "b", "c"], action="append", help="run only these parts")
    parser.add_argument("--steps", type=int, default=200, help="(a) saved steps")
    parser.add_argument("--tensors", type=int, default=4, help="tensors saved a step")
    parser.add_argument("--size", type=int, default=256, help="float32 elements of each tensor")
    parser.add_argument("--work-ms", type=float, default=5.0, help="(b) compute a step, ms")
    parser.add_argument("--dim", type=int, default=96, help="(b) matrix size of the compute")
    parser.add_argument("--blocks", type=int, default=9, help="(b) blocks per loop")
    parser.add_argument("--interval", type=int, default=1, help="(b) save_interval of both hooks")
    parser.add_argument("--block", type=int, default=32, help="(b) steps per block")
    parser.add_argument("--read-steps", type=int, default=1000, help="(c) steps of the run read back")
    parser.add_argument("--smdebug-python", help="(c) interpreter with the original smdebug 1.0.34 and boto3")
    args = parser.parse_args()
    os.environ.setdefault("SMDEBUG_SPOOL_DIR", tempfile.mkdtemp(prefix="bench_s3_spool_"))
    server = start_endpoint()
    try:
        parts = args.only or ["a", "b", "c"]
        if "a" in parts:
            bench_uploads(args, server.pid)
        if "b" in parts:
            bench_overhead(args, server.pid)
        if "c" in parts:
            bench_read(args)
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
