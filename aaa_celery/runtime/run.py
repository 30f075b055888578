"""A run of an algorithm: its events, its approvals, its tool calls and its outcome."""

from __future__ import annotations

import asyncio
import copy
import enum
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ApprovalDenied, ApprovalExpired, ToolArgsError
from ..llm.types import LLMRequest, LLMResponse, ToolCall
from ..protocol import mint_call_id
from ..tools.tool import Tool
from .approvals import (
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
    APPROVAL_GRANTED,
    APPROVAL_REQUESTED,
    DENIED_MESSAGE,
    PendingApproval,
)
from .results import ToolFact, failed

if TYPE_CHECKING:
    from .engine import Engine


class AnyTenant(enum.Enum):
    """The type of :data:`ANY_TENANT`."""

    ANY_TENANT = "any tenant"

    def __repr__(self) -> str:
        return "ANY_TENANT"


#: A read of every tenant's runs (an operator's view): the default of the engine's reads.
ANY_TENANT = AnyTenant.ANY_TENANT


def in_scope(owner: str | None, tenant: str | None | AnyTenant) -> bool:
    """Whether a run or call of tenant ``owner`` is visible to a read scoped to ``tenant``."""
    return tenant is ANY_TENANT or owner == tenant


@dataclass
class RunOutcome:
    """How a run ended: ``status`` is ``completed`` or ``failed``; ``value`` is what the
    algorithm returned, ``error`` the ``<type>: <message>`` of a failed run."""

    run_id: str
    status: str
    value: Any = None
    error: str | None = None


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
        self._turns = 0
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
        with ``{"call_id": ..., "digest": ...}``: the digest of the request shown
        (``PendingApproval.digest``) is mandatory; ``arguments`` or ``tenant`` may
        bind the decision further, ``reason`` explains a denial.

        Approvals come only through here, from the app (a person), never from the
        model. Raises ``KeyError`` for a call that is not waiting (never asked,
        decided already, expired, or another tenant's), ``ValueError`` for a
        decision without the digest or about something else than was shown.
        Other ``aaa.*`` types are reserved; any other type is recorded as an
        event. Safe to call from any thread.
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
        pending.check(data)  # digest, arguments, tenant, expiry
        granted = type == APPROVAL_GRANTED
        reason = str(data.get("reason") or "")
        self.emit(type, {"call_id": call_id, "name": pending.tool, **({"reason": reason} if reason else {})})
        pending._future.set_result((granted, reason))

    # -- what the algorithm calls ---------------------------------------------
    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Ask the model (the engine's LLM handler)."""
        response: LLMResponse = await self.engine.llm.complete(request)
        data: dict[str, Any] = {"text": response.text, "tool_calls": len(response.tool_calls)}
        if response.usage is not None:
            data["usage"] = response.usage.as_dict()
        self.emit("aaa.llm.completed", data)
        return response

    async def call_tools(self, calls: tuple[ToolCall, ...] | list[ToolCall]) -> list[ToolFact]:
        """Run the calls concurrently; each ends as one fact, never an exception.

        Each call gets an id of the engine's (:func:`~aaa_celery.protocol.mint_call_id`):
        this run's tenant and id, the number of this ``call_tools`` in the run (its turn),
        the call's position in ``calls``, and a digest of its tool and arguments. The
        model's id (``ToolCall.id``) only threads the fact back to the model's message.
        """
        turn, self._turns = self._turns, self._turns + 1
        ids = [mint_call_id(self.tenant, self.run_id, turn, n, c.name, c.arguments) for n, c in enumerate(calls)]
        return list(await asyncio.gather(*(self._call(call_id, c) for call_id, c in zip(ids, calls, strict=True))))

    async def _call(self, call_id: str, call: ToolCall) -> ToolFact:
        self.emit("aaa.tool.requested", {"call_id": call_id, "tool_call_id": call.id, "name": call.name,
                                         "arguments": self.engine.tools.shown(call.name, call.arguments)})
        fact = await self._execute(call_id, call)
        self.emit(fact.event_type, fact.event_data())
        return fact

    async def _execute(self, call_id: str, call: ToolCall) -> ToolFact:
        if call.error is not None:  # the model's call is malformed (its arguments are not JSON)
            return failed(call_id, call.name, ToolArgsError(call.error))
        t = self.engine.tools.registry.get(call.name)
        if t is None:
            known = ", ".join(sorted(x.name for x in self.engine.tools.registry)) or "none"
            return failed(call_id, call.name, ToolArgsError(f"unknown tool {call.name!r}; the tools are: {known}"))
        try:  # checked before anything is stored or sent; the canonical form is what is sent
            checked = self.engine.tools.check(t, call.arguments)
        except ToolArgsError as e:
            return failed(call_id, t.name, e)
        arguments = checked.canonical
        if t.requires_approval:  # a person sees (and approves) them with secrets redacted
            pending, reason = await self._approval(call_id, call, t, checked.shown)
            if pending is None:
                return failed(call_id, t.name, ApprovalExpired(reason))
            if reason is not None:
                message = f"{DENIED_MESSAGE}: {reason}" if reason else DENIED_MESSAGE
                return failed(call_id, t.name, ApprovalDenied(message))
            try:
                pending.consume(checked.shown)  # single use, and only for what was approved
            except ValueError as e:
                return failed(call_id, t.name, ApprovalDenied(str(e)))
        try:
            return await self.engine.tools.send(self.run_id, self.tenant, call_id, call.id, t, arguments)
        except Exception as e:  # noqa: BLE001 - a broken send is a fact for the model, not a crash
            return failed(call_id, t.name, e)

    async def _approval(self, call_id: str, call: ToolCall, t: Tool,
                        arguments: dict[str, Any]) -> tuple[PendingApproval | None, str | None]:
        """Ask a person about exactly ``arguments`` and wait, at most ``engine.approval_ttl_s``.

        Returns ``(grant, None)`` when granted (the caller consumes the grant when it
        sends), ``(request, reason)`` when denied, and ``(None, message)`` when the
        request expired undecided.
        """
        future: asyncio.Future[tuple[bool, str]] = asyncio.get_running_loop().create_future()
        pending = PendingApproval.request(
            run_id=self.run_id, tenant=self.tenant, call_id=call_id, tool=t.name,
            arguments=copy.deepcopy(arguments), ttl_s=self.engine.approval_ttl_s, tool_call_id=call.id, future=future,
        )
        self._approvals[call_id] = pending  # a new request replaces (and voids) an older one for this call id
        self.emit(
            APPROVAL_REQUESTED,
            {"call_id": call_id, "tool_call_id": call.id, "name": t.name, "arguments": pending.arguments,
             "tenant": self.tenant, "digest": pending.digest, "expires_at": pending.expires_at},
        )
        try:
            granted, reason = await asyncio.wait_for(
                asyncio.shield(future), max(0.0, pending.expires_at - time.time()))
        except TimeoutError:
            if not future.done():
                pending.expired = True
                future.cancel()
                self.emit(APPROVAL_EXPIRED, {"call_id": call_id, "name": t.name, "expires_at": pending.expires_at})
                return None, (f"nobody approved the call within {self.engine.approval_ttl_s:g} s; it was not sent. "
                              f"Ask for it again if it is still needed: a person must approve it again")
            granted, reason = future.result()
        return pending, None if granted else reason

    async def _drive(self, algo: Any, input: Any) -> RunOutcome:
        self.emit("aaa.run.started", {"input": input, "tenant": self.tenant})
        try:
            value = await algo.run(self, input)
        except Exception as e:
            self.emit("aaa.run.failed", {"error": type(e).__name__, "message": str(e)})
            return RunOutcome(self.run_id, "failed", error=f"{type(e).__name__}: {e}")
        self.emit("aaa.run.completed", {"value": value})
        return RunOutcome(self.run_id, "completed", value)
