"""Approvals: a person, not the model, lets a ``requires_approval`` call go out.

A call waits as a :class:`PendingApproval` until the app signals
``aaa.approval.granted`` or ``aaa.approval.denied`` on its run
(``RunHandle.signal``). The model has no way to produce that signal: the engine
never turns model output (text, tool calls or arguments) into signals. The
approval is bound to the call id and to the exact arguments shown: the engine
sends the snapshot that was shown, and a signal that names other arguments (or
another ``digest``) is refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

APPROVAL_REQUESTED = "aaa.approval.requested"
APPROVAL_GRANTED = "aaa.approval.granted"
APPROVAL_DENIED = "aaa.approval.denied"
#: What the model reads for a denied call (plus the person's reason, if given).
DENIED_MESSAGE = "denied by a person"


def digest(run_id: str, call_id: str, tool: str, arguments: dict[str, Any]) -> str:
    """A fingerprint of exactly what a person is asked to approve."""
    shown = json.dumps([run_id, call_id, tool, arguments], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(shown.encode()).hexdigest()[:32]


@dataclass
class PendingApproval:
    """A call waiting for a person: its tool, the arguments shown, its run and since when.

    Attributes:
        run_id: the run the call belongs to.
        call_id: the call's id (its task id); the approval signal names it.
        tool: the tool's name.
        arguments: the arguments shown (and, once granted, sent; a copy).
        since: when the call started waiting (``time.time()`` seconds).
        digest: fingerprint of run, call, tool and arguments; a signal may carry
            it to prove it approves what was shown.
        tool_call_id: the model's own id for the call.
    """

    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    since: float
    digest: str = ""
    _future: asyncio.Future[tuple[bool, str]] | None = field(repr=False, default=None)
    tool_call_id: str | None = None

    @property
    def decided(self) -> bool:
        """Whether a person granted or denied it already."""
        return self._future is not None and self._future.done()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view, for an app to show to a person."""
        return {
            "run_id": self.run_id,
            "call_id": self.call_id,
            "tool_call_id": self.tool_call_id,
            "tool": self.tool,
            "arguments": self.arguments,
            "since": self.since,
            "digest": self.digest,
        }

    def check(self, data: dict[str, Any]) -> None:
        """Refuse a decision that names other arguments or another digest than the ones shown."""
        if "arguments" in data and data["arguments"] != self.arguments:
            raise ValueError(f"approval for {self.call_id!r} names other arguments than the ones shown")
        if "digest" in data and data["digest"] != self.digest:
            raise ValueError(f"approval for {self.call_id!r} carries a digest of something else than was shown")
