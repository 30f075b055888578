"""The model side of an agent run: the client interface, a fake client, the vendors'
clients (OpenAI-compatible chat completions, Anthropic messages) and the handler.

The vendors' clients import their SDK only when constructed, so importing this
package needs neither ``openai`` nor ``anthropic``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from . import fake
from .anthropic import AnthropicMessagesClient
from .openai import OpenAIChatClient
from .types import (
    LLMClient,
    LLMError,
    LLMRequest,
    LLMResponse,
    Message,
    ToolCall,
    Usage,
)


class FakeLLMClient:
    """A model for tests: a function of the request, or a scripted list of responses."""

    def __init__(self, model: Callable[[LLMRequest], LLMResponse] | Iterable[LLMResponse]) -> None:
        if callable(model):
            self._model = model
        else:
            script = list(model)
            self._model = lambda request: script.pop(0) if script else LLMResponse(text="")

    async def complete(self, request: LLMRequest) -> LLMResponse:
        response = self._model(request)
        if asyncio.iscoroutine(response):
            response = await response
        if not isinstance(response, LLMResponse):
            raise TypeError(f"the fake model returned {response!r}; use fake.text() or fake.tool_call()")
        return response


class LLMHandler:
    """Answers the engine's model requests with ``client``."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def attach(self, engine: Any) -> None:
        """Answer ``engine``'s model requests (an ``Engine`` or a ``SyncEngine``)."""
        engine.llm = self

    async def complete(self, request: LLMRequest) -> LLMResponse:
        return await self.client.complete(request)  # type: ignore[no-any-return]


__all__ = [
    "AnthropicMessagesClient",
    "FakeLLMClient",
    "LLMClient",
    "LLMError",
    "LLMHandler",
    "LLMRequest",
    "LLMResponse",
    "Message",
    "OpenAIChatClient",
    "ToolCall",
    "Usage",
    "fake",
]
