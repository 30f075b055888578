"""A secret argument cannot be guessed back from anything minted from a call (issue 21, item 1).

Reproduces on c79799f: the engine's call id carried 64 bits of an unkeyed SHA-256 of the
model's raw arguments, secret included, and that id is in the worker's log line, the run's
events, the store's keys and the default idempotency key; a 4-digit PIN came back from it
in a tenth of a second. Now the digest is of the arguments with every secret left out, so
nothing derived from a call depends on a secret's value.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

import pytest

from aaa_celery import open_store
from aaa_celery.algos import ToolLoop
from aaa_celery.llm import FakeLLMClient, LLMHandler, LLMResponse, ToolCall
from aaa_celery.llm.fake import text
from aaa_celery.protocol import arguments_digest
from aaa_celery.runtime import Engine
from aaa_celery.tools import Secret, ToolContext, ToolHandler, ToolRegistry, tool

from .test_secrets import redis_dump

pytestmark = [pytest.mark.redis]

keys: list[str] = []


@tool
def unlock(user: str, pin: Annotated[str, Secret], ctx: ToolContext = None) -> str:  # type: ignore[assignment]
    """Unlock a user's account with their PIN."""
    keys.append(ctx.idempotency_key)
    return f"unlocked {user}"


def run_with_pin(store_url: str, pin: str, run_id: str) -> tuple[Any, list[dict[str, Any]]]:
    def model(request: Any) -> LLMResponse:
        if request.messages[-1].role == "user":
            return LLMResponse(tool_calls=(ToolCall("unlock", {"user": "bob", "pin": pin}),))
        return text("done")

    async def main() -> tuple[Any, list[dict[str, Any]]]:
        async with Engine(store=open_store(store_url)) as engine:
            LLMHandler(FakeLLMClient(model)).attach(engine)
            ToolHandler(ToolRegistry([unlock])).attach(engine)
            handle = engine.start(ToolLoop(ToolRegistry([unlock])), {"task": "go"}, run_id=run_id, tenant="acme")
            outcome = await handle.result()
            return outcome, handle.events()

    return asyncio.run(main())


def test_a_4_digit_secret_cannot_be_brute_forced_from_anything_the_call_shows(redis_url, caplog):
    # Given a tool with a secret PIN, called by the model on the embedded worker over Redis
    keys.clear()
    caplog.set_level(logging.DEBUG)
    outcome, events = run_with_pin(redis_url, "4821", "run_pin")
    assert outcome.value["text"] == "done"
    call_id = next(e["data"]["call_id"] for e in events if e["type"] == "aaa.tool.requested")
    logs = "\n".join(f"{r.name} {r.getMessage()}" for r in caplog.records)
    assert call_id in logs  # the worker's "received" line shows the id
    everything = "\n".join([logs, repr(events), redis_dump(redis_url), *keys])
    # When every PIN is tried against every place the id appears
    found = [f"{n:04d}" for n in range(10_000)
             if arguments_digest("unlock", {"user": "bob", "pin": f"{n:04d}"}) in everything]
    # Then none is found
    assert found == []


def test_the_call_id_does_not_depend_on_the_secret_and_stays_deterministic(redis_url):
    # The same run id, tenant and non-secret arguments give the same call id whatever the
    # PIN (nothing of it is in the id), and driving it again gives that id again (resume)
    ids = []
    for pin, run_id in (("1111", "run_a"), ("9999", "run_a_again")):
        _, events = run_with_pin(redis_url, pin, run_id)
        ids.append(next(e["data"]["call_id"] for e in events if e["type"] == "aaa.tool.requested"))
    local = [i.rsplit(":", 1)[1] for i in ids]
    assert local[0] == local[1]
    assert ids[0].startswith("acme:run_a:0.0.")
