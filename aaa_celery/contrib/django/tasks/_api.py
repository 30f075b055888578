"""Django's task API, from whichever package provides it: ``django.tasks`` (Django 6.0 and
later) or its backport ``django_tasks`` (0.12, Django 4.2 to 5.2). Both have one contract;
the backport still names ``InvalidTask`` ``InvalidTaskError``. Type checks read Django's names."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started

    SOURCE = "django.tasks"
else:
    try:
        from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskError
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started

        SOURCE = "django.tasks"
    except ImportError:
        try:
            from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import Task, TaskError
            from django_tasks.exceptions import InvalidTaskError as InvalidTask
            from django_tasks.exceptions import TaskResultDoesNotExist
            from django_tasks.signals import task_enqueued, task_finished, task_started
        except ImportError as e:
            raise ImportError(
                "aaa_celery.contrib.django.tasks needs Django's task API: Django 6.0 or later "
                "(django.tasks), or before Django 6 the backport: pip install 'aaa_celery[django-tasks]'"
            ) from e
        SOURCE = "django_tasks"

__all__ = [
    "SOURCE",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
