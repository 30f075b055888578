"""An operator's decision is the truth everywhere (issue 22 item 4), on a real fleet.

An ``at_most_once`` call's holder is killed with ``kill -9`` mid-call; the call ends as
``OutcomeUnknown``. An operator runs ``celery aaa resolve`` in a process of its own.
Then a caller in yet another process (this test) reads the verdict through Celery's
``AsyncResult.get()``, the engine's reading of the result agrees, and ``aaa show`` says
who resolved it, never "completed by attempt 1" beside the lost attempt 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from celery.result import AsyncResult

from aaa_celery import OutcomeUnknown, ToolError
from aaa_celery.lifecycle import FAILED, STARTED
from aaa_celery.runtime.executor import ToolExecutor
from aaa_celery.lifecycle import RESOLVED
from aaa_celery.testing import kill_child, wait_for

from .conftest import APP, ROOT

pytestmark = [pytest.mark.redis, pytest.mark.fleet]

TTL = 2.0


def aaa(f, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.worker.fleet_app aaa ...`` in a process of its own."""
    env = {**os.environ, **f.env, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "celery", "-A", APP, "aaa", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def lost_at_most_once_call(f, kill) -> str:
    """Send a 4 s at_most_once call, kill its holder, and wait until the caller sees OutcomeUnknown."""
    result = f.client.tasks["fleet.long_amo"].delay(4.0)
    first = wait_for(lambda: f.ledger.entries(result.id, "start"), 30, "the body's start")[0]
    kill(f, first)
    with pytest.raises(OutcomeUnknown):
        result.get(timeout=30)
    assert f.store.result(result.id).error == "OutcomeUnknown"
    return result.id


def engine_reads(f, call_id: str):
    """The fact the engine's executor makes of the call's Celery result (and the store's record)."""
    executor = ToolExecutor(f.client, embedded=False, poll_s=0.05)
    return asyncio.run(asyncio.wait_for(executor._wait(AsyncResult(call_id, app=f.client), call_id, "long_amo"), 30))


def test_resolve_from_the_cli_is_what_a_caller_gets_after_kill_9_of_an_at_most_once_holder(fleet):
    f = fleet(TTL=TTL)
    call_id = lost_at_most_once_call(f, lambda f, entry: f.worker_of(entry["pid"]).kill())

    done = aaa(f, "resolve", call_id, "--as", "completed", "--note", "refund re_1 seen in the PSP",
               "--value", '{"refunded": "A-1", "id": "re_1"}')
    assert done.returncode == 0, done.stderr

    # a caller in another process than the operator's reads the verdict through Celery
    assert AsyncResult(call_id, app=f.client).get(timeout=10) == {"refunded": "A-1", "id": "re_1"}
    fact = engine_reads(f, call_id)
    assert fact.ok and fact.value == {"refunded": "A-1", "id": "re_1"}
    assert f.store.result(call_id).value == fact.value

    story = json.loads(aaa(f, "show", call_id, "--json").stdout)
    assert story["state"] == "resolved as completed"
    assert story["attempts"][0]["ended"] == "lost (OutcomeUnknown)"
    human = aaa(f, "show", call_id).stdout
    assert "completed by attempt" not in human, human
    assert "result: resolved as completed by " in human and "re_1" in human, human
    assert [e.type for e in f.store.events(call_id)] == [STARTED, FAILED, RESOLVED]


def test_resolve_as_failed_raises_the_resolved_failure_for_the_caller(fleet):
    f = fleet(TTL=TTL)
    call_id = lost_at_most_once_call(f, lambda f, entry: kill_child(f.worker_of(entry["pid"]), entry["pid"]))

    done = aaa(f, "resolve", call_id, "--as", "failed", "--note", "no refund in the PSP")
    assert done.returncode == 0, done.stderr

    with pytest.raises(ToolError) as raised:
        AsyncResult(call_id, app=f.client).get(timeout=10)
    assert type(raised.value) is ToolError and "no refund in the PSP" in str(raised.value)
    fact = engine_reads(f, call_id)
    assert not fact.ok and fact.error == "ToolError" and "no refund in the PSP" in fact.message
    human = aaa(f, "show", call_id).stdout
    assert "result: resolved as failed by " in human and "no refund in the PSP" in human, human
