"""Hostile arguments that reach a real ``celery worker`` around ``apply_async`` (which
would refuse them): each is a recorded ``ToolArgsError``, the tool never runs, and the
worker keeps serving (issue 12). The engine side is the hypothesis property of
``tests/runtime/test_arguments.py``; this is its smaller, example-based worker side."""

from __future__ import annotations

import pytest

from aaa_celery import ToolArgsError
from aaa_celery.lifecycle import FAILED, STARTED

from .test_fleet_faults import TTL, types

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def deep(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


CASES = {
    "a list": [1, 2],
    "a string": "text=hi",
    "null": None,
    "nested 200 deep": {"text": deep(200)},
    "NaN": {"text": float("nan")},
    "an unpaired surrogate": {"text": "ab\ud800"},
    "300 KB": {"text": "x" * 300_000},
    "an unknown field": {"text": "hi", "admin": True},
    "a wrong type": {"text": ["hi"]},
    "a huge integer": {"text": 2**80},
}


def test_hostile_arguments_sent_around_apply_async_become_recorded_tool_args_errors(fleet):
    """Reproduces on 23716a3: ``apply_async`` published every one of these, and the
    registered spec kept the 300 KB one for recovery."""
    f = fleet(size=1, TTL=TTL)
    echo = f.client.tasks["aaa.tool.echo"]
    sent = {}
    for name, arguments in CASES.items():
        with pytest.raises(ToolArgsError):  # apply_async refuses each before it is published
            echo.apply_async(kwargs={"arguments": arguments})
        sent[name] = f.client.send_task("aaa.tool.echo", kwargs={"arguments": arguments}, queue="aaa.default")
    for name, result in sent.items():
        with pytest.raises(ToolArgsError):
            result.get(timeout=30)
        assert types(f.store, result.id) == [STARTED, FAILED], name
        assert f.store.result(result.id).error == "ToolArgsError", name
    # the tool never ran
    assert not {e.get("task_id") for e in f.ledger.entries()} & {r.id for r in sent.values()}
    # the worker is still up and serves a normal call
    assert f[0].alive
    assert echo.delay(arguments={"text": "still here"}).get(timeout=30) == "still here"
