"""aaa_celery: make side-effecting Celery tasks safe on fleets that crash, stall and redeliver."""

from .config import Delivery, GuardConfig, GuardPolicy, LostLease, RetryPolicy
from .context import ToolContext
from .errors import (
    AAACeleryError,
    ConfigError,
    ExecutionAbandoned,
    OutcomeUnknown,
    StoreError,
    StoreUnavailable,
    ToolArgsError,
    ToolError,
    ToolTimeout,
)
from .stores import Store, open_store
from .worker import GuardedTask, install

__version__ = "0.1.0"

__all__ = [
    # the guard on Celery
    "GuardedTask",
    "install",
    "open_store",
    "Store",
    # configuration
    "GuardConfig",
    "Delivery",
    "LostLease",
    "RetryPolicy",
    "GuardPolicy",
    "ToolContext",
    # errors
    "AAACeleryError",
    "ConfigError",
    "ToolError",
    "ToolArgsError",
    "ToolTimeout",
    "OutcomeUnknown",
    "ExecutionAbandoned",
    "StoreError",
    "StoreUnavailable",
]
