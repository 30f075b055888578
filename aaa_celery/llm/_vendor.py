"""What the vendors' clients share: the key from the environment, the SDK client per
event loop, arguments parsing, unique tool-call ids and error wrapping.

The SDKs are imported lazily (in ``_sdk_module``), so importing aaa_celery needs neither.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import threading
import weakref
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from ..errors import ConfigError
from .types import LLMError, LLMRequest, LLMResponse, Message, ToolCall

#: What every vendor accepts as a tool-call id in the conversation it is sent back.
_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


class VendorClient:
    """The shared half of an ``LLMClient`` over a vendor's official async SDK.

    A subclass names its SDK (``sdk``, its async client class ``sdk_client``, the
    ``extra`` that installs it) and implements ``_create`` (one API call) and ``_response``.
    """

    sdk: str
    sdk_client: str
    extra: str
    vendor: str
    owned: tuple[str, ...] = ("model", "messages", "tools")
    """Request fields the client writes itself, which ``params`` may not set."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None,
        key_env: str,
        timeout_s: float,
        max_retries: int,
        params: Mapping[str, Any] | None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ConfigError(f"{type(self).__name__}: model must be the model's name, got {model!r}")
        if not timeout_s > 0:
            raise ConfigError(f"{type(self).__name__}: timeout_s must be > 0 seconds, got {timeout_s!r}")
        if not (isinstance(max_retries, int) and max_retries >= 0):
            raise ConfigError(f"{type(self).__name__}: max_retries must be an int >= 0, got {max_retries!r}")
        self.model = model
        self.base_url = base_url
        self.key_env = key_env
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.params = dict(params or {})
        if clash := sorted(set(self.params) & set(self.owned)):
            raise ConfigError(
                f"{type(self).__name__}: params[{clash[0]!r}]: the client sets {clash[0]!r} itself; "
                f"pass it as the constructor's argument or leave it out"
            )
        self._module = _sdk_module(self.sdk, type(self).__name__, self.extra)
        self._api_key = _key_from_env(key_env, type(self).__name__)
        self._build()  # a bad option fails here, not in the first run
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def _build(self) -> Any:
        return getattr(self._module, self.sdk_client)(
            api_key=self._api_key, base_url=self.base_url, timeout=self.timeout_s, max_retries=self.max_retries
        )

    async def _create(self, client: Any, request: LLMRequest) -> Any:
        raise NotImplementedError

    def _response(self, raw: Any, request: LLMRequest) -> LLMResponse:
        raise NotImplementedError

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Ask the model; the SDK retries 408, 409, 429 and 5xx answers and timeouts with
        exponential backoff (honouring ``Retry-After``) up to ``max_retries`` times.

        Raises:
            LLMError: the API failed the request for good (a 4xx, or retries exhausted).
        """
        try:
            raw = await self._create(self._sdk_client(), request)
        except self._module.APIError as e:
            status = getattr(e, "status_code", None)
            what = f"HTTP {status}" if status else type(e).__name__
            retried = status is None or status in (408, 409, 429) or status >= 500
            raise LLMError(
                f"{self.vendor} model {self.model!r}: {what}: {getattr(e, 'message', None) or e}"
                + (f" (after {self.max_retries} retries)" if retried else ""),
                vendor=self.vendor, model=self.model, status_code=status,
            ) from e
        return self._response(raw, request)

    def _sdk_client(self) -> Any:
        """The running event loop's SDK client: its pooled connections belong to the loop
        that opened them, so each loop gets its own, dropped with the loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.get(loop)
            if client is None:
                client = self._clients[loop] = self._build()
        return client

    def __repr__(self) -> str:
        return f"<{type(self).__name__} model={self.model!r} base_url={self.base_url!r} key from ${self.key_env}>"


def _sdk_module(name: str, owner: str, extra: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError(f"{owner} needs the {name} SDK: pip install 'aaa_celery[{extra}]'") from e


def _key_from_env(env: str, owner: str) -> str:
    key = os.environ.get(env, "")
    if not key:
        raise ConfigError(
            f"{owner}: no API key: set the environment variable {env} (for a server that needs no key, "
            f"e.g. Ollama or vLLM, any value) or name another variable with key_env=..."
        )
    return key


def arguments_of(name: str, raw: Any, *, text: bool) -> tuple[dict[str, Any], str | None]:
    """A model's tool-call arguments (JSON ``text``, else an object) as a dict, or
    ``({}, why)`` when they are malformed; the run turns ``why`` into a ``ToolArgsError`` fact.

    ``why`` names the problem (its kind, its position) and never quotes the model's text:
    it may hold a secret argument, and ``why`` is shown in events, pages and the store."""
    if text and isinstance(raw, str):
        if not raw.strip():
            return {}, None  # some servers send "" for a call without arguments
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            return {}, (f"{name}: the arguments are not valid JSON ({e.msg} at char {e.pos} of {len(raw)}, "
                        f"line {e.lineno} column {e.colno})")
    if not isinstance(raw, dict):
        return {}, f"{name}: the arguments must be a JSON object, got {type(raw).__name__}"
    return raw, None


def unique_calls(calls: list[ToolCall], request: LLMRequest) -> tuple[ToolCall, ...]:
    """The turn's calls, each with an id that is new in the conversation.

    The history sent back threads every result to its call by this id, so it must name
    one call only. A server that reuses an id (``call_0`` every turn), sends none, or
    sends one a vendor refuses to take back (Anthropic: ``[A-Za-z0-9_-]``) has that call
    renamed to a fresh id, deterministic in the conversation; the model sees that id in
    the history it is sent next.
    """
    seen = {c.id for m in request.messages for c in m.tool_calls}
    seen |= {m.tool_call_id for m in request.messages if m.tool_call_id}
    turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
    out = []
    for i, call in enumerate(calls, 1):
        if not _ID.fullmatch(call.id or "") or call.id in seen:
            n, fresh = 0, f"call_t{turn}_{i}"
            while fresh in seen:
                n += 1
                fresh = f"call_t{turn}_{i}_{n}"
            call = ToolCall(call.name, call.arguments, fresh, call.error)
        seen.add(call.id)
        out.append(call)
    return tuple(out)


def tool_function(spec: dict[str, Any], schema_key: str) -> dict[str, Any]:
    """A registry tool spec as a vendor's tool: name, description (when there is one) and
    the JSON schema of the arguments under ``schema_key``."""
    tool: dict[str, Any] = {"name": spec["name"]}
    if spec.get("description"):
        tool["description"] = spec["description"]
    tool[schema_key] = spec.get("parameters") or {"type": "object", "properties": {}}
    return tool


def tool_result_text(message: Message) -> str:
    """A tool message's text for a vendor without an error flag (the content names the error type)."""
    return f"Error: {message.content}" if message.is_error else message.content


__all__ = ["VendorClient", "arguments_of", "tool_function", "tool_result_text", "unique_calls"]
