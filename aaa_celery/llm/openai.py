"""An ``LLMClient`` for OpenAI-compatible chat completions with tool calling.

It speaks ``POST {base_url}/chat/completions`` through the official ``openai`` SDK
(``pip install 'aaa_celery[openai]'``), so it serves OpenAI itself and any compatible
server (vLLM, Ollama, LiteLLM, llama.cpp) through ``base_url``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ._vendor import (
    VendorClient,
    arguments_of,
    tool_function,
    tool_result_text,
    unique_calls,
)
from .types import LLMError, LLMRequest, LLMResponse, Message, ToolCall, Usage


class OpenAIChatClient(VendorClient):
    """Answers the engine's model requests with an OpenAI-compatible chat model.

    Args:
        model: the model's name (``"gpt-4.1-mini"``, or what a vLLM/Ollama server serves).
        base_url: the API's root (``"http://localhost:11434/v1"`` for Ollama); None reads
            ``OPENAI_BASE_URL``, else OpenAI's.
        key_env: the environment variable that holds the API key (never a source file).
        timeout_s: seconds one HTTP request may take before it is retried.
        max_retries: retries of a timed-out, 408, 409, 429 or 5xx request, with the SDK's
            exponential backoff (0.5 s doubling to 8 s, jittered) or the server's ``Retry-After``.
        params: more fields of the request body, sent as they are (``temperature``,
            ``max_completion_tokens``, ``tool_choice``, ``parallel_tool_calls``...).

    Raises:
        ConfigError: a bad option, or no key in ``key_env``.
        ImportError: the ``openai`` SDK is not installed.
    """

    sdk = extra = vendor = "openai"
    sdk_client = "AsyncOpenAI"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 120.0,
        max_retries: int = 4,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            model, base_url=base_url, key_env=key_env, timeout_s=timeout_s, max_retries=max_retries, params=params
        )

    async def _create(self, client: Any, request: LLMRequest) -> Any:
        body: dict[str, Any] = {"model": self.model, "messages": chat_messages(request.messages)}
        if request.tools:
            body["tools"] = chat_tools(request.tools)
        return await client.chat.completions.create(**body, extra_body=self.params or None)

    def _response(self, raw: Any, request: LLMRequest) -> LLMResponse:
        if not raw.choices:
            raise LLMError(f"openai model {self.model!r}: the answer has no choices", vendor=self.vendor)
        message = raw.choices[0].message
        calls = []
        for call in message.tool_calls or ():
            function = getattr(call, "function", None)
            if function is None:
                name = str(getattr(getattr(call, "custom", None), "name", "") or "")
                calls.append(ToolCall(name, {}, call.id or "", f"{name}: unsupported tool call type {call.type!r}"))
                continue
            arguments, error = arguments_of(function.name, function.arguments, text=True)
            calls.append(ToolCall(function.name, arguments, call.id or "", error))
        usage = raw.usage
        return LLMResponse(
            text=message.content or getattr(message, "refusal", None) or "",
            tool_calls=unique_calls(calls, request),
            usage=Usage(usage.prompt_tokens or 0, usage.completion_tokens or 0) if usage else None,
        )


def chat_tools(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The registry's tool specs as chat-completions ``function`` tools."""
    return [{"type": "function", "function": tool_function(spec, "parameters")} for spec in specs]


def chat_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The conversation as chat-completions messages: each tool result threaded to its
    call by the model's own ``tool_call_id``; a failed one starts with ``Error:``."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": tool_result_text(m)})
        elif m.role == "assistant" and m.tool_calls:
            out.append({
                "role": "assistant",
                "content": m.content or None,
                "tool_calls": [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                    for c in m.tool_calls
                ],
            })
        else:
            out.append({"role": m.role, "content": m.content})
    return out


__all__ = ["OpenAIChatClient", "chat_messages", "chat_tools"]
