"""Retries, Ignore, Reject, Task.replace, update_state, hooks and canvas: the same on a
plain ``acks_late`` task and guarded.

Reproduced on 702d210: ``self.retry()`` and ``autoretry_for`` never retried under the guard
(Celery's ``Retry`` was recorded as the call's one result), and ``Task.replace`` ended the
call as a ``ToolError`` ("Ignore: Replaced by new task").
"""

from __future__ import annotations

import time

import pytest
from celery import chord, group

from aaa_celery.testing import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def trail(compat, task_id):
    from aaa_celery.worker import app_store

    return [(e.type, e.attempt) for e in app_store(compat.app).events(task_id)]


def test_self_retry_retries_and_each_delivery_is_the_next_attempt(compat):
    # compat.flaky is at_most_once: a retry the body asks for is not a lost attempt
    result = compat.app.tasks["compat.flaky"].delay(2)
    assert result.get(timeout=30) == 2
    assert len(compat.starts(result.id)) == 3
    if compat.guarded:
        assert trail(compat, result.id) == [
            ("aaa.tool.started", 1), ("aaa.tool.retried", 1),
            ("aaa.tool.started", 2), ("aaa.tool.retried", 2),
            ("aaa.tool.started", 3), ("aaa.tool.completed", 3),
        ]


def test_autoretry_for_retries(compat):
    result = compat.app.tasks["compat.auto"].delay()
    assert result.get(timeout=30) == 2
    assert len(compat.starts(result.id)) == 3


def test_retry_past_max_retries_raises_the_given_exc(compat):
    result = compat.app.tasks["compat.exhausted"].delay()
    with pytest.raises(ValueError, match="gave up"):
        result.get(timeout=30)
    assert len(compat.starts(result.id)) == 2  # the first run and its one retry
    assert result.state == "FAILURE"


def test_retry_with_eta_waits_for_it(compat):
    sent = time.monotonic()
    result = compat.app.tasks["compat.eta_retry"].delay()
    assert result.get(timeout=30) == 1
    assert time.monotonic() - sent >= 1.8
    assert len(compat.starts(result.id)) == 2


def test_autoretry_with_backoff_waits_between_tries(compat):
    sent = time.monotonic()
    result = compat.app.tasks["compat.backoff"].delay()
    assert result.get(timeout=30) == 2
    assert time.monotonic() - sent >= 2.8  # backoff 1 s, then 2 s
    assert len(compat.starts(result.id)) == 3


def test_reject_with_requeue_runs_the_call_again(compat):
    result = compat.app.tasks["compat.requeued"].delay()
    assert result.get(timeout=30) == "second delivery"
    assert len(compat.starts(result.id)) == 2
    if compat.guarded:
        assert trail(compat, result.id) == [
            ("aaa.tool.started", 1), ("aaa.tool.retried", 1),
            ("aaa.tool.started", 2), ("aaa.tool.completed", 2),
        ]


def test_ignore_ends_the_call_without_a_result_and_it_never_runs_again(compat):
    result = compat.app.tasks["compat.ignored"].delay()
    wait_for(lambda: compat.starts(result.id), 20, "the body ran")
    time.sleep(4.0)  # past the lease TTL and two recovery sweeps
    assert len(compat.starts(result.id)) == 1
    assert result.state == "PENDING"


def test_reject_without_requeue_ends_the_call_and_it_never_runs_again(compat):
    result = compat.app.tasks["compat.rejected"].delay()
    wait_for(lambda: compat.starts(result.id), 20, "the body ran")
    time.sleep(4.0)
    assert len(compat.starts(result.id)) == 1
    state = result.state
    if compat.guarded:
        assert trail(compat, result.id)[-1] == ("aaa.tool.failed", 1)
    assert state == "FAILURE"  # as plain Celery reports a rejected task


def test_task_replace_gives_the_replacement_s_result(compat):
    result = compat.app.tasks["compat.replaced"].delay(5)
    assert result.get(timeout=30) == 105
    assert len(compat.starts(result.id)) == 1


def test_update_state_shows_a_custom_state_while_running(compat):
    result = compat.app.tasks["compat.progress"].delay()
    wait_for(lambda: result.state == "PROGRESS", 20, "the custom state")
    assert result.info == {"done": 1}
    assert result.get(timeout=20) == "ok"


def test_hooks_run_as_in_celery(compat):
    ok = compat.app.tasks["compat.hooked"].delay(False)
    bad = compat.app.tasks["compat.hooked"].delay(True)
    assert ok.get(timeout=20) == "fine"
    with pytest.raises(ValueError):
        bad.get(timeout=20)
    wait_for(lambda: compat.ledger.entries(ok.id, "after_return:SUCCESS"), 10, "after_return ran")
    assert compat.ledger.entries(ok.id, "on_success") and not compat.ledger.entries(ok.id, "on_failure")
    wait_for(lambda: compat.ledger.entries(bad.id, "after_return:FAILURE"), 10, "after_return ran")
    assert compat.ledger.entries(bad.id, "on_failure") and not compat.ledger.entries(bad.id, "on_success")


def test_link_group_and_chord(compat):
    tasks = compat.app.tasks
    linked = tasks["compat.add"].apply_async((1, 2), link=tasks["compat.add"].s(10))
    assert linked.get(timeout=20) == 3
    child = wait_for(lambda: linked.children, 20, "the linked call was sent")[0]
    assert child.get(timeout=20) == 13
    assert group(tasks["compat.add"].s(i, i) for i in range(3)).apply_async().get(timeout=30) == [0, 2, 4]
    assert chord(tasks["compat.add"].s(i, i) for i in range(3))(tasks["compat.total"].s()).get(timeout=30) == 6
