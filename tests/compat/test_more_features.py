"""More of Celery's task API, plain and guarded: soft time limits, task_track_started,
ignore_result, link_error, on_retry, starmap and chunks."""

from __future__ import annotations

import time

import pytest
from aaa_celery.testing import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def test_soft_time_limit_reaches_the_body(compat):
    assert compat.app.tasks["compat.soft"].delay().get(timeout=20) == "soft limit reached the body"


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
