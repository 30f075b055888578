"""The engine's tool executor: the merged tools of every attached handler, their pools'
bounds, and sending a call to the fleet and waiting for its fact."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from celery import Celery

from ..errors import ConfigError, ToolArgsError
from ..llm.types import ToolCall
from ..protocol import RUN_HEADER, TENANT_HEADER, TOOL_CALL_HEADER, mint_call_id, task_name, usable_tool_call_id
from ..tools.args import CheckedArgs
from ..tools.secrets import open_raw, seal_raw, sealer_for
from ..tools.handler import ToolHandler, ToolTask, store_of
from ..tools.registry import ToolRegistry
from ..tools.tool import Tool
from .results import ToolFact, fact_from_celery, fact_from_record

#: The concurrency of a pool that no handler sized (``ToolHandler(pools=...)``).
DEFAULT_POOL_SIZE = 8


class ToolExecutor:
    """One per engine: the merged tools of every attached handler, and how calls are sent.

    Each pool lets at most ``pool_sizes[pool]`` calls be in flight at once.
    """

    def __init__(self, app: Celery, *, embedded: bool, poll_s: float) -> None:
        self.app, self.embedded, self.poll_s = app, embedded, poll_s
        self.registry = ToolRegistry()
        self.handlers: dict[str, ToolHandler] = {}
        self.pool_sizes: dict[str, int] = {}
        self._limits: dict[str, asyncio.Semaphore] = {}

    def add(self, handler: ToolHandler) -> list[Tool[..., Any]]:
        """Merge ``handler``'s tools (the first handler to size a pool sets its bound)."""
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
        for pool, size in handler.pools.items():
            self.pool_sizes.setdefault(pool, size)
        for t in handler.registry:
            self.pool_sizes.setdefault(t.pool, DEFAULT_POOL_SIZE)
        return added

    def new_loop(self) -> None:
        """The runs moved to another event loop: the pools' semaphores start afresh there."""
        self._limits = {}

    def _limit(self, pool: str) -> asyncio.Semaphore:
        limit = self._limits.get(pool)
        if limit is None:
            limit = self._limits[pool] = asyncio.Semaphore(self.pool_sizes.get(pool, DEFAULT_POOL_SIZE))
        return limit

    def check(self, t: Tool[..., Any], arguments: Any) -> CheckedArgs:
        """Check a call's arguments as its handler's ``GuardPolicy`` and the tool's schema
        say (before anything is stored or sent); raises ``ToolArgsError``."""
        return t.check(arguments, self.handlers[t.name].guards)

    def checked(self, t: Tool[Any, Any], arguments: Any) -> CheckedArgs | ToolArgsError:
        """:meth:`check`, with a refusal returned rather than raised: a call's arguments are
        checked once, and the result carried on (shown in events, approved, sent)."""
        try:
            return self.check(t, arguments)
        except ToolArgsError as e:
            return e

    def identity(self, name: str, arguments: Any) -> Any:
        """What a call's id digests of its raw arguments: nothing secret (see ``Tool.identity``)."""
        t = self.registry.get(name)
        return t.identity(arguments) if t is not None else arguments

    def recorded_ids(self, tenant: str | None, run_id: str, turn: int, calls: Sequence[ToolCall],
                     ids: list[str]) -> list[str]:
        """``ids`` (minted by :meth:`identity`) for the calls of ``turn`` of a run the store
        has a record of, each call of a tool with secrets under the id 0.1.0 gave it if the
        store holds a call (an attempt or a result) under that id: a run 0.1.0 drove is
        resumed (or driven again) without sending its calls again.

        0.1.0 digested the raw arguments, secrets included. Only a stored run pays for this
        (one look-up per call of a secret tool); a new run's calls never get such an id.
        """
        found = list(ids)
        for n, c in enumerate(calls):
            t = self.registry.get(c.name)
            if t is None or not t.secrets:
                continue  # without secrets the id is what 0.1.0 minted
            legacy = mint_call_id(tenant, run_id, turn, n, c.name, c.arguments)
            if legacy != ids[n] and self.known(legacy):
                found[n] = legacy
        return found

    def known(self, call_id: str) -> bool:
        """Whether the guard's store holds a call under ``call_id``: a result, or any event
        of its trail (registered at publish, an attempt begun)."""
        store = store_of(self.app)
        return store.result(call_id) is not None or bool(store.events(call_id))

    def keepable_turn(self, turn: dict[str, Any], *, opened: bool = False) -> dict[str, Any]:
        """A recorded model turn (``response_to_dict``) with its tool calls' secret arguments
        sealed (``opened``: opened again, to replay it); see :mod:`aaa_celery.tools.secrets`."""
        calls = turn.get("tool_calls") or []
        secret: list[frozenset[str]] = [getattr(self.registry.get(c.get("name")), "secrets", frozenset())
                                        for c in calls]
        if not any(secret):
            return turn
        sealer = sealer_for(self.app)
        if sealer is None:
            return turn  # bind() refuses secret tools without a key: not reached
        change: Callable[[Any, frozenset[str]], Any] = (lambda a, s: open_raw(a, s, sealer)) if opened \
            else (lambda a, s: seal_raw(a, s, sealer))
        return {**turn, "tool_calls": [{**c, "arguments": change(c.get("arguments"), s)}
                                       for c, s in zip(calls, secret, strict=True)]}

    def _shorten(self, t: Tool[..., Any], fact: ToolFact) -> ToolFact:
        """Apply the handler's ``GuardPolicy.max_result_chars`` to a text result."""
        limit = self.handlers[t.name].guards.max_result_chars
        if not (fact.ok and limit and isinstance(fact.value, str) and len(fact.value) > limit):
            return fact
        return dataclasses.replace(fact, value=fact.value[: limit - 1] + "…")

    async def send(self, run_id: str, tenant: str | None, call_id: str, tool_call_id: str, t: Tool[..., Any],
                   checked: CheckedArgs) -> ToolFact:
        """Send one call, its arguments checked already (:meth:`checked`), as a guarded task
        (within its pool's bound) and wait for its fact."""
        task: ToolTask = self.app.tasks[task_name(t.name)]  # type: ignore[assignment]  # bound by add()
        headers = {RUN_HEADER: run_id}
        if usable_tool_call_id(tool_call_id):  # the model's id, for ctx.tool_call_id only: dropped if unusable
            headers[TOOL_CALL_HEADER] = tool_call_id
        if tenant:
            headers[TENANT_HEADER] = tenant
        async with self._limit(t.pool):
            result = await asyncio.to_thread(
                task.apply_checked, checked, task_id=call_id, headers=headers
            )
            return self._shorten(t, await self._wait(result, call_id, t.name))

    def _store_truth(self, call_id: str, name: str, fact: ToolFact) -> ToolFact | None:
        """A failed Celery fact checked against the guard's store, whose record wins."""
        try:
            store = store_of(self.app)
            recorded = store.result(call_id)
            begun = recorded is not None or bool(store.events(call_id))
        except Exception:  # noqa: BLE001 - a store the engine cannot read leaves Celery's word
            return fact
        return fact_from_record(call_id, name, fact, recorded, begun)

    async def _wait(self, result: Any, call_id: str, name: str) -> ToolFact:
        def read() -> ToolFact | None:
            fact = fact_from_celery(call_id, name, result.state, result.result)
            if fact is None or fact.ok:
                return fact
            return self._store_truth(call_id, name, fact)

        delay = self.poll_s
        while True:
            # the in-memory backend answers at once; a real one is read off the loop
            fact = read() if self.embedded else await asyncio.to_thread(read)
            if fact is not None:
                return fact
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.5)
