"""An ``LLMClient`` for Anthropic's messages API with tool use.

It speaks ``POST {base_url}/v1/messages`` through the official ``anthropic`` SDK
(``pip install 'aaa_celery[anthropic]'``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from ._vendor import VendorClient, arguments_of, tool_function, unique_calls
from .types import LLMRequest, LLMResponse, Message, ToolCall, Usage


class AnthropicMessagesClient(VendorClient):
    """Answers the engine's model requests with an Anthropic model.

    Args:
        model: the model's name (``"claude-sonnet-4-5"``).
        max_tokens: the most tokens one answer may generate (the API requires it).
        base_url: the API's root; None reads ``ANTHROPIC_BASE_URL``, else Anthropic's.
        key_env: the environment variable that holds the API key (never a source file).
        timeout_s: seconds one HTTP request may take before it is retried.
        max_retries: retries of a timed-out, 408, 409, 429, 5xx or 529 (overloaded) request,
            with the SDK's exponential backoff or the server's ``Retry-After``.
        params: more fields of the request body, sent as they are (``temperature``,
            ``tool_choice``, ``metadata``...).

    Raises:
        ConfigError: a bad option, or no key in ``key_env``.
        ImportError: the ``anthropic`` SDK is not installed.
    """

    sdk = extra = vendor = "anthropic"
    sdk_client = "AsyncAnthropic"
    owned = ("model", "messages", "tools", "system", "max_tokens")

    def __init__(
        self,
        model: str,
        *,
        max_tokens: int = 4096,
        base_url: str | None = None,
        key_env: str = "ANTHROPIC_API_KEY",
        timeout_s: float = 120.0,
        max_retries: int = 4,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        if not (isinstance(max_tokens, int) and max_tokens > 0):
            raise ConfigError(f"AnthropicMessagesClient: max_tokens must be an int > 0, got {max_tokens!r}")
        self.max_tokens = max_tokens
        super().__init__(
            model, base_url=base_url, key_env=key_env, timeout_s=timeout_s, max_retries=max_retries, params=params
        )

    async def _create(self, client: Any, request: LLMRequest) -> Any:
        system, messages = anthropic_messages(request.messages)
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": messages}
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = anthropic_tools(request.tools)
        return await client.messages.create(**body, extra_body=self.params or None)

    def _response(self, raw: Any, request: LLMRequest) -> LLMResponse:
        texts, calls = [], []
        for block in raw.content:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                arguments, error = arguments_of(block.name, block.input, text=False)
                calls.append(ToolCall(block.name, arguments, block.id or "", error))
        u = raw.usage
        usage = None
        if u is not None:
            cached = (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)
            usage = Usage(u.input_tokens + cached, u.output_tokens)
        return LLMResponse(text="".join(texts), tool_calls=unique_calls(calls, request), usage=usage)


def anthropic_tools(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The registry's tool specs as Anthropic tools (``input_schema``)."""
    return [tool_function(spec, "input_schema") for spec in specs]


def anthropic_messages(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """The conversation as Anthropic's ``system`` and alternating ``messages``.

    System messages join the top-level ``system``. A turn's tool results go, in order,
    into the one user message that follows the assistant's ``tool_use`` blocks, each as a
    ``tool_result`` threaded by the model's own id and flagged ``is_error`` when it failed.
    """
    system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
    out: list[dict[str, Any]] = []
    for m in messages:
        blocks: list[dict[str, Any]]
        if m.role == "system":
            continue
        if m.role == "tool":
            role = "user"
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}
            if m.is_error:
                result["is_error"] = True
            blocks = [result]
        else:
            role = m.role
            blocks = [{"type": "text", "text": m.content}] if m.content else []
            blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in m.tool_calls]
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return system, out


__all__ = ["AnthropicMessagesClient", "anthropic_messages", "anthropic_tools"]
