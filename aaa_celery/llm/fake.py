"""Build fake model responses for tests and examples."""

from __future__ import annotations

from typing import Any

from .types import LLMResponse, ToolCall


def text(content: str) -> LLMResponse:
    """A final text answer."""
    return LLMResponse(text=str(content))


def tool_call(name: str, /, **arguments: Any) -> LLMResponse:
    """One tool call with keyword arguments."""
    return LLMResponse(tool_calls=(ToolCall(name, arguments),))


def tool_calls(*calls: tuple[str, dict[str, Any]]) -> LLMResponse:
    """Several tool calls in one turn: ``tool_calls(("search", {"query": "x"}), ...)``."""
    return LLMResponse(tool_calls=tuple(ToolCall(name, dict(args)) for name, args in calls))


__all__ = ["text", "tool_call", "tool_calls"]
