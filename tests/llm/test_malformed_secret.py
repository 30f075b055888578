"""A malformed model call to a tool with a secret never quotes the model's raw text (issue 21, item 2).

Reproduces on c79799f: ``{"user":"bob","pin":"4821",}`` (a trailing comma) became a
``ToolArgsError`` whose text quoted up to 200 characters of the raw arguments, PIN
included; that text was in the run's ``aaa.tool.failed`` event (so the pages and their
JSON), in the recorded model turn in the store, and in the logs. Now the error names the
problem (its kind and position) and quotes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

import pytest

from aaa_celery import open_store
from aaa_celery.algos import ToolLoop
from aaa_celery.llm import LLMHandler
from aaa_celery.runtime import Engine
from aaa_celery.tools import Secret, ToolHandler, ToolRegistry, tool

from ..runtime.test_secrets import redis_dump
from .conftest import Raw, Vendor, echo_results

pytestmark = [pytest.mark.redis]

PIN = "4821"


@tool
def unlock(user: str, pin: Annotated[str, Secret]) -> str:
    """Unlock a user's account with their PIN."""
    return f"unlocked {user}"


def test_a_malformed_call_with_a_secret_is_refused_without_quoting_it(vendor: Vendor, redis_url, caplog):
    # Given a model whose call to a tool with a secret is malformed, PIN in it
    caplog.set_level(logging.DEBUG)
    bad = Raw('{"user":"bob","pin":"' + PIN + '",}') if vendor.name == "openai" else Raw(["bob", PIN])
    first = vendor.calls(("id_bad", "unlock", bad))

    async def main(client: Any) -> tuple[Any, Any]:
        async with Engine(store=open_store(redis_url)) as engine:
            LLMHandler(client).attach(engine)
            ToolHandler(ToolRegistry([unlock])).attach(engine)
            handle = engine.start(ToolLoop(ToolRegistry([unlock])), {"task": "go"})
            return handle, await handle.result()

    with vendor.server(echo_results(vendor, first)) as server:
        handle, outcome = asyncio.run(main(vendor.client(server)))
    # When the run reads the refusal, Then it names the kind and place of the problem ...
    assert outcome.status == "completed", outcome.error
    [failed] = [e["data"] for e in handle.events() if e["type"] == "aaa.tool.failed"]
    assert failed["error"] == "ToolArgsError"
    if vendor.name == "openai":
        assert failed["message"].startswith("unlock: the arguments are not valid JSON (Expecting property name")
        assert "at char 27" in failed["message"]
    else:
        assert failed["message"] == "unlock: the arguments must be a JSON object, got list"
    # ... and the PIN is nowhere: events (what the pages show), the store (the recorded
    # turn), the logs; only the model's own conversation carries its text back to it
    logs = "\n".join(f"{r.name} {r.getMessage()}" for r in caplog.records)
    everything = f"{handle.events()!r}\n{redis_dump(redis_url)}\n{logs}"
    assert PIN not in everything
    assert "4821" not in vendor.results(server.bodies[1])[0].content
