"""The step pipeline (smdebug_core/capture/pipeline.py): one worker thread, jobs in order, fences,
failures kept off the training thread, and references dropped on the worker."""
import threading
import time
import weakref

from smdebug.capture.pipeline import StepPipeline


class Payload:
    """Stands for a tensor: records which thread freed it."""

    def __init__(self, freed_on: list):
        weakref.finalize(self, lambda: freed_on.append(threading.current_thread().name))


def test_jobs_run_in_order_on_one_worker_and_tickets_fence_them():
    pipeline, seen = StepPipeline(name="test-steps"), []
    tickets = [pipeline.submit("job", lambda i=i: (time.sleep(0.002), seen.append((i, threading.current_thread().name)))[1])
               for i in range(10)]
    tickets[-1].wait(10)
    assert [i for i, _ in seen] == list(range(10)) and {name for _, name in seen} == {"test-steps"}
    assert all(t.done for t in tickets)  # the last one fences every job before it
    assert pipeline.close(10)


def test_a_failing_job_is_reported_and_the_next_ones_run():
    errors = []
    pipeline = StepPipeline(on_error=lambda what, exc: errors.append((what, str(exc))))

    def boom():
        raise ValueError("bad tensor")

    failed = pipeline.submit("reducing a batch", boom)
    after = pipeline.submit("next", lambda: 42)
    assert after.wait(10) == 42 and failed.wait(10) is None and isinstance(failed.error, ValueError)
    assert errors == [("reducing a batch", "bad tensor")]
    assert pipeline.close(10)


def test_discarded_references_are_dropped_by_the_worker_not_the_caller():
    pipeline, freed_on = StepPipeline(name="test-steps"), []
    pipeline.submit("start the worker", lambda: None).wait(10)
    held = [Payload(freed_on) for _ in range(3)]
    pipeline.discard(held)
    del held  # the caller's last reference goes; the pipeline still holds them
    assert freed_on == []
    pipeline.submit("a later job", lambda: None).wait(10)
    pipeline.drain(10)
    assert freed_on == ["test-steps"] * 3
    assert pipeline.close(10)


def test_without_a_worker_discard_drops_at_once():
    pipeline, freed_on = StepPipeline(), []
    pipeline.discard(Payload(freed_on))
    assert freed_on == [threading.current_thread().name]


def test_submit_waits_when_max_pending_jobs_are_queued():
    pipeline, gate = StepPipeline(max_pending=2), threading.Event()
    pipeline.submit("blocked", gate.wait)  # the worker is busy with this one
    time.sleep(0.05)
    pipeline.submit("queued 1", lambda: None)
    pipeline.submit("queued 2", lambda: None)
    submitted = threading.Event()
    threading.Thread(target=lambda: (pipeline.submit("one too many", lambda: None), submitted.set())).start()
    assert not submitted.wait(0.3)  # bounded: the third queued job waits for room
    gate.set()
    assert submitted.wait(10) and pipeline.drain(10)
    assert pipeline.close(10)
