"""A result above the guard's ``max_result_bytes`` (default 1 MiB, in bytes of its JSON as
stored) fails the call with a clear ``ResultTooLarge``, and nothing large is stored
(issue 12). Reproduces on 23716a3: a 50 MB result was stored (twice, see
``test_a_result_value_is_stored_once_and_every_reader_still_sees_it``) and kept 7 days."""

from __future__ import annotations

import pytest

from aaa_celery.algos import ToolLoop
from aaa_celery.errors import ResultTooLarge
from aaa_celery.llm import FakeLLMClient, LLMHandler
from aaa_celery.runtime import SyncEngine
from aaa_celery.tools import GuardConfig, ToolHandler, ToolRegistry, tool

from .conftest import call_then_echo


@tool
def report(size: int, wide: bool = False) -> str:
    """A report of ``size`` characters (2-byte ones if ``wide``: 6 bytes each as JSON)."""
    return ("é" if wide else "x") * size


@tool(guard={"max_result_bytes": 8 * 1024 * 1024})
def archive(size: int) -> dict[str, str]:
    """A large archive: this tool allows 8 MiB."""
    return {"data": "x" * size}


def test_a_result_above_max_result_bytes_fails_the_call_and_is_not_stored():
    assert GuardConfig().max_result_bytes == 1024 * 1024
    registry = ToolRegistry([report, archive])
    handler = ToolHandler(registry)
    with SyncEngine() as engine:
        LLMHandler(FakeLLMClient(call_then_echo(
            ("report", {"size": 1000}), ("report", {"size": 50_000_000}), ("report", {"size": 200_000, "wide": True}),
            ("archive", {"size": 3_000_000}),
        ))).attach(engine)
        handler.attach(engine)
        handle = engine.start(ToolLoop(registry), {"task": "go"})
        outcome = handle.result(timeout=120)
        assert outcome.status == "completed"
        requested = {e["data"]["call_id"]: e["data"] for e in handle.events() if e["type"] == "aaa.tool.requested"}
        by_size = {(requested[e["data"]["call_id"]]["name"], requested[e["data"]["call_id"]]["arguments"]["size"]):
                   e["data"] for e in handle.events() if e["type"] in ("aaa.tool.completed", "aaa.tool.failed")}
        assert by_size[("report", 1000)]["value"] == "x" * 1000
        assert by_size[("archive", 3_000_000)]["value"] == {"data": "x" * 3_000_000}  # its own limit
        for key, size in ((("report", 50_000_000), 50_000_002), (("report", 200_000), 1_200_002)):
            fact = by_size[key]
            assert fact["error"] == "ResultTooLarge"
            assert fact["message"] == (f"the result, of type str, is {size} bytes as JSON, above the limit of 1048576 "
                                       "(guard option max_result_bytes): return less, e.g. where the data is kept")
            recorded = engine.store.result(fact["call_id"])
            assert recorded.error == "ResultTooLarge" and recorded.value is None
        # a plain send sees the same error from its AsyncResult
        with pytest.raises(ResultTooLarge, match="above the limit of 1048576"):
            handler.task("report").delay(size=2_000_000).get(timeout=60)
