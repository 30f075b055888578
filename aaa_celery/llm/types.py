"""Messages, tool calls and the model client interface."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class ToolCall:
    """The model asks for tool ``name`` with ``arguments``; ``id`` is the call id."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:12]}")


@dataclass(frozen=True)
class Message:
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False


@dataclass(frozen=True)
class LLMRequest:
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class LLMResponse:
    """Either text, or tool calls (several run concurrently)."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


class LLMClient(Protocol):
    async def complete(self, request: LLMRequest) -> LLMResponse: ...
