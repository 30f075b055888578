"""Recovery sends the message as it was sent, and never a call Celery would not run.

Reproduced on 702d210: recovery republished only task, args, kwargs, queue and the
``aaa_`` headers, so a chain whose first step's holder was ``kill -9``ed never ran its
second step; a ``countdown`` call ran once ``aaa_unclaimed_grace_s`` (2 s here) passed;
an expired call was republished (and would run on a worker that did not drop it).
"""

from __future__ import annotations

import time

import pytest
from celery import chain

from aaa_celery.testing import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def test_a_chain_whose_first_step_s_holder_is_killed_still_completes(compat):
    if not compat.guarded:
        pytest.skip("plain Celery over Redis brings the message back after visibility_timeout (1 h)")
    tasks = compat.app.tasks
    result = chain(tasks["compat.slow"].s(3.0, "a"), tasks["compat.append"].s("b")).apply_async()
    first_id = result.parent.id
    first = wait_for(lambda: compat.starts(first_id), 20, "the first step started")[0]
    compat.replace_worker(compat.fleet.worker_of(first["pid"]), kill=True)
    assert result.get(timeout=40) == "a+b"
    assert len(compat.starts(first_id)) == 2  # attempt 2 of the first step, on another worker


@pytest.mark.parametrize("protocol", [2, 1])
def test_countdown_is_kept_while_recovery_runs(compat, protocol):
    """Also for ``task_protocol=1``, whose message keeps ``eta`` in its body, not in a header
    (recovery reads it from either). On 4156db8 the guarded worker refused a protocol 1
    message outright; with only that fixed, this test passes too (the worker holds the eta
    message in kombu's unacked, so recovery leaves it alone; tests/worker/test_publish_times.py
    shows the body read)."""
    compat.app.conf.task_protocol = protocol
    try:
        result = compat.app.tasks["compat.add"].apply_async((1, 2), countdown=6)
    finally:
        compat.app.conf.task_protocol = 2
    sent = time.monotonic()
    assert result.get(timeout=30) == 3
    assert time.monotonic() - sent >= 5.5  # not brought forward by recovery (grace is 2 s)


def test_countdown_is_kept_across_a_worker_restart(compat):
    """The workers holding a countdown call are restarted before it is due: it runs once,
    not before its eta, neither brought forward by recovery nor lost."""
    result = compat.app.tasks["compat.slow_pass"].apply_async(("late", 0.0), countdown=10)
    sent = time.monotonic()
    time.sleep(1.0)
    compat.restart()
    assert result.get(timeout=60) == "late"
    assert time.monotonic() - sent >= 9.5
    time.sleep(3.0)  # a recovery sweep past the 2 s grace
    assert len(compat.starts(result.id)) == 1


def test_an_expired_call_is_never_run(compat):
    tasks = compat.app.tasks
    result = tasks["compat.append"].apply_async(("x", "y"), expires=-1)  # expired when it arrives
    wait_for(lambda: result.state == "REVOKED", 20, "Celery dropped the expired call")
    time.sleep(4.0)  # two recovery sweeps past the 2 s grace
    assert compat.starts(result.id) == []
    assert result.state == "REVOKED"
    compat.restart()  # fresh workers, whose memory of the expiry is gone
    time.sleep(4.0)
    assert compat.starts(result.id) == []


def test_a_revoked_call_is_never_run_not_even_after_a_restart(compat):
    """Reproduced on 702d210: a revoked call was republished every hold period and ran on
    the first worker that had not seen the revoke (one restarted after it)."""
    add = compat.app.tasks["compat.append"]
    result = add.apply_async(("x", "y"), countdown=3)
    result.revoke()
    wait_for(lambda: result.state == "REVOKED", 20, "Celery revoked the call")
    if compat.guarded:
        from aaa_celery.worker import app_store

        store = app_store(compat.app)
        recorded = wait_for(lambda: store.result(result.id), 20, "the revocation recorded")
        assert recorded.error == "TaskRevokedError"
    # a worker that never saw the revoke gets a copy of the call
    compat.restart()
    from aaa_celery.testing import duplicate_delivery

    again = duplicate_delivery(compat.app, result.id, "compat.append", ["x", "y"])
    time.sleep(5.0)  # the copy is taken, and recovery sweeps past the 2 s grace
    if compat.guarded:
        assert compat.starts(result.id) == []
        from celery.exceptions import TaskRevokedError

        with pytest.raises(TaskRevokedError):
            again.get(timeout=10)
    else:
        # plain Celery runs what a worker was not told to revoke: the copy, and, when the
        # restart put the held countdown message back before it was acked, the original too
        assert len(compat.starts(result.id)) >= 1


def test_terminating_a_running_call_records_it_as_revoked(compat):
    if not compat.guarded:
        pytest.skip("the store's record is the guard's")
    from aaa_celery.worker import app_store

    result = compat.app.tasks["compat.slow"].delay(30.0, "never")
    wait_for(lambda: compat.starts(result.id), 20, "the body started")
    result.revoke(terminate=True)
    store = app_store(compat.app)
    wait_for(lambda: store.result(result.id) is not None, 20, "the revocation recorded")
    assert store.result(result.id).error == "TaskRevokedError"
    time.sleep(4.0)  # past the lease TTL and recovery sweeps: no attempt 2
    assert len(compat.starts(result.id)) == 1


def test_a_chain_whose_middle_step_s_holder_is_killed_still_completes(compat):
    if not compat.guarded:
        pytest.skip("plain Celery over Redis brings the message back after visibility_timeout (1 h)")
    tasks = compat.app.tasks
    result = chain(tasks["compat.append"].si("a", "b"), tasks["compat.slow_pass"].s(3.0),
                   tasks["compat.append"].s("c")).apply_async()
    middle_id = result.parent.id
    first = wait_for(lambda: compat.starts(middle_id), 30, "the middle step started")[0]
    compat.replace_worker(compat.fleet.worker_of(first["pid"]), kill=True)
    assert result.get(timeout=40) == "a+b+c"
    assert len(compat.starts(middle_id)) == 2  # attempt 2 of the middle step


def test_a_recovered_call_keeps_its_priority_routing_and_headers(compat):
    """Reproduced on 702d210: recovery republished only task, args, kwargs, queue and the
    ``aaa_`` headers, so priority, exchange routing and custom headers were lost. Attempt 2
    must see the message attempt 1 saw."""
    if not compat.guarded:
        pytest.skip("plain Celery over Redis brings the message back after visibility_timeout (1 h)")
    result = compat.app.tasks["compat.routed"].apply_async(
        (3.0,), priority=7, headers={"x_custom": "kept"})
    first = wait_for(lambda: compat.starts(result.id), 20, "attempt 1 started")[0]
    compat.replace_worker(compat.fleet.worker_of(first["pid"]), kill=True)
    assert result.get(timeout=40) == "routed"
    starts = compat.starts(result.id)
    assert len(starts) == 2, starts
    assert first["delivery"]["priority"] == 7 and first["custom"] == "kept", first
    assert starts[1]["delivery"] == first["delivery"] and starts[1]["custom"] == "kept", starts
