"""The on-disk format (docs/format.md), shared by the writer and the reader.

* ``layout``  - file and directory names of a run, step/worker parsing and validation;
* ``records`` - TFRecord framing and CRC32C (smdebug's constant footer vs. real CRCs);
* ``proto``   - the Event/Summary/TensorProto/HistogramProto messages, built at runtime;
* ``wire``    - a tensor record's byte layout: field numbers and keys, varints, the metadata
  field (the encoder and the reader's vectorized walk both go by it);
* ``codec``   - numpy array <-> serialized tensor ``Event``, with the dtype policy;
* ``index``   - building and validating index files.

Nothing here does I/O: functions take and return bytes.
"""
