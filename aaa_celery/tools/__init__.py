"""``aaa_celery.tools``: register tools and run them under the execution guard."""

from ..config import Delivery, GuardConfig, GuardPolicy, LostLease, RetryPolicy
from ..context import ToolContext
from ..errors import ExecutionAbandoned, OutcomeUnknown, PolicyDenied, ToolArgsError, ToolError
from ..guard.reconcile import Happened, NotHappened
from .handler import ToolHandler
from .registry import ToolRegistry
from .search import Index, search_tool
from .secrets import Secret
from .tool import Tool, tool

__all__ = [
    # registering tools
    "Tool",
    "ToolRegistry",
    "tool",
    "search_tool",
    "Index",
    "Secret",
    # what a reconcile step answers (@tool(reconcile=fn))
    "Happened",
    "NotHappened",
    # running them
    "ToolHandler",
    "ToolContext",
    # guard configuration
    "GuardConfig",
    "Delivery",
    "LostLease",
    "RetryPolicy",
    "GuardPolicy",
    # errors
    "ToolError",
    "ToolArgsError",
    "OutcomeUnknown",
    "ExecutionAbandoned",
    "PolicyDenied",
]


def __dir__() -> list[str]:
    # The public names, not the submodules that importing leaves behind as attributes.
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
