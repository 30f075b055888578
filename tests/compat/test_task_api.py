"""Celery's task API behaves the same on a plain ``acks_late`` task and on the same task
guarded (``task_cls = GuardedTask``): each test runs in both modes on a real worker.

Reproduced on 702d210 (before the fixes): a ``bind=True`` guarded task could not be sent
(the send-time argument check still asked for ``self``); a bad argument count raised
``ToolArgsError`` in the worker where Celery raises ``TypeError``.
"""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

pytestmark = [pytest.mark.redis, pytest.mark.fleet]


def test_the_mode_is_what_it_says(compat):
    from aaa_celery import GuardedTask

    assert isinstance(compat.app.tasks["compat.add"], GuardedTask) is compat.guarded


def test_bind_true_gives_the_body_its_request(compat):
    result = compat.app.tasks["compat.whoami"].delay(7)
    assert result.get(timeout=20) == {"id": result.id, "x": 7, "retries": 0}


def test_a_bad_argument_count_fails_at_send_time_with_celery_s_type_error(compat):
    with pytest.raises(TypeError):
        compat.app.tasks["compat.whoami"].delay(1, 2)
    with pytest.raises(TypeError):
        compat.app.tasks["compat.add"].delay(1)


def test_the_send_time_check_has_the_function_s_own_arity(compat):
    header = compat.app.tasks["compat.add"].__header__
    import inspect

    assert list(inspect.signature(header).parameters) == ["x", "y"]


def test_a_message_with_bad_arguments_fails_in_the_worker_with_type_error(compat):
    result = compat.app.send_task("compat.add", args=[1])  # send_task skips the send-time check
    with pytest.raises(TypeError):
        result.get(timeout=20)

