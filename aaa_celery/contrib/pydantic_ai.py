"""Pydantic AI: an agent's function tools run as guarded Celery calls on the fleet.

``GuardedToolset(FunctionToolset([...]), app=celery_app, policies={...})`` is a Pydantic AI
toolset. The agent sees the wrapped tools as they are (names, descriptions, argument
schemas, Pydantic AI's own validation and retry prompts); each call the model makes is
sent as the guarded Celery task ``aaa.tool.<name>`` and its result read back, so the tool
body runs on a worker under a lease, a fencing token and its delivery policy. The tool
functions do not change: ``policies`` gives each one its guard options (those of
``@tool``: ``delivery``, ``requires_approval``, ``idempotency_key``, ``timeout_s``, ...).

Why a toolset wrapper (``WrapperToolset``) and not a capability or external deferred
tools: a wrapper sits exactly where a call leaves for its tool (``call_tool``), sees
the call's ``RunContext`` (conversation, message history, approval state), and keeps
every other behaviour of the agent: validation, retries, events, streaming, and the
framework's own human-in-the-loop API, which the wrapper uses for approvals. External
deferred tools would end the run at every call; a capability would see the call but not
own the tool. Nothing of Pydantic AI is patched: the public ``WrapperToolset``,
``ApprovalRequired``, ``DeferredToolResults`` and ``HandleDeferredToolCalls`` are all
it uses.

**Call ids.** Each call's id is minted by the guard (:func:`~aaa_celery.protocol.mint_call_id`)
from the tenant, the conversation (``RunContext.conversation_id``: Pydantic AI keeps it when
a run is resumed from its message history, where it gives the run a new ``run_id``), the
step (which model response of the conversation asked for the call), the call's position in
that response, the tool and its canonical arguments. The model's ``tool_call_id`` is not
part of it. A conversation driven again (its web process died; it is replayed from the
message history) mints the same ids and finds each call's recorded result: no effect
repeats.

**Errors**, in Pydantic AI's idiom (``docs/pydantic-ai.md`` has the table):

| the guard says             | the agent gets                                           |
|----------------------------|----------------------------------------------------------|
| ``ToolArgsError``          | ``ModelRetry``: a retry prompt the model answers          |
| the body's ``ModelRetry``  | ``ModelRetry``, as without the guard                      |
| the body's ``ToolFailed``  | ``ToolFailed``, as without the guard                      |
| ``PolicyDenied``           | ``ToolFailed``: the model reads it and adapts             |
| ``ApprovalDenied``         | ``ToolDenied`` / ``ToolFailed``: the model reads it       |
| ``OutcomeUnknown``         | raised out of ``agent.run``: the app decides              |
| ``ExecutionAbandoned``     | raised out of ``agent.run``                               |
| any other failure          | ``ToolError`` raised (as an unguarded tool's exception)   |

**What crosses the wire:** the arguments, as JSON. ``RunContext`` (its ``deps`` above
all) stays in the web process: a tool that takes ``RunContext`` is refused when the
toolset is made (declare guarded tools with ``tool_plain``). The result comes back as JSON.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from celery import Celery
from pydantic_ai import (
    AbstractToolset,
    ApprovalRequired,
    DeferredToolRequests,
    DeferredToolResults,
    FunctionToolset,
    ModelResponse,
    ModelRetry,
    RunContext,
    ToolCallPart,
    ToolDenied,
    ToolFailed,
    ToolsetTool,
    WrapperToolset,
)
from pydantic_ai.capabilities import HandleDeferredToolCalls
from pydantic_core import to_jsonable_python

from ..config import GuardConfig, GuardPolicy
from ..errors import ConfigError, ExecutionAbandoned, OutcomeUnknown, ToolArgsError, ToolError
from ..lifecycle import APPROVAL_DENIED, APPROVAL_GRANTED, APPROVAL_REQUESTED
from ..protocol import check_run_id, check_tenant, mint_call_id
from ..runtime.embedded import EmbeddedWorker, embedded_app
from ..runtime.approvals import DEFAULT_APPROVAL_TTL_S, PendingApproval, arguments_hash, check_ttl, stored_approval
from ..runtime.executor import ToolExecutor
from ..runtime.results import ToolFact, failed
from ..runtime.runstate import RunRecord, run_key
from ..tools import Tool, ToolHandler, ToolRegistry
from ..tools.handler import store_of

__all__ = ["GuardedToolset", "TenantOf", "decide"]

#: The tenant of a run: a fixed one (None: no tenant), or a function of the run's context.
TenantOf = str | None | Callable[[RunContext[Any]], str | None]

#: The guard options a policy may give a tool (those of ``@tool``, its name aside).
_OPTIONS = frozenset({"description", "requires_approval", "timeout_s", "pool", "delivery", "idempotency_key",
                      "guard", "reconcile"})
#: The name a conversation's record carries as its algorithm (the pages show it).
ALGO = "pydantic_ai"
#: How long a process holds a conversation's record for one write (its run lease, seconds), and
#: how long it waits for another process's hold to end.
_RECORD_LEASE_S = 10.0
_RECORD_WAIT_S = 30.0
#: Errors the model reads as a terminal tool failure (``ToolFailed``).
_TOLD = frozenset({"PolicyDenied", "ApprovalDenied", "ApprovalExpired", "ResultTooLarge"})
#: Errors that become a retry prompt (``ModelRetry``).
_RETRIED = frozenset({"ToolArgsError", "ModelRetry"})
#: Errors raised out of the run, for the app to handle (the effect may have happened, or never will).
_RAISED: dict[str, type[ToolError]] = {"OutcomeUnknown": OutcomeUnknown, "ExecutionAbandoned": ExecutionAbandoned}


def _guarded_tools(wrapped: FunctionToolset[Any], policies: Mapping[str, Mapping[str, Any]]) -> list[Tool[..., Any]]:
    """The aaa tools of ``wrapped``'s function tools, with their policies' guard options."""
    unknown = sorted(set(policies) - set(wrapped.tools))
    if unknown:
        raise ConfigError(f"GuardedToolset(policies=...): no tool named {unknown} in the wrapped toolset; "
                          f"its tools are {sorted(wrapped.tools)}")
    made = []
    for name, ptool in wrapped.tools.items():
        options = dict(policies.get(name, {}))
        bad = sorted(set(options) - _OPTIONS)
        if bad:
            raise ConfigError(f"GuardedToolset(policies={{{name!r}: ...}}): unknown option(s) {bad}; "
                              f"a policy takes {sorted(_OPTIONS)}")
        if ptool.takes_ctx:
            raise ConfigError(
                f"GuardedToolset: tool {name!r} takes Pydantic AI's RunContext, which stays in the web "
                "process (its deps are not sent to a worker); declare it with tool_plain, and build what "
                "its body needs on the worker")
        options.setdefault("description", ptool.description or "")
        options.setdefault("requires_approval", ptool.requires_approval)
        made.append(Tool(ptool.function, name=name, **options))
    return made


def _step_and_position(ctx: RunContext[Any]) -> tuple[int, int]:
    """Which model response of the conversation asked for the call of ``ctx`` (0 for the first),
    and the call's place among that response's tool calls."""
    step = sum(isinstance(m, ModelResponse) for m in ctx.messages)
    for message in reversed(ctx.messages):
        if not isinstance(message, ModelResponse):
            continue
        step -= 1
        calls = [p for p in message.parts if isinstance(p, ToolCallPart)]
        for position, part in enumerate(calls):
            if part.tool_call_id == ctx.tool_call_id:
                return step, position
    raise ToolError(f"the call {ctx.tool_call_id!r} of tool {ctx.tool_name!r} is in no model response of the "
                    f"conversation; a guarded call needs its message history to be named")


def _agent_error(fact: ToolFact) -> BaseException:
    """What the agent gets for a failed call (see the module's table)."""
    kind, message = fact.error or "ToolError", fact.message
    if kind in _RETRIED:
        return ModelRetry(message)
    if kind == "ToolFailed":  # the body's own: as the model would read it without the guard
        return ToolFailed(message)
    if kind in _TOLD:
        return ToolFailed(f"{kind}: {message}")
    raised = _RAISED.get(kind)
    if raised is not None:
        return raised(message, call_id=fact.call_id, tool=fact.name)
    return ToolError(f"{kind}: {message}", call_id=fact.call_id, tool=fact.name)


class GuardedToolset(WrapperToolset[Any]):
    """A Pydantic AI toolset whose function tools run as guarded Celery calls.

    Make it in a module that both the web process and the workers import: making it binds
    each tool as the task ``aaa.tool.<name>`` on ``app`` (``ToolHandler.bind``), so a
    worker of ``app`` runs the bodies. The agent takes it as any toolset::

        guarded = GuardedToolset(tools, app=app, policies={"refund": {"delivery": "at_most_once"}})
        agent = Agent(model, toolsets=[guarded])
        await agent.run("refund A-100", conversation_id="order-A-100")

    Without ``app`` it is the embedded default, as ``Engine()`` is: an in-process worker
    thread on the in-memory broker and store (started at the first call; ``close()`` stops
    it), so an example or a test needs no server.

    Args:
        wrapped: a ``FunctionToolset`` of plain tools (``tool_plain``: no ``RunContext``).
        app: the Celery app of the fleet (its ``aaa_store_url`` is the guard's store); None
            for the embedded default.
        policies: guard options by tool name, as ``@tool`` takes them (``delivery``,
            ``requires_approval``, ``idempotency_key``, ``timeout_s``, ``pool``, ``guard``,
            ``reconcile``); a tool without one gets the handler's default.
        tenant: the tenant of each run: a string, None, or a function of the run's
            ``RunContext`` (``lambda ctx: ctx.deps.tenant``). Part of every call id.
        guard: the handler's default ``GuardConfig`` (or its dict).
        guards: a ``GuardPolicy`` on what the model may send.
        pools: concurrent calls per pool, for this process (``{"default": 8}``).
        approval_ttl_s: how long a request for approval stays open (default 24 h).
        poll_s: first interval between result checks of a call, in seconds.
    """

    def __init__(
        self,
        wrapped: FunctionToolset[Any],
        *,
        app: Celery | None = None,
        policies: Mapping[str, Mapping[str, Any]] | None = None,
        tenant: TenantOf = None,
        guard: GuardConfig | dict[str, Any] | None = None,
        guards: GuardPolicy | None = None,
        pools: dict[str, int] | None = None,
        approval_ttl_s: float = DEFAULT_APPROVAL_TTL_S,
        poll_s: float = 0.05,
    ) -> None:
        if not isinstance(wrapped, FunctionToolset):
            raise ConfigError(f"GuardedToolset: wrapped must be a pydantic_ai.FunctionToolset of the tools to "
                              f"guard, got {type(wrapped).__name__}")
        if not (tenant is None or isinstance(tenant, str) or callable(tenant)):
            raise ConfigError(f"GuardedToolset(tenant=...): a string, None or a function of the RunContext, "
                              f"got {type(tenant).__name__}")
        if isinstance(tenant, str):
            check_tenant(tenant)
        super().__init__(wrapped)
        self.embedded = app is None
        self.app = app if app is not None else embedded_app(uuid.uuid4().hex[:8])
        self.tenant = tenant
        self.approval_ttl_s = check_ttl(approval_ttl_s, "GuardedToolset(approval_ttl_s=...)")
        self.registry = ToolRegistry(_guarded_tools(wrapped, policies or {}))
        self.handler = ToolHandler(self.registry, pools=pools, guard=guard, guards=guards)
        self.handler.bind(self.app)
        self.executor = ToolExecutor(self.app, embedded=self.embedded, poll_s=poll_s)
        self.executor.add(self.handler)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: EmbeddedWorker | None = None
        self._records = threading.Lock()  # one read-modify-write of a conversation's record at a time
        self._holder = f"{socket.gethostname()}/{os.getpid()}/pydantic-ai-{uuid.uuid4().hex[:8]}"

    # -- the toolset -------------------------------------------------------------------------
    # A dataclass ``replace`` would call __init__ with ``wrapped`` alone (and bind again):
    # a function toolset is the same for every run and step, so this one is too.
    async def for_run(self, ctx: RunContext[Any]) -> AbstractToolset[Any]:
        return self

    async def for_run_step(self, ctx: RunContext[Any]) -> AbstractToolset[Any]:
        return self

    def visit_and_replace(
        self, visitor: Callable[[AbstractToolset[Any]], AbstractToolset[Any]]
    ) -> AbstractToolset[Any]:
        return self

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools = await self.wrapped.get_tools(ctx)
        # the guard asks for approval itself (bound to the call's digest), so the framework is
        # told the tool is a plain function tool, and calls it: it then raises ApprovalRequired
        return {name: dataclasses.replace(t, tool_def=dataclasses.replace(t.tool_def, kind="function"))
                if name in self.registry and t.tool_def.kind == "unapproved" else t
                for name, t in tools.items()}

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        t = self.registry.get(name)
        if t is None:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # the pools' bounds live on one event loop
            self._loop = loop
            self.executor.new_loop()
        if self.embedded and self._worker is None:
            self._worker = EmbeddedWorker(self.app, f"aaa-pydantic-ai-{self.app.main}",
                                          max(4, sum(self.executor.pool_sizes.values())))
        tenant, conversation = self.tenant_of(ctx), self.conversation_of(ctx)
        arguments = to_jsonable_python(tool_args)
        step, position = _step_and_position(ctx)
        call_id = mint_call_id(tenant, conversation, step, position, name, self.executor.identity(name, arguments))
        checked = self.executor.checked(t, arguments)
        if isinstance(checked, ToolArgsError):  # the guard's limits: the framework's retry prompt
            raise ModelRetry(str(checked))
        if t.requires_approval:
            await self._approved(ctx, tenant, conversation, call_id, t, checked.shown)
        try:
            fact = await self.executor.send(conversation, tenant, call_id, ctx.tool_call_id or "", t, checked)
        except ToolError as e:  # refused before it was sent (the policy's rules): a fact, as the engine's
            fact = failed(call_id, name, e)
        if fact.ok:
            return fact.value
        raise _agent_error(fact)

    def close(self) -> None:
        """Stop the embedded worker (if it started); a fleet's toolset has nothing to stop."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()

    # -- identity ----------------------------------------------------------------------------
    def tenant_of(self, ctx: RunContext[Any]) -> str | None:
        """The tenant of the run of ``ctx`` (checked: a usable tenant or None)."""
        tenant = self.tenant(ctx) if callable(self.tenant) else self.tenant
        return check_tenant(tenant)

    @staticmethod
    def conversation_of(ctx: RunContext[Any]) -> str:
        """The run id of the guard's call ids: the conversation (kept across a resumed run)."""
        return check_run_id(ctx.conversation_id or ctx.run_id)

    # -- approvals -----------------------------------------------------------------------------
    async def _approved(self, ctx: RunContext[Any], tenant: str | None, conversation: str, call_id: str,
                        t: Tool[..., Any], shown: Any) -> None:
        """Let an approval-required call go only with a person's grant of exactly this call
        (its id names its arguments; the grant names the request's digest). A call that
        ran already (the conversation driven again) finds its result and needs none."""
        store = store_of(self.app)
        if await asyncio.to_thread(store.result, call_id) is not None:
            return
        key = run_key(tenant, conversation)
        if not ctx.tool_call_approved:
            request = await asyncio.to_thread(self._request, key, tenant, conversation, call_id, t, shown,
                                              ctx.tool_call_id)
            raise ApprovalRequired(metadata={"call_id": call_id, "digest": request.digest, "tenant": tenant,
                                             "run_id": conversation, "expires_at": request.expires_at})
        found = await asyncio.to_thread(self._grant, key, call_id, shown, ctx.tool_call_metadata)
        if found is not None:
            raise ToolFailed(f"ApprovalDenied: {found}")

    @contextlib.contextmanager
    def _holding(self, key: str) -> Iterator[None]:
        """Hold a conversation's record for one read-modify-write: this process's lock, and the
        run's lease in the store against another process's (it writes only what it holds). The
        first write of a record has nothing to hold yet."""
        store = store_of(self.app)
        with self._records:
            deadline = time.monotonic() + _RECORD_WAIT_S
            while not store.lease_run(key, self._holder, _RECORD_LEASE_S):
                if store.get_run(key) is None:
                    break  # no record to hold yet: this write makes it
                if time.monotonic() > deadline:
                    raise ToolError(f"the record of conversation {key!r} is held by another process for longer "
                                    f"than {_RECORD_WAIT_S:g} s")
                time.sleep(0.05)
            try:
                yield
            finally:
                store.release_run(key, self._holder)

    def _request(self, key: str, tenant: str | None, conversation: str, call_id: str, t: Tool[..., Any],
                 shown: Any, tool_call_id: str | None) -> PendingApproval:
        """The open request for approval of ``call_id``: the one stored (same arguments, not
        expired), else a new one, written to the conversation's record (decidable anywhere)."""
        store = store_of(self.app)
        with self._holding(key):
            record = store.get_run(key) or RunRecord(conversation, tenant, ALGO, None, "waiting", time.time())
            prior = record.approvals.get(call_id)
            if prior is not None and prior.get("state") == "open" and prior.get("expires_at", 0) > time.time() \
                    and prior.get("args_hash") == arguments_hash(shown):
                return stored_approval(prior)
            pending = PendingApproval.request(run_id=conversation, tenant=tenant, call_id=call_id, tool=t.name,
                                              arguments=copy.deepcopy(shown), ttl_s=self.approval_ttl_s,
                                              tool_call_id=tool_call_id)
            record.approvals[call_id] = {**pending.to_dict(), "args_hash": pending.args_hash, "state": "open",
                                         "reason": ""}
            self._put(record, APPROVAL_REQUESTED, {"call_id": call_id, "tool_call_id": tool_call_id,
                                                   "name": t.name, "arguments": pending.arguments,
                                                   "tenant": tenant, "digest": pending.digest,
                                                   "expires_at": pending.expires_at})
            return pending

    def _grant(self, key: str, call_id: str, shown: Any, metadata: Any) -> str | None:
        """Take the grant of ``call_id`` (single use: its request is closed); None when granted,
        else why the call may not go. ``metadata`` (``DeferredToolResults.metadata``) may carry
        the ``digest`` of the request shown: the app's approval is then recorded as the decision."""
        store = store_of(self.app)
        with self._holding(key):
            record = store.get_run(key)
            prior = record.approvals.get(call_id) if record is not None else None
            if record is None or prior is None:
                return ("no request for approval of this call with these arguments was shown to a person; "
                        "an approval of other arguments does not let it run")
            pending = stored_approval(prior)
            if pending.args_hash != arguments_hash(shown):
                return "the arguments differ from the ones approved"
            decision = store.approval_decision(key, call_id, pending.digest)
            given = metadata.get("digest") if isinstance(metadata, dict) else None
            if decision is None and isinstance(given, str):
                try:
                    pending.check({"digest": given})
                except (KeyError, ValueError) as e:
                    return str(e)
                store.decide_approval(key, call_id, pending.digest, {"granted": True, "reason": ""})
                decision = store.approval_decision(key, call_id, pending.digest)
            if decision is None:
                return (f"no person's decision is recorded for request {pending.digest[:12]}…; decide it by its "
                        f"digest (aaa_celery.contrib.pydantic_ai.decide, or the web pages) first")
            state = prior.get("state", "open")
            if state == "open":
                granted = bool(decision.get("granted"))
                prior["state"] = "granted" if granted else "denied"
                prior["reason"] = str(decision.get("reason") or "")
                self._put(record, APPROVAL_GRANTED if granted else APPROVAL_DENIED,
                          {"call_id": call_id, "name": pending.tool})
            if not decision.get("granted"):
                reason = str(decision.get("reason") or "")
                return f"denied by a person: {reason}" if reason else "denied by a person"
            return None

    def _put(self, record: RunRecord, event: str, data: dict[str, Any]) -> None:
        """Write a conversation's record (waiting while a request is open) and one event of it."""
        store = store_of(self.app)
        record.status = "waiting" if any(a.get("state") == "open" for a in record.approvals.values()) \
            else "completed"
        record.updated_at = time.time()
        if record.status == "completed" and record.outcome is None:
            record.outcome = {"status": "completed", "value": None, "error": None}
        store.put_run(record)
        seq = (store.get_run(record.key) or record).events + 1
        store.append_run_events(record.key, [{"seq": seq, "type": event, "run_id": record.run_id,
                                              "data": data, "at": time.time()}])

    def pending(self, conversation_id: str, *, tenant: str | None = None) -> list[dict[str, Any]]:
        """The open requests for approval of a conversation (of ``tenant``), oldest first: what a
        person is shown (tool, arguments, ``digest``, ``expires_at``) and what :func:`decide` takes."""
        record = store_of(self.app).get_run(run_key(check_tenant(tenant), check_run_id(conversation_id)))
        found = [dict(a) for a in (record.approvals.values() if record is not None else ())
                 if a.get("state") == "open" and a.get("expires_at", 0) > time.time()]
        return sorted(found, key=lambda a: a["since"])

    async def decisions(self, requests: DeferredToolRequests, *, wait_s: float = 0.0,
                        poll_s: float = 0.25) -> DeferredToolResults | None:
        """The decisions a person took on this toolset's ``requests``, as ``DeferredToolResults``
        for the next ``agent.run(..., deferred_tool_results=...)``: ``True`` for a grant (the
        request's digest travels in the metadata), ``ToolDenied`` for a denial. Waits up to
        ``wait_s`` seconds for every request to be decided; None if none was."""
        ours = [p for p in requests.approvals
                if isinstance(requests.metadata.get(p.tool_call_id), dict)
                and "digest" in requests.metadata[p.tool_call_id]]
        deadline = time.monotonic() + wait_s
        store = store_of(self.app)
        while True:
            results = DeferredToolResults()
            for part in ours:
                meta = requests.metadata[part.tool_call_id]
                key = run_key(meta.get("tenant"), meta["run_id"])
                decision = await asyncio.to_thread(store.approval_decision, key, meta["call_id"], meta["digest"])
                if decision is None:
                    continue
                if decision.get("granted"):
                    results.approvals[part.tool_call_id] = True
                    results.metadata[part.tool_call_id] = {"digest": meta["digest"]}
                else:
                    reason = str(decision.get("reason") or "")
                    results.approvals[part.tool_call_id] = ToolDenied(
                        f"ApprovalDenied: denied by a person: {reason}" if reason else
                        "ApprovalDenied: denied by a person")
            if len(results.approvals) == len(ours) or time.monotonic() >= deadline:
                return results if results.approvals else None
            await asyncio.sleep(poll_s)

    def wait_for_approvals(self, timeout_s: float = DEFAULT_APPROVAL_TTL_S,
                           poll_s: float = 0.25) -> HandleDeferredToolCalls[Any]:
        """A capability that keeps the run waiting until a person decides each request (in any
        process, by its digest), then goes on with the decisions: ``Agent(..., capabilities=
        [guarded.wait_for_approvals()])``. Requests still undecided after ``timeout_s`` end the
        run with ``DeferredToolRequests`` as Pydantic AI does."""

        async def handle(ctx: RunContext[Any], requests: DeferredToolRequests) -> DeferredToolResults | None:
            return await self.decisions(requests, wait_s=timeout_s, poll_s=poll_s)

        return HandleDeferredToolCalls(handler=handle)


def decide(app: Celery, metadata: Mapping[str, Any], *, granted: bool, digest: str, reason: str = "") -> None:
    """A person's decision on a request for approval, from any process: ``metadata`` is the
    request's (``DeferredToolRequests.metadata[tool_call_id]``: its call id, run and tenant),
    ``digest`` the one shown to the person (it must match: a decision on anything else is refused).

    Raises:
        KeyError: no such request (or it expired), or it was decided already.
        ValueError: ``digest`` is not the request's.
    """
    store = store_of(app)
    key = run_key(metadata.get("tenant"), metadata["run_id"])
    record = store.get_run(key)
    prior = record.approvals.get(metadata["call_id"]) if record is not None else None
    if prior is None:
        raise KeyError(f"no request for approval of call {metadata['call_id']!r}")
    pending = stored_approval(prior)
    pending.check({"digest": digest})
    if not store.decide_approval(key, pending.call_id, pending.digest, {"granted": granted, "reason": reason}):
        raise KeyError(f"the request for approval of call {pending.call_id!r} was decided already")
