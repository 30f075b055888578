"""More of Celery's task API, plain and guarded: soft and hard time limits, task_track_started,
ignore_result, link_error, on_retry, starmap and chunks."""

from __future__ import annotations

import time

import pytest
from aaa_celery.testing import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def test_soft_time_limit_reaches_the_body(compat):
    assert compat.app.tasks["compat.soft"].delay().get(timeout=20) == "soft limit reached the body"


def test_hard_time_limit_is_the_one_final_failure(compat):
    """A hard ``time_limit`` is final, as in plain Celery: the caller's FAILURE is the
    store's record, and recovery never runs the call again, under either delivery
    (reproduces on bc26f5c: the store had no result and kept attempt 1's lease; at least
    once, recovery ran the body again and again, 3 starts within the 9 s wait, each killed
    by the limit in turn; at most once, the store recorded ``OutcomeUnknown(worker_lost)``
    behind the caller's ``TimeLimitExceeded``)."""
    from celery.exceptions import TimeLimitExceeded

    from aaa_celery.lifecycle import STARTED
    from aaa_celery.worker import app_store

    store = app_store(compat.app)
    results = [compat.app.tasks[name].delay() for name in ("compat.hard", "compat.hard_once")]
    outcomes = {}
    for result in results:  # two workers: both run at once
        with pytest.raises(TimeLimitExceeded):
            result.get(timeout=20)
        if compat.guarded:
            outcome = outcomes[result.id] = store.result(result.id)
            assert outcome is not None and not outcome.ok and outcome.error == "TimeLimitExceeded", outcome
            assert outcome.attempt == 1
    time.sleep(9.0)  # three lease TTLs (3 s), with recovery sweeping every second
    for result in results:
        assert len(compat.starts(result.id)) == 1
        assert result.state == "FAILURE"
        if compat.guarded:
            types = [(e.type, e.attempt) for e in store.events(result.id)]
            assert [a for t, a in types if t == STARTED] == [1], types
            assert store.result(result.id) == outcomes[result.id]  # no OutcomeUnknown either


def test_track_started_shows_started_while_running(compat):
    result = compat.app.tasks["compat.tracked"].delay()
    wait_for(lambda: result.state == "STARTED", 20, "the STARTED state")
    assert result.get(timeout=20) == "tracked"


def test_ignore_result_runs_once_and_stores_no_result(compat):
    import uuid

    marker = uuid.uuid4().hex
    result = compat.app.tasks["compat.quiet"].delay(marker)
    wait_for(lambda: compat.starts(marker), 20, "the body ran")
    time.sleep(4.0)  # past the lease TTL and recovery sweeps
    assert len(compat.starts(marker)) == 1
    assert result.state == "PENDING"  # nothing stored in the result backend


def test_link_error_calls_the_errback(compat):
    tasks = compat.app.tasks
    result = tasks["compat.boom"].apply_async(link_error=tasks["compat.on_error"].s())
    with pytest.raises(ValueError):
        result.get(timeout=20)
    wait_for(lambda: compat.ledger.entries(result.id, "errback"), 20, "the errback ran")


def test_on_retry_hook_runs(compat):
    result = compat.app.tasks["compat.hooked_retry"].delay()
    assert result.get(timeout=20) == 1
    wait_for(lambda: compat.ledger.entries(result.id, "on_retry"), 10, "on_retry ran")


def test_starmap_and_chunks(compat):
    add = compat.app.tasks["compat.add"]
    assert add.starmap([(1, 2), (3, 4)]).apply_async().get(timeout=20) == [3, 7]
    chunks = add.chunks(zip(range(4), range(4)), 2).group().apply_async()
    assert chunks.get(timeout=20) == [[0, 2], [4, 6]]


def test_protocol_1_messages(compat):
    """``task_protocol=1`` (Celery's older message format, which Celery 5 still sends on
    request): a call, and a chain of groups into a chord, run as in plain Celery
    (reproduces on 4156db8: a guarded worker refused every protocol 1 message as malformed
    and recorded a ``ToolArgsError``; Celery's own
    ``test_group_chains.py::test_group_results_reach_the_next_group[...-1]``)."""
    from celery import chain, group

    app = compat.app
    add, total = app.tasks["compat.add"], app.tasks["compat.total"]
    app.conf.task_protocol = 1
    try:
        result = add.delay(2, 3)
        assert result.get(timeout=20) == 5
        flow = chain(group(add.si(1, 1), add.si(2, 2)), group(total.s(), total.s()), total.s(), app=app)
        assert flow.apply_async().get(timeout=30) == 12
    finally:
        app.conf.task_protocol = 2
    if compat.guarded:
        from aaa_celery.worker import app_store

        outcome = app_store(app).result(result.id)
        assert outcome is not None and outcome.ok, outcome


def test_arguments_kombu_json_decodes_to_other_types(compat):
    """Bytes, ``Decimal`` and ``date`` arguments (kombu's JSON sends and decodes them)
    run as in plain Celery (reproduces on 4156db8: the worker's ``begin`` wrote the call's
    arguments with the stdlib's ``json``, its ``TypeError`` was taken for store trouble, and
    the message went back to the queue again and again, the call never ran; Celery's own
    ``test_canvas.py`` hung on its ``redis_echo`` tasks, which take bytes)."""
    import datetime as dt
    import decimal

    add = compat.app.tasks["compat.add"]
    assert add.delay(b"ab", b"cd").get(timeout=20) == b"abcd"
    assert add.delay(decimal.Decimal("1.5"), decimal.Decimal("2.25")).get(timeout=20) == decimal.Decimal("3.75")
    day = dt.date(2030, 1, 2)
    assert compat.app.tasks["compat.whoami"].delay(day).get(timeout=20)["x"] == day


def test_a_repeated_task_id_fails_with_its_own_exception(compat):
    """A task id sent again after its body failed (a reapplied frozen signature does that):
    Celery's errbacks and chords get the body's own exception type, as in plain Celery
    (reproduces on 4156db8: the guard answered the later delivery from its record with a
    ``ToolError``; Celery's ``test_canvas.py::test_chord::test_mutable_errback_called_by_chord_from_chain``)."""
    import uuid

    from .compat_app import CompatError

    tasks = compat.app.tasks
    task_id = f"again-{uuid.uuid4().hex[:12]}"
    for n in (1, 2):
        result = tasks["compat.boom_own"].apply_async(task_id=task_id, link_error=tasks["compat.on_error"].s())
        with pytest.raises(CompatError):
            result.get(timeout=20)
        calls = wait_for(lambda n=n: len(compat.ledger.entries(task_id, "errback")) >= n and
                         compat.ledger.entries(task_id, "errback"), 20, f"errback {n}")
    assert [c["error"] for c in calls] == ["CompatError", "CompatError"]
