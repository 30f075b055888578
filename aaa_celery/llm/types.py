"""Messages, tool calls and the model client interface."""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from ..errors import AAACeleryError


@dataclass(frozen=True)
class ToolCall:
    """The model asks for tool ``name`` with ``arguments``; ``id`` is the call id.

    ``error`` says why the model's call is malformed (arguments that are not JSON,
    or not an object); the run answers such a call with a ``ToolArgsError`` fact
    and never sends it to a worker.
    """

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:12]}")
    error: str | None = None


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
class Usage:
    """The tokens one model call consumed, as the vendor reported them."""

    input_tokens: int = 0
    """Prompt tokens (the whole conversation and the tool schemas)."""
    output_tokens: int = 0
    """Generated tokens (text and tool calls)."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class LLMResponse:
    """Either text, or tool calls (several run concurrently); ``usage`` when the client reports it."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None


class LLMClient(Protocol):
    async def complete(self, request: LLMRequest) -> LLMResponse: ...


class LLMError(AAACeleryError):
    """The model's API failed the request (after the client's own retries)."""


__all__ = ["LLMClient", "LLMError", "LLMRequest", "LLMResponse", "Message", "ToolCall", "Usage"]
