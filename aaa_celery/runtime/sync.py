"""A synchronous facade over :class:`Engine`, for WSGI apps (Flask, Django) and scripts.

The engine is asyncio; a WSGI view is not. :class:`SyncEngine` runs the engine's
event loop in one background thread for the life of the process, and every
method hands work to that loop and waits for it::

    engine = SyncEngine()                       # or SyncEngine(Engine(app=celery_app))
    LLMHandler(client).attach(engine)
    ToolHandler(registry).attach(engine)

    handle = engine.start(ToolLoop(registry), {"task": "refund A-100"}, tenant="acme")
    handle.run_id                               # keep it in the session / URL
    engine.get(run_id).events()                 # in a later request
    engine.get(run_id).approve(call_id, digest) # a person clicked Approve on what was shown
    outcome = handle.result(timeout=30)         # blocks this thread only

    engine.run_sync(ToolLoop(registry), {"task": "..."}, timeout=60)   # start + result

Create one ``SyncEngine`` per process (at app start-up, not per request) and
``close()`` it at exit. Under a pre-forking server (gunicorn), create it after
the fork, in each worker process: a thread does not survive ``fork``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from .approvals import APPROVAL_DENIED, APPROVAL_GRANTED, PendingApproval
from .engine import Engine
from .run import ANY_TENANT, AnyTenant, RunHandle, RunOutcome

T = TypeVar("T")


class SyncRunHandle:
    """A run seen from synchronous code. Every method may be called from any thread."""

    def __init__(self, sync: SyncEngine, handle: RunHandle) -> None:
        self._sync = sync
        self.handle = handle

    @property
    def run_id(self) -> str:
        return self.handle.run_id

    @property
    def tenant(self) -> str | None:
        return self.handle.tenant

    @property
    def status(self) -> str:
        """``running``, ``waiting`` (for a person), ``completed``, ``failed`` or ``cancelled``."""
        return self.handle.status

    @property
    def done(self) -> bool:
        return self.handle.done

    @property
    def resumed(self) -> int:
        """How many times the run was resumed (after a process stopped driving it)."""
        return self.handle.resumed

    @property
    def orphaned(self) -> bool:
        """Still going, but nobody drives it: ``SyncEngine.resume`` takes it on."""
        return self.handle.orphaned

    @property
    def started_at(self) -> float:
        return self.handle.started_at

    @property
    def outcome(self) -> RunOutcome | None:
        """The outcome once the run ended, else None (never blocks)."""
        return self.handle.outcome

    def events(self, after: int = 0) -> list[dict[str, Any]]:
        """Every event of the run so far, in order (those with ``seq > after``)."""
        return self.handle.events(after)

    def pending_approvals(self) -> list[PendingApproval]:
        return self.handle.pending_approvals()

    def signal(self, type: str, data: dict[str, Any]) -> None:
        """``RunHandle.signal`` (approvals come from here, from a person)."""
        self.handle.signal(type, data)

    def approve(self, call_id: str, digest: str, **binding: Any) -> None:
        """Grant a pending call: ``digest`` is the ``PendingApproval.digest`` shown to the person;
        ``binding`` may add the ``arguments`` or ``tenant`` shown."""
        self.signal(APPROVAL_GRANTED, {"call_id": call_id, "digest": digest, **binding})

    def deny(self, call_id: str, digest: str, reason: str = "", **binding: Any) -> None:
        """Deny a pending call (``digest`` as for :meth:`approve`); the model reads "denied by a
        person" (and the reason)."""
        self.signal(APPROVAL_DENIED, {"call_id": call_id, "digest": digest, "reason": reason, **binding})

    def result(self, timeout: float | None = None) -> RunOutcome:
        """Block until the run ends and return its outcome; ``TimeoutError`` after ``timeout`` s."""
        return self._sync._call(self.handle.result(), timeout)


class SyncEngine:
    """An :class:`Engine` whose event loop runs in a background thread.

    ``LLMHandler(...).attach(sync)`` and ``ToolHandler(...).attach(sync)`` work on
    it as on an ``Engine``.

    Args:
        engine: the engine to drive; a new ``Engine(**engine_kwargs)`` by default
            (the embedded one, or ``app=celery_app`` for a fleet).
    """

    def __init__(self, engine: Engine | None = None, /, **engine_kwargs: Any) -> None:
        self.engine = engine if engine is not None else Engine(**engine_kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"aaa-engine-{self.engine.id}", daemon=True)
        self._thread.start()
        self._closed = False
        if self.engine.auto_resume:

            async def sweep() -> None:
                self.engine._use_loop()

            self._call(sweep())

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self._closed:
            coro.close()
            raise RuntimeError("SyncEngine is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- what handlers attach to -------------------------------------------------
    @property
    def llm(self) -> Any:
        return self.engine.llm

    @llm.setter
    def llm(self, handler: Any) -> None:
        self.engine.llm = handler

    def attach_tools(self, handler: Any) -> None:
        self.engine.attach_tools(handler)

    @property
    def store(self) -> Any:
        """The engine's store (for each call's audit trail)."""
        return self.engine.store

    # -- runs --------------------------------------------------------------------
    def start(self, algo: Any, input: Any, *, tenant: str | None = None, run_id: str | None = None) -> SyncRunHandle:
        """Start a run and return at once with its handle (see ``Engine.start``)."""

        async def start() -> RunHandle:
            return self.engine.start(algo, input, tenant=tenant, run_id=run_id)

        return SyncRunHandle(self, self._call(start()))

    def run_sync(self, algo: Any, input: Any, *, timeout: float | None = None, **kwargs: Any) -> RunOutcome:
        """Start a run and block until its outcome (``TimeoutError`` after ``timeout`` s)."""
        return self.start(algo, input, **kwargs).result(timeout)

    def get(self, run_id: str, *, tenant: str | None | AnyTenant = ANY_TENANT) -> SyncRunHandle:
        """The handle of a run this engine started (``KeyError`` if unknown or, with ``tenant``,
        another tenant's run)."""
        return SyncRunHandle(self, self.engine.get(run_id, tenant=tenant))

    def runs(self, *, tenant: str | None | AnyTenant = ANY_TENANT, limit: int = 50,
             before: tuple[float, str] | None = None) -> list[SyncRunHandle]:
        """A page of runs (of ``tenant``) from the store, newest first (``Engine.list_runs``):
        pass ``before=(h.started_at, h.run_id)`` of the last one for the next page."""
        return [SyncRunHandle(self, h) for h in self.engine.list_runs(tenant=tenant, limit=limit, before=before)]

    def resume(self, run_id: str, algo: Any = None, *,
               tenant: str | None | AnyTenant = ANY_TENANT) -> SyncRunHandle:
        """Drive on, in this process, a run whose process stopped (see ``Engine.resume``)."""

        async def resume() -> RunHandle:
            return self.engine.resume(run_id, algo, tenant=tenant)

        return SyncRunHandle(self, self._call(resume()))

    def resume_orphans(self, *, tenant: str | None | AnyTenant = ANY_TENANT) -> list[SyncRunHandle]:
        """Resume every orphaned run whose algorithm this engine knows (``Engine.resume_orphans``)."""

        async def resume() -> list[RunHandle]:
            return self.engine.resume_orphans(tenant=tenant)

        return [SyncRunHandle(self, h) for h in self._call(resume())]

    def forget(self, run_id: str, *, tenant: str | None | AnyTenant = ANY_TENANT) -> None:
        """Drop a run that ended (``Engine.forget``)."""
        self.engine.forget(run_id, tenant=tenant)

    def add_algo(self, algo: Any, name: str | None = None) -> str:
        """Let this engine resume runs of ``algo`` (``Engine.add_algo``)."""
        return self.engine.add_algo(algo, name)

    def pending_approvals(self, *, tenant: str | None | AnyTenant = ANY_TENANT) -> list[PendingApproval]:
        """Every call of every run (of ``tenant``) waiting for a person, oldest first."""
        return self.engine.pending_approvals(tenant=tenant)

    # -- lifecycle ---------------------------------------------------------------
    def close(self, timeout: float = 10.0) -> None:
        """Cancel the runs still going, stop the embedded worker and the loop thread."""
        if self._closed:
            return
        try:
            self._call(self.engine.aclose(), timeout)
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> SyncEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
