"""Each vendor's wire format behind one face, so one test covers both clients.

A test takes the ``vendor`` fixture (parametrized over ``openai`` and ``anthropic``),
scripts the stub server with ``vendor.calls(...)`` / ``vendor.text(...)``, and reads
what the client sent back with ``vendor.results(body)``.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from aaa_celery.algos import ToolLoop
from aaa_celery.llm import AnthropicMessagesClient, LLMHandler, OpenAIChatClient
from aaa_celery.runtime import Engine
from aaa_celery.tools import ToolHandler, ToolRegistry

from ..conftest import unavailable
from .stub_server import Reply, StubModelServer, anthropic_reply, openai_reply


@dataclass(frozen=True)
class Raw:
    """Malformed arguments, sent as they are (JSON text for OpenAI, the ``input`` for Anthropic)."""

    value: Any


@dataclass(frozen=True)
class Result:
    """A tool result as the client sent it back to the model."""

    id: str
    content: str
    is_error: bool


@dataclass(frozen=True)
class Vendor:
    name: str
    key_env: str
    client_class: type

    def client(self, server: StubModelServer, **options: Any) -> Any:
        return self.client_class("stub-model", base_url=server.base_url, **options)

    def server(self, model: Callable[[dict[str, Any]], Reply] | list[Reply]) -> StubModelServer:
        return StubModelServer(self.name, model)  # type: ignore[arg-type]

    def text(self, text: str) -> Reply:
        return openai_reply(text=text) if self.name == "openai" else anthropic_reply(text)

    def calls(self, *calls: tuple[str, str, dict[str, Any] | Raw]) -> Reply:
        """A turn of tool calls ``(id, name, arguments)``."""
        if self.name == "openai":
            return openai_reply(tool_calls=[
                (i, n, a.value if isinstance(a, Raw) else json.dumps(a)) for i, n, a in calls
            ])
        return anthropic_reply(tool_uses=[(i, n, a.value if isinstance(a, Raw) else a) for i, n, a in calls])

    def results(self, body: dict[str, Any]) -> list[Result]:
        """The tool results that end the conversation in ``body``, in order."""
        messages = body["messages"]
        if self.name == "openai":
            tail = []
            for m in reversed(messages):
                if m["role"] != "tool":
                    break
                tail.insert(0, Result(m["tool_call_id"], m["content"], m["content"].startswith("Error: ")))
            return tail
        last = messages[-1]
        return [
            Result(b["tool_use_id"], b["content"], b.get("is_error", False))
            for b in last["content"] if b["type"] == "tool_result"
        ]

    def call_ids(self, body: dict[str, Any]) -> list[str]:
        """Every tool-call id of the assistant turns in ``body``."""
        if self.name == "openai":
            return [c["id"] for m in body["messages"] for c in m.get("tool_calls") or ()]
        return [b["id"] for m in body["messages"] if m["role"] == "assistant"
                for b in m["content"] if b["type"] == "tool_use"]


VENDORS = {
    "openai": Vendor("openai", "OPENAI_API_KEY", OpenAIChatClient),
    "anthropic": Vendor("anthropic", "ANTHROPIC_API_KEY", AnthropicMessagesClient),
}


@pytest.fixture(autouse=True, scope="session")
def sdks() -> None:
    """The vendors' SDKs (``pip install -e '.[dev]'``): missing, the tests skip locally and fail in CI."""
    missing = [name for name in ("openai", "anthropic") if importlib.util.find_spec(name) is None]
    if missing:
        unavailable(f"the {' and '.join(missing)} SDK is not installed: pip install -e '.[dev]'")


@pytest.fixture(autouse=True)
def api_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys come from the environment only; the vendors' own URL variables must not leak in."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-openai")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test-anthropic")
    for var in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(params=sorted(VENDORS))
def vendor(request: pytest.FixtureRequest) -> Vendor:
    return VENDORS[request.param]


def echo_results(vendor: Vendor, first: Reply) -> Callable[[dict[str, Any]], Reply]:
    """A model: ``first`` for the task, then a text answer joining every tool result it got."""

    def model(body: dict[str, Any]) -> Reply:
        results = vendor.results(body)
        return vendor.text(" | ".join(r.content for r in results)) if results else first

    return model


async def run_agent(client: Any, registry: ToolRegistry, task: str = "go") -> tuple[Any, Any]:
    """A full agent run on the embedded engine: the ``ToolLoop`` asks ``client``; the
    tools run as guarded Celery tasks on the in-process worker."""
    async with Engine() as engine:
        LLMHandler(client).attach(engine)
        ToolHandler(registry).attach(engine)
        handle = engine.start(ToolLoop(registry), {"task": task})
        outcome = await handle.result()
    return handle, outcome
