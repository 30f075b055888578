"""The engine shim that drives agent runs and maps Celery results onto facts."""

from .approvals import APPROVAL_DENIED, APPROVAL_GRANTED, PendingApproval
from .engine import Engine
from .results import ToolFact
from .run import ANY_TENANT, RunHandle, RunOutcome
from .sync import SyncEngine, SyncRunHandle

__all__ = [
    # async
    "Engine",
    "RunHandle",
    "RunOutcome",
    "ToolFact",
    "ANY_TENANT",
    # sync facade for WSGI apps
    "SyncEngine",
    "SyncRunHandle",
    # approvals
    "PendingApproval",
    "APPROVAL_GRANTED",
    "APPROVAL_DENIED",
]


def __dir__() -> list[str]:
    # The public names, not the submodules that importing leaves behind as attributes.
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
