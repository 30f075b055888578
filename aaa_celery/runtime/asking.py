"""A driven run's requests for approval: asked, waited for, decided, expired.

:class:`RunApprovals` is the approval half of a :class:`~aaa_celery.runtime.run.RunHandle`
that this process drives. A ``requires_approval`` call asks (:meth:`RunApprovals.ask`)
and waits for a decision, which comes from this process (``RunHandle.signal``) or, for a
durable run, from any process through the store. The rules of a request (its digest,
single use, expiry) are :class:`~aaa_celery.runtime.approvals.PendingApproval`'s.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import TYPE_CHECKING, Any

from ..llm.types import ToolCall
from ..tools.tool import Tool
from .approvals import (
    APPROVAL_DENIED,
    APPROVAL_EXPIRED,
    APPROVAL_GRANTED,
    APPROVAL_REQUESTED,
    PendingApproval,
    arguments_hash,
)
from .runstate import off_loop, stored_approval

if TYPE_CHECKING:
    from .run import RunHandle


class RunApprovals:
    """The requests for approval of one run driven in this process, by call id."""

    def __init__(self, run: RunHandle) -> None:
        self.run = run
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
            raise KeyError(f"no pending approval for call_id {call_id!r} in run {self.run.run_id}")
        return pending

    def decide(self, pending: PendingApproval, granted: bool, reason: str) -> None:
        """A decision taken in this process (``RunHandle.signal``): the waiting call goes on."""
        assert pending._future is not None
        self._decision(pending, granted, reason)
        pending._future.set_result((granted, reason))

    def _decision(self, pending: PendingApproval, granted: bool, reason: str) -> None:
        """Record a decision in the run (its event, and the request's state in the record)."""
        self.decided[pending.call_id] = ("granted" if granted else "denied", reason)
        self.run.emit(APPROVAL_GRANTED if granted else APPROVAL_DENIED,
                      {"call_id": pending.call_id, "name": pending.tool, **({"reason": reason} if reason else {})})
        self.run._touch()

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
        return (f"nobody approved the call within {self.run.engine.approval_ttl_s:g} s; it was not sent. "
                f"Ask for it again if it is still needed: a person must approve it again")

    async def ask(self, call_id: str, call: ToolCall, t: Tool,
                  arguments: dict[str, Any]) -> tuple[PendingApproval | None, str | None]:
        """Ask a person about exactly ``arguments`` and wait, at most ``engine.approval_ttl_s``.

        Returns ``(grant, None)`` when granted (the caller consumes the grant when it
        sends), ``(request, reason)`` when denied, and ``(None, message)`` when the
        request expired undecided.

        A resumed run finds its request in the run's record: a decision taken on it (before
        or while nobody drove the run) holds, and an open one is still decidable with the
        digest shown.
        """
        run = self.run
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
                run_id=run.run_id, tenant=run.tenant, call_id=call_id, tool=t.name,
                arguments=copy.deepcopy(arguments), ttl_s=run.engine.approval_ttl_s, tool_call_id=call.id,
            )
        pending._future = future
        self.requests[call_id] = pending  # a new request replaces (and voids) an older one for this call id
        run.emit(
            APPROVAL_REQUESTED,
            {"call_id": call_id, "tool_call_id": call.id, "name": t.name, "arguments": pending.arguments,
             "tenant": run.tenant, "digest": pending.digest, "expires_at": pending.expires_at},
        )
        run._touch()
        if run._writer is not None:
            await run._writer.drain()  # decidable from any process once this returns
        self.shown.add(call_id)
        granted, reason = await self._wait_decision(pending, future)
        if granted is None:
            return None, self._expired_message()
        return pending, None if granted else reason

    async def _wait_decision(self, pending: PendingApproval,
                             future: asyncio.Future[tuple[bool, str]]) -> tuple[bool | None, str]:
        """Wait for a decision: from this process (the future), or from any other (the store)."""
        run = self.run
        store, writer = run.engine.store, run._writer
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
                found = await off_loop(writer.inline, store.approval_decision, run.key, pending.call_id,
                                       pending.digest)
                if found is None and pending.expires_at <= time.time():
                    # the expiry is a decision too: a person's click that comes after it loses
                    expired = {"granted": False, "expired": True, "reason": ""}
                    if await off_loop(writer.inline, store.decide_approval, run.key, pending.call_id,
                                      pending.digest, expired):
                        found = expired
                    else:
                        found = await off_loop(writer.inline, store.approval_decision, run.key,
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
        self.run.emit(APPROVAL_EXPIRED, {"call_id": pending.call_id, "name": pending.tool,
                                         "expires_at": pending.expires_at})
        self.run._touch()
        return None, ""
