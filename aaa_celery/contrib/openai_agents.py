"""OpenAI Agents SDK integration: an agent's function tools run as guarded Celery tasks.

::

    from agents import Agent, Runner
    from aaa_celery.contrib.openai_agents import AgentTools

    guard = AgentTools(celery_app, handler)          # handler: a ToolHandler of @tool functions
    agent = Agent(name="support", tools=guard.function_tools())

    with guard.run(run_id="ticket-4711", tenant="acme"):
        result = await Runner.run(agent, "refund order A-100")

Each tool is a plain function under a guard policy (``@tool(delivery="at_most_once")``);
:meth:`AgentTools.function_tools` hands the SDK one ``FunctionTool`` per tool (the SDK's
public constructor), whose invocation sends the call to the fleet as a guarded task, the
way :class:`~aaa_celery.runtime.Engine` sends its calls (``ToolExecutor``), and waits for
its fact. The guard's rules (leases, fencing, delivery policies) are the worker's, as for
every call: this module only translates.

**Call ids.** :func:`~aaa_celery.protocol.mint_call_id` of the tenant, the run id, the step
(``ToolContext.usage.requests``: how many model requests the run made so far), the position
(the call's rank among the step's calls of the same tool with the same arguments), the tool
and its canonical arguments. The model's ``tool_call_id`` is not part of it; it still reaches
the tool as ``ctx.tool_call_id``. A run driven again with the same run id (after the web
process died), or resumed from a ``RunState``, mints the same ids, so every call finds its
recorded result and no effect repeats.

**Errors** (see ``docs/openai-agents.md``): ``ToolArgsError``, ``PolicyDenied``,
``ExecutionAbandoned`` and a tool's own ``ToolError`` become a tool output the model reads,
formatted by ``failure_error_function`` (:func:`guard_error_function`: ``<Type>: <message>``),
so a model that sent bad arguments reads the validation error and tries again; a tool body's
other exceptions read as the SDK's ``default_tool_error_function`` shows them unguarded. ``OutcomeUnknown`` is raised out of ``Runner.run`` for the app to catch: whether the
effect happened is for a person to verify, not for the model to guess. ``raise_on`` moves any
of them to the other side.

**Approvals.** A ``requires_approval`` tool is a ``needs_approval`` tool for the SDK: the run
stops with interruptions. :meth:`AgentTools.request_approvals` records a request per
interrupted call in the store (bound to the call id, its arguments' hash, a nonce and an
expiry: one digest), where any process (the Flask and Django pages too) decides it by digest
(:meth:`AgentTools.approve`, :meth:`AgentTools.deny`). The SDK's own ``state.approve(item)``
lets the resumed run invoke the tool; the guard sends the call only if the store holds a
grant for exactly that call, and uses the grant once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from celery import Celery

from ..errors import (
    ApprovalDenied,
    ApprovalExpired,
    ConfigError,
    ExecutionAbandoned,
    OutcomeUnknown,
    PolicyDenied,
    ToolArgsError,
    ToolError,
)
from ..protocol import check_run_id, check_tenant, mint_call_id
from ..runtime.approvals import DEFAULT_APPROVAL_TTL_S, PendingApproval, arguments_hash, check_ttl, stored_approval
from ..runtime.executor import ToolExecutor
from ..runtime.results import ToolFact
from ..runtime.runstate import RunRecord, keeps_runs, run_key
from ..tools.args import CheckedArgs
from ..tools.handler import ToolHandler
from ..tools.tool import Tool

try:
    from agents import AgentsException, FunctionTool, RunContextWrapper, UserError, default_tool_error_function
    from agents.tool_context import ToolContext as AgentToolContext
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError("aaa_celery.contrib.openai_agents needs the OpenAI Agents SDK: "
                      "pip install 'aaa_celery[openai-agents]'") from e

if TYPE_CHECKING:
    from ..stores import Store

#: How a run record made by this adapter names its driver (``RunRecord.algo``).
ALGO = "openai-agents"
#: The guard's errors, by the type name a call's fact carries.
ERRORS: dict[str, type[ToolError]] = {
    "OutcomeUnknown": OutcomeUnknown,
    "ExecutionAbandoned": ExecutionAbandoned,
    "PolicyDenied": PolicyDenied,
    "ToolArgsError": ToolArgsError,
    "ApprovalDenied": ApprovalDenied,
    "ApprovalExpired": ApprovalExpired,
    "ToolError": ToolError,
}
#: The errors raised out of ``Runner.run`` by default; every other one is a tool output.
DEFAULT_RAISE_ON = frozenset({"OutcomeUnknown"})

ErrorFunction = Callable[[RunContextWrapper[Any], Exception], "str | Awaitable[str]"]


def _raised(kind: type[ToolError]) -> type[ToolError]:
    """``kind`` as the SDK lets it out of ``Runner.run``: also an ``AgentsException`` (any other
    exception of a tool reaches the app wrapped in ``UserError``); ``except OutcomeUnknown`` catches it."""
    return cast("type[ToolError]", type(kind.__name__, (kind, AgentsException),
                                       {"__module__": __name__, "__doc__": kind.__doc__}))


#: What ``raise_on`` raises, by the error's type name.
RAISED = {name: _raised(kind) for name, kind in ERRORS.items()}


def guard_error_function(ctx: RunContextWrapper[Any], error: Exception) -> str:
    """The default ``failure_error_function``: a guard's error (a ``ToolError``: bad arguments,
    a refusal, a lost call, the tool's own ``ToolError``) as ``<Type>: <message>``, written for
    the model, as the engine shows it; any other failure of a tool as the SDK shows it
    (``default_tool_error_function``: a fixed text, the exception hidden)."""
    if isinstance(error, ToolError):
        return f"{type(error).__name__}: {error}"
    return default_tool_error_function(ctx, error)


@dataclass
class AgentRun:
    """One drive of an agent run (``AgentTools.run``): the ids its calls are minted from."""

    run_id: str
    tenant: str | None
    _seen: dict[tuple[int, str, str], int] = field(default_factory=dict, repr=False)

    @property
    def key(self) -> str:
        """The run's key in the store (its record, if approvals made one)."""
        return run_key(self.tenant, self.run_id)

    def call_id(self, step: int, tool: str, identity: Any) -> str:
        """The next call id of ``tool`` with these arguments in ``step`` (see the module's docstring)."""
        probe = mint_call_id(self.tenant, self.run_id, step, 0, tool, identity)
        position = self._seen.get((step, tool, probe), 0)
        self._seen[(step, tool, probe)] = position + 1
        return probe if position == 0 else mint_call_id(self.tenant, self.run_id, step, position, tool, identity)


_current: contextvars.ContextVar[AgentRun | None] = contextvars.ContextVar("aaa_openai_agents_run", default=None)


class AgentTools:
    """The guarded tools of one ``ToolHandler``, as the Agents SDK's function tools.

    Args:
        app: the Celery app of the fleet (its result backend carries the results back).
        handler: the tools and their guard policies; bound to ``app`` here.
        failure_error_function: turns an error the model reads into its tool output
            (default: :func:`guard_error_function`).
        raise_on: the type names of the errors raised out of ``Runner.run`` instead
            (default ``{"OutcomeUnknown"}``); any of ``ERRORS``.
        approval_ttl_s: how long a request for approval stays open (default 24 h).
        poll_s: first interval, in seconds, between result checks of a call.
    """

    def __init__(self, app: Celery, handler: ToolHandler, *,
                 failure_error_function: ErrorFunction = guard_error_function,
                 raise_on: Collection[str] = DEFAULT_RAISE_ON,
                 approval_ttl_s: float = DEFAULT_APPROVAL_TTL_S, poll_s: float = 0.02) -> None:
        if isinstance(raise_on, str) or not set(raise_on) <= set(ERRORS):
            raise ConfigError(f"AgentTools(raise_on=...) takes a set of error names among {sorted(ERRORS)}, "
                              f"got {raise_on!r}")
        if not callable(failure_error_function):
            raise ConfigError("AgentTools(failure_error_function=...) must be a function of (ctx, error) "
                              "returning the text the model reads, like agents.default_tool_error_function")
        self.app = app
        self.raise_on = frozenset(raise_on)
        self.failure_error_function = failure_error_function
        self.approval_ttl_s = check_ttl(approval_ttl_s, "AgentTools(approval_ttl_s=...)")
        self.executor = ToolExecutor(app, embedded=False, poll_s=poll_s)
        self.executor.add(handler)
        handler.bind(app)
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def store(self) -> Store:
        """The store that guards the calls (their audit trail, the approvals)."""
        from ..tools.handler import store_of

        return store_of(self.app)

    # -- the SDK's tools ---------------------------------------------------------
    def function_tools(self, names: Iterable[str] | None = None) -> list[FunctionTool]:
        """One ``FunctionTool`` per tool (those named, else all), for ``Agent(tools=...)``."""
        registry = self.executor.registry
        chosen = list(names) if names is not None else [t.name for t in registry]
        missing = [n for n in chosen if registry.get(n) is None]
        if missing:
            raise ConfigError(f"AgentTools.function_tools: no tool named {missing}; the tools are "
                              f"{sorted(t.name for t in registry)}")
        return [self._function_tool(t) for t in (registry.get(n) for n in chosen) if t is not None]

    def _function_tool(self, t: Tool[..., Any]) -> FunctionTool:
        schema = t.schema
        strict = set(schema.get("required", [])) == set(schema.get("properties", {}))

        async def invoke(ctx: AgentToolContext[Any], raw: str) -> Any:
            return await self._invoke(t, ctx, raw)

        return FunctionTool(name=t.name, description=t.description, params_json_schema=schema,
                            on_invoke_tool=invoke, strict_json_schema=strict,
                            needs_approval=t.requires_approval)

    # -- runs ----------------------------------------------------------------------
    @contextlib.contextmanager
    def run(self, run_id: str | None = None, *, tenant: str | None = None) -> Iterator[AgentRun]:
        """Drive an agent run inside this block: its tool calls get ids of this run.

        Use one block per drive (``Runner.run``, or a resume from a ``RunState``); the
        same ``run_id`` and ``tenant`` drive the same run again.
        """
        check_tenant(tenant)
        run = AgentRun(check_run_id(run_id) if run_id is not None else f"run_{uuid.uuid4().hex[:12]}", tenant)
        token = _current.set(run)
        try:
            yield run
        finally:
            _current.reset(token)
            self._settle(run)

    def _scope(self, t: Tool[..., Any]) -> AgentRun:
        run = _current.get()
        if run is None:  # the SDK's error for a misuse: it leaves Runner.run as it is
            raise UserError(f"tool {t.name!r} was called outside a guarded run: call Runner.run inside "
                            "`with agent_tools.run(run_id=..., tenant=...):`")
        return run

    async def _invoke(self, t: Tool[..., Any], ctx: AgentToolContext[Any], raw: str) -> Any:
        run = self._scope(t)
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # the pools' bounds are per event loop
            self._loop = loop
            self.executor.new_loop()
        try:
            arguments = json.loads(raw) if raw else {}
        except json.JSONDecodeError as e:
            return await self._model_reads(ctx, ToolArgsError(f"{t.name}: the arguments are not JSON: {e}"))
        checked = self.executor.checked(t, arguments)
        if isinstance(checked, ToolArgsError):
            return await self._model_reads(ctx, checked)
        call_id = run.call_id(ctx.usage.requests, t.name, self.executor.identity(t.name, arguments))
        if t.requires_approval:
            refused = await asyncio.to_thread(self._use_grant, run, call_id, checked)
            if refused is not None:
                return await self._outcome(ctx, ToolFact(call_id, t.name, False, error=type(refused).__name__,
                                                         message=str(refused)))
        fact = await self.executor.send(run.run_id, run.tenant, call_id, ctx.tool_call_id, t, checked)
        return await self._outcome(ctx, fact)

    async def _outcome(self, ctx: AgentToolContext[Any], fact: ToolFact) -> Any:
        if fact.ok:
            return fact.value
        context = {"call_id": fact.call_id, "tool": fact.name}
        if fact.error in self.raise_on:
            raise RAISED[fact.error or ""](fact.message, **context)
        kind = ERRORS.get(fact.error or "")
        # a tool body's own exception (not the guard's) reads as it would without the guard
        error = kind(fact.message, **context) if kind is not None else RuntimeError(f"{fact.error}: {fact.message}")
        return await self._model_reads(ctx, error)

    async def _model_reads(self, ctx: AgentToolContext[Any], error: Exception) -> str:
        text = self.failure_error_function(ctx, error)
        return await text if not isinstance(text, str) else text

    # -- approvals -------------------------------------------------------------------
    def request_approvals(self, interruptions: Iterable[Any], context: RunContextWrapper[Any]) -> list[PendingApproval]:
        """Record a request for approval of each interrupted call of the run in this block
        (``result.interruptions``, ``result.context_wrapper``), decidable from any process;
        returns them (show each with its ``digest``). Call inside the run's block."""
        run = _current.get()
        if run is None:
            raise ConfigError("AgentTools.request_approvals: call it inside the run's "
                              "`with agent_tools.run(run_id=..., tenant=...):` block")
        step = context.usage.requests
        probe = AgentRun(run.run_id, run.tenant)
        found: list[PendingApproval] = []
        for item in interruptions:
            t = self.executor.registry.get(getattr(item, "name", None) or "")
            if t is None or not t.requires_approval:
                continue  # not one of ours: the app decides it with the SDK alone
            arguments = json.loads(item.arguments or "{}")
            checked = self.executor.checked(t, arguments)
            if isinstance(checked, ToolArgsError):
                continue  # refused as it is: the model reads why once the run goes on
            call_id = probe.call_id(step, t.name, self.executor.identity(t.name, arguments))
            found.append(PendingApproval.request(
                run_id=run.run_id, tenant=run.tenant, call_id=call_id, tool=t.name,
                arguments=copy.deepcopy(checked.shown), ttl_s=self.approval_ttl_s, tool_call_id=item.call_id))
        if found:
            store = self.store
            if not keeps_runs(store):
                raise ConfigError(f"AgentTools.request_approvals: the store {type(store).__name__} keeps no run "
                                  "records, where requests for approval are kept; use a built-in store")
            record = store.get_run(run.key) or RunRecord(run.run_id, run.tenant, ALGO, started_at=time.time())
            for p in found:
                record.approvals[p.call_id] = {**p.to_dict(), "args_hash": p.args_hash, "state": "open",
                                               "reason": ""}
            record.status, record.updated_at = "waiting", time.time()
            store.put_run(record)
        return found

    def pending_approvals(self, run_id: str, *, tenant: str | None = None) -> list[PendingApproval]:
        """The open requests for approval of a run (read from the store; any process)."""
        record = self.store.get_run(run_key(tenant, run_id))
        if record is None:
            return []
        return [stored_approval(a) for call_id, a in record.approvals.items()
                if a.get("state") == "open" and self._decision(record.key, a) is None
                and a.get("expires_at", 0) > time.time()]

    def approve(self, run_id: str, call_id: str, digest: str, *, tenant: str | None = None,
                arguments: dict[str, Any] | None = None) -> None:
        """A person grants the call shown with ``digest`` (from any process).

        Raises:
            KeyError: no open request for ``call_id`` in that run (or it was decided, or expired).
            ValueError: another digest, or ``arguments`` other than the ones shown.
        """
        self._decide(run_id, call_id, digest, True, "", tenant, arguments)

    def deny(self, run_id: str, call_id: str, digest: str, *, tenant: str | None = None, reason: str = "") -> None:
        """A person denies the call shown with ``digest``; the model reads ``ApprovalDenied``."""
        self._decide(run_id, call_id, digest, False, reason, tenant, None)

    def _decide(self, run_id: str, call_id: str, digest: str, granted: bool, reason: str, tenant: str | None,
                arguments: dict[str, Any] | None) -> None:
        key = run_key(tenant, run_id)
        record = self.store.get_run(key)
        stored = record.approvals.get(call_id) if record is not None else None
        if stored is None or stored.get("state") != "open":
            raise KeyError(f"no pending approval for call_id {call_id!r} in run {run_id!r}")
        data: dict[str, Any] = {"digest": digest, "tenant": tenant}
        if arguments is not None:
            data["arguments"] = arguments
        stored_approval(stored).check(data)
        if not self.store.decide_approval(key, call_id, digest, {"granted": granted, "reason": reason}):
            raise KeyError(f"the approval of call_id {call_id!r} in run {run_id!r} was decided already")

    def _decision(self, key: str, request: dict[str, Any]) -> dict[str, Any] | None:
        return self.store.approval_decision(key, request["call_id"], request["digest"])

    def _use_grant(self, run: AgentRun, call_id: str, checked: CheckedArgs) -> ToolError | None:
        """Let an approval-required call go out: once, on a grant for exactly this call;
        else the refusal the model reads. A call the store knows (a run driven again) goes
        out again without a grant: the guard returns its recorded result."""
        if self.executor.known(call_id):
            return None
        store = self.store
        record = store.get_run(run.key)
        request = record.approvals.get(call_id) if record is not None else None
        if request is None:
            return ApprovalDenied(f"no person approved this call (call id {call_id}); ask for approval "
                                  f"with AgentTools.request_approvals and decide it by digest")
        decision = self._decision(run.key, request)
        if decision is None:
            if request.get("expires_at", 0) <= time.time():
                return ApprovalExpired("nobody approved the call in time; it was not sent")
            return ApprovalDenied(f"the approval of call id {call_id} is not decided yet")
        if not decision.get("granted"):
            reason = str(decision.get("reason") or "")
            return ApprovalDenied("denied by a person" + (f": {reason}" if reason else ""))
        if request.get("args_hash") != arguments_hash(checked.shown):
            return ApprovalDenied("the arguments differ from the ones approved; the call must be approved again")
        # single use: the first process to mark the grant used sends the call
        if not store.decide_approval(run.key, call_id, request["digest"] + ":used", {"used_at": time.time()}):
            return ApprovalDenied("the approval was used already; a new call needs a new approval")
        return None

    def _settle(self, run: AgentRun) -> None:
        """At the end of a drive, a run record this adapter made waits while a request is open."""
        store = self.store
        record = store.get_run(run.key) if keeps_runs(store) else None
        if record is None or record.algo != ALGO:
            return
        for call_id, request in record.approvals.items():
            if request.get("state") == "open":
                decision = self._decision(run.key, request)
                if decision is not None:
                    request["state"] = "granted" if decision.get("granted") else "denied"
                    request["reason"] = str(decision.get("reason") or "")
                elif request.get("expires_at", 0) <= time.time():
                    request["state"] = "expired"
        waiting = any(r.get("state") == "open" for r in record.approvals.values())
        record.status, record.updated_at = ("waiting" if waiting else "completed"), time.time()
        store.put_run(record)


__all__ = ["ALGO", "AgentRun", "AgentTools", "DEFAULT_RAISE_ON", "ERRORS", "RAISED", "guard_error_function"]
