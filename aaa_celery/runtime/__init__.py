"""The engine shim that drives agent runs and maps Celery results onto facts."""

from .engine import Engine, PendingApproval, RunHandle, RunOutcome
from .results import ToolFact

__all__ = ["Engine", "PendingApproval", "RunHandle", "RunOutcome", "ToolFact"]
