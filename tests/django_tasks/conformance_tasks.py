"""The conformance run's tasks, written with Django's public ``@task`` only."""

from __future__ import annotations

from typing import Any

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]


@task
def add(a: int, b: int) -> int:
    return a + b


@task(takes_context=True)
def who(context: Any, x: str) -> dict[str, Any]:
    return {"attempt": context.attempt, "id": context.task_result.id, "x": x}


@task
async def apong(x: str) -> str:
    return f"pong {x}"


@task
def broken(reason: str) -> None:
    raise KeyError(reason)


@task(queue_name="slow", priority=10)
def slow() -> str:
    return "slow"
