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
    holder = compat.fleet.worker_of(first["pid"])
    holder.kill()
    try:
        assert result.get(timeout=40) == "a+b"
        assert len(compat.starts(first_id)) == 2  # attempt 2 of the first step, on the other worker
    finally:
        holder.proc = None
        compat.fleet.workers.remove(holder)
        compat.fleet.add()


def test_countdown_is_kept_while_recovery_runs(compat):
    result = compat.app.tasks["compat.add"].apply_async((1, 2), countdown=6)
    sent = time.monotonic()
    assert result.get(timeout=30) == 3
    assert time.monotonic() - sent >= 5.5  # not brought forward by recovery (grace is 2 s)


def test_an_expired_call_is_never_run(compat):
    tasks = compat.app.tasks
    result = tasks["compat.append"].apply_async(("x", "y"), expires=-1)  # expired when it arrives
    wait_for(lambda: result.state == "REVOKED", 20, "Celery dropped the expired call")
    time.sleep(4.0)  # two recovery sweeps past the 2 s grace
    assert compat.starts(result.id) == []
    assert result.state == "REVOKED"
