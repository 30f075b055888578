"""ToolContext: what a running tool knows about its call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolContext:
    """Injected into tools that declare a ``ctx: ToolContext`` parameter.

    ``call_id`` is the guard's id of this call: the Celery task id and the store's key.
    ``tool_call_id`` is the model's own id for it (engine calls only), which threads the
    transcript. ``idempotency_key`` is stable across every attempt and every worker for the
    same logical call (``<run id>/<tool call id>`` for engine calls and the call id for
    plain tasks by default, or what the tool's
    ``idempotency_key=`` function returns): pass it to the system you call so a
    repeated attempt cannot repeat the effect. ``attempt`` and ``fence`` are the
    1-based, rising execution number of this call.
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
