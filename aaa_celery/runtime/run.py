"""A run of an algorithm: its events, its tool calls and its outcome (its approvals:
:mod:`aaa_celery.runtime.approvals`)."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ApprovalDenied, ApprovalExpired, PolicyDenied, ToolArgsError
from ..lifecycle import (
    LLM_COMPLETED,
    LLM_REPLAYED,
    LLM_UNRECORDED,
    RUN_CANCELLED,
    RUN_COMPLETED,
    RUN_FAILED,
    RUN_RESUMED,
    RUN_STARTED,
    TOOL_REQUESTED,
)
from ..llm.types import LLMRequest, LLMResponse, ToolCall
from ..protocol import mint_call_id
from ..tools.args import CheckedArgs
from ..tools.tool import Tool
from .approvals import (
    APPROVAL_DENIED,
    APPROVAL_GRANTED,
    DENIED_MESSAGE,
    PendingApproval,
    RunApprovals,
    stored_approval,
)
from .results import ToolFact, fact_from_outcome, failed
from .runstate import (
    RunRecord,
    RunWriter,
    off_loop,
    response_from_dict,
    response_to_dict,
    run_key,
)

if TYPE_CHECKING:
    from ..stores.base import RunStore
    from .executor import ToolExecutor

#: Statuses of a run that ended.
_ENDED = ("completed", "failed", "cancelled")


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


#: The most tool calls of one model turn that an engine runs (``Engine(max_calls_per_turn=...)``).
DEFAULT_MAX_CALLS_PER_TURN = 256


@dataclass(frozen=True)
class RunContext:
    """What a run uses of the engine that drives (or reads) it, fixed when its handle is made.

    Attributes:
        store: the store of the run's record and of its calls' results.
        tools: the engine's tool executor (checks and sends the calls).
        llm: the model (the engine's LLM handler); None on a view of a stored run.
        holder: who holds the run's lease when this process drives it (host/pid/engine).
        lease_s: how long the run's lease lasts without a heartbeat (seconds).
        approval_ttl_s: how long a request for approval stays open (seconds).
        durable: whether the run's state is kept in the store.
        loop: the event loop the engine's runs live on (None before the first run).
        ended: told when a run this process drove ends, or stops being driven here.
        max_calls_per_turn: the most tool calls of one model turn that are run.
    """

    store: RunStore
    tools: ToolExecutor
    llm: Any
    holder: str
    lease_s: float
    approval_ttl_s: float
    durable: bool
    loop: asyncio.AbstractEventLoop | None
    ended: Callable[[RunHandle], None]
    max_calls_per_turn: int = DEFAULT_MAX_CALLS_PER_TURN


class RunHandle:
    """A run of an algorithm: its id, events, approvals and outcome.

    ``events()`` lists every ``aaa.*`` event of the run in order;
    ``await result()`` waits for the :class:`RunOutcome`; ``signal()`` delivers
    the app's decisions (approvals). All of it may be used from any thread.

    A handle either drives its run in this process (``start``, ``resume``), or is a
    view of a run that another process drives (or drove), read from the store
    (``Engine.get`` of a run this process does not drive): its approvals can be
    decided from here, and ``result()`` waits for the outcome in the store.
    """

    def __init__(self, ctx: RunContext, run_id: str, tenant: str | None, *,
                 record: RunRecord | None = None) -> None:
        #: What the run uses of its engine: store, tools, model, lease.
        self.ctx = ctx
        self.run_id = run_id
        self.tenant = tenant
        #: The run's key in the store: ``<tenant>:<run id>``.
        self.key = run_key(tenant, run_id)
        self.started_at = time.time() if record is None else record.started_at
        #: How many times this run was resumed (after a process stopped driving it).
        self.resumed = 0 if record is None else record.resumed
        self.algo = "" if record is None else record.algo
        self.input: Any = None if record is None else record.input
        self._record = record  # a view of a stored run (no _task): what the store said
        self._events: list[dict[str, Any]] = []
        self._seq0 = 0  # events already stored before this process drove the run (a resume)
        #: The run's requests for approval (of a run this process drives).
        self.approvals = RunApprovals(run_id=run_id, tenant=tenant, key=self.key, store=ctx.store,
                                      ttl_s=ctx.approval_ttl_s, emit=self.emit, touch=self._touch,
                                      writer=lambda: self._writer)
        self._turns = 0
        self._llm_turns = 0
        self._replaying = False
        #: The run id was driven before (a resume, or a start of a known run id): its calls
        #: may have results already.
        self._driven_before = record is not None
        self._writer: RunWriter | None = None
        self._cancel_requested = False
        self._lost = False  # another process took the run's lease over
        self._task: asyncio.Task[RunOutcome] = None  # type: ignore[assignment]

    @property
    def durable(self) -> bool:
        """Whether the run's state is kept in the store (any process can read and resume it)."""
        return self.ctx.durable

    @property
    def detached(self) -> bool:
        """Whether this handle is a view of a run that this process does not drive."""
        return self._task is None and self._record is not None

    @property
    def done(self) -> bool:
        """Whether the run has ended (completed, failed or cancelled)."""
        if self.detached:
            assert self._record is not None
            return self._record.status in _ENDED
        return self._task is not None and self._task.done()

    @property
    def status(self) -> str:
        """``running``, ``waiting`` (for a person), ``completed``, ``failed`` or ``cancelled``."""
        if self.detached:
            assert self._record is not None
            return self._record.status
        if not self.done:
            return "waiting" if self.pending_approvals() else "running"
        if self._task.cancelled():
            return "cancelled"
        return self._task.result().status

    @property
    def orphaned(self) -> bool:
        """A stored run that is still going but that nobody drives (its process died or stopped):
        ``Engine.resume`` takes it on."""
        return self.detached and self._record is not None and self._record.orphaned

    @property
    def outcome(self) -> RunOutcome | None:
        """The outcome once the run ended, else None."""
        if self.detached:
            assert self._record is not None
            found = self._record.outcome
            return RunOutcome(self.run_id, **found) if found and self._record.status in _ENDED else None
        if not self.done or self._task.cancelled():
            return None
        return self._task.result()

    def cancel(self) -> None:
        """End the run as ``cancelled`` (recorded so; it is not resumed). Call from the engine's loop."""
        if self._task is not None and not self._task.done():
            self._cancel_requested = True
            self._task.cancel()

    def emit(self, type: str, data: dict[str, Any]) -> None:
        """Append an event (``seq`` numbers them from 1, across every process that drove the run)."""
        seq = self._seq0 + len(self._events) + 1
        event = {"seq": seq, "type": type, "run_id": self.run_id, "data": data, "at": time.time()}
        self._events.append(event)
        if self._writer is not None:
            self._writer.event(event)

    def events(self, after: int = 0) -> list[dict[str, Any]]:
        """Every ``aaa.*`` event of the run so far, in order (those with ``seq > after``).
        Events of a run driven elsewhere (or before a resume) come from the store."""
        if self.detached:
            return self.ctx.store.run_events(self.key, after)
        earlier = self.ctx.store.run_events(self.key, after, self._seq0 - after) if after < self._seq0 else []
        return earlier + self._events[max(0, after - self._seq0):]

    async def result(self) -> RunOutcome:
        """Wait for the run's outcome (of a run driven elsewhere: as the store records it)."""
        if not self.detached:
            return await asyncio.shield(self._task)
        delay = 0.05
        while True:
            record = await asyncio.to_thread(self.ctx.store.get_run, self.key)
            if record is None:
                raise KeyError(f"run {self.run_id!r} is no longer in the store")
            self._record = record
            if self.outcome is not None:
                return self.outcome
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def pending_approvals(self) -> list[PendingApproval]:
        """This run's calls waiting for a person."""
        if self.detached:
            assert self._record is not None
            return [stored_approval(a) for a in self._record.approvals.values() if a.get("state") == "open"
                    and a.get("expires_at", 0) > time.time()]
        return self.approvals.pending()

    @property
    def cursor(self) -> tuple[float, str]:
        """Where a page of runs that ends with this one ends (``list_runs(before=...)``)."""
        return (self.started_at, self.key)

    def _record_now(self, status: str | None = None, outcome: RunOutcome | None = None) -> RunRecord:
        if status is None:
            status = "waiting" if self.approvals.waiting() else "running"
        return RunRecord(
            self.run_id, self.tenant, self.algo, self.input, status, self.started_at, time.time(),
            None if outcome is None else {"status": outcome.status, "value": outcome.value, "error": outcome.error},
            self.approvals.recorded(), self.resumed,
        )

    def _touch(self, status: str | None = None, outcome: RunOutcome | None = None) -> None:
        """Queue the run's record for the store (its status, approvals, outcome)."""
        if self._writer is not None:
            self._writer.record(functools.partial(self._record_now, status, outcome))

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
        if self.detached:  # a run driven elsewhere: the decision goes through the store
            self._signal(type, data)
            return
        loop = self.ctx.loop
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
            if self.detached:
                raise KeyError(f"run {self.run_id!r} is not driven by this process; only approvals can be "
                               f"decided from here")
            self.emit(type, dict(data))
            return
        call_id = data.get("call_id")
        if self.detached:
            record = self.ctx.store.get_run(self.key)
            stored = record.approvals.get(call_id) if record is not None and isinstance(call_id, str) else None
            pending = stored_approval(stored) if stored is not None and stored.get("state") == "open" else None
            if pending is None:
                raise KeyError(f"no pending approval for call_id {call_id!r} in run {self.run_id}")
        else:
            pending = self.approvals.open_request(call_id)
        pending.check(data)  # digest, arguments, tenant, expiry
        granted = type == APPROVAL_GRANTED
        reason = str(data.get("reason") or "")
        if self.durable and not self.ctx.store.decide_approval(
                self.key, pending.call_id, pending.digest, {"granted": granted, "reason": reason}):
            raise KeyError(f"the approval of call_id {call_id!r} in run {self.run_id} was decided already")
        if not self.detached:  # else the process that drives the run reads the decision from the store
            self.approvals.decide(pending, granted, reason)

    # -- what the algorithm calls ---------------------------------------------
    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Ask the model (the engine's LLM handler). A durable run records each answer; a
        resumed run replays the recorded answers instead of asking again."""
        turn, self._llm_turns = self._llm_turns, self._llm_turns + 1
        writer = self._writer
        if self._replaying and writer is not None:
            recorded = await off_loop(writer.inline, self.ctx.store.recorded_turn, self.key, turn)
            if recorded is not None:
                response: LLMResponse = response_from_dict(self.ctx.tools.keepable_turn(recorded, opened=True))
                self.emit(LLM_REPLAYED, {"turn": turn, "text": response.text,
                                               "tool_calls": len(response.tool_calls)})
                return response
            self._replaying = False  # the record ends here: from now on the model is asked
        response = await self.ctx.llm.complete(request)
        if writer is not None:
            try:  # first writer wins: a driver that lost the run cannot change what was recorded
                recorded = await off_loop(writer.inline, self.ctx.store.record_turn, self.key, turn,
                                          self.ctx.tools.keepable_turn(response_to_dict(response)))
                response = response_from_dict(self.ctx.tools.keepable_turn(recorded, opened=True))
            except Exception as e:  # noqa: BLE001 - an unrecorded turn is asked again on a resume
                writer.failures += 1
                self.emit(LLM_UNRECORDED, {"turn": turn, "error": f"{type(e).__name__}: {e}"})
        data: dict[str, Any] = {"turn": turn, "text": response.text, "tool_calls": len(response.tool_calls)}
        if response.usage is not None:
            data["usage"] = response.usage.as_dict()
        self.emit(LLM_COMPLETED, data)
        return response

    async def call_tools(self, calls: tuple[ToolCall, ...] | list[ToolCall]) -> list[ToolFact]:
        """Run the calls concurrently; each ends as one fact, never an exception.

        Each call gets an id of the engine's (:func:`~aaa_celery.protocol.mint_call_id`):
        this run's tenant and id, the number of this ``call_tools`` in the run (its turn),
        the call's position in ``calls``, and a digest of its tool and arguments, secrets
        left out (``docs/arguments-and-secrets.md``, "What a call's id is made of"). The
        model's id (``ToolCall.id``) only threads the fact back to the model's message.
        Calls beyond ``Engine(max_calls_per_turn=...)`` are answered with a ``PolicyDenied``
        fact, and not run.
        """
        turn, self._turns = self._turns, self._turns + 1
        tools, cap = self.ctx.tools, self.ctx.max_calls_per_turn
        ids = [mint_call_id(self.tenant, self.run_id, turn, n, c.name, tools.identity(c.name, c.arguments))
               for n, c in enumerate(calls)]
        if self.durable and self._driven_before:  # a stored run (perhaps 0.1.0's): its calls keep their ids
            ids = await off_loop(self.ctx.store.kind == "memory", tools.recorded_ids, self.tenant, self.run_id,
                                 turn, calls, ids)
        over = None if len(calls) <= cap else PolicyDenied(
            f"{len(calls)} tool calls in one turn, more than the {cap} this engine runs "
            f"(Engine(max_calls_per_turn=...)); this call was not run: ask for fewer calls at a time")
        return list(await asyncio.gather(*(self._call(call_id, c, None if n < cap else over)
                                           for n, (call_id, c) in enumerate(zip(ids, calls, strict=True)))))

    async def _call(self, call_id: str, call: ToolCall, refused: Exception | None = None) -> ToolFact:
        tools = self.ctx.tools
        t = tools.registry.get(call.name)
        # checked once, before anything is stored or sent: the canonical form is what is sent
        checked = tools.checked(t, call.arguments) if t is not None else None
        shown: Any = "<refused: unknown tool>" if checked is None else \
            checked.shown if isinstance(checked, CheckedArgs) else f"<refused: {checked}>"
        self.emit(TOOL_REQUESTED, {"call_id": call_id, "tool_call_id": call.id, "name": call.name,
                                   "arguments": shown})
        fact = failed(call_id, call.name, refused) if refused is not None else \
            await self._execute(call_id, call, t, checked)
        self.emit(fact.event_type, fact.event_data())
        return fact

    async def _execute(self, call_id: str, call: ToolCall, t: Tool[Any, Any] | None,
                       checked: CheckedArgs | ToolArgsError | None) -> ToolFact:
        if call.error is not None:  # the model's call is malformed (its arguments are not JSON)
            return failed(call_id, call.name, ToolArgsError(call.error))
        if t is None:
            known = ", ".join(sorted(x.name for x in self.ctx.tools.registry)) or "none"
            return failed(call_id, call.name, ToolArgsError(f"unknown tool {call.name!r}; the tools are: {known}"))
        if not isinstance(checked, CheckedArgs):  # a known tool's arguments are always checked
            return failed(call_id, t.name, checked if checked is not None else ToolArgsError(t.name))
        if t.requires_approval:  # a person sees (and approves) them with secrets redacted
            # A call that already ran (a run driven again, or resumed) has its result in the
            # store: nobody is asked to approve it again. (A new run's calls cannot have one.)
            recorded = None
            if self._driven_before:
                recorded = await off_loop(self.ctx.store.kind == "memory", self.ctx.store.result, call_id)
            if recorded is not None:
                return self.ctx.tools._shorten(t, fact_from_outcome(call_id, t.name, recorded))
            pending, reason = await self.approvals.ask(call_id, call, t, checked.shown)
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
            return await self.ctx.tools.send(self.run_id, self.tenant, call_id, call.id, t, checked)
        except Exception as e:  # noqa: BLE001 - a broken send is a fact for the model, not a crash
            return failed(call_id, t.name, e)

    # -- driving ---------------------------------------------------------------
    async def _drive(self, algo: Any, input: Any, *, resume: bool = False) -> RunOutcome:
        ctx = self.ctx
        heartbeat: asyncio.Task[None] | None = None
        try:
            if self.durable:
                self._writer = RunWriter(ctx.store, self.key)
                self._replaying = resume
                heartbeat = asyncio.get_running_loop().create_task(self._heartbeat())
            if resume:
                self.emit(RUN_RESUMED, {"resumed": self.resumed, "by": ctx.holder})
            else:
                self.emit(RUN_STARTED, {"input": input, "tenant": self.tenant})
            self._touch()
            try:
                value = await algo.run(self, input)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the algorithm's failure is the run's outcome
                self.emit(RUN_FAILED, {"error": type(e).__name__, "message": str(e)})
                outcome = RunOutcome(self.run_id, "failed", error=f"{type(e).__name__}: {e}")
            else:
                self.emit(RUN_COMPLETED, {"value": value})
                outcome = RunOutcome(self.run_id, "completed", value)
            self._touch(outcome.status, outcome)
            await self._let_go()
            return outcome
        except asyncio.CancelledError:
            if self._cancel_requested:
                self.emit(RUN_CANCELLED, {})
                self._touch("cancelled", RunOutcome(self.run_id, "cancelled"))
            # else: this process stops driving the run (it closes, or lost the run's lease):
            # the record stays as it was, and any process may resume the run
            await self._let_go()
            raise
        finally:
            if heartbeat is not None:
                heartbeat.cancel()
            ctx.ended(self)

    async def _let_go(self) -> None:
        """Write what is queued, and give the run's lease back (unless another process took it)."""
        writer = self._writer
        if writer is None or self._lost:
            return
        await writer.drain()
        with contextlib.suppress(Exception):
            await off_loop(writer.inline, self.ctx.store.release_run, self.key, self.ctx.holder)

    async def _heartbeat(self) -> None:
        """Renew the run's lease; a driver that lost it (another process resumed the run) stops."""
        ctx = self.ctx
        inline = ctx.store.kind == "memory"
        while True:
            await asyncio.sleep(ctx.lease_s / 3)
            try:
                held = await off_loop(inline, ctx.store.lease_run, self.key, ctx.holder, ctx.lease_s)
            except Exception:  # noqa: BLE001, S112 - store trouble: try again at the next beat
                continue
            if not held:
                self._lost = True
                self._task.cancel()
                return
