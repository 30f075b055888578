"""Wire names that the runtime, the worker and the web pages share: plain constants.

A *call id* is the guard's name for one call, everywhere: the Celery task id, the
store's key, ``ctx.call_id``, the ``call_id`` of every ``aaa.*`` event and page.
The model's own id for a tool call is its *tool call id*: it only threads the
transcript (``ctx.tool_call_id``, ``Message.tool_call_id``).
"""

from __future__ import annotations

#: Message headers the engine sets on a tool call; plain tasks fall back to Celery's ids.
RUN_HEADER = "aaa_run_id"
TOOL_CALL_HEADER = "aaa_tool_call_id"
TENANT_HEADER = "aaa_tenant"
HEADERS = (RUN_HEADER, TOOL_CALL_HEADER, TENANT_HEADER)

#: Task names of tools: ``aaa.tool.<tool name>``.
TASK_PREFIX = "aaa.tool."
#: Queue names of pools: ``aaa.<pool>``.
QUEUE_PREFIX = "aaa."


def task_name(tool_name: str) -> str:
    """The Celery task name of a tool."""
    return f"{TASK_PREFIX}{tool_name}"


def call_id_for(run_id: str, tool_call_id: str) -> str:
    """The call id (task id, store key) of the model's tool call ``tool_call_id`` in a run."""
    return f"{run_id}:{tool_call_id}"
