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
:class:`~aaa_celery.runtime.SyncEngine` (``SyncEngine(engine)``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from celery import Celery

from ..errors import ConfigError
from ..protocol import check_run_id, check_tenant, tenant_of
from ..tools.handler import ToolHandler, store_of, use_store
from .approvals import DEFAULT_APPROVAL_TTL_S, PendingApproval, check_ttl, stored_approval
from .embedded import EmbeddedWorker, embedded_app
from .executor import ToolExecutor
from .run import ANY_TENANT, DEFAULT_MAX_CALLS_PER_TURN, AnyTenant, RunContext, RunHandle, RunOutcome, in_scope
from .runstate import (
    DEFAULT_KEEP_FINISHED,
    DEFAULT_RUN_LEASE_S,
    DEFAULT_RUN_RETENTION_S,
    algo_name,
    holder_name,
    keeps_runs,
    log,
    off_loop,
    run_key,
)

if TYPE_CHECKING:
    from ..lifecycle import Event, Outcome
    from ..stores import Store
    from .runstate import RunRecord


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
        run_lease_s: how long a run's lease lasts without a heartbeat (default 30 s):
            a run whose process died is taken on by ``resume`` once it lapsed.
        run_retention_s: how long finished runs stay in the store (default 7 days).
        keep_finished: how many finished runs' handles this process keeps in memory
            (default 64); older ones are read from the store.
        run_state: keep run state in the store (default True). False keeps runs in this
            process only, as before run state was stored: nothing to resume or share.
        max_calls_per_turn: the most tool calls of one model turn that are run (default
            256); each call beyond it is answered with a ``PolicyDenied`` fact and not run.
        auto_resume: resume the store's orphaned runs (whose driver died) in this
            process, checking every ``run_lease_s``; only runs whose algorithm this
            engine knows (``add_algo``, or started here) are taken on.

    Run state lives in the store (``docs/durable-runs.md``): every process on the same
    store lists runs, reads their events, decides their approvals and resumes them.
    """

    def __init__(
        self,
        app: Celery | None = None,
        *,
        store: Store | None = None,
        concurrency: int = 4,
        poll_s: float = 0.02,
        approval_ttl_s: float = DEFAULT_APPROVAL_TTL_S,
        run_lease_s: float = DEFAULT_RUN_LEASE_S,
        run_retention_s: float = DEFAULT_RUN_RETENTION_S,
        keep_finished: int = DEFAULT_KEEP_FINISHED,
        run_state: bool = True,
        auto_resume: bool = False,
        max_calls_per_turn: int = DEFAULT_MAX_CALLS_PER_TURN,
    ) -> None:
        self.approval_ttl_s = check_ttl(approval_ttl_s, "Engine(approval_ttl_s=...)")
        self.run_lease_s = check_ttl(run_lease_s, "Engine(run_lease_s=...)")
        self.run_retention_s = check_ttl(run_retention_s, "Engine(run_retention_s=...)")
        if isinstance(keep_finished, bool) or not isinstance(keep_finished, int) or keep_finished < 0:
            raise ConfigError(f"Engine(keep_finished=...) must be a whole number >= 0, got {keep_finished!r}")
        self.keep_finished = keep_finished
        if isinstance(max_calls_per_turn, bool) or not isinstance(max_calls_per_turn, int) or max_calls_per_turn < 1:
            raise ConfigError(f"Engine(max_calls_per_turn=...) must be a whole number >= 1 (default "
                              f"{DEFAULT_MAX_CALLS_PER_TURN}), got {max_calls_per_turn!r}")
        self.max_calls_per_turn = max_calls_per_turn
        self.run_state = bool(run_state)
        self.auto_resume = bool(auto_resume)
        self.embedded = app is None
        self.id = uuid.uuid4().hex[:8]
        self.app = app if app is not None else embedded_app(self.id)
        if store is not None:
            use_store(self.app, store)
        self.concurrency = concurrency
        self.poll_s = poll_s
        self.llm: Any = None
        self.tools = ToolExecutor(self.app, embedded=self.embedded, poll_s=poll_s)
        #: The runs this process drives now.
        self.runs: dict[str, RunHandle] = {}
        self._finished: OrderedDict[str, RunHandle] = OrderedDict()
        #: The algorithms this engine can resume runs of, by name (``add_algo``; ``start`` adds its own).
        self.algos: dict[str, Any] = {}
        #: Who drives this engine's runs (the holder of their leases): host/pid/engine id.
        self.holder = holder_name(self.id)
        self._ended_count = 0
        self._purged_at = time.monotonic()
        self._sweeper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: EmbeddedWorker | None = None
        self._queue_prefix = f"aaa-embedded-{self.id}." if self.embedded else "aaa."
        self._store: tuple[int, Store, bool] | None = None  # (pid, store, durable), resolved at first use

    def _resolved(self) -> tuple[int, Store, bool]:
        resolved = self._store
        if resolved is None or resolved[0] != os.getpid():  # a forked child opens its own store
            store = store_of(self.app)
            resolved = self._store = (os.getpid(), store, self.run_state and keeps_runs(store))
        return resolved

    @property
    def store(self) -> Store:
        """The store that guards this engine's calls (for its audit trail), resolved once."""
        return self._resolved()[1]

    @property
    def durable(self) -> bool:
        """Whether run state is kept in the store (``run_state``, and every built-in store keeps it)."""
        return self._resolved()[2]

    def _context(self) -> RunContext:
        """What a run made now uses of this engine (``RunHandle.ctx``)."""
        _, store, durable = self._resolved()
        return RunContext(store, self.tools, self.llm, self.holder, self.run_lease_s, self.approval_ttl_s,
                          durable, self._loop, self._ended, self.max_calls_per_turn)

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
        """Stop driving the runs still going, and stop the embedded worker.

        The runs are not ended: their records stay in the store, their leases are given
        back, and any process may ``resume`` them (``handle.cancel()`` ends a run).
        """
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        tasks = [h._task for h in list(self.runs.values()) if not h.done]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=10)
        await off_loop(False, self._stop_worker)

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
                recorded result. A run id is one tenant's: one that the engine or the store
                knows as another tenant's is refused.

        Raises:
            InvalidId: an empty, over-long or control-character tenant or run id.
            ConfigError: the run is still running, or ``run_id`` is another tenant's run
                (in this engine or in the store).
        """
        if self.llm is None:
            raise ConfigError("Engine: no model attached; call LLMHandler(client).attach(engine) first")
        check_tenant(tenant)
        run_id = check_run_id(run_id) if run_id is not None else f"run_{uuid.uuid4().hex[:12]}"
        known = self.runs.get(run_id) or self._finished.get(run_id)
        stored = self.store.get_run(run_key(tenant, run_id)) if self.durable and known is None else None
        if (known is not None and known.tenant != tenant) or self._taken_by_another_tenant(run_id, tenant):
            raise ConfigError(f"Engine.start: run id {run_id!r} is taken by another tenant's run; "
                              "a run id belongs to one tenant, choose another")
        if (known is not None and not known.done) or (stored is not None and stored.holder is not None):
            raise ConfigError(f"Engine.start: run {run_id!r} is already running")
        loop = self._use_loop()
        handle = RunHandle(self._context(), run_id, tenant)
        handle.algo, handle.input = self.add_algo(algo), input
        handle._driven_before = known is not None or stored is not None or not self.durable
        if self.durable:
            # a run id started again is a new drive of it: its calls find their recorded
            # results, its model is asked again (``resume`` replays the recorded turns)
            if stored is not None or known is not None:
                self.store.forget_run(handle.key)
            self._claim(handle)
            if stored is None and known is None and self._taken_by_another_tenant(run_id, tenant):
                # another tenant's start of this id raced ours: both records are written now,
                # so at least the later of the two reads sees both, and withdraws
                self.store.forget_run(handle.key)
                raise ConfigError(f"Engine.start: run id {run_id!r} was just taken by another tenant's run; "
                                  "a run id belongs to one tenant, choose another")
        self._finished.pop(run_id, None)
        self.runs[handle.run_id] = handle
        handle._task = loop.create_task(handle._drive(algo, input))
        return handle

    def _taken_by_another_tenant(self, run_id: str, tenant: str | None) -> bool:
        """Whether the store holds a run of this id for another tenant (a run id is one tenant's)."""
        return self.durable and any(r.tenant != tenant for r in self.store.find_runs(run_id))

    def _use_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop = loop
            self.tools.new_loop()
        self._ensure_worker()
        if self.auto_resume and self.durable and self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep())
        return loop

    def _claim(self, handle: RunHandle) -> None:
        """Write the run's first record and take its lease (before its task starts)."""
        self.store.put_run(handle._record_now())
        if not self.store.lease_run(handle.key, self.holder, self.run_lease_s):
            raise ConfigError(f"Engine.start: run {handle.run_id!r} is already running in another process")

    def add_algo(self, algo: Any, name: str | None = None) -> str:
        """Let this engine resume runs of ``algo`` (recorded under ``name``: ``algo.name``, else
        its class's name); returns the name. ``start`` adds the algorithm it runs."""
        name = name or algo_name(algo)
        self.algos[name] = algo
        return name

    def resume(self, run_id: str, algo: Any = None, *, tenant: str | None | AnyTenant = ANY_TENANT) -> RunHandle:
        """Drive on, in this process, a run whose process stopped driving it (a deploy, a crash).

        The run's loop is replayed: the model's recorded answers are read back, not asked
        again; every tool call finds its recorded result (the guard's store), a call still
        in flight is waited for, never sent as a new effect; a request for approval still
        open stays decidable with the digest shown. ``docs/durable-runs.md`` lists what
        may repeat. Call it on the engine's loop (``SyncEngine.resume`` from a thread).

        Args:
            run_id: the run.
            algo: its algorithm; by default the one this engine knows under the run's
                recorded name (``add_algo``).
            tenant: the tenant the caller acts for (another tenant's run is not there).

        Returns:
            The run's handle: this process's if it drives the run already, a view of the
            stored run if the run ended.

        Raises:
            KeyError: no such run (for this tenant).
            ConfigError: another live process drives the run (its lease holds), or no
                algorithm of that name is known.
        """
        if self.llm is None:
            raise ConfigError("Engine.resume: no model attached; call LLMHandler(client).attach(engine) first")
        live = self.runs.get(run_id)
        if live is not None and in_scope(live.tenant, tenant):
            return live
        record = self._stored(run_id, tenant)
        if record is None:
            raise KeyError(f"no run {run_id!r}" + ("" if tenant is ANY_TENANT else " for this tenant"))
        if not record.active:
            return RunHandle(self._context(), run_id, record.tenant, record=record)
        algo = algo if algo is not None else self.algos.get(record.algo)
        if algo is None:
            raise ConfigError(f"Engine.resume: run {run_id!r} was driven by algorithm {record.algo!r}, which this "
                              f"engine does not know; pass it (resume(run_id, algo)) or engine.add_algo(algo)")
        if not self.store.lease_run(record.key, self.holder, self.run_lease_s):
            raise ConfigError(f"Engine.resume: run {run_id!r} is driven by {record.holder or 'another process'}; "
                              f"it can be resumed once that process stops renewing its lease "
                              f"({self.run_lease_s:g} s)")
        loop = self._use_loop()
        handle = RunHandle(self._context(), run_id, record.tenant)
        handle.started_at, handle.algo, handle.input = record.started_at, record.algo, record.input
        handle.resumed = record.resumed + 1
        handle._seq0 = record.events
        handle.approvals.prior = dict(record.approvals)
        handle._driven_before = True
        self._finished.pop(run_id, None)
        self.runs[run_id] = handle
        handle._task = loop.create_task(handle._drive(algo, record.input, resume=True))
        log.info("run %s resumed by %s (resume %d)", run_id, self.holder, handle.resumed)
        return handle

    def orphaned_runs(self, *, tenant: str | None | AnyTenant = ANY_TENANT, limit: int = 100) -> list[RunHandle]:
        """Runs still going in the store that nobody drives (their process died or stopped)."""
        if not self.durable:
            return []
        found = self.store.list_runs(tenant=None if tenant is ANY_TENANT else tenant,
                                     all_tenants=tenant is ANY_TENANT, active=True, limit=limit)
        ctx = self._context()
        return [RunHandle(ctx, r.run_id, r.tenant, record=r) for r in found if r.orphaned and r.run_id not in self.runs]

    def resume_orphans(self, *, tenant: str | None | AnyTenant = ANY_TENANT) -> list[RunHandle]:
        """``resume`` every orphaned run whose algorithm this engine knows; returns their handles."""
        resumed = []
        for view in self.orphaned_runs(tenant=tenant):
            if view.algo not in self.algos:
                continue
            with contextlib.suppress(ConfigError, KeyError):  # another process got there first
                resumed.append(self.resume(view.run_id, tenant=view.tenant))
        return resumed

    async def _sweep(self) -> None:
        """``auto_resume``: take on orphaned runs, every ``run_lease_s``."""
        while True:
            try:
                self.resume_orphans()
            except Exception as e:  # noqa: BLE001 - store trouble: look again later
                log.warning("auto_resume: could not look for orphaned runs: %s", e)
            await asyncio.sleep(self.run_lease_s)

    def _ended(self, handle: RunHandle) -> None:
        """A run this process drove ended, or stopped being driven here: it leaves ``runs``."""
        if self.runs.get(handle.run_id) is handle:
            del self.runs[handle.run_id]
        if self.keep_finished:
            self._finished[handle.run_id] = handle
            self._finished.move_to_end(handle.run_id)
            while len(self._finished) > self.keep_finished:
                self._finished.popitem(last=False)
        self._ended_count += 1
        if self.durable and (self._ended_count % 1000 == 0 or time.monotonic() - self._purged_at > 600):
            self._purged_at = time.monotonic()
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.run_in_executor(None, self._purge)

    def _purge(self) -> None:
        try:
            self.store.purge_runs(time.time() - self.run_retention_s)
        except Exception as e:  # noqa: BLE001
            log.warning("could not purge finished runs: %s", e)

    def forget(self, run_id: str, *, tenant: str | None | AnyTenant = ANY_TENANT) -> None:
        """Drop a run that ended from this process's memory and from the store (its calls'
        records stay). ``KeyError`` if unknown; ``ConfigError`` if it is still going."""
        live = self.runs.get(run_id)
        if live is not None and in_scope(live.tenant, tenant):
            raise ConfigError(f"Engine.forget: run {run_id!r} is still going; cancel it first")
        handle = self.get(run_id, tenant=tenant)
        if not handle.done:
            raise ConfigError(f"Engine.forget: run {run_id!r} is still going; resume or cancel it first")
        self._finished.pop(run_id, None)
        if self.durable:
            self.store.forget_run(handle.key)

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
        """The handle of a run: this process's if it drives it (or drove it lately), else a view
        of the run in the store (which any process can decide approvals on, or resume);
        ``KeyError`` if unknown, or another tenant's."""
        handle = self.runs.get(run_id) or self._finished.get(run_id)
        if handle is None and self.durable:
            record = self._stored(run_id, tenant)
            handle = RunHandle(self._context(), run_id, record.tenant, record=record) if record is not None else None
        if handle is None or not in_scope(handle.tenant, tenant):
            raise KeyError(f"no run {run_id!r}" + ("" if tenant is ANY_TENANT else " for this tenant"))
        return handle

    def _stored(self, run_id: str, tenant: str | None | AnyTenant) -> RunRecord | None:
        """The stored run ``run_id`` of ``tenant`` (of any tenant: the one run of that id;
        ``KeyError`` if several tenants have one)."""
        if not self.durable:
            return None
        if tenant is not ANY_TENANT:
            return self.store.get_run(run_key(tenant, run_id))
        found = self.store.find_runs(run_id)
        if len(found) > 1:
            raise KeyError(f"run id {run_id!r} names runs of several tenants; name the tenant (tenant=...)")
        return found[0] if found else None

    def list_runs(self, *, tenant: str | None | AnyTenant = ANY_TENANT, limit: int = 50,
                  before: tuple[float, str] | None = None) -> list[RunHandle]:
        """A page of runs (of ``tenant``), newest first: those older than the cursor ``before``
        (``handle.cursor`` of the last run of the page before)."""
        if not self.durable:
            handles = [h for h in [*self.runs.values(), *self._finished.values()] if in_scope(h.tenant, tenant)
                       and (before is None or h.cursor < tuple(before))]
            return sorted(handles, key=lambda h: h.cursor, reverse=True)[:limit]
        records = self.store.list_runs(tenant=None if tenant is ANY_TENANT else tenant,
                                       all_tenants=tenant is ANY_TENANT, limit=limit, before=before)
        ctx = self._context()
        return [self.runs.get(r.run_id) or RunHandle(ctx, r.run_id, r.tenant, record=r) for r in records]

    def pending_approvals(self, *, tenant: str | None | AnyTenant = ANY_TENANT) -> list[PendingApproval]:
        """Every call of every run (of ``tenant``) that waits for a person, oldest first: of the
        runs this process drives, and of every other run in the store."""
        found = [p for h in list(self.runs.values()) if in_scope(h.tenant, tenant) for p in h.pending_approvals()]
        if self.durable:
            now = time.time()
            for record in self._active_runs(tenant):
                live = self.runs.get(record.run_id)
                if (live is None or live.tenant != record.tenant) and record.status == "waiting":
                    found.extend(stored_approval(a) for a in record.approvals.values()
                                 if a.get("state") == "open" and a.get("expires_at", 0) > now)
        return sorted(found, key=lambda p: p.since)

    def _active_runs(self, tenant: str | None | AnyTenant, page: int = 1000) -> Iterator[RunRecord]:
        """Every run still going (of ``tenant``) in the store, newest first, read a page at a time."""
        before: tuple[float, str] | None = None
        while True:
            records = self.store.list_runs(tenant=None if tenant is ANY_TENANT else tenant,
                                           all_tenants=tenant is ANY_TENANT, active=True, limit=page, before=before)
            yield from records
            if len(records) < page:
                return
            before = records[-1].cursor

    def call_events(self, call_id: str, *, tenant: str | None | AnyTenant = ANY_TENANT) -> list[Event]:
        """A call's audit trail from the store; empty for another tenant's call."""
        return self.store.events(call_id) if in_scope(tenant_of(call_id), tenant) else []

    def call_result(self, call_id: str, *, tenant: str | None | AnyTenant = ANY_TENANT) -> Outcome | None:
        """A call's recorded result from the store; None for another tenant's call."""
        return self.store.result(call_id) if in_scope(tenant_of(call_id), tenant) else None
