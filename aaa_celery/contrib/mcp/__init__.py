"""``aaa_celery.contrib.mcp``: guarded tools over the Model Context Protocol.

- :class:`GuardedMCPServer` serves a :class:`~aaa_celery.tools.ToolHandler`'s tools as an
  MCP server (streamable HTTP, stdio), each ``tools/call`` a guarded call on the fleet,
  with the tasks extension (``taskId`` = the call id).
- :func:`annotate` and :class:`Hints`: a tool's MCP annotations and its delivery policy agree.
- :class:`RemoteServer` and :func:`remote_tool`: a remote MCP server's tools as guarded tools.

Needs the ``mcp`` extra: ``pip install aaa_celery[mcp]`` (docs/mcp.md).
"""

from __future__ import annotations

try:
    import mcp as _mcp  # noqa: F401
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError("aaa_celery.contrib.mcp needs the official MCP SDK: pip install 'aaa_celery[mcp]'") from e

from .annotations import Hints, advertised, annotate, delivery_for
from .client import RemoteServer, TaskFailed, TasksExtension, cancel_task, get_task, remote_tool, remote_tools
from .server import CALL_KEY_META, TASKS_EXTENSION, GuardedMCPServer

__all__ = [
    "GuardedMCPServer",
    "TASKS_EXTENSION",
    "CALL_KEY_META",
    "Hints",
    "annotate",
    "advertised",
    "delivery_for",
    "RemoteServer",
    "remote_tool",
    "remote_tools",
    "TasksExtension",
    "TaskFailed",
    "get_task",
    "cancel_task",
]
