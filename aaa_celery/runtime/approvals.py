"""Approvals: a person, not the model, lets a ``requires_approval`` call go out.

A call waits as a :class:`PendingApproval` until the app signals
``aaa.approval.granted`` or ``aaa.approval.denied`` on its run
(``RunHandle.signal``, ``SyncRunHandle.approve``/``deny``). Only the app's API
can decide: the engine never turns model output (text, tool calls, arguments),
tool results or message headers into signals, and workers never read an
approval from a message.

Each request for approval is bound to what a person is shown:

- the call id (minted by the engine), the run, the tenant, the tool, a
  canonical hash of the arguments, a random nonce and the expiry time, all in
  one ``digest``. A decision must carry that digest: one without it, or with
  the digest of another request, is refused. The nonce makes every request's
  digest new, so a recorded decision can never be replayed onto a later
  request, even for the same call id and arguments;
- single use: a grant is consumed when the engine sends the call. A later send
  of the call (or another call) needs a new request and a new decision;
- an expiry (``Engine(approval_ttl_s=...)``, default 24 h). A request nobody
  decided in time ends the call as an ``ApprovalExpired`` failed fact for the
  model, and a decision arriving later is refused. If the model asks for the
  call again, a person is asked again.

A run driven in this process keeps its requests in a :class:`RunApprovals`: a
``requires_approval`` call asks (:meth:`RunApprovals.ask`) and waits for a decision,
which comes from this process (``RunHandle.signal``) or, for a durable run, from any
process through the store.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..lifecycle import APPROVAL_DENIED as APPROVAL_DENIED  # re-exported: the runtime's names of them
from ..lifecycle import APPROVAL_EXPIRED as APPROVAL_EXPIRED
from ..lifecycle import APPROVAL_GRANTED as APPROVAL_GRANTED
from ..lifecycle import APPROVAL_REQUESTED as APPROVAL_REQUESTED
from ..llm.types import ToolCall
from ..tools.tool import Tool
from .runstate import RunWriter, off_loop

if TYPE_CHECKING:
    from ..stores.runs import RunJournal

#: What the model reads for a denied call (plus the person's reason, if given).
DENIED_MESSAGE = "denied by a person"
#: How long a request for approval stays open by default: 24 hours, in seconds.
DEFAULT_APPROVAL_TTL_S = 24 * 3600.0


def check_ttl(value: Any, field_name: str = "approval_ttl_s") -> float:
    """``value`` as a validated approval lifetime in seconds, else a ``ConfigError`` naming the field."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{field_name} must be a positive number of seconds (default {DEFAULT_APPROVAL_TTL_S:g}, "
                          f"24 h), got {value!r}")
    return float(value)


def arguments_hash(arguments: dict[str, Any]) -> str:
    """A canonical hash of a call's arguments: key order and JSON spacing do not matter."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def digest(*, run_id: str, tenant: str | None, call_id: str, tool: str, args_hash: str, nonce: str,
           expires_at: float) -> str:
    """The fingerprint of one request for approval: what a person is shown, and this request only."""
    shown = json.dumps(["aaa.approval.v2", run_id, tenant, call_id, tool, args_hash, nonce, repr(expires_at)],
                       separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(shown.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class PendingApproval:
    """A call waiting for a person: its tool, the arguments shown, its run and tenant, since when
    and until when.

    Attributes:
        run_id: the run the call belongs to.
        call_id: the call's id (given by the engine; its task id); the decision names it.
        tool: the tool's name.
        arguments: the arguments shown (and, once granted, sent; a copy).
        since: when the call started waiting (``time.time()`` seconds).
        digest: fingerprint of this request (run, tenant, call, tool, arguments,
            nonce, expiry); every decision must carry it.
        tool_call_id: the model's own id for the call (to thread the transcript only).
        tenant: the run's tenant.
        expires_at: when the request lapses (``time.time()`` seconds); the call
            then fails as ``ApprovalExpired``.
        args_hash: canonical hash of ``arguments``.
    """

    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    since: float
    digest: str = ""
    _future: asyncio.Future[tuple[bool, str]] | None = field(repr=False, default=None)
    tool_call_id: str | None = None
    tenant: str | None = None
    expires_at: float = math.inf
    args_hash: str = ""
    consumed: bool = False
    expired: bool = False

    @classmethod
    def request(cls, *, run_id: str, tenant: str | None, call_id: str, tool: str, arguments: dict[str, Any],
                ttl_s: float, tool_call_id: str | None = None,
                future: asyncio.Future[tuple[bool, str]] | None = None) -> PendingApproval:
        """A new request for approval of exactly ``arguments``, open for ``ttl_s`` seconds."""
        since = time.time()
        expires_at = since + ttl_s
        args_hash = arguments_hash(arguments)
        nonce = secrets.token_hex(16)
        return cls(run_id, call_id, tool, arguments, since,
                   digest(run_id=run_id, tenant=tenant, call_id=call_id, tool=tool, args_hash=args_hash,
                          nonce=nonce, expires_at=expires_at),
                   future, tool_call_id=tool_call_id, tenant=tenant, expires_at=expires_at, args_hash=args_hash)

    @property
    def decided(self) -> bool:
        """Whether a person granted or denied it already (or it expired)."""
        return self.expired or (self._future is not None and self._future.done())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view, for an app to show to a person."""
        return {
            "run_id": self.run_id,
            "tenant": self.tenant,
            "call_id": self.call_id,
            "tool_call_id": self.tool_call_id,
            "tool": self.tool,
            "arguments": self.arguments,
            "since": self.since,
            "expires_at": self.expires_at,
            "digest": self.digest,
        }

    def check(self, data: dict[str, Any], now: float | None = None) -> None:
        """Refuse a decision that lacks the digest, names another one, other arguments or
        another tenant than the ones shown, or comes after the request expired.

        Raises:
            KeyError: the request expired, or ``data["tenant"]`` is another tenant's.
            ValueError: no digest, another digest, or other arguments.
        """
        if (time.time() if now is None else now) >= self.expires_at:
            raise KeyError(f"the approval request for {self.call_id!r} expired; the call must be requested "
                           f"and approved again")
        if "tenant" in data and data["tenant"] != self.tenant:
            raise KeyError(f"no pending approval for call_id {self.call_id!r} of tenant {data['tenant']!r}")
        given = data.get("digest")
        if not isinstance(given, str) or not given:
            raise ValueError(f"a decision on {self.call_id!r} must carry the digest shown with it "
                             f"(PendingApproval.digest); without one it could be replayed")
        if not secrets.compare_digest(given.encode(), self.digest.encode()):
            raise ValueError(f"the decision on {self.call_id!r} carries a digest of something else than was shown "
                             f"(another request, or one that was already decided)")
        if "arguments" in data and data["arguments"] != self.arguments:
            raise ValueError(f"the decision on {self.call_id!r} names other arguments than the ones shown")

    def consume(self, arguments: dict[str, Any]) -> None:
        """Use the grant to send ``arguments``: once, and only for the arguments approved.

        Raises:
            ValueError: the grant was used already, or ``arguments`` are not the ones approved.
        """
        if self.consumed:
            raise ValueError(f"the approval of {self.call_id!r} was used already; a new send needs a new approval")
        if arguments_hash(arguments) != self.args_hash:
            raise ValueError(f"the arguments of {self.call_id!r} changed after they were approved; "
                             f"the call must be approved again")
        self.consumed = True


def stored_approval(data: dict[str, Any]) -> PendingApproval:
    """A request for approval as the run's record keeps it (decidable from any process)."""
    return PendingApproval(
        data["run_id"], data["call_id"], data["tool"], data["arguments"], data["since"], data["digest"],
        None, data.get("tool_call_id"), data.get("tenant"), data.get("expires_at", float("inf")),
        data.get("args_hash", ""),
    )


class RunApprovals:
    """The requests for approval of one run driven in this process, by call id.

    It knows its run by what it uses of it, not by the handle: the run's id, tenant and key,
    its store of run records, how long a request stays open, and three callables of the run:
    ``emit`` (an event of the run), ``touch`` (queue the run's record for the store) and
    ``writer`` (the run's writer to the store, None while the run keeps no record).
    """

    def __init__(self, *, run_id: str, tenant: str | None, key: str, store: RunJournal, ttl_s: float,
                 emit: Callable[[str, dict[str, Any]], None], touch: Callable[[], None],
                 writer: Callable[[], RunWriter | None]) -> None:
        self.run_id = run_id
        self.tenant = tenant
        self.key = key
        self.store = store
        self.ttl_s = ttl_s
        self._emit = emit
        self._touch = touch
        self._writer = writer
        self.requests: dict[str, PendingApproval] = {}
        self.decided: dict[str, tuple[str, str]] = {}  # call id -> (state, reason) of a decided request
        self.shown: set[str] = set()  # call ids whose open request is in the store (decidable anywhere)
        #: A resumed run's requests for approval as its record held them, by call id.
        self.prior: dict[str, dict[str, Any]] = {}

    def pending(self) -> list[PendingApproval]:
        """The requests a person can decide now: open, and in the store (decidable anywhere)."""
        return [p for p in list(self.requests.values()) if not p.decided and p.call_id in self.shown]

    def waiting(self) -> bool:
        """Whether a call of the run waits for a person."""
        return any(not p.decided for p in list(self.requests.values()))

    def recorded(self) -> dict[str, dict[str, Any]]:
        """Every request with its state, as the run's record keeps them."""
        approvals = dict(self.prior)
        for call_id, p in self.requests.items():
            state, reason = self.decided.get(call_id, ("open", ""))
            approvals[call_id] = {**p.to_dict(), "args_hash": p.args_hash, "state": state, "reason": reason}
        return approvals

    def open_request(self, call_id: Any) -> PendingApproval:
        """The undecided request of ``call_id``, else ``KeyError``."""
        pending = self.requests.get(call_id) if isinstance(call_id, str) else None
        if pending is None or pending.decided or pending._future is None:
            raise KeyError(f"no pending approval for call_id {call_id!r} in run {self.run_id}")
        return pending

    def decide(self, pending: PendingApproval, granted: bool, reason: str) -> None:
        """A decision taken in this process (``RunHandle.signal``): the waiting call goes on."""
        assert pending._future is not None
        self._decision(pending, granted, reason)
        pending._future.set_result((granted, reason))

    def _decision(self, pending: PendingApproval, granted: bool, reason: str) -> None:
        """Record a decision in the run (its event, and the request's state in the record)."""
        self.decided[pending.call_id] = ("granted" if granted else "denied", reason)
        self._emit(APPROVAL_GRANTED if granted else APPROVAL_DENIED,
                   {"call_id": pending.call_id, "name": pending.tool, **({"reason": reason} if reason else {})})
        self._touch()

    def _resumed_request(self, call_id: str, arguments: dict[str, Any]) -> PendingApproval | None:
        """The request for approval of ``call_id`` that a resumed run's record holds, if it was
        for exactly these arguments (its digest, expiry and state carry over)."""
        prior = self.prior.pop(call_id, None)
        if prior is None:
            return None
        pending = stored_approval(prior)
        if pending.args_hash != arguments_hash(arguments):
            return None
        state = prior.get("state", "open")
        if state != "open":
            self.decided[call_id] = (state, str(prior.get("reason") or ""))
        return pending

    def _expired_message(self) -> str:
        return (f"nobody approved the call within {self.ttl_s:g} s; it was not sent. "
                f"Ask for it again if it is still needed: a person must approve it again")

    async def ask(self, call_id: str, call: ToolCall, t: Tool[..., Any],
                  arguments: dict[str, Any]) -> tuple[PendingApproval | None, str | None]:
        """Ask a person about exactly ``arguments`` and wait, at most ``engine.approval_ttl_s``.

        Returns ``(grant, None)`` when granted (the caller consumes the grant when it
        sends), ``(request, reason)`` when denied, and ``(None, message)`` when the
        request expired undecided.

        A resumed run finds its request in the run's record: a decision taken on it (before
        or while nobody drove the run) holds, and an open one is still decidable with the
        digest shown.
        """
        future: asyncio.Future[tuple[bool, str]] = asyncio.get_running_loop().create_future()
        pending = self._resumed_request(call_id, arguments)
        if pending is not None and call_id in self.decided:
            state, reason = self.decided[call_id]
            self.requests[call_id] = pending
            pending._future = future
            if state == "expired":
                pending.expired = True
                return None, self._expired_message()
            future.set_result((state == "granted", reason))
            return pending, None if state == "granted" else reason
        if pending is None:
            pending = PendingApproval.request(
                run_id=self.run_id, tenant=self.tenant, call_id=call_id, tool=t.name,
                arguments=copy.deepcopy(arguments), ttl_s=self.ttl_s, tool_call_id=call.id,
            )
        pending._future = future
        self.requests[call_id] = pending  # a new request replaces (and voids) an older one for this call id
        self._emit(
            APPROVAL_REQUESTED,
            {"call_id": call_id, "tool_call_id": call.id, "name": t.name, "arguments": pending.arguments,
             "tenant": self.tenant, "digest": pending.digest, "expires_at": pending.expires_at},
        )
        self._touch()
        writer = self._writer()
        if writer is not None:
            await writer.drain()  # decidable from any process once this returns
        self.shown.add(call_id)
        granted, reason = await self._wait_decision(pending, future)
        if granted is None:
            return None, self._expired_message()
        return pending, None if granted else reason

    async def _wait_decision(self, pending: PendingApproval,
                             future: asyncio.Future[tuple[bool, str]]) -> tuple[bool | None, str]:
        """Wait for a decision: from this process (the future), or from any other (the store)."""
        store, writer = self.store, self._writer()
        poll = 0.1
        while True:
            remaining = pending.expires_at - time.time()
            try:
                wait = remaining if writer is None else min(remaining, poll)
                return await asyncio.wait_for(asyncio.shield(future), max(0.0, wait))
            except TimeoutError:
                pass
            if future.done():
                return future.result()
            if writer is not None:
                found = await off_loop(writer.inline, store.approval_decision, self.key, pending.call_id,
                                       pending.digest)
                if found is None and pending.expires_at <= time.time():
                    # the expiry is a decision too: a person's click that comes after it loses
                    expired = {"granted": False, "expired": True, "reason": ""}
                    if await off_loop(writer.inline, store.decide_approval, self.key, pending.call_id,
                                      pending.digest, expired):
                        found = expired
                    else:
                        found = await off_loop(writer.inline, store.approval_decision, self.key,
                                               pending.call_id, pending.digest)
                if found is not None and not future.done():
                    if found.get("expired"):
                        return self._expire(pending, future)
                    granted, reason = bool(found.get("granted")), str(found.get("reason") or "")
                    self._decision(pending, granted, reason)
                    future.set_result((granted, reason))
                    return granted, reason
                if future.done():
                    return future.result()
                poll = min(poll * 1.5, 1.0)
            elif pending.expires_at <= time.time():
                return self._expire(pending, future)

    def _expire(self, pending: PendingApproval, future: asyncio.Future[tuple[bool, str]]) -> tuple[None, str]:
        pending.expired = True
        future.cancel()
        self.decided[pending.call_id] = ("expired", "")
        self._emit(APPROVAL_EXPIRED, {"call_id": pending.call_id, "name": pending.tool,
                                      "expires_at": pending.expires_at})
        self._touch()
        return None, ""
