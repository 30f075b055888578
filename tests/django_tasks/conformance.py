"""A conformance run of a ``django.tasks`` backend, written only against Django's public task
API (``django.tasks`` on Django 6, ``django_tasks`` before): ``python -m tests.django_tasks.conformance``
prints ``conformance: N checks passed on <package> <version> (Django <version>)`` or fails.

It runs on whatever ``TASKS["default"]`` configures (here ``conformance_settings``: the guarded
backend on an eager Celery app and the memory store, so it needs no server).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

os.environ.setdefault("AAA_DT_SQLITE", os.path.join(tempfile.mkdtemp(), "db.sqlite3"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django_tasks.conformance_settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402
from django.utils import timezone  # noqa: E402

try:
    from django import tasks as api
    from django.tasks import exceptions, signals
except ImportError:
    import django_tasks as api  # type: ignore[no-redef]
    from django_tasks import exceptions, signals  # type: ignore[no-redef]

InvalidTask = getattr(exceptions, "InvalidTask", None) or exceptions.InvalidTaskError
CHECKS: list[Callable[[], None]] = []


def check(fn: Callable[[], None]) -> Callable[[], None]:
    CHECKS.append(fn)
    return fn


class Heard:
    """The signals sent, as (signal name, sender, task result id, status)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any, str, str]] = []
        for name in ("task_enqueued", "task_started", "task_finished"):
            getattr(signals, name).connect(self.receiver(name), weak=False, dispatch_uid=f"conformance.{name}")

    def receiver(self, name: str) -> Callable[..., None]:
        def heard(sender: Any, task_result: Any, **_: Any) -> None:
            self.seen.append((name, sender, task_result.id, str(task_result.status)))
        return heard

    def of(self, result_id: str) -> list[tuple[str, str]]:
        return [(name, status) for name, _, rid, status in self.seen if rid == result_id]


heard = Heard()
backend = api.task_backends["default"]


@check
def the_backend_declares_what_it_supports() -> None:
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority


@check
def enqueue_returns_a_ready_result_and_sends_task_enqueued() -> None:
    from tests.django_tasks.conformance_tasks import add

    result = add.enqueue(2, 3)
    assert result.status == api.TaskResultStatus.READY, result.status
    assert isinstance(result.id, str) and 0 < len(result.id) < 64
    assert result.task == add and result.args == [2, 3] and result.kwargs == {}
    assert result.backend == "default" and result.errors == [] and result.worker_ids == []
    assert result.attempts == 0 and result.enqueued_at is not None and not result.is_finished
    assert heard.of(result.id)[0] == ("task_enqueued", "READY")
    assert any(sender is type(backend) for name, sender, rid, _ in heard.seen if rid == result.id)


@check
def get_result_is_the_finished_result_with_one_attempt() -> None:
    from tests.django_tasks.conformance_tasks import add

    result = add.enqueue(2, 3)
    done = add.get_result(result.id)
    assert done.status == api.TaskResultStatus.SUCCESSFUL and done.is_finished
    assert done.return_value == 5 and done.attempts == 1 and len(done.worker_ids) == 1
    assert done.enqueued_at <= done.started_at <= done.finished_at  # type: ignore[operator]
    assert done.last_attempted_at == done.started_at
    assert [n for n, _ in heard.of(result.id)] == ["task_enqueued", "task_started", "task_finished"]
    assert heard.of(result.id)[1:] == [("task_started", "RUNNING"), ("task_finished", "SUCCESSFUL")]
    result.refresh()
    assert result.status == api.TaskResultStatus.SUCCESSFUL and result.return_value == 5
    assert backend.get_result(result.id).return_value == 5


@check
def an_unknown_id_or_another_tasks_id_is_refused() -> None:
    from tests.django_tasks.conformance_tasks import add, slow

    for missing in ("no-such-result", "0" * 36):
        try:
            backend.get_result(missing)
        except exceptions.TaskResultDoesNotExist:
            pass
        else:
            raise AssertionError("get_result of an unknown id must raise TaskResultDoesNotExist")
    result = add.enqueue(1, 1)
    try:
        slow.get_result(result.id)
    except exceptions.TaskResultMismatch:
        pass
    else:
        raise AssertionError("get_result through another task must raise TaskResultMismatch")


@check
def a_task_that_takes_context_sees_its_attempt_and_result() -> None:
    from tests.django_tasks.conformance_tasks import who

    result = who.enqueue("x")
    assert who.get_result(result.id).return_value == {"attempt": 1, "id": result.id, "x": "x"}


@check
def an_async_task_runs_and_the_async_api_works() -> None:
    from tests.django_tasks.conformance_tasks import apong

    async def go() -> Any:
        result = await apong.aenqueue("A")
        return await apong.aget_result(result.id)

    assert asyncio.run(go()).return_value == "pong A"


@check
def a_failing_task_is_failed_with_its_exception() -> None:
    from tests.django_tasks.conformance_tasks import broken

    result = broken.get_result(broken.enqueue("nope").id)
    assert result.status == api.TaskResultStatus.FAILED and result.attempts == 1
    [error] = result.errors
    assert error.exception_class is KeyError and "nope" in error.traceback
    try:
        result.return_value  # noqa: B018
    except ValueError:
        pass
    else:
        raise AssertionError("return_value of a failed task must raise ValueError")
    assert heard.of(result.id)[-1] == ("task_finished", "FAILED")


@check
def queues_priorities_and_run_after_are_taken() -> None:
    from tests.django_tasks.conformance_tasks import add, slow

    assert slow.get_result(slow.enqueue().id).return_value == "slow"
    later = add.using(run_after=timezone.now() + dt.timedelta(seconds=1), priority=-50)
    assert later.enqueue(1, 2).status == api.TaskResultStatus.READY


@check
def an_invalid_task_is_refused_when_it_is_defined() -> None:
    def module_level(x: int) -> int:  # checked for everything but being module-level
        return x

    module_level.__qualname__ = "module_level"
    for bad in ({"queue_name": "nowhere"}, {"priority": 101}):
        try:
            api.task(**bad)(module_level)
        except InvalidTask:
            continue
        raise AssertionError(f"{bad} must raise InvalidTask")
    try:
        add_naive = api.task(module_level).using(run_after=dt.datetime(2030, 1, 1))  # naive under USE_TZ
        add_naive.enqueue(1)
    except InvalidTask:
        pass
    else:
        raise AssertionError("a naive run_after must raise InvalidTask")


@check
def an_enqueue_in_a_rolled_back_transaction_is_gone() -> None:
    from tests.django_tasks.conformance_tasks import add

    try:
        with transaction.atomic():
            result = add.enqueue(1, 2)
            raise RuntimeError
    except RuntimeError:
        pass
    try:
        backend.get_result(result.id)
    except exceptions.TaskResultDoesNotExist:
        return
    raise AssertionError("a rolled-back enqueue must leave no result")


def main() -> int:
    call_command("migrate", verbosity=0)
    for fn in CHECKS:
        try:
            fn()
        except Exception:
            print(f"conformance: {fn.__name__} FAILED", file=sys.stderr)
            raise
    source = api.__name__
    print(f"conformance: {len(CHECKS)} checks passed on {source} (Django {django.get_version()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
