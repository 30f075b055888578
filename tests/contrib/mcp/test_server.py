"""The guarded MCP server, driven by the official MCP Python client over streamable HTTP,
on a real fleet: two ``celery worker`` processes, Redis as broker, backend and store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from aaa_celery.contrib.mcp import CALL_KEY_META, GuardedMCPServer, TasksExtension, cancel_task, get_task
from aaa_celery.testing import Fleet

from . import mcp_app
from .conftest import ROOT, HttpServer

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


@pytest.fixture(scope="module")
def served(fleet: Fleet) -> Iterator[tuple[GuardedMCPServer, str]]:
    app = mcp_app.make_app(mcp_app.ledger().url)
    server = GuardedMCPServer(mcp_app.HANDLER, app, name="shop", wait_s=60, poll_s=0.1)
    with HttpServer(server.streamable_http_app()) as http:
        yield server, http.url


def run(fn: Any) -> Any:
    return anyio.run(fn)


def entries(task_id: str, event: str = "start") -> list[dict[str, Any]]:
    return mcp_app.ledger().entries(task_id, event)


async def until_task(client: Client, task_id: str, statuses: set[str], timeout_s: float = 90) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        task = await get_task(client.session, task_id)
        if task.status in statuses:
            return task
        assert time.monotonic() < deadline, f"task {task_id} still {task.status}: {task.status_message}"
        await anyio.sleep(0.2)


async def until_started(task_id: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not entries(task_id):
        assert time.monotonic() < deadline, f"call {task_id} never started"
        await anyio.sleep(0.1)
    return entries(task_id)[0]


def test_tools_are_listed_with_annotations_that_agree_with_the_delivery(served: tuple[GuardedMCPServer, str]) -> None:
    _, url = served

    async def main() -> dict[str, Any]:
        async with Client(url) as client:
            return {t.name: t for t in (await client.list_tools()).tools}

    tools = run(main)
    assert set(tools) == {"lookup", "charge", "sync_index", "long_job", "wire"}
    lookup, charge, sync, wire = (tools[n].annotations for n in ("lookup", "charge", "sync_index", "wire"))
    assert (lookup.read_only_hint, lookup.idempotent_hint) == (True, True)  # read-only: at_least_once
    assert (charge.read_only_hint, charge.destructive_hint, charge.idempotent_hint) == (False, True, False)
    assert (sync.idempotent_hint, sync.destructive_hint) == (True, False)
    assert (wire.destructive_hint, wire.idempotent_hint) == (True, False)
    assert tools["charge"].meta["io.github.aaa-celery/delivery"] == "at_most_once"
    assert tools["lookup"].meta["io.github.aaa-celery/delivery"] == "at_least_once"
    assert tools["charge"].input_schema["required"] == ["order_id", "amount", "hold_s"]


def test_a_call_returns_its_result(served: tuple[GuardedMCPServer, str]) -> None:
    _, url = served

    async def main() -> Any:
        async with Client(url) as client:
            return await client.call_tool("lookup", {"order_id": "A-1"})

    result = run(main)
    assert not result.is_error
    assert result.structured_content == {"result": "order A-1: paid 30 EUR"}


def test_a_retried_request_makes_one_effect(served: tuple[GuardedMCPServer, str]) -> None:
    server, url = served
    args = {"order_id": "R-1", "amount": 5, "hold_s": 0}

    async def main() -> list[Any]:
        out = []
        for _ in range(3):  # the client retries: a lost response, a reconnect
            async with Client(url) as client:
                out.append(await client.call_tool("charge", args))
        return out

    results = run(main)
    assert [r.structured_content for r in results] == [{"result": "charged 5 for R-1"}] * 3
    task_id = server.call_id_for(mcp_app.charge, args)
    assert len(entries(task_id)) == 1


def test_a_new_call_key_is_a_new_call_and_its_retry_the_same(served: tuple[GuardedMCPServer, str]) -> None:
    _, url = served
    args = {"order_id": "R-2", "amount": 5, "hold_s": 0}

    async def main() -> None:
        async with Client(url) as client:
            for key in ("first", "second", "second"):
                await client.call_tool("charge", args, meta={CALL_KEY_META: key})  # type: ignore[typeddict-unknown-key]

    run(main)
    starts = [e for e in mcp_app.ledger().entries(event="start") if e.get("order_id") == "R-2"]
    assert len(starts) == 2
    assert len({e["task_id"] for e in starts}) == 2


def test_the_same_tools_are_served_over_stdio(served: tuple[GuardedMCPServer, str],
                                              mcp_env: dict[str, str]) -> None:
    import os
    import sys

    params = StdioServerParameters(command=sys.executable, args=["-m", "tests.contrib.mcp.stdio_server"],
                                   env={**os.environ, **mcp_env, "PYTHONPATH": str(ROOT)}, cwd=str(ROOT))

    async def main() -> tuple[list[str], Any]:
        async with Client(params) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            return names, await client.call_tool("lookup", {"order_id": "S-1"})

    names, result = run(main)
    assert "charge" in names
    assert result.structured_content == {"result": "order S-1: paid 30 EUR"}


def _kill_holder(fleet: Fleet, entry: dict[str, Any]) -> None:
    worker = fleet.worker_of(entry["pid"])
    worker.kill()  # kill -9 of the worker and its pool
    fleet.add()  # two workers again for the tests after this one


def test_kill_9_of_the_holder_at_least_once_completes_as_attempt_2(
        served: tuple[GuardedMCPServer, str], fleet: Fleet) -> None:
    _, url = served

    async def main() -> tuple[str, Any]:
        async with Client(url, extensions=[TasksExtension()]) as client:
            handle = await client.session.call_tool("sync_index", {"name": "k9", "hold_s": 60}, allow_claimed=True)
            task_id = handle.task_id
            assert handle.status == "working"
            _kill_holder(fleet, await until_started(task_id))
            return task_id, await until_task(client, task_id, {"completed", "failed"})

    task_id, task = run(main)
    assert task.status == "completed", task
    assert task.result["structuredContent"] == {"result": "indexed k9"}
    assert task.status_message == "completed by attempt 2"
    assert [e["attempt"] for e in entries(task_id)] == [1, 2]


def test_kill_9_of_the_holder_at_most_once_ends_failed_outcome_unknown_and_never_runs_twice(
        served: tuple[GuardedMCPServer, str], fleet: Fleet) -> None:
    _, url = served

    async def main() -> tuple[str, Any]:
        async with Client(url, extensions=[TasksExtension()]) as client:
            handle = await client.session.call_tool("charge", {"order_id": "K-9", "amount": 7, "hold_s": 60},
                                                    allow_claimed=True)
            _kill_holder(fleet, await until_started(handle.task_id))
            return handle.task_id, await until_task(client, handle.task_id, {"completed", "failed"})

    task_id, task = run(main)
    assert task.status == "failed", task
    assert task.error_type == "OutcomeUnknown"
    assert task.error["data"]["callId"] == task_id
    time.sleep(3)  # recovery had its chances to bring it back
    assert len(entries(task_id)) == 1  # the effect ledger: the body ran once


def test_tasks_cancel_stops_a_long_tool_and_fences_its_late_result(
        served: tuple[GuardedMCPServer, str]) -> None:
    server, url = served

    async def main() -> tuple[str, Any]:
        async with Client(url, extensions=[TasksExtension()]) as client:
            handle = await client.session.call_tool("long_job", {"seconds": 8}, allow_claimed=True)
            await until_started(handle.task_id)
            await cancel_task(client.session, handle.task_id)
            return handle.task_id, await until_task(client, handle.task_id, {"cancelled", "completed", "failed"})

    task_id, task = run(main)
    assert task.status == "cancelled", task
    time.sleep(10)  # past the body's own end
    assert entries(task_id, "end") == []
    assert server.task(task_id)["status"] == "cancelled"  # no late result replaced the revocation


def test_an_approval_required_tool_is_input_required_until_approved(served: tuple[GuardedMCPServer, str]) -> None:
    server, url = served

    async def main() -> tuple[str, list[str], Any]:
        async with Client(url, extensions=[TasksExtension()]) as client:
            handle = await client.session.call_tool("wire", {"to": "ACME", "amount": 9}, allow_claimed=True)
            seen = [handle.status]
            again = await client.session.call_tool("wire", {"to": "ACME", "amount": 9}, allow_claimed=True)
            assert again.task_id == handle.task_id  # a retried tools/call gets the same task
            for _ in range(3):
                seen.append((await get_task(client.session, handle.task_id)).status)
                await anyio.sleep(0.3)
            assert entries(handle.task_id) == []  # nothing ran while it waits
            assert server.approve(handle.task_id, by="ops@example.com")
            return handle.task_id, seen, await until_task(client, handle.task_id, {"completed", "failed"})

    task_id, seen, task = run(main)
    assert seen == ["input_required"] * 4
    assert task.status == "completed", task
    assert task.result["structuredContent"] == {"result": "wired 9 to ACME"}
    assert len(entries(task_id)) == 1


def test_tasks_cancel_of_a_call_waiting_for_approval_cancels_it_unsent(served: tuple[GuardedMCPServer, str]) -> None:
    _, url = served

    async def main() -> tuple[str, Any]:
        async with Client(url, extensions=[TasksExtension()]) as client:
            handle = await client.session.call_tool("wire", {"to": "Globex", "amount": 1}, allow_claimed=True)
            await cancel_task(client.session, handle.task_id)
            return handle.task_id, await get_task(client.session, handle.task_id)

    task_id, task = run(main)
    assert task.status == "cancelled"
    assert entries(task_id) == []


def test_a_held_call_is_sent_once_by_another_replica_of_the_server(served: tuple[GuardedMCPServer, str]) -> None:
    server, url = served
    replica = GuardedMCPServer(mcp_app.HANDLER, server.app, name="shop")  # another process, as far as state goes

    async def main() -> str:
        async with Client(url, extensions=[TasksExtension()]) as client:
            handle = await client.session.call_tool("wire", {"to": "Initech", "amount": 3}, allow_claimed=True)
            return str(handle.task_id)

    task_id = run(main)
    assert replica.task(task_id)["status"] == "input_required"  # the held call is in the store
    assert replica.approve(task_id, by="ops@example.com")
    deadline = time.monotonic() + 60
    while (view := replica.task(task_id))["status"] != "completed":
        server.task(task_id)  # both replicas poll: the call is still sent once
        assert time.monotonic() < deadline, view
        time.sleep(0.2)
    assert view["result"]["structuredContent"] == {"result": "wired 3 to Initech"}
    assert len(entries(task_id)) == 1
