"""Capture: the step session and what feeds it, on the training process's side.

An adapter drives the session through :mod:`.contract`; the session plans what to save
(:mod:`.plans`), reduces off the training thread (:mod:`.pipeline`), makes each step's
records (:mod:`.step_records`) and hands them to its step sinks (:mod:`.sinks`). It
writes through :mod:`smdebug.storage` and never imports :mod:`smdebug.analysis`.
"""
