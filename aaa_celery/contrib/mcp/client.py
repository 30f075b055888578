"""A remote MCP server's tools as guarded tools: each remote ``tools/call`` is a guarded
call on the fleet.

The delivery of a remote tool, first match wins:

1. the operator's pin for the tool (``RemoteServer(pins={"refund": "at_most_once"})``);
2. the operator's pin for the whole server (``pins={"*": ...}``);
3. the server's annotations (:func:`~aaa_celery.contrib.mcp.annotations.delivery_for`),
   only for a server the operator trusts (``trusted=True``): the MCP spec says a client
   should never decide on annotations from an untrusted server;
4. ``at_most_once``, what the spec's defaults (destructive, not idempotent) mean.

An ``at_most_once`` remote call sends its request once. If the connection breaks after the
request went out (the server died, the network cut), nobody knows whether the effect
happened: the call ends ``OutcomeUnknown`` and is never sent again; a worker killed
mid-call ends the same way, through the guard's lease. An ``at_least_once`` remote call
(a read) sends it again on a broken connection, up to ``RemoteServer.tries`` times within
an attempt, and the guard runs a lost attempt again.

:class:`TasksExtension` is the client side of the tasks extension for the SDK's
``mcp.Client``: a ``tools/call`` answered with a task handle is polled with ``tasks/get``
until it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientSession

from ...config import Delivery, parse_delivery
from ...errors import ConfigError, OutcomeUnknown, ToolError
from ...tools import Tool
from ._wire import TASKS_EXTENSION, TERMINAL, CancelTaskRequest, CreateTaskResult, GetTaskRequest, GetTaskResult, TaskParams
from .annotations import Hints, annotate, delivery_for

__all__ = ["RemoteServer", "RemoteToolError", "TaskFailed", "TasksExtension", "cancel_task", "get_task",
           "remote_tool"]


class RemoteToolError(ToolError):
    """The remote tool answered with ``isError: true``."""


class TaskFailed(ToolError):
    """A remote task ended ``failed`` or ``cancelled``; ``error_type`` names the server's error."""

    def __init__(self, message: str, *, error_type: str | None = None, task_id: str | None = None) -> None:
        super().__init__(message)
        self.error_type, self.task_id = error_type, task_id


async def get_task(session: ClientSession, task_id: str) -> GetTaskResult:
    """``tasks/get``: the task as the server shows it now."""
    return await session.send_request(GetTaskRequest(params=TaskParams(taskId=task_id)), GetTaskResult)


async def cancel_task(session: ClientSession, task_id: str) -> None:
    """``tasks/cancel``: ask the server to cancel the task."""
    await session.send_request(CancelTaskRequest(params=TaskParams(taskId=task_id)), types.EmptyResult)


class TasksExtension(ClientExtension):
    """The tasks extension for ``mcp.Client(extensions=[TasksExtension()])``: advertises it,
    and turns a task handle into the call's final ``CallToolResult`` by polling ``tasks/get``
    (a ``failed`` or ``cancelled`` task raises :class:`TaskFailed`)."""

    identifier = TASKS_EXTENSION

    def __init__(self, *, timeout_s: float | None = None, poll_s: float = 0.2) -> None:
        self.timeout_s, self.poll_s = timeout_s, poll_s

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=CreateTaskResult, resolve=self._resolve),)

    async def _resolve(self, handle: CreateTaskResult, ctx: ClaimContext) -> types.CallToolResult:
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            task = await get_task(ctx.session, handle.task_id)
            if task.status in TERMINAL:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"task {handle.task_id} is still {task.status} after {self.timeout_s} s")
            await anyio.sleep(max(self.poll_s, (task.poll_interval_ms or 0) / 1000))
        if task.status == "completed" and task.result is not None:
            return types.CallToolResult.model_validate(task.result)
        raise TaskFailed(f"task {handle.task_id} ended {task.status}: {task.status_message or ''}",
                         error_type=task.error_type, task_id=handle.task_id)


@dataclass(frozen=True)
class RemoteServer:
    """A remote MCP server, as the operator configures it.

    Args:
        name: the operator's name for it; its tools are named ``<name>_<tool>`` here.
        url: its streamable HTTP endpoint (``http://host:port/mcp``).
        trusted: whether its annotations are believed (else every unpinned tool runs
            ``at_most_once``).
        pins: delivery by tool name, ``"*"`` for every tool; a pin beats the annotations.
        tries: how many times an ``at_least_once`` call sends its request within one attempt.
        timeout_s: how long one remote call may take.
    """

    name: str
    url: str
    trusted: bool = False
    pins: Mapping[str, str | Delivery] = field(default_factory=dict)
    tries: int = 3
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.name.replace("_", "").isalnum():
            raise ConfigError(f"RemoteServer.name: letters, digits and _ only, got {self.name!r}")
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"RemoteServer.url: an http(s) URL of the server's MCP endpoint, got {self.url!r}")
        if self.tries < 1:
            raise ConfigError(f"RemoteServer.tries: at least 1, got {self.tries}")
        for tool_name, pin in self.pins.items():
            if parse_delivery(pin) is None:
                raise ConfigError(f"RemoteServer.pins[{tool_name!r}]: a delivery, got {pin!r}")

    def delivery(self, tool_name: str, annotations: Any = None) -> Delivery:
        """The delivery of remote tool ``tool_name`` (see the module: pins, then trusted annotations)."""
        for key in (tool_name, "*"):
            if key in self.pins:
                pinned = parse_delivery(self.pins[key])
                assert pinned is not None  # checked in __post_init__
                return pinned
        if self.trusted:
            return delivery_for(Hints.from_wire(annotations))
        return Delivery.AT_MOST_ONCE

    async def list_tools(self) -> list[types.Tool]:
        """The server's tools, as it lists them (to build :func:`remote_tool` from)."""
        async with Client(self.url) as client:
            return list((await client.list_tools()).tools)


async def _call(server: RemoteServer, name: str, arguments: dict[str, Any], delivery: Delivery) -> Any:
    tries = server.tries if delivery == Delivery.AT_LEAST_ONCE else 1
    for attempt in range(1, tries + 1):
        sent = False
        try:
            async with Client(server.url, read_timeout_seconds=server.timeout_s, cache=None) as client:
                sent = True
                result = await client.call_tool(name, arguments)
        except Exception as e:  # noqa: BLE001 - a broken connection, a refused one, a timeout
            if attempt < tries:
                await anyio.sleep(min(2.0, 0.2 * 2 ** attempt))
                continue
            if sent and delivery == Delivery.AT_MOST_ONCE:
                raise OutcomeUnknown(f"{server.name}.{name}: the connection broke after the request was sent "
                                     f"({type(e).__name__}: {e}); whether it took effect is unknown") from e
            raise ToolError(f"{server.name}.{name}: the server did not answer: {type(e).__name__}: {e}") from e
        if result.is_error:
            text = " ".join(getattr(c, "text", "") for c in result.content)
            raise RemoteToolError(f"{server.name}.{name}: {text}")
        if result.structured_content is not None:
            return result.structured_content
        return " ".join(getattr(c, "text", "") for c in result.content)
    raise AssertionError("unreachable")  # pragma: no cover


def remote_tool(server: RemoteServer, name: str, *, annotations: Any = None, description: str = "",
                **tool_options: Any) -> Tool[..., Any]:
    """Remote tool ``name`` of ``server`` as a guarded :class:`~aaa_celery.tools.Tool`
    named ``<server.name>_<name>``, with one argument, ``arguments`` (the remote tool's
    arguments, passed on as they are). Its delivery is :meth:`RemoteServer.delivery`'s;
    ``annotations`` are the server's ``ToolAnnotations`` (believed only for a trusted server).
    ``tool_options`` go to :class:`~aaa_celery.tools.Tool` (``requires_approval``, ``pool``, ...).
    """
    if "delivery" in tool_options:
        raise ConfigError(f"remote_tool({name!r}): pin the delivery with RemoteServer(pins={{{name!r}: ...}})")
    delivery = server.delivery(name, annotations)

    def call(arguments: dict[str, Any]) -> Any:
        return anyio.run(_call, server, name, arguments, delivery)

    call.__name__ = f"{server.name}_{name}"
    t: Tool[..., Any] = Tool(call, name=f"{server.name}_{name}", description=description or f"{name} on {server.name}",
                             delivery=delivery.value, timeout_s=server.timeout_s * server.tries + 10,
                             **tool_options)
    if server.trusted and annotations is not None:
        hints = Hints.from_wire(annotations)
        pinned = delivery != delivery_for(hints)
        if not pinned and not (hints.read_only and t.requires_approval):
            annotate(t, hints)
    return t


def remote_tools(server: RemoteServer, listing: Sequence[types.Tool],
                 options: Callable[[types.Tool], dict[str, Any]] | None = None) -> list[Tool[..., Any]]:
    """Every tool of a listing (:meth:`RemoteServer.list_tools`) as :func:`remote_tool`."""
    return [remote_tool(server, t.name, annotations=t.annotations, description=t.description or "",
                        **(options(t) if options else {})) for t in listing]
