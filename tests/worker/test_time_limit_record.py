"""Which attempt a hard time limit is recorded for (the fence), on an in-memory store.

The fleet test (tests/compat/test_more_features.py::test_hard_time_limit_is_the_one_final_failure)
shows the whole path; these pin the cases a fleet rarely hits: the timed-out child is not
the holder any more, the body raised ``TimeLimitExceeded`` itself, a later attempt started
while the record was being written.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from aaa_celery.config import GuardConfig
from aaa_celery.lifecycle import FAILED, CallSpec, Outcome
from aaa_celery.stores.memory import MemoryStore
from aaa_celery.worker import GuardedTask, use_store
from aaa_celery.worker.settle import settle
from aaa_celery.worker.timelimit import record_time_limit

CONFIG = GuardConfig(lease_ttl_s=30)


def _app() -> tuple[Any, MemoryStore]:
    app = Celery("tl", broker="memory://", set_as_current=False)
    store = MemoryStore()
    use_store(app, store)

    @app.task(base=GuardedTask, shared=False, name="tl.slow", time_limit=2)
    def slow() -> None: ...

    return app, store


def test_records_the_failure_of_the_killed_childs_attempt_and_frees_the_lease():
    app, store = _app()
    claimed = store.begin(CallSpec("c1", name="tl.slow"), "w1@host/4242/1", CONFIG)
    assert record_time_limit(app.tasks["tl.slow"], "c1", "w1@host", 4242, 2)
    outcome = store.result("c1")
    assert outcome is not None and outcome.error == "TimeLimitExceeded" and outcome.attempt == 1
    assert [e.type for e in store.events("c1")][-1] == FAILED
    assert not store.renew(claimed.lease)  # type: ignore[union-attr]  # the lease is freed


def test_leaves_a_call_whose_last_attempt_is_another_childs():
    app, store = _app()
    store.begin(CallSpec("c2", name="tl.slow"), "w2@host/999/1", CONFIG)
    assert not record_time_limit(app.tasks["tl.slow"], "c2", "w1@host", 4242, 2)
    assert store.result("c2") is None


def test_leaves_a_call_that_has_its_result():
    app, store = _app()
    claimed = store.begin(CallSpec("c3", name="tl.slow"), "w1@host/4242/1", CONFIG)
    store.finish(claimed.lease, Outcome.failure("TimeLimitExceeded", "raised by the body"), CONFIG)  # type: ignore[union-attr]
    events = store.events("c3")
    assert not record_time_limit(app.tasks["tl.slow"], "c3", "w1@host", 4242, 2)
    assert store.events("c3") == events  # no stale_result noise


def test_the_record_is_fenced_by_the_attempt():
    app, store = _app()
    first = store.begin(CallSpec("c4", name="tl.slow"), "w1@host/4242/1", CONFIG)
    store.release(first.lease)  # type: ignore[union-attr]  # attempt 1's lease is gone
    later = store.begin(CallSpec("c4", name="tl.slow"), "w2@host/7/1", CONFIG)  # attempt 2 elsewhere
    assert later.attempt == 2  # type: ignore[union-attr]
    late = Outcome.failure("TimeLimitExceeded", "late", 1)
    assert not settle(app, CallSpec("c4"), late, "fenced")  # attempt 1's time limit cannot end attempt 2
    assert store.result("c4") is None
    assert settle(app, CallSpec("c4"), Outcome.failure("TimeLimitExceeded", "late", 2), "fenced")


def test_tool_tasks_use_the_guarded_request():
    from aaa_celery.tools.handler import ToolTask

    assert ToolTask.Request == GuardedTask.Request == "aaa_celery.worker.timelimit:GuardedRequest"
