"""Guarded calls to a remote MCP server: a stub server written with the SDK, in its own
process, called from a real fleet (two ``celery worker`` processes on Redis)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from aaa_celery.testing import Fleet
from aaa_celery.testing.faults import kill9, stop_process
from aaa_celery.tools import ToolHandler
from aaa_celery.tools.handler import store_of

from . import mcp_app
from .conftest import ROOT, free_port

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


class Stub:
    def __init__(self, port: int, log: Path) -> None:
        self.port, self.log, self.url = port, log, f"http://127.0.0.1:{port}/mcp"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> Stub:
        import os

        self.proc = subprocess.Popen([sys.executable, "-m", "tests.contrib.mcp.stub_server", str(self.port),
                                      str(self.log)], cwd=ROOT, env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 30
        while True:
            try:
                with __import__("socket").create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                assert time.monotonic() < deadline, "the stub MCP server did not start"
                time.sleep(0.1)

    def requests(self, tool: str) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line]
        return [r for r in lines if r["tool"] == tool]

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stub]:
    s = Stub(free_port(), tmp_path_factory.mktemp("stub") / "requests.jsonl").start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def mcp_env(redis_server: Any, stub: Stub) -> Iterator[dict[str, str]]:
    url = redis_server.url.rsplit("/", 1)[0] + "/10"
    redis.Redis.from_url(url).flushdb()
    yield {mcp_app.ENV: url, mcp_app.STUB_ENV: stub.url}


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
