"""Guarded calls to a remote MCP server: a stub server written with the SDK, in its own
process, called from a real fleet (two ``celery worker`` processes on Redis)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from aaa_celery.testing import Fleet
from aaa_celery.testing.faults import kill9
from aaa_celery.tools import ToolHandler
from aaa_celery.tools.handler import store_of

from . import mcp_app
from .conftest import Stub

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


@pytest.fixture(scope="module")
def remote(fleet: Fleet, mcp_env: dict[str, str], stub: Stub) -> ToolHandler:
    app = mcp_app.make_app(mcp_env[mcp_app.ENV])
    handler = mcp_app.remote_handler(stub.url)
    handler.bind(app)
    return handler


def test_remote_annotations_of_a_trusted_server_decide_the_delivery(remote: ToolHandler) -> None:
    pay, balance = remote.registry["stub_pay"], remote.registry["stub_balance"]
    assert remote.config_for(pay).delivery.value == "at_most_once"
    assert remote.config_for(balance).delivery.value == "at_least_once"


def test_server_killed_during_a_destructive_call_is_outcome_unknown_with_one_request(
        remote: ToolHandler, stub: Stub) -> None:
    result = remote.task("stub_pay").delay(arguments={"to": "ACME", "amount": 10})
    deadline = time.monotonic() + 60
    while not stub.requests("pay"):
        assert time.monotonic() < deadline, "the remote call never reached the stub"
        time.sleep(0.1)
    assert stub.proc is not None
    kill9(stub.proc.pid)  # the remote server dies mid-call
    stub.proc.wait(10)
    with pytest.raises(Exception):
        result.get(timeout=90)
    outcome = store_of(remote.task("stub_pay").task.app).result(result.id)  # the store's record is the truth
    assert (outcome.ok, outcome.error) == (False, "OutcomeUnknown")
    stub.start()  # the server is back: still nothing is sent again
    time.sleep(4)
    assert len(stub.requests("pay")) == 1


def test_a_read_only_remote_tool_is_retried_and_succeeds(remote: ToolHandler, stub: Stub) -> None:
    stub.stop()
    stub.start(env={"AAA_STUB_READ_S": "20"})
    result = remote.task("stub_balance").delay(arguments={"account": "A"})
    deadline = time.monotonic() + 60
    while not stub.requests("balance"):
        assert time.monotonic() < deadline, "the remote call never reached the stub"
        time.sleep(0.1)
    assert stub.proc is not None
    kill9(stub.proc.pid)  # the server dies mid-read
    stub.proc.wait(10)
    stub.start()  # and comes back (no delay now)
    assert result.get(timeout=90) == {"balance": 42}
    assert len(stub.requests("balance")) >= 2
