"""aaa_celery: make side-effecting Celery tasks safe on fleets that crash, stall and redeliver."""

from typing import TYPE_CHECKING

from .config import Delivery, GuardConfig, GuardPolicy, LostLease, RetryPolicy
from .context import ToolContext
from .errors import (
    AAACeleryError,
    CallSkipped,
    ConfigError,
    ExecutionAbandoned,
    OutcomeUnknown,
    PolicyDenied,
    StoreError,
    StoreUnavailable,
    ToolArgsError,
    ToolError,
    ToolTimeout,
)
from .stores import Store, open_store

if TYPE_CHECKING:
    from .worker import GuardedTask, install
del TYPE_CHECKING

__version__ = "0.3.0.dev0"

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
    "PolicyDenied",
    "CallSkipped",
    "StoreError",
    "StoreUnavailable",
]


def __getattr__(name: str) -> object:
    # The Celery side loads on first use, so importing the pure modules
    # (``aaa_celery.lifecycle``, ``aaa_celery.config``) never loads Celery.
    if name in ("GuardedTask", "install"):
        from . import worker

        return getattr(worker, name)
    raise AttributeError(f"module 'aaa_celery' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The public names, not the submodules that importing leaves behind as attributes.
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
