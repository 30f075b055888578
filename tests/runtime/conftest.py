from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from aaa_celery.llm import LLMRequest, LLMResponse
from aaa_celery.llm.fake import text, tool_calls


def call_then_echo(*calls: tuple[str, dict[str, Any]]) -> Callable[[LLMRequest], LLMResponse]:
    """A fake model: make ``calls`` in one turn, then answer with every tool message joined."""

    def model(request: LLMRequest) -> LLMResponse:
        if request.messages[-1].role == "user":
            return tool_calls(*calls)
        facts = [m.content for m in request.messages if m.role == "tool"]
        return text(" | ".join(facts))

    return model


async def until(check: Callable[[], Any], timeout_s: float = 30, what: str = "condition") -> Any:
    """Wait (on the event loop) until ``check()`` is truthy, and return its value."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not true after {timeout_s} s")
        await asyncio.sleep(0.02)
    return value
