"""Storage: the bytes of a run and the run directory they live in.

* ``format/`` - the on-disk format (docs/format.md), once: framing, messages, tensors, index;
* ``writer/`` - the background writer of a run's steps, and the TensorBoard writer;
* ``remote``, ``uploader``, ``upload_process`` - runs at URLs (fsspec), through a local spool;
* ``run_files``, ``siblings``, ``stop_request`` - the run-directory protocol that capture
  writes and analysis reads: per-worker files, the end marker, the stop-request file.

Capture writes through it and analysis reads through it; it imports neither.
"""
