from __future__ import annotations

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
