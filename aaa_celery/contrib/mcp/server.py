"""A guarded MCP server: a :class:`~aaa_celery.tools.ToolHandler`'s tools served over MCP,
each ``tools/call`` a guarded call on the Celery fleet.

Built on the official ``mcp`` SDK's low-level ``Server`` (streamable HTTP and stdio).
The SDK (2.x) ships the extension surface of SEP-2133 but no tasks extension, so this
module serves ``io.modelcontextprotocol/tasks`` (SEP-2663) itself, through the SDK's
public ``add_request_handler``: a client that lists the extension in its capabilities
gets a task handle for its ``tools/call``, then polls ``tasks/get`` and may send
``tasks/cancel``. Every state comes from the guard's store, which is the truth:

=================================  ==========================================================
the guard                          the MCP task
=================================  ==========================================================
the call id                        ``taskId``
waiting for an operator's approval ``input_required``
sent, running, or lost and         ``working``
brought back by recovery
a recorded success                 ``completed``, ``result`` a ``CallToolResult``
a tool's own error                 ``completed``, ``result`` with ``isError: true``
``OutcomeUnknown`` /               ``failed``, ``error.data.type`` names it
``ExecutionAbandoned``
revoked (``tasks/cancel``)         ``cancelled``
=================================  ==========================================================

"The same call" is one call id, minted with :func:`aaa_celery.protocol.call_id` from the
server's tenant and run id and a digest of: the tool's name, its canonical arguments
(secrets left out), and the request's scope: the client's own request key in
``_meta["io.github.aaa-celery/call-key"]`` when it sends one, else the MCP session id
when the transport has one (``Mcp-Session-Id``), else nothing. A client that retries a
``tools/call`` (a lost response, a reconnect) therefore gets the same task and never a
second effect; a client that means to run the same tool with the same arguments again
sends a new call key.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from ...errors import ConfigError, ToolArgsError
from ...lifecycle import STARTED
from ...protocol import arguments_digest, call_id, parse_call_id
from ...stores.runs import RunRecord, run_key
from ...tools import Tool, ToolHandler
from ...tools.handler import store_of
from ._wire import TASKS_EXTENSION, TaskParams, UpdateParams
from .annotations import advertised, hints_of

if TYPE_CHECKING:
    from celery import Celery
    from starlette.applications import Starlette

__all__ = ["CALL_KEY_META", "LOSS_ERRORS", "TASKS_EXTENSION", "GuardedMCPServer"]

#: The ``_meta`` key of a client's own request key (what makes two requests one call).
CALL_KEY_META = "io.github.aaa-celery/call-key"
#: The guard's errors that end a task ``failed``: nobody knows whether the effect happened.
LOSS_ERRORS = frozenset({"OutcomeUnknown", "ExecutionAbandoned"})
#: The JSON-RPC error code of a failed task (MCP leaves -32000..-32019 to implementations).
LOSS_CODE = -32001
_REVOKED = "TaskRevokedError"
#: The run record's entries of a held call (beside the decision, keyed by the call id).
_HELD, _SENT = "held", "sent"
_INVALID_PARAMS = -32602


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def tool_result(value: Any, *, error: str | None = None, message: str = "") -> dict[str, Any]:
    """A ``CallToolResult`` wire dict of a recorded success (``value``) or a tool's error."""
    if error is not None:
        text = f"{error}: {message}" if message else error
        return {"resultType": "complete", "content": [{"type": "text", "text": text}], "isError": True,
                "structuredContent": {"error": error, "message": message}}
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return {"resultType": "complete", "content": [{"type": "text", "text": text}],
            "structuredContent": {"result": value}, "isError": False}


class GuardedMCPServer:
    """Serve a bound :class:`~aaa_celery.tools.ToolHandler`'s tools over MCP.

    Args:
        handler: the tools, bound to ``app`` (``handler.bind(app)``) in this process and
            in the workers, which import the same module.
        app: the Celery app whose fleet runs the calls, and whose store the guard uses.
        name: the server's name, as MCP clients see it.
        tenant: the tenant of every call (None: no tenant).
        run_id: the run the calls belong to (a part of each call id; see the module).
        wait_s: how long a ``tools/call`` without the tasks extension waits for its
            result before it answers "still running" (the client may call again: same call).
        poll_s: how often the store is read while a call runs.
    """

    def __init__(self, handler: ToolHandler, app: Celery, *, name: str = "aaa_celery", tenant: str | None = None,
                 run_id: str = "mcp", wait_s: float = 300.0, poll_s: float = 0.2) -> None:
        if not isinstance(handler, ToolHandler):
            raise ConfigError("GuardedMCPServer: handler must be a ToolHandler of the tools to serve")
        if wait_s <= 0 or poll_s <= 0:
            raise ConfigError(f"GuardedMCPServer: wait_s and poll_s must be positive seconds, got {wait_s}, {poll_s}")
        for t in handler.registry:
            handler.task(t.name)  # bound to an app: else ConfigError names the fix
            if "delivery" not in t.guard_overrides and "delivery" not in handler.guard.model_fields_set:
                raise ConfigError(
                    f"GuardedMCPServer: tool {t.name!r} has no delivery of its own, and an MCP tool's default "
                    "annotations (destructive, not idempotent) mean at_most_once: declare its annotations with "
                    f"aaa_celery.contrib.mcp.annotate({t.name}, ...) where it is defined, or give it "
                    "@tool(delivery=...)")
        call_id(tenant, run_id, "check")  # an unusable tenant or run id fails here
        self.handler, self.app, self.tenant, self.run_id = handler, app, tenant, run_id
        self.wait_s, self.poll_s = wait_s, poll_s
        #: Calls waiting for approval in this process: call id -> (tool, arguments).
        self._held: dict[str, tuple[Tool[..., Any], dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self.server: Server[Any] = Server(name, on_list_tools=self._list_tools)
        self.server.add_request_handler("tools/call", types.CallToolRequestParams, self._call_tool)
        self.server.add_request_handler("tasks/get", TaskParams, self._tasks_get)
        self.server.add_request_handler("tasks/cancel", TaskParams, self._tasks_cancel)
        self.server.add_request_handler("tasks/update", UpdateParams, self._tasks_update)
        self.server.extensions[TASKS_EXTENSION] = {}

    # -- the operator's verbs ----------------------------------------------------------------

    @property
    def store(self) -> Any:
        return store_of(self.app)

    def approve(self, task_id: str, *, by: str, note: str = "") -> bool:
        """Grant the held call ``task_id`` (a person's decision, never the client's); True if
        this decision is the one recorded. The call is sent at its next ``tasks/get`` or
        retried ``tools/call``."""
        return self._decide(task_id, "granted", by, note)

    def deny(self, task_id: str, *, by: str, note: str = "") -> bool:
        """Deny the held call ``task_id``; it ends ``failed`` (``ApprovalDenied``)."""
        return self._decide(task_id, "denied", by, note)

    def _decide(self, task_id: str, state: str, by: str, note: str) -> bool:
        if not self.owns(task_id):
            raise ValueError(f"{task_id[:200]!r} is not a call of this server (tenant {self.tenant!r}, "
                             f"run {self.run_id!r})")
        decision = {"state": state, "by": by, "note": note, "at": time.time()}
        return self._record(task_id, task_id, decision)

    def _record(self, task_id: str, what: str, data: dict[str, Any]) -> bool:
        """Record ``data`` as ``what`` of ``task_id`` in the store, first writer wins (the run
        record's decisions: ``what`` is the call id for a person's decision, ``held`` for the
        held call, ``sent`` for the one sending of a granted call); True if this write won."""
        store, key = self.store, run_key(self.tenant, self.run_id)
        if store.get_run(key) is None:
            now = time.time()
            store.put_run(RunRecord(self.run_id, self.tenant, algo="mcp", status="completed",
                                    started_at=now, updated_at=now))
        return bool(store.decide_approval(key, task_id, what, data))

    def decision(self, task_id: str) -> dict[str, Any] | None:
        """The recorded approval decision of ``task_id``, if any."""
        found = self.store.approval_decision(run_key(self.tenant, self.run_id), task_id, task_id)
        return dict(found) if found else None

    # -- identity ----------------------------------------------------------------------------

    def call_id_for(self, t: Tool[..., Any], arguments: dict[str, Any], scope: str = "") -> str:
        """The call id of ``t`` with ``arguments`` in ``scope`` (see the module: "the same call")."""
        return call_id(self.tenant, self.run_id, f"mcp.{arguments_digest(t.name, [scope, t.identity(arguments)])}")

    @staticmethod
    def scope_of(ctx: ServerRequestContext[Any, Any]) -> str:
        """A request's scope: the client's call key, else the MCP session id, else none."""
        meta = ctx.meta or {}
        key = meta.get(CALL_KEY_META) if isinstance(meta, Mapping) else None
        if isinstance(key, str) and key:
            return f"key:{key}"
        request = ctx.request
        headers = getattr(request, "headers", None)
        session = headers.get("mcp-session-id") if headers is not None else None
        return f"session:{session}" if session else ""

    @staticmethod
    def wants_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
        """Whether the request's client listed the tasks extension in its capabilities (on a
        2026-07-28 or later connection: an older wire has no extension results)."""
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return False
        caps = getattr(ctx.session, "client_capabilities", None)
        extensions = getattr(caps, "extensions", None) or {}
        return TASKS_EXTENSION in extensions

    # -- tools/list ----------------------------------------------------------------------------

    def tools(self) -> list[types.Tool]:
        """The served tools, each with the annotations its guard config implies."""
        listed = []
        for t in self.handler.registry:
            hints = advertised(self.handler.config_for(t), hints_of(t))
            listed.append(types.Tool(
                name=t.name, description=t.description or None, input_schema=t.schema,
                annotations=types.ToolAnnotations.model_validate(hints.to_wire()),
                _meta={"io.github.aaa-celery/delivery": self.handler.config_for(t).delivery.value,
                       "io.github.aaa-celery/requiresApproval": t.requires_approval},
            ))
        return listed

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any],
                          params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools())

    # -- tools/call ----------------------------------------------------------------------------

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> Any:
        t = self.handler.registry.get(params.name)
        if t is None:
            raise MCPError(_INVALID_PARAMS, f"unknown tool {params.name!r}")
        arguments = dict(params.arguments or {})
        try:
            t.check(arguments, self.handler.guards)
        except ToolArgsError as e:
            return tool_result(None, error="ToolArgsError", message=str(e))
        task_id = self.call_id_for(t, arguments, self.scope_of(ctx))
        held = await anyio.to_thread.run_sync(self._start, t, arguments, task_id)
        if self.wants_tasks(ctx):
            view = await anyio.to_thread.run_sync(self.task, task_id)
            view.pop("result", None), view.pop("error", None), view.pop("inputRequests", None)
            return {**view, "resultType": "task"}
        if held:
            return tool_result(None, error="AwaitingApproval",
                               message=f"call {task_id} waits for a person's approval; call again once approved")
        return await self._wait(task_id)

    def _start(self, t: Tool[..., Any], arguments: dict[str, Any], task_id: str) -> bool:
        """Send the call unless it waits for approval; True if it is held."""
        if t.requires_approval:
            decision = self.decision(task_id)
            if decision is None or decision.get("state") != "granted":
                self._hold(t, arguments, task_id)
                return True
        self._send(t, arguments, task_id)
        return False

    def _hold(self, t: Tool[..., Any], arguments: dict[str, Any], task_id: str) -> None:
        """Keep a call that waits for approval: in this process, and (for a tool without
        secret parameters) in the store, so that any replica of the server, or this one
        restarted, sends it once it is granted."""
        with self._lock:
            self._held[task_id] = (t, arguments)
        if not t.secrets:
            canonical = t.check(arguments, self.handler.guards).canonical
            self._record(task_id, _HELD, {"tool": t.name, "arguments": canonical})

    def _held_call(self, task_id: str) -> tuple[Tool[..., Any], dict[str, Any]] | None:
        with self._lock:
            found = self._held.get(task_id)
        if found is not None:
            return found
        kept = self.store.approval_decision(run_key(self.tenant, self.run_id), task_id, _HELD)
        t = self.handler.registry.get(kept["tool"]) if kept else None
        return (t, dict(kept["arguments"])) if t is not None and kept else None

    def _send(self, t: Tool[..., Any], arguments: dict[str, Any], task_id: str) -> None:
        """Publish the call under its id, unless the store knows it ran already. A second
        copy of a known call is harmless (the guard drops it, or answers its result)."""
        store = self.store
        if store.result(task_id) is not None or store.events(task_id):
            return
        self.handler.task(t.name).apply_async(arguments, task_id=task_id)

    async def _wait(self, task_id: str) -> dict[str, Any]:
        with anyio.move_on_after(self.wait_s):
            while True:
                view = await anyio.to_thread.run_sync(self.task, task_id)
                if view["status"] in ("completed", "failed", "cancelled"):
                    break
                await anyio.sleep(self.poll_s)
        if view["status"] == "completed":
            return dict(view["result"])
        if view["status"] in ("failed", "cancelled"):
            error = view.get("error") or {"message": "cancelled", "data": {"type": _REVOKED}}
            data = error.get("data") or {}
            return tool_result(None, error=str(data.get("type", "failed")), message=str(error.get("message", "")))
        return tool_result(None, error="StillRunning",
                           message=f"call {task_id} is still running; call again for its result")

    # -- tasks ---------------------------------------------------------------------------------

    def task(self, task_id: str) -> dict[str, Any]:
        """The task ``task_id`` as ``tasks/get`` shows it, read from the store."""
        store = self.store
        outcome = store.result(task_id)
        events = store.events(task_id)
        attempts = sum(1 for e in events if e.type == STARTED)
        created = events[0].at if events else time.time()
        updated = events[-1].at if events else created
        view: dict[str, Any] = {"taskId": task_id, "createdAt": _iso(created), "lastUpdatedAt": _iso(updated),
                                "ttlMs": None, "pollIntervalMs": max(1, round(self.poll_s * 1000))}
        if outcome is not None:
            if outcome.ok:
                return {**view, "status": "completed", "result": tool_result(outcome.value),
                        "statusMessage": f"completed by attempt {outcome.attempt}"}
            if outcome.error == _REVOKED:
                return {**view, "status": "cancelled", "statusMessage": outcome.message or "cancelled"}
            if outcome.error in LOSS_ERRORS:
                return {**view, "status": "failed", "statusMessage": f"{outcome.error}: {outcome.message}",
                        "error": {"code": LOSS_CODE, "message": f"{outcome.error}: {outcome.message}",
                                  "data": {"type": outcome.error, "callId": task_id, "attempt": outcome.attempt}}}
            return {**view, "status": "completed", "statusMessage": f"the tool failed: {outcome.error}",
                    "result": tool_result(None, error=outcome.error or "ToolError", message=outcome.message)}
        held = self._held_call(task_id) if not events else None
        if held is not None:
            decision = self.decision(task_id)
            state = (decision or {}).get("state")
            if state == "denied" and decision and decision.get("by") == "tasks/cancel":
                return {**view, "status": "cancelled", "statusMessage": "cancelled by the client before approval"}
            if state == "denied":
                message = f"ApprovalDenied: denied by {decision.get('by')}" if decision else "ApprovalDenied"
                return {**view, "status": "failed", "statusMessage": message,
                        "error": {"code": LOSS_CODE, "message": message,
                                  "data": {"type": "ApprovalDenied", "callId": task_id}}}
            if state != "granted":
                return {**view, "status": "input_required", "inputRequests": {},
                        "statusMessage": "waiting for a person's approval (the operator's API decides, "
                                         "never tasks/update)"}
            if self._record(task_id, _SENT, {"at": time.time()}):  # one replica sends it, once
                self._send(*held, task_id)
            with self._lock:
                self._held.pop(task_id, None)
        message = f"attempt {attempts} running" if attempts else "no attempt yet: sent, waiting for a worker"
        return {**view, "status": "working", "statusMessage": message}

    def owns(self, task_id: str) -> bool:
        """Whether ``task_id`` is a call this server minted: its tenant, its run, its prefix.
        ``tasks/get`` and ``tasks/cancel`` of any other id are refused before the store is
        asked, so a client never reads or cancels another tenant's (or run's) call."""
        identity = parse_call_id(task_id)
        return (identity is not None and identity.tenant == self.tenant and identity.run_id == self.run_id
                and identity.local.startswith("mcp."))

    def _owned(self, task_id: str) -> str:
        if not self.owns(task_id):
            raise MCPError(_INVALID_PARAMS, f"unknown task {task_id[:200]!r}")
        return task_id

    async def _tasks_get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        view = await anyio.to_thread.run_sync(self.task, self._owned(params.task_id))
        return {**view, "resultType": "complete"}

    async def _tasks_cancel(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> dict[str, Any]:
        await anyio.to_thread.run_sync(self.cancel, self._owned(params.task_id))
        return {"resultType": "complete"}

    async def _tasks_update(self, ctx: ServerRequestContext[Any, Any], params: UpdateParams) -> dict[str, Any]:
        raise MCPError(_INVALID_PARAMS, "this server asks no input through tasks/update: an approval is a "
                                        "person's decision, made through the operator's API")

    def cancel(self, task_id: str) -> None:
        """Revoke the call (a running attempt is terminated, and its late result fenced:
        the revocation is the call's recorded result); a held call is denied."""
        if not self.store.events(task_id) and self._held_call(task_id) is not None:
            self._decide(task_id, "denied", "tasks/cancel", "cancelled by the client")
            return
        self.app.control.revoke(task_id, terminate=True)

    # -- transports ------------------------------------------------------------------------------

    def streamable_http_app(self, **options: Any) -> Starlette:
        """The ASGI app serving MCP over streamable HTTP at ``/mcp`` (``options``: the SDK's
        ``Server.streamable_http_app`` options)."""
        return self.server.streamable_http_app(**options)

    async def run_stdio(self) -> None:
        """Serve MCP over this process's stdin and stdout until the client closes them."""
        from mcp.server.stdio import stdio_server

        async with stdio_server() as (read, write):
            await self.server.run(read, write, self.server.create_initialization_options())
