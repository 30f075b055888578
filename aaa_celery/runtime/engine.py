"""The engine shim: drive an agent run in the app process, run its tools on Celery.

``Engine()`` is the embedded default: an in-process Celery worker thread on the
in-memory broker, with the in-memory store, so nothing needs a server.
``Engine(app=celery_app)`` drives a real fleet: tool calls leave as guarded
Celery tasks (task id ``<run id>:<call id>``, so re-sending a call is
deduplicated by the guard), go to their pool's queue ``aaa.<pool>``, and come
back through the result backend as ``aaa.tool.completed`` / ``aaa.tool.failed``
facts.

Pools: each engine lets at most ``pools[name]`` calls of a pool be in flight at
once (``ToolHandler(pools={"default": 8, "slow": 2})``). On a fleet, give each
pool its own workers, sized alike, so the bound holds for every engine::

    celery -A proj worker -Q aaa.default -c 8 -n default@%h
    celery -A proj worker -Q aaa.slow -c 2 -n slow@%h

A tool that waits on a child run (delegation) holds a slot of *its* pool only;
the child's calls go to their own pools' queues and workers, so a saturated
supervisor pool can never starve the pool its children need. The embedded
worker reserves threads for every pool the same way.

The engine is asyncio. From synchronous code (a Flask or Django view) use
:class:`~aaa_celery.runtime.SyncEngine` (or ``engine.start_sync()``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import dataclasses
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery import Celery

from ..errors import ApprovalDenied, ConfigError, ToolArgsError
from ..llm.types import LLMRequest, LLMResponse, ToolCall
from ..protocol import RUN_HEADER, TENANT_HEADER, TOOL_CALL_HEADER, call_id_for, task_name
from ..tools.handler import ToolHandler, store_of, use_store
from ..tools.registry import ToolRegistry
from ..tools.tool import Tool
from .approvals import (
    APPROVAL_DENIED,
    APPROVAL_GRANTED,
    APPROVAL_REQUESTED,
    DENIED_MESSAGE,
    PendingApproval,
    digest,
)
from .embedded import EmbeddedWorker, embedded_app
from .results import ToolFact, fact_from_celery, failed

if TYPE_CHECKING:
    from ..stores import Store
    from .sync import SyncEngine

#: The concurrency of a pool that no handler sized (``ToolHandler(pools=...)``).
DEFAULT_POOL_SIZE = 8


@dataclass
class RunOutcome:
    """How a run ended: ``status`` is ``completed`` or ``failed``; ``value`` is what the
    algorithm returned, ``error`` the ``<type>: <message>`` of a failed run."""

    run_id: str
    status: str
    value: Any = None
    error: str | None = None


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
    """Runs algorithms in this process; sends their tool calls to Celery workers as guarded tasks.

    Args:
        app: the Celery app of the fleet; ``None`` for the embedded default (an
            in-process worker on the in-memory broker and store).
        store: a store object to use in this process instead of ``aaa_store_url``.
        concurrency: embedded only: the least number of worker threads; the
            worker has at least the sum of the pools' sizes, so each pool has
            threads of its own.
        poll_s: first interval, in seconds, between result checks of a call
            (it grows to 0.5 s while the call runs).
    """

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
        self.app = app if app is not None else embedded_app(self.id)
        if store is not None:
            use_store(self.app, store)
        self.concurrency = concurrency
        self.poll_s = poll_s
        self.llm: Any = None
        self.tools = _ToolExecutor()
        self.runs: dict[str, RunHandle] = {}
        self.pool_sizes: dict[str, int] = {}
        self._limits: dict[str, asyncio.Semaphore] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: EmbeddedWorker | None = None
        self._queue_prefix = f"aaa-embedded-{self.id}." if self.embedded else "aaa."

    @property
    def store(self) -> Store:
        """The store that guards this engine's calls (for its audit trail)."""
        return store_of(self.app)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop this engine's runs live on (set by the first ``start``)."""
        return self._loop

    # -- lifecycle -------------------------------------------------------------
    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel the runs still going and stop the embedded worker."""
        for handle in list(self.runs.values()):
            if not handle.done:
                handle._task.cancel()
        await asyncio.to_thread(self._stop_worker)

    def start_sync(self) -> SyncEngine:
        """This engine behind a synchronous facade (for WSGI apps); see :class:`SyncEngine`."""
        from .sync import SyncEngine

        return SyncEngine(self)

    def _ensure_worker(self) -> None:
        if self.embedded and self._worker is None:
            # every pool's calls have threads of their own: a pool that waits on
            # child runs can never take the threads its children need
            concurrency = max(self.concurrency, sum(self.pool_sizes.values()))
            self._worker = EmbeddedWorker(self.app, f"aaa-embedded-{self.id}", concurrency)

    def _stop_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()

    # -- tools -----------------------------------------------------------------
    def attach_tools(self, handler: ToolHandler) -> None:
        """Merge ``handler``'s tools into this engine's one executor and bind them.

        The first handler to size a pool sets its bound on this engine. Attach
        tools before the first run: the embedded worker sizes its threads then.
        """
        added = self.tools.add(handler)
        for pool, size in handler.pools.items():
            self.pool_sizes.setdefault(pool, size)
        for t in handler.registry:
            self.pool_sizes.setdefault(t.pool, DEFAULT_POOL_SIZE)
        if self.embedded:
            handler.bind(self.app, queue_prefix=self._queue_prefix, engine=self)
        else:
            handler.bind(self.app)
        if self._worker is not None and added:
            self._worker.add_queues([handler.queue_for(t, self._queue_prefix) for t in added])

    def _limit(self, pool: str) -> asyncio.Semaphore:
        limit = self._limits.get(pool)
        if limit is None:
            limit = self._limits[pool] = asyncio.Semaphore(self.pool_sizes.get(pool, DEFAULT_POOL_SIZE))
        return limit

    # -- runs ------------------------------------------------------------------
    def start(self, algo: Any, input: Any, *, tenant: str | None = None, run_id: str | None = None) -> RunHandle:
        """Start a run on the running event loop; returns at once with its handle.

        Args:
            algo: the algorithm, e.g. ``ToolLoop(registry)``.
            input: its input, e.g. ``{"task": "refund order A-100"}``.
            tenant: optional; reaches every tool as ``ctx.tenant``.
            run_id: optional; a fresh ``run_<hex>`` by default.
        """
        if self.llm is None:
            raise ConfigError("Engine: no model attached; call LLMHandler(client).attach(engine) first")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._limits = loop, {}
        run_id = run_id or f"run_{uuid.uuid4().hex[:12]}"
        if run_id in self.runs and not self.runs[run_id].done:
            raise ConfigError(f"Engine.start: run {run_id!r} is already running")
        self._ensure_worker()
        handle = RunHandle(self, run_id, tenant)
        self.runs[handle.run_id] = handle
        handle._task = loop.create_task(handle._drive(algo, input))
        return handle

    async def run(self, algo: Any, input: Any, **kwargs: Any) -> RunOutcome:
        """Start a run and wait for its outcome (``start`` plus ``result``)."""
        return await self.start(algo, input, **kwargs).result()

    def submit(self, algo: Any, input: Any, **kwargs: Any) -> concurrent.futures.Future[RunOutcome]:
        """Start a run from another thread (a tool body, a WSGI view); returns a future of its outcome.

        The engine's loop must be running elsewhere (``SyncEngine``, or an earlier
        ``start``); never block on the future from the loop's own thread.
        """
        loop = self._loop
        if loop is None or loop.is_closed():
            raise ConfigError("Engine.submit: the engine's event loop is not running; use SyncEngine")
        return asyncio.run_coroutine_threadsafe(self.run(algo, input, **kwargs), loop)

    def pending_approvals(self) -> list[PendingApproval]:
        """Every call of every run that waits for a person, oldest first."""
        return sorted((p for h in self.runs.values() for p in h.pending_approvals()), key=lambda p: p.since)

    def _shorten(self, t: Tool, fact: ToolFact) -> ToolFact:
        """Apply the handler's ``GuardPolicy.max_result_chars`` to a text result."""
        limit = self.tools.handlers[t.name].guards.max_result_chars
        if not (fact.ok and limit and isinstance(fact.value, str) and len(fact.value) > limit):
            return fact
        return dataclasses.replace(fact, value=fact.value[: limit - 1] + "…")

    async def _send(self, handle: RunHandle, call_id: str, call: ToolCall, t: Tool, arguments: dict[str, Any]) -> ToolFact:
        """Send one call as a guarded task (within its pool's bound) and wait for its fact."""
        task = self.app.tasks[task_name(t.name)]
        headers = {RUN_HEADER: handle.run_id, TOOL_CALL_HEADER: call.id}
        if handle.tenant:
            headers[TENANT_HEADER] = handle.tenant
        async with self._limit(t.pool):
            result = await asyncio.to_thread(
                task.apply_async, kwargs={"arguments": arguments}, task_id=call_id, headers=headers
            )
            return await self._wait(result, call_id, t.name)

    async def _wait(self, result: Any, call_id: str, name: str) -> ToolFact:
        def read() -> ToolFact | None:
            return fact_from_celery(call_id, name, result.state, result.result)

        delay = self.poll_s
        while True:
            # the in-memory backend answers at once; a real one is read off the loop
            fact = read() if self.embedded else await asyncio.to_thread(read)
            if fact is not None:
                return fact
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)


class RunHandle:
    """A running algorithm: its id, events, approvals and outcome.

    ``events()`` lists every ``aaa.*`` event of the run in order;
    ``await result()`` waits for the :class:`RunOutcome`; ``signal()`` delivers
    the app's decisions (approvals). All of it may be used from any thread.
    """

    def __init__(self, engine: Engine, run_id: str, tenant: str | None) -> None:
        self.engine = engine
        self.run_id = run_id
        self.tenant = tenant
        self.started_at = time.time()
        self._events: list[dict[str, Any]] = []
        self._approvals: dict[str, PendingApproval] = {}
        self._task: asyncio.Task[RunOutcome] = None  # type: ignore[assignment]

    @property
    def done(self) -> bool:
        """Whether the run has ended (completed, failed or cancelled)."""
        return self._task is not None and self._task.done()

    @property
    def status(self) -> str:
        """``running``, ``waiting`` (for a person), ``completed``, ``failed`` or ``cancelled``."""
        if not self.done:
            return "waiting" if self.pending_approvals() else "running"
        if self._task.cancelled():
            return "cancelled"
        return self._task.result().status

    @property
    def outcome(self) -> RunOutcome | None:
        """The outcome once the run ended, else None."""
        if not self.done or self._task.cancelled():
            return None
        return self._task.result()

    def emit(self, type: str, data: dict[str, Any]) -> None:
        """Append an event (``seq`` numbers them from 1)."""
        event = {"seq": len(self._events) + 1, "type": type, "run_id": self.run_id, "data": data, "at": time.time()}
        self._events.append(event)

    def events(self, after: int = 0) -> list[dict[str, Any]]:
        """Every ``aaa.*`` event of the run so far, in order (those with ``seq > after``)."""
        return self._events[after:]

    async def result(self) -> RunOutcome:
        """Wait for the run's outcome."""
        return await asyncio.shield(self._task)

    def pending_approvals(self) -> list[PendingApproval]:
        """This run's calls waiting for a person."""
        return [p for p in list(self._approvals.values()) if not p.decided]

    def signal(self, type: str, data: dict[str, Any]) -> None:
        """Deliver an app-side signal: ``aaa.approval.granted`` / ``aaa.approval.denied``
        with ``{"call_id": ...}`` (optionally ``arguments`` or ``digest`` to bind the
        decision to what was shown, and ``reason`` for a denial).

        Approvals come only through here, from the app (a person), never from the
        model. Raises ``KeyError`` for a call that is not waiting, ``ValueError``
        for a decision about other arguments than the ones shown. Other
        ``aaa.*`` types are reserved; any other type is recorded as an event.
        Safe to call from any thread.
        """
        loop = self.engine.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop or not loop.is_running():
            self._signal(type, data)
            return

        async def deliver() -> None:
            self._signal(type, data)

        asyncio.run_coroutine_threadsafe(deliver(), loop).result()

    def _signal(self, type: str, data: dict[str, Any]) -> None:
        if type not in (APPROVAL_GRANTED, APPROVAL_DENIED):
            if type.startswith("aaa."):
                raise ValueError(f"signal: {type!r} is reserved; the app may send {APPROVAL_GRANTED!r} or "
                                 f"{APPROVAL_DENIED!r}, or its own (non-aaa.) types")
            self.emit(type, dict(data))
            return
        call_id = data.get("call_id")
        pending = self._approvals.get(call_id) if isinstance(call_id, str) else None
        if pending is None or pending.decided or pending._future is None:
            raise KeyError(f"no pending approval for call_id {call_id!r} in run {self.run_id}")
        pending.check(data)
        granted = type == APPROVAL_GRANTED
        reason = str(data.get("reason") or "")
        self.emit(type, {"call_id": call_id, "name": pending.tool, **({"reason": reason} if reason else {})})
        pending._future.set_result((granted, reason))

    # -- what the algorithm calls ---------------------------------------------
    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Ask the model (the engine's LLM handler)."""
        response: LLMResponse = await self.engine.llm.complete(request)
        self.emit("aaa.llm.completed", {"text": response.text, "tool_calls": len(response.tool_calls)})
        return response

    async def call_tools(self, calls: tuple[ToolCall, ...] | list[ToolCall]) -> list[ToolFact]:
        """Run the calls concurrently; each ends as one fact, never an exception."""
        return list(await asyncio.gather(*(self._call(c) for c in calls)))

    async def _call(self, call: ToolCall) -> ToolFact:
        call_id = call_id_for(self.run_id, call.id)
        self.emit("aaa.tool.requested", {"call_id": call_id, "tool_call_id": call.id, "name": call.name,
                                         "arguments": call.arguments})
        fact = await self._execute(call_id, call)
        self.emit(fact.event_type, fact.event_data())
        return fact

    async def _execute(self, call_id: str, call: ToolCall) -> ToolFact:
        t = self.engine.tools.registry.get(call.name)
        if t is None:
            known = ", ".join(sorted(x.name for x in self.engine.tools.registry)) or "none"
            return failed(call_id, call.name, ToolArgsError(f"unknown tool {call.name!r}; the tools are: {known}"))
        # a snapshot: what a person approves is exactly what is sent
        arguments = copy.deepcopy(dict(call.arguments))
        if t.requires_approval:
            granted, reason = await self._approval(call_id, call, t, arguments)
            if not granted:
                message = f"{DENIED_MESSAGE}: {reason}" if reason else DENIED_MESSAGE
                return failed(call_id, t.name, ApprovalDenied(message))
        try:
            fact = await self.engine._send(self, call_id, call, t, arguments)
        except Exception as e:  # noqa: BLE001 - a broken send is a fact for the model, not a crash
            return failed(call_id, t.name, e)
        return self.engine._shorten(t, fact)

    async def _approval(self, call_id: str, call: ToolCall, t: Tool, arguments: dict[str, Any]) -> tuple[bool, str]:
        future: asyncio.Future[tuple[bool, str]] = asyncio.get_running_loop().create_future()
        shown = copy.deepcopy(arguments)
        pending = PendingApproval(
            self.run_id, call_id, t.name, shown, time.time(), digest(self.run_id, call_id, t.name, shown), future,
            tool_call_id=call.id,
        )
        self._approvals[call_id] = pending
        self.emit(
            APPROVAL_REQUESTED,
            {"call_id": call_id, "tool_call_id": call.id, "name": t.name, "arguments": shown,
             "digest": pending.digest},
        )
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
