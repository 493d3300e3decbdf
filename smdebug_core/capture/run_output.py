"""Where a session's run goes and what writes it: the local directory (or the spool of a URL
out_dir), the writer thread, its uploader, and the flight recorder that writes through it.

Apart from the session's step logic: this runs once, when the session is built.
"""
from __future__ import annotations

import os
from typing import List, Optional

from ..exceptions import ConfigError
from ..flight_recorder_config import FlightRecorder
from ..layouts import STORE_LAYOUT
from ..storage import remote
from ..storage.format.layout import MARKER_DIR
from ..storage.run_files import prepare_out_dir
from ..storage.stop_request import STOP_REQUEST_FILE
from .flight_recorder import Recorder

# Left by rules in a run directory; removed with the run on overwrite.
RUN_SIDE_FILES = ("rule_reports", "training_stop_reason.json", "early_stopping.json", STOP_REQUEST_FILE, MARKER_DIR)


def locate(arguments, out_url: Optional[str], out_dir: str, worker_name: str, writes_files: bool, is_chief: bool,
           siblings: List[str]):
    """``(out_dir, tensorboard_dir, export_tensorboard, remote_extra, prefix_check)``. For a URL
    out_dir (s3://, any fsspec URL; storage/remote.py) the run is written into a local spool
    directory, which becomes out_dir, and uploaded; ``remote_extra`` lists the other spooled
    folders (TensorBoard's); ``prefix_check``, the check for an earlier run at the URL,
    running meanwhile (:class:`~smdebug.storage.remote.PrefixCheck`; None for none)."""
    a = arguments
    tensorboard_dir, export_tensorboard = a.tensorboard_dir, a.export_tensorboard
    remote_extra: list = []
    prefix_check = None
    if out_url is not None and writes_files:
        # As for a local out_dir, only the chief checks for (and may remove) an earlier run.
        out_dir, tb_local, remote_extra, prefix_check = remote.start_remote_writer(
            out_url, worker_name, tensorboard_dir, export_tensorboard, a.overwrite, check=is_chief,
            siblings=siblings)
        tensorboard_dir, export_tensorboard = tb_local, False
    elif out_url is not None:  # writes nothing: no spool (out_dir names where one would be)
        out_dir = os.path.join(remote.default_spool_root(), "unwritten")
        tensorboard_dir, export_tensorboard = None, False
    elif tensorboard_dir is not None and remote.is_url(os.fspath(tensorboard_dir)):
        raise ConfigError(f"tensorboard_dir {tensorboard_dir!r} is a URL but out_dir {a.out_dir!r} is local; "
                          "give a local tensorboard_dir, or a URL out_dir (its spool uploads both)")
    return out_dir, tensorboard_dir, export_tensorboard, remote_extra, prefix_check


def open_writer(session, overwrite: bool, siblings: List[str], remote_extra: list,
                flight_recorder: Optional[FlightRecorder], prefix_check: Optional[remote.PrefixCheck] = None,
                layout: str = STORE_LAYOUT):
    """``(writer, recorder)`` of a session that writes files: the run directory prepared
    (an earlier run refused, or removed with ``overwrite``), the writer thread started with
    its uploader for a URL out_dir, and the flight recorder (None when not configured).
    ``prefix_check`` is settled while the upload process starts (OutDirError: the spool goes)."""
    s = session
    # As for a URL (remote.py), only the chief checks for (and may remove) an earlier run.
    prepare_out_dir(s.out_dir, check=s.is_chief and s.out_url is None, overwrite=overwrite,
                    siblings=siblings, world_size=s.world_size, side_files=RUN_SIDE_FILES)
    from ..storage.writer import RunWriter  # the writer thread starts only for hooks that write

    uploader = None
    if s.out_url is not None:
        from ..storage.upload_process import make_uploader

        # Several workers into one prefix: the chief's end marker waits for the others' uploads.
        multi = s.include_workers == "all" and s.world_size > 1
        others = ([f"worker_{r}" for r in range(s.world_size) if r != s.rank]
                  if multi and s.is_chief and s.worker_name == f"worker_{s.rank}" else [])
        try:
            uploader = make_uploader(s.out_dir, s.out_url, extra_dirs=remote_extra,
                                     worker=s.worker_name if multi else None, wait_for_workers=others,
                                     before_start=prefix_check.settle if prefix_check is not None else None)
        except Exception:
            import shutil

            shutil.rmtree(s.out_dir, ignore_errors=True)  # the spool, empty: this run never started
            raise
    writer = RunWriter(s.out_dir, s.worker_name, tensorboard_dir=s.tensorboard_dir, uploader=uploader,
                       run_layout=layout)
    recorder = None
    if flight_recorder is not None:
        recorder = Recorder(flight_recorder, s.worker_name, submit=lambda d: writer.submit(d, True),
                            write_file=writer.write_file)
    return writer, recorder
