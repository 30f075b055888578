from __future__ import annotations

import asyncio
import os
import signal
import subprocess
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


def kill_9_when(child: subprocess.Popen[bytes], ready: Callable[[], Any], timeout_s: float, what: str) -> None:
    """``kill -9`` the driving ``child`` (by its pid) once ``ready()`` is truthy; fail with its
    stderr if it exits first, or after ``timeout_s``. The child is gone when this returns."""
    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert child.poll() is None, child.stderr.read().decode(errors="replace")[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, f"the child never reached {what}"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
