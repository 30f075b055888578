"""The exact request bodies each client sends: the registry's schemas in the vendor's tool
format, and a conversation with parallel calls, a success and a failure threaded back."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Literal

from aaa_celery.llm import LLMRequest, Message, ToolCall
from aaa_celery.tools import ToolRegistry, tool

from .conftest import VENDORS

ROOT = Path(__file__).resolve().parents[2]


@tool
def refund(order_id: str, amount_cents: int = 0) -> str:
    """Refund an order."""
    return order_id


@tool(requires_approval=True)
def notify(channel: Literal["email", "sms"], to: list[str]) -> str:
    """Tell the customer."""
    return channel


REFUND_SCHEMA = {
    "additionalProperties": False,
    "properties": {
        "order_id": {"title": "Order Id", "type": "string"},
        "amount_cents": {"default": 0, "title": "Amount Cents", "type": "integer"},
    },
    "required": ["order_id"],
    "type": "object",
}
NOTIFY_SCHEMA = {
    "additionalProperties": False,
    "properties": {
        "channel": {"enum": ["email", "sms"], "title": "Channel", "type": "string"},
        "to": {"items": {"type": "string"}, "title": "To", "type": "array"},
    },
    "required": ["channel", "to"],
    "type": "object",
}

CONVERSATION = LLMRequest(
    [
        Message("system", "You run a shop."),
        Message("user", "refund A-1 and tell them"),
        Message("assistant", "On it.", tool_calls=(
            ToolCall("refund", {"order_id": "A-1"}, "id_1"),
            ToolCall("notify", {"channel": "sms", "to": ["+4100"]}, "id_2"),
        )),
        Message("tool", "refunded A-1", tool_call_id="id_1", name="refund"),
        Message("tool", "ApprovalDenied: A person denied this call.", tool_call_id="id_2", name="notify",
                is_error=True),
    ],
    ToolRegistry([refund, notify]).specs(),
)


def _sent(name: str, **options) -> dict:
    vendor = VENDORS[name]
    with vendor.server([vendor.text("ok")]) as server:
        asyncio.run(vendor.client(server, **options).complete(CONVERSATION))
    [request] = server.requests
    assert request.path == server.path
    return request.body


def test_openai_chat_completions_body():
    assert _sent("openai", params={"temperature": 0}) == {
        "model": "stub-model",
        "temperature": 0,
        "messages": [
            {"role": "system", "content": "You run a shop."},
            {"role": "user", "content": "refund A-1 and tell them"},
            {"role": "assistant", "content": "On it.", "tool_calls": [
                {"id": "id_1", "type": "function",
                 "function": {"name": "refund", "arguments": '{"order_id": "A-1"}'}},
                {"id": "id_2", "type": "function",
                 "function": {"name": "notify", "arguments": '{"channel": "sms", "to": ["+4100"]}'}},
            ]},
            {"role": "tool", "tool_call_id": "id_1", "content": "refunded A-1"},
            {"role": "tool", "tool_call_id": "id_2", "content": "Error: ApprovalDenied: A person denied this call."},
        ],
        "tools": [
            {"type": "function",
             "function": {"name": "refund", "description": "Refund an order.", "parameters": REFUND_SCHEMA}},
            {"type": "function",
             "function": {"name": "notify", "description": "Tell the customer.", "parameters": NOTIFY_SCHEMA}},
        ],
    }


def test_anthropic_messages_body():
    assert _sent("anthropic", max_tokens=512, params={"temperature": 0}) == {
        "model": "stub-model",
        "max_tokens": 512,
        "temperature": 0,
        "system": "You run a shop.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "refund A-1 and tell them"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "On it."},
                {"type": "tool_use", "id": "id_1", "name": "refund", "input": {"order_id": "A-1"}},
                {"type": "tool_use", "id": "id_2", "name": "notify", "input": {"channel": "sms", "to": ["+4100"]}},
            ]},
            # one user turn holds every result of the assistant's turn, in order
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "id_1", "content": "refunded A-1"},
                {"type": "tool_result", "tool_use_id": "id_2", "content": "ApprovalDenied: A person denied this call.",
                 "is_error": True},
            ]},
        ],
        "tools": [
            {"name": "refund", "description": "Refund an order.", "input_schema": REFUND_SCHEMA},
            {"name": "notify", "description": "Tell the customer.", "input_schema": NOTIFY_SCHEMA},
        ],
    }


def test_a_request_without_tools_sends_no_tools_field():
    request = LLMRequest([Message("user", "hi")])
    for name in VENDORS:
        vendor = VENDORS[name]
        with vendor.server([vendor.text("ok")]) as server:
            asyncio.run(vendor.client(server).complete(request))
        assert "tools" not in server.bodies[0]


def test_importing_aaa_celery_needs_neither_sdk():
    code = (
        "import sys\n"
        "sys.modules['openai'] = None; sys.modules['anthropic'] = None  # as if not installed\n"
        "import aaa_celery, aaa_celery.llm, aaa_celery.runtime, aaa_celery.algos\n"
        "from aaa_celery.llm import OpenAIChatClient, AnthropicMessagesClient\n"
        "for cls, extra in ((OpenAIChatClient, 'openai'), (AnthropicMessagesClient, 'anthropic')):\n"
        "    try:\n"
        "        cls('m')\n"
        "    except ImportError as e:\n"
        "        assert f\"pip install 'aaa_celery[{extra}]'\" in str(e), e\n"
        "    else:\n"
        "        raise AssertionError('no ImportError')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_public_names_of_aaa_celery_llm_are_frozen():
    import inspect

    import aaa_celery.llm as llm
    from aaa_celery.llm import AnthropicMessagesClient, OpenAIChatClient

    assert sorted(llm.__all__) == sorted([
        "LLMClient", "LLMHandler", "LLMRequest", "LLMResponse", "Message", "ToolCall", "Usage", "LLMError",
        "FakeLLMClient", "fake", "OpenAIChatClient", "AnthropicMessagesClient",
    ])

    def defaults(cls: type) -> dict:
        return {k: p.default for k, p in inspect.signature(cls).parameters.items() if p.default is not p.empty}

    common = {"base_url": None, "timeout_s": 120.0, "max_retries": 4, "params": None}
    assert defaults(OpenAIChatClient) == {**common, "key_env": "OPENAI_API_KEY"}
    assert defaults(AnthropicMessagesClient) == {**common, "key_env": "ANTHROPIC_API_KEY", "max_tokens": 4096}
