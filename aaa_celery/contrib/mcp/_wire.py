"""The tasks extension's wire shapes (SEP-2663, schema 2026-07-28), as ``mcp`` SDK models."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import mcp_types as types
from pydantic import ConfigDict, Field

#: The tasks extension's identifier (SEP-2663).
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
#: The task states that never change again.
TERMINAL = frozenset({"completed", "failed", "cancelled"})


class TaskParams(types.RequestParams):
    """The params of ``tasks/get`` and ``tasks/cancel``."""

    task_id: str = Field(alias="taskId")


class UpdateParams(types.RequestParams):
    """The params of ``tasks/update``."""

    task_id: str = Field(alias="taskId")
    input_responses: dict[str, Any] = Field(default_factory=dict, alias="inputResponses")


class GetTaskRequest(types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param: ClassVar[str | None] = "taskId"


class CancelTaskRequest(types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams
    name_param: ClassVar[str | None] = "taskId"


class TaskFields(types.Result):
    """A task as ``tasks/get`` and a task handle carry it (other fields are kept)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    task_id: str = Field(alias="taskId")
    status: str
    status_message: str | None = Field(default=None, alias="statusMessage")
    created_at: str | None = Field(default=None, alias="createdAt")
    last_updated_at: str | None = Field(default=None, alias="lastUpdatedAt")
    ttl_ms: int | None = Field(default=None, alias="ttlMs")
    poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")


class CreateTaskResult(TaskFields):
    """A ``tools/call`` answered with a task handle (``resultType: "task"``)."""

    result_type: Literal["task"] = Field(default="task", alias="resultType")


class GetTaskResult(TaskFields):
    """The answer of ``tasks/get``: the task, with its result, error or input requests."""

    result_type: str = Field(default="complete", alias="resultType")
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    input_requests: dict[str, Any] | None = Field(default=None, alias="inputRequests")

    @property
    def error_type(self) -> str | None:
        """The guard's error a failed task names (``OutcomeUnknown``, ...), if any."""
        data = (self.error or {}).get("data")
        return data.get("type") if isinstance(data, dict) else None
