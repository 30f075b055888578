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
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError

APPROVAL_REQUESTED = "aaa.approval.requested"
APPROVAL_GRANTED = "aaa.approval.granted"
APPROVAL_DENIED = "aaa.approval.denied"
APPROVAL_EXPIRED = "aaa.approval.expired"
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
