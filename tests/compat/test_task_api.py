"""Celery's task API behaves the same on a plain ``acks_late`` task and on the same task
guarded (``task_cls = GuardedTask``): each test runs in both modes on a real worker.

Reproduced on 702d210 (before the fixes): a ``bind=True`` guarded task could not be sent
(the send-time argument check still asked for ``self``); a bad argument count raised
``ToolArgsError`` in the worker where Celery raises ``TypeError``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import time

import pytest

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def test_the_mode_is_what_it_says(compat):
    from aaa_celery import GuardedTask

    assert isinstance(compat.app.tasks["compat.add"], GuardedTask) is compat.guarded


def test_bind_true_gives_the_body_its_request(compat):
    result = compat.app.tasks["compat.whoami"].delay(7)
    assert result.get(timeout=20) == {"id": result.id, "x": 7, "retries": 0}


def test_a_bad_argument_count_fails_at_send_time_with_celery_s_type_error(compat):
    with pytest.raises(TypeError):
        compat.app.tasks["compat.whoami"].delay(1, 2)
    with pytest.raises(TypeError):
        compat.app.tasks["compat.add"].delay(1)


def test_a_send_that_celery_refuses_leaves_nothing_for_recovery_to_run(compat):
    """Reproduced on 702d210: registration ran before Celery's argument check, so a send
    that raised ``TypeError`` still left a registered call, which recovery ran later."""
    task_id = f"phantom-{compat.mode}-{time.time_ns()}"
    with pytest.raises(TypeError):
        compat.app.tasks["compat.append"].apply_async(("x",), task_id=task_id)
    if compat.guarded:
        from aaa_celery.worker import app_store

        store = app_store(compat.app)
        everything = store.expired(now=store.now() + 10**6, unclaimed_grace_s=0)
        assert task_id not in [spec.call_id for spec in everything]
        assert store.events(task_id) == [] and store.result(task_id) is None
    time.sleep(3.0)  # a recovery sweep past the 2 s grace
    assert compat.starts(task_id) == []


def test_the_send_time_check_has_the_function_s_own_arity(compat):
    header = compat.app.tasks["compat.add"].__header__
    import inspect

    assert list(inspect.signature(header).parameters) == ["x", "y"]


def test_a_message_with_bad_arguments_fails_in_the_worker_with_type_error(compat):
    result = compat.app.send_task("compat.add", args=[1])  # send_task skips the send-time check
    with pytest.raises(TypeError):
        result.get(timeout=20)



def test_a_result_kombu_s_json_encodes_comes_back_as_in_plain_celery(compat):
    """Reproduced on 702d210: a ``datetime``/``Decimal`` result failed with ``TypeError`` under
    the guard, the lease lapsed, and recovery ran the body again until ``ExecutionAbandoned``."""
    result = compat.app.tasks["compat.rich"].delay()
    value = result.get(timeout=20)
    assert value == {"when": dt.datetime(2026, 1, 2, 3, 4, 5), "amount": decimal.Decimal("12.50")}
    if compat.guarded:
        from aaa_celery.worker import app_store

        store = app_store(compat.app)
        recorded = store.result(result.id)
        assert recorded is not None and recorded.ok and recorded.attempt == 1
        # a second delivery answers with the recorded value, decoded as kombu would
        from aaa_celery.testing import duplicate_delivery

        again = duplicate_delivery(compat.app, result.id, "compat.rich", [])
        assert again.get(timeout=20) == value
        assert [e.type for e in store.events(result.id)].count("aaa.tool.started") == 1


def test_a_result_nothing_can_serialize_fails_the_call_once_naming_its_type(compat):
    if not compat.guarded:
        pytest.skip("the guard's own promise: plain Celery fails in its result backend")
    from aaa_celery.worker import app_store

    result = compat.app.tasks["compat.opaque"].delay()
    with pytest.raises(TypeError, match="of type object, cannot be serialized"):
        result.get(timeout=20)
    store = app_store(compat.app)
    recorded = store.result(result.id)
    assert recorded is not None and recorded.error == "TypeError" and recorded.attempt == 1
    time.sleep(4.5)  # past the lease TTL (3 s) and a recovery sweep: nothing runs it again
    assert [e.type for e in store.events(result.id)] == ["aaa.tool.started", "aaa.tool.failed"]


def test_a_task_may_return_an_async_result_as_in_celery(compat):
    """Found by Celery's test_canvas (test_groupresult_serialization): the guard's result
    store refused a returned AsyncResult, which Celery's backend stores as a tuple."""
    value = compat.app.tasks["compat.handle"].delay().get(timeout=20)
    assert isinstance(value, list | tuple) and len(value) == 2
