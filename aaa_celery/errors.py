"""The one exception tree of aaa_celery.

Every error the library raises derives from :class:`AAACeleryError`. The tool
failures (:class:`ToolError` and its children) travel through Celery's JSON
result serialization, so each one is constructible from its message alone;
extra context is keyword-only and optional.
"""

from __future__ import annotations

import re
from typing import Any


class AAACeleryError(Exception):
    """An aaa_celery error."""

    def __init__(self, message: str | None = None, **context: Any) -> None:
        super().__init__(message or (type(self).__doc__ or "").strip().splitlines()[0])
        for key, value in context.items():
            setattr(self, key, value)

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConfigError(AAACeleryError, ValueError):
    """Invalid guard or tool configuration."""


class InvalidId(AAACeleryError, ValueError):
    """An id (call id, run id or tenant) is empty, too long, or carries control characters."""


class ForeignCall(InvalidId):
    """A message's tenant or run header names another tenant or run than its call id belongs to."""


class ToolError(AAACeleryError):
    """A tool failed cleanly; the message is meant for the model."""


class ToolArgsError(ToolError):
    """The arguments of a tool call do not match the tool's schema."""


class ToolTimeout(ToolError):
    """The tool body ran longer than the tool's timeout_s."""


#: Why an attempt was lost, as ``OutcomeUnknown`` and ``ExecutionAbandoned`` report it (their
#: ``cause``, and ``(cause: ...)`` at the end of their message): its worker was lost (a crash,
#: a kill, a stall), it could not reach the store for longer than its lease, or every one
#: of the call's attempts lost its worker (a call that kills its worker: a poison call).
WORKER_LOST = "worker_lost"
STORE_UNREACHABLE = "store_unreachable"
POISON_CALL = "poison_call"


class _LossCause:
    """``cause``: which loss ended the call (:data:`WORKER_LOST`, :data:`STORE_UNREACHABLE` or
    :data:`POISON_CALL`), read from the message, so it survives any result backend that keeps
    an error's text."""

    @property
    def cause(self) -> str | None:
        found = re.search(r"\(cause: (\w+)\)\s*$", str(self))
        return found.group(1) if found else None


class OutcomeUnknown(_LossCause, ToolError):
    """The action may already have happened: verify its effect, do not blindly retry it."""


class ExecutionAbandoned(_LossCause, ToolError):
    """The call kept losing its worker and reached max_attempts; it was abandoned."""


class PolicyDenied(ToolError):
    """The handler's guard policy refused this call; ``rule`` names the rule."""


class CallSkipped(PolicyDenied):
    """The call did not run: every slot of its concurrency key was held (``on_busy="skip"``)."""


class ResultTooLarge(ToolError):
    """The tool's result is larger than its max_result_bytes; it was not recorded."""


class ApprovalDenied(ToolError):
    """A person denied this call."""


class ApprovalExpired(ToolError):
    """Nobody decided on this call before its approval request expired; it was not sent."""


class StoreError(AAACeleryError):
    """The lease and attempt-log store failed."""


class StoreUnavailable(StoreError):
    """The store cannot be reached; nothing was run or recorded."""


class UnsafeDeployment(StoreError):
    """The store's deployment cannot keep the guarantees (e.g. a transaction-pooling proxy)."""


class StoreOutdated(StoreError):
    """The store's schema (or Redis format) is not the one this release runs on: an older one
    to upgrade with ``celery -A proj aaa migrate``, or a newer one written by a later release."""


class LeaseLost(AAACeleryError):
    """This worker lost the call's lease; another attempt may be running."""


class NotResolvable(AAACeleryError):
    """An operator may settle only a call whose outcome is in doubt (``OutcomeUnknown`` or
    ``ExecutionAbandoned``); a real result is never overwritten."""

    def __init__(self, message: str = "", *, call_id: str = "", current: object = None) -> None:
        super().__init__(message or self.__doc__)
        self.call_id = call_id
        self.current = current


class ResultBackendNotWritten(AAACeleryError):
    """The store took an operator's verdict, but Celery's result backend could not be
    written: the engine and later deliveries see the verdict, a plain ``AsyncResult`` still
    reads the old result."""


OUTCOME_UNKNOWN_MESSAGE = (
    "The outcome of this action is unknown: the worker running it was lost after the "
    "action started, so it may or may not have taken effect. Do not simply retry it: "
    "verify first (look the effect up), then decide."
)

OUTCOME_UNKNOWN_STORE_MESSAGE = (
    "The outcome of this action is unknown: the worker running it could not reach the guard's "
    "store for longer than its lease, so it stopped the action part way; it may or may not have "
    "taken effect. Do not simply retry it: verify first (look the effect up), then decide."
)

ABANDONED_MESSAGE = (
    "The call was abandoned after {attempts} attempts: each attempt lost its worker "
    "(crash or stall). It may have taken effect partially; verify before retrying."
)

#: Error types that a recorded outcome may name, for mapping back to exceptions.
TOOL_ERRORS: dict[str, type[ToolError]] = {
    cls.__name__: cls
    for cls in (
        ToolError,
        ToolArgsError,
        ToolTimeout,
        OutcomeUnknown,
        ExecutionAbandoned,
        ResultTooLarge,
        ApprovalDenied,
        ApprovalExpired,
        PolicyDenied,
        CallSkipped,
    )
}
