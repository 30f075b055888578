"""A value the PostgreSQL store cannot hold, on a real worker: that call's bad input, never an
outage (issue 35, item 2).

Reproduces on 03c27cd: PostgreSQL refuses a NUL character (``UntranslatableCharacter``);
``begin`` took that for store trouble, retried it for a lease TTL and handed the message back,
and the call was delivered again, with no end and no result.
"""

from __future__ import annotations

import time

import pytest

from aaa_celery import ToolArgsError
from aaa_celery.lifecycle import FAILED

from .test_fleet_faults import TTL, types

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.fleet]


def test_a_nul_character_fails_its_call_within_10_s_and_the_worker_serves_on(fleet, postgres_url):
    f = fleet(size=1, TTL=TTL, STORE=postgres_url)
    echo = f.client.tasks["aaa.tool.echo"]
    with pytest.raises(ToolArgsError, match=r"text: a string with a NUL character"):
        echo.delay(arguments={"text": "a\x00b"})  # refused before it is published
    # sent anyway: by another producer, to a tool and to a plain guarded task
    tool_call = f.client.send_task("aaa.tool.echo", kwargs={"arguments": {"text": "a\x00b"}}, queue="aaa.default")
    plain_call = f.client.send_task("fleet.fail", args=["a\x00b"])
    delayed = f.client.tasks["fleet.fail"].delay("a\x00b")  # a plain guarded task, as the issue sent it
    started = time.monotonic()
    for sent in (tool_call, plain_call, delayed):
        with pytest.raises((ValueError, ToolArgsError)) as raised:
            sent.get(timeout=10)
        assert "NUL" in str(raised.value) or "UntranslatableCharacter" in str(raised.value)
        assert types(f.store, sent.id)[-1] == FAILED  # the audit trail says so
    assert time.monotonic() - started < 10
    assert not {e.get("task_id") for e in f.ledger.entries()} & {tool_call.id, plain_call.id, delayed.id}  # never ran
    assert f[0].alive
    assert echo.delay(arguments={"text": "still here"}).get(timeout=10) == "still here"
    assert f.client.tasks["fleet.quick"].delay(1).get(timeout=10) == 2
