"""The engine shim: drive an agent run in the app process, run its tools on Celery.

``Engine()`` is the embedded default: an in-process Celery worker thread on the
in-memory broker, with the in-memory store, so nothing needs a server.
``Engine(app=celery_app)`` drives a real fleet: tool calls leave as guarded
Celery tasks (task id: a call id the engine mints, ``<tenant>:<run id>:<turn>.<position>.<digest>``,
so re-sending a call is deduplicated by the guard, and a tenant's calls never share a key
with another's), go to their pool's queue ``aaa.<pool>``, and come
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
import uuid
from typing import TYPE_CHECKING, Any

from celery import Celery

from ..errors import ConfigError
from ..protocol import check_run_id, check_tenant, tenant_of
from ..tools.handler import ToolHandler, store_of, use_store
from .approvals import DEFAULT_APPROVAL_TTL_S, PendingApproval, check_ttl
from .embedded import EmbeddedWorker, embedded_app
from .executor import ToolExecutor
from .run import ANY_TENANT, AnyTenant, RunHandle, RunOutcome, in_scope

if TYPE_CHECKING:
    from ..lifecycle import Event, Outcome
    from ..stores import Store
    from .sync import SyncEngine


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
        approval_ttl_s: how long, in seconds, a ``requires_approval`` call waits
            for a person (default 24 h). Undecided by then, it fails as
            ``ApprovalExpired`` and is not sent; a decision after that is refused.
    """

    def __init__(
        self,
        app: Celery | None = None,
        *,
        store: Store | None = None,
        concurrency: int = 4,
        poll_s: float = 0.02,
        approval_ttl_s: float = DEFAULT_APPROVAL_TTL_S,
    ) -> None:
        self.approval_ttl_s = check_ttl(approval_ttl_s, "Engine(approval_ttl_s=...)")
        self.embedded = app is None
        self.id = uuid.uuid4().hex[:8]
        self.app = app if app is not None else embedded_app(self.id)
        if store is not None:
            use_store(self.app, store)
        self.concurrency = concurrency
        self.poll_s = poll_s
        self.llm: Any = None
        self.tools = ToolExecutor(self.app, embedded=self.embedded, poll_s=poll_s)
        self.runs: dict[str, RunHandle] = {}
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
            concurrency = max(self.concurrency, sum(self.tools.pool_sizes.values()))
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
        if self.embedded:
            handler.bind(self.app, queue_prefix=self._queue_prefix, engine=self)
        else:
            handler.bind(self.app)
        if self._worker is not None and added:
            self._worker.add_queues([handler.queue_for(t, self._queue_prefix) for t in added])

    # -- runs ------------------------------------------------------------------
    def start(self, algo: Any, input: Any, *, tenant: str | None = None, run_id: str | None = None) -> RunHandle:
        """Start a run on the running event loop; returns at once with its handle.

        Args:
            algo: the algorithm, e.g. ``ToolLoop(registry)``.
            input: its input, e.g. ``{"task": "refund order A-100"}``.
            tenant: optional; part of every call id of the run (so of every store key),
                and reaches every tool as ``ctx.tenant``.
            run_id: optional; a fresh ``run_<hex>`` by default. Starting a run id again
                (for the same tenant) drives it again: each call it makes again finds its
                recorded result.

        Raises:
            InvalidId: an empty, over-long or control-character tenant or run id.
            ConfigError: the run is still running, or this engine knows ``run_id`` as
                another tenant's run.
        """
        if self.llm is None:
            raise ConfigError("Engine: no model attached; call LLMHandler(client).attach(engine) first")
        check_tenant(tenant)
        run_id = check_run_id(run_id) if run_id is not None else f"run_{uuid.uuid4().hex[:12]}"
        known = self.runs.get(run_id)
        if known is not None and known.tenant != tenant:
            raise ConfigError(f"Engine.start: run id {run_id!r} is taken by another tenant's run; "
                              "a run id belongs to one tenant, choose another")
        if known is not None and not known.done:
            raise ConfigError(f"Engine.start: run {run_id!r} is already running")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop = loop
            self.tools.new_loop()
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

    # -- reads, scoped by tenant -------------------------------------------------
    # Omit ``tenant`` for an operator's view of every tenant; pass it (None: the runs
    # without a tenant) and another tenant's runs and calls are not there at all.
    def get(self, run_id: str, *, tenant: str | None | AnyTenant = ANY_TENANT) -> RunHandle:
        """The handle of a run this engine started; ``KeyError`` if unknown, or another tenant's."""
        handle = self.runs.get(run_id)
        if handle is None or not in_scope(handle.tenant, tenant):
            raise KeyError(f"no run {run_id!r}" + ("" if tenant is ANY_TENANT else " for this tenant"))
        return handle

    def pending_approvals(self, *, tenant: str | None | AnyTenant = ANY_TENANT) -> list[PendingApproval]:
        """Every call of every run (of ``tenant``) that waits for a person, oldest first."""
        return sorted((p for h in list(self.runs.values()) if in_scope(h.tenant, tenant)
                       for p in h.pending_approvals()), key=lambda p: p.since)

    def call_events(self, call_id: str, *, tenant: str | None | AnyTenant = ANY_TENANT) -> list[Event]:
        """A call's audit trail from the store; empty for another tenant's call."""
        return self.store.events(call_id) if in_scope(tenant_of(call_id), tenant) else []

    def call_result(self, call_id: str, *, tenant: str | None | AnyTenant = ANY_TENANT) -> Outcome | None:
        """A call's recorded result from the store; None for another tenant's call."""
        return self.store.result(call_id) if in_scope(tenant_of(call_id), tenant) else None
