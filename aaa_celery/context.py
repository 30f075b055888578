"""ToolContext: what a running tool knows about its call."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol


class AttemptGuard(Protocol):
    """What the guard tells a running attempt about its lease (see :class:`ToolContext`)."""

    def lease_remaining_s(self) -> float: ...

    def check_lease(self, min_s: float) -> None: ...

    def checkpoint(self, data: Any) -> None: ...

    def last_checkpoint(self) -> Any: ...


#: The guard of the attempt running in this thread (or asyncio task), if any.
_attempt: ContextVar[AttemptGuard | None] = ContextVar("aaa_attempt", default=None)


@contextmanager
def running_attempt(guard: AttemptGuard) -> Iterator[None]:
    """Make ``guard`` the one a ``ToolContext`` made inside this block reports on."""
    reset = _attempt.set(guard)
    try:
        yield
    finally:
        _attempt.reset(reset)


@dataclass
class ToolContext:
    """Injected into tools that declare a ``ctx: ToolContext`` parameter.

    ``call_id`` is the guard's id of this call: the Celery task id and the store's key.
    ``tool_call_id`` is the model's own id for it (engine calls only), which threads the
    transcript. ``idempotency_key`` is stable across every attempt and every worker for the
    same logical call (``<run id>/<call id>`` for engine calls, with the guard's call id,
    never the model's tool call id, and the call id for plain tasks by default, or what the tool's
    ``idempotency_key=`` function returns): pass it to the system you call so a
    repeated attempt cannot repeat the effect. ``attempt`` and ``fence`` are the
    1-based, rising execution number of this call. ``tool`` is the tool's name (the task's
    name for a plain task): with ``tenant``, the scope of what :func:`aaa_celery.effects.once`
    records under the key.
    """

    engine: Any
    run_id: str
    call_id: str
    attempt: int = 1
    fence: int = 1
    idempotency_key: str = ""
    tenant: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    tool_call_id: str | None = None
    tool: str | None = None
    guard: AttemptGuard | None = field(default_factory=_attempt.get, repr=False, compare=False)

    @classmethod
    def direct(cls) -> ToolContext:
        """The context of a direct call (a unit test calling the function): it is not
        guarded, so there is no lease, no attempt record and no idempotency key.
        ``meta["unguarded"]`` is True."""
        return cls(engine=None, run_id="direct", call_id="direct", meta={"unguarded": True})

    @property
    def guarded(self) -> bool:
        """Whether this call runs under the guard (False for a direct call)."""
        return not self.meta.get("unguarded", False)

    @property
    def lease_remaining_s(self) -> float:
        """Seconds this attempt's lease is proved for (the TTL since the last renewal the
        store confirmed); 0 once lost, infinite when the call is not guarded."""
        return self.guard.lease_remaining_s() if self.guard is not None else float("inf")

    def check_lease(self, min_s: float = 0.0) -> None:
        """Raise :class:`~aaa_celery.errors.LeaseLost` unless the lease is proved for at
        least ``min_s`` more seconds (renewing it now if it must). Call it just before an
        effect you might not finish under the lease; the attempt then ends without a
        result (as a lost lease's does) instead of starting that effect. ``min_s`` must not
        exceed ``lease_ttl_s``."""
        if self.guard is not None:
            self.guard.check_lease(min_s)

    def checkpoint(self, data: Any) -> None:
        """Save ``data`` (JSON, at most ``MAX_CHECKPOINT_BYTES`` = 64 KiB encoded) as this
        call's progress. It is written with the lease's next renewal (only while this
        attempt holds the lease), and a later attempt of the same call reads it as
        :attr:`last_checkpoint`. A later checkpoint replaces an earlier one."""
        if self.guard is not None:
            self.guard.checkpoint(data)

    @property
    def last_checkpoint(self) -> Any:
        """The data of the last checkpoint saved for this call (by an earlier attempt, or
        this one), or None. Read from the store on each access."""
        return self.guard.last_checkpoint() if self.guard is not None else None
