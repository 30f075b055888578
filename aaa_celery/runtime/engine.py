"""The engine shim: drive an agent run in the app process, run its tools on Celery.

``Engine()`` is the embedded default: an in-process Celery worker thread on the
in-memory broker, with the in-memory store, so nothing needs a server.
``Engine(app=celery_app)`` drives a real fleet: tool calls leave as guarded
Celery tasks (task id ``<run id>:<call id>``) and come back as facts.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from celery import Celery

from ..errors import ApprovalDenied, ConfigError, ToolArgsError
from ..llm.types import LLMRequest, LLMResponse, ToolCall
from ..stores.base import Store
from ..stores.memory import MemoryStore
from ..tools.handler import ToolHandler, task_name
from ..tools.registry import ToolRegistry
from ..tools.tool import Tool
from ..worker.stores import app_store, use_store
from ..worker.task import CALL_HEADER, RUN_HEADER, TENANT_HEADER
from .results import ToolFact, fact_from_celery, failed

APPROVAL_GRANTED = "aaa.approval.granted"
APPROVAL_DENIED = "aaa.approval.denied"


@dataclass
class RunOutcome:
    """How a run ended: ``value`` is what the algorithm returned."""

    run_id: str
    status: str
    value: Any = None
    error: str | None = None


@dataclass
class PendingApproval:
    """A call waiting for a person: shown with its tool, arguments, run and age."""

    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    since: float
    _future: asyncio.Future[bool] = field(repr=False, default=None)  # type: ignore[assignment]


class _ToolExecutor:
    """One per engine: the merged tools of every attached handler."""

    def __init__(self) -> None:
        self.registry = ToolRegistry()
        self.handlers: dict[str, ToolHandler] = {}

    def add(self, handler: ToolHandler) -> list[Tool]:
        handler.check()
        added = []
        for t in handler.registry:
            existing = self.registry.get(t.name)
            if existing is not None and existing is not t:
                raise ConfigError(
                    f"attach(): tool name {t.name!r} is already taken on this engine by a different "
                    "tool; rename one with @tool(name=...)"
                )
            if existing is None:
                self.registry.add(t)
                self.handlers[t.name] = handler
                added.append(t)
        return added


class Engine:
    """Runs algorithms; sends their tool calls to Celery workers as guarded tasks."""

    def __init__(
        self,
        app: Celery | None = None,
        *,
        store: Store | None = None,
        concurrency: int = 4,
        poll_s: float = 0.02,
    ) -> None:
        self.embedded = app is None
        self.id = uuid.uuid4().hex[:8]
        self.app = app if app is not None else self._embedded_app()
        if store is not None:
            use_store(self.app, store)
        self.concurrency = concurrency
        self.poll_s = poll_s
        self.llm: Any = None
        self.tools = _ToolExecutor()
        self.runs: dict[str, RunHandle] = {}
        self._worker: Any = None
        self._thread: threading.Thread | None = None
        self._queue_prefix = f"aaa-embedded-{self.id}." if self.embedded else "aaa."

    def _embedded_app(self) -> Celery:
        app = Celery(f"aaa-embedded-{self.id}", broker="memory://", backend="cache+memory://", set_as_current=False)
        app.conf.update(
            aaa_store_url="memory://",
            task_serializer="json",
            result_serializer="json",
            accept_content=["json"],
            worker_prefetch_multiplier=1,
            task_default_queue=f"aaa-embedded-{self.id}",
            aaa_recovery_interval_s=1.0,
            broker_transport_options={"polling_interval": 0.05},
        )
        use_store(app, MemoryStore())
        return app

    @property
    def store(self) -> Store:
        """The store that guards this engine's calls (for its audit trail)."""
        return app_store(self.app)

    # -- lifecycle -------------------------------------------------------------
    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for handle in list(self.runs.values()):
            if not handle.done:
                handle._task.cancel()
        await asyncio.to_thread(self._stop_worker)

    def _ensure_worker(self) -> None:
        if not self.embedded or self._worker is not None:
            return
        from celery.contrib.testing.worker import TestWorkController

        self.app.finalize()
        # The threads pool resolves tasks through Celery's default app.
        self.app.set_default()
        queues = [q.name for q in self.app.conf.task_queues or []] or [self.app.conf.task_default_queue]
        worker = TestWorkController(
            app=self.app,
            concurrency=self.concurrency,
            pool="threads",
            hostname=f"aaa-embedded-{self.id}@localhost",
            loglevel="WARNING",
            queues=queues,
            ready_callback=None,
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
        )
        self._thread = threading.Thread(target=worker.start, name=f"aaa-embedded-{self.id}", daemon=True)
        self._thread.start()
        worker.ensure_started()
        self._worker = worker

    def _stop_worker(self) -> None:
        if self._worker is None:
            return
        self._worker.stop(in_sighandler=False)
        if self._thread is not None:
            # Celery's sync loop polls the in-memory broker in 2 s slices; the stopped
            # worker's daemon thread ends on its own at the next one, owning nothing.
            self._thread.join(0.2)
        self._worker = self._thread = None

    # -- tools -----------------------------------------------------------------
    def attach_tools(self, handler: ToolHandler) -> None:
        """Merge ``handler``'s tools into this engine's one executor and bind them."""
        added = self.tools.add(handler)
        if self.embedded:
            handler.bind(self.app, queue_prefix=self._queue_prefix, engine=self)
        else:
            handler.bind(self.app)
        if self._worker is not None and added:
            consumer = self._worker.consumer
            consumer.update_strategies()
            for t in added:
                consumer.add_task_queue(handler.queue_for(t, self._queue_prefix))

    # -- runs ------------------------------------------------------------------
    def start(self, algo: Any, input: Any, *, tenant: str | None = None, run_id: str | None = None) -> RunHandle:
        """Start a run; returns at once with its handle."""
        if self.llm is None:
            raise ConfigError("Engine: no model attached; call LLMHandler(client).attach(engine) first")
        self._ensure_worker()
        handle = RunHandle(self, run_id or f"run_{uuid.uuid4().hex[:12]}", tenant)
        self.runs[handle.run_id] = handle
        handle._task = asyncio.get_running_loop().create_task(handle._drive(algo, input))
        return handle

    async def run(self, algo: Any, input: Any, **kwargs: Any) -> RunOutcome:
        """Start a run and wait for its outcome."""
        return await self.start(algo, input, **kwargs).result()

    def pending_approvals(self) -> list[PendingApproval]:
        return [p for h in self.runs.values() for p in h.pending_approvals()]

    async def _send(self, handle: RunHandle, call: ToolCall, t: Tool) -> ToolFact:
        task = self.app.tasks[task_name(t.name)]
        task_id = f"{handle.run_id}:{call.id}"
        headers = {RUN_HEADER: handle.run_id, CALL_HEADER: call.id}
        if handle.tenant:
            headers[TENANT_HEADER] = handle.tenant
        result = await asyncio.to_thread(
            task.apply_async, kwargs={"arguments": dict(call.arguments)}, task_id=task_id, headers=headers
        )
        delay = self.poll_s
        while True:
            fact = fact_from_celery(call.id, t.name, result.state, result.result)
            if fact is not None:
                return fact
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)


class RunHandle:
    """A running algorithm: its id, events, approvals and outcome."""

    def __init__(self, engine: Engine, run_id: str, tenant: str | None) -> None:
        self.engine = engine
        self.run_id = run_id
        self.tenant = tenant
        self._events: list[dict[str, Any]] = []
        self._approvals: dict[str, PendingApproval] = {}
        self._task: asyncio.Task[RunOutcome] = None  # type: ignore[assignment]

    @property
    def done(self) -> bool:
        return self._task is not None and self._task.done()

    def emit(self, type: str, data: dict[str, Any]) -> None:
        self._events.append({"type": type, "run_id": self.run_id, "data": data, "at": time.time()})

    def events(self) -> list[dict[str, Any]]:
        """Every ``aaa.*`` event of the run so far, in order."""
        return list(self._events)

    async def result(self) -> RunOutcome:
        return await asyncio.shield(self._task)

    def pending_approvals(self) -> list[PendingApproval]:
        return [p for p in self._approvals.values() if not p._future.done()]

    def signal(self, type: str, data: dict[str, Any]) -> None:
        """Deliver an app-side signal, such as ``aaa.approval.granted {"call_id": ...}``.

        Approvals come only through here, from the app (a person), never from the model.
        """
        if type not in (APPROVAL_GRANTED, APPROVAL_DENIED):
            self.emit(type, dict(data))
            return
        call_id = data.get("call_id")
        pending = self._approvals.get(call_id)  # type: ignore[arg-type]
        if pending is None or pending._future.done():
            raise KeyError(f"no pending approval for call_id {call_id!r} in run {self.run_id}")
        if "arguments" in data and data["arguments"] != pending.arguments:
            raise ValueError(f"approval for {call_id!r} names other arguments than the ones shown")
        self.emit(type, {"call_id": call_id, "tool": pending.tool})
        pending._future.get_loop().call_soon_threadsafe(pending._future.set_result, type == APPROVAL_GRANTED)

    # -- what the algorithm calls ---------------------------------------------
    async def complete(self, request: LLMRequest) -> LLMResponse:
        response: LLMResponse = await self.engine.llm.complete(request)
        self.emit("aaa.llm.completed", {"text": response.text, "tool_calls": len(response.tool_calls)})
        return response

    async def call_tools(self, calls: tuple[ToolCall, ...] | list[ToolCall]) -> list[ToolFact]:
        """Run the calls concurrently; each ends as one fact, never an exception."""
        return list(await asyncio.gather(*(self._call(c) for c in calls)))

    async def _call(self, call: ToolCall) -> ToolFact:
        self.emit("aaa.tool.requested", {"call_id": call.id, "name": call.name, "arguments": call.arguments})
        fact = await self._execute(call)
        self.emit(fact.event_type, fact.event_data())
        return fact

    async def _execute(self, call: ToolCall) -> ToolFact:
        t = self.engine.tools.registry.get(call.name)
        if t is None:
            known = ", ".join(sorted(x.name for x in self.engine.tools.registry)) or "none"
            return failed(call.id, call.name, ToolArgsError(f"unknown tool {call.name!r}; the tools are: {known}"))
        if t.requires_approval and not await self._approved(call, t):
            return failed(call.id, t.name, ApprovalDenied("denied by a person"))
        try:
            return await self.engine._send(self, call, t)
        except Exception as e:  # noqa: BLE001 - a broken send is a fact for the model, not a crash
            return failed(call.id, t.name, e)

    async def _approved(self, call: ToolCall, t: Tool) -> bool:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._approvals[call.id] = PendingApproval(
            self.run_id, call.id, t.name, dict(call.arguments), time.time(), future
        )
        self.emit("aaa.approval.requested", {"call_id": call.id, "name": t.name, "arguments": call.arguments})
        return await future

    async def _drive(self, algo: Any, input: Any) -> RunOutcome:
        self.emit("aaa.run.started", {"input": input, "tenant": self.tenant})
        try:
            value = await algo.run(self, input)
        except Exception as e:
            self.emit("aaa.run.failed", {"error": type(e).__name__, "message": str(e)})
            return RunOutcome(self.run_id, "failed", error=f"{type(e).__name__}: {e}")
        self.emit("aaa.run.completed", {"value": value})
        return RunOutcome(self.run_id, "completed", value)
