"""What the types promise holds at run time (issue 19, docs/typing.md).

``Tool[P, R]`` gives a tool its function's signature, so a direct call may pass arguments
by position and may pass ``ctx``, as the function takes them; the sends of
``GuardedTask`` and ``ToolTask`` take Celery's positional parameters (``producer``,
``link``...), as ``celery.Task.apply_async`` does.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from celery import Celery

from aaa_celery import GuardedTask
from aaa_celery.errors import ToolArgsError
from aaa_celery.tools import ToolContext, ToolHandler, ToolRegistry, tool
from aaa_celery.worker import app_store


@tool
async def refund(order_id: str, ctx: ToolContext, amount: int = 1) -> str:
    """Refund."""
    return f"{order_id} {amount} {ctx.call_id} {ctx.idempotency_key}"


@tool
def add(a: int, b: int = 1) -> int:
    """Add."""
    return a + b


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_direct_call_binds_positional_arguments_as_the_function_does():
    assert run(add(2, 3)) == 5
    assert run(add(2, b=3)) == 5
    assert run(add(2)) == 3
    assert run(add("2")) == 3  # checked and converted by the schema, as a model's arguments are


def test_a_direct_call_refuses_what_python_would_refuse():
    with pytest.raises(TypeError, match="takes 2 positional arguments but 3 were given"):
        run(add(1, 2, 3))
    with pytest.raises(TypeError, match="multiple values for argument 'a'"):
        run(add(1, a=2))
    with pytest.raises(ToolArgsError, match="(?i)extra"):  # as before: the schema names it
        run(add(1, c=2))


def test_a_direct_call_uses_the_ctx_given_else_a_direct_one():
    ctx = ToolContext(engine=None, run_id="test", call_id="c-1", idempotency_key="refund:A-1")
    assert run(refund("A-1", ctx, 5)) == "A-1 5 c-1 refund:A-1"
    assert run(refund(order_id="A-1", ctx=ctx)) == "A-1 1 c-1 refund:A-1"
    assert run(refund(order_id="A-1")) == "A-1 1 direct "  # as before: ToolContext.direct()


def test_a_ctx_that_is_not_a_tool_context_is_refused():
    with pytest.raises(ToolArgsError, match="ctx must be a ToolContext, got str"):
        run(refund("A-1", "not a context"))


def registered(app: Celery) -> list[str]:
    return [record.call_id for record in app_store(app).calls()]


@pytest.fixture
def app():
    app = Celery("typed_calls", broker="memory://", set_as_current=False)
    app.conf.update(aaa_store_url="memory://", worker_prefetch_multiplier=1)
    yield app
    app_store(app).close()


def test_a_guarded_task_is_sent_with_a_positional_producer_as_celery_takes_it(app):
    @app.task(base=GuardedTask, name="typed_calls.echo", shared=False)
    def echo(x: int) -> int:
        return x

    with app.producer_or_acquire() as producer:
        result = echo.apply_async((1,), None, None, producer)
    assert result.id in registered(app)  # registered at publish, as a send by keyword is


def test_a_tool_task_is_sent_with_a_positional_producer_as_celery_takes_it(app):
    handler = ToolHandler(ToolRegistry([add]))
    handler.bind(app)
    with app.producer_or_acquire() as producer:
        result = handler.task("add").task.apply_async(None, {"arguments": {"a": 1}}, None, producer)
    assert result.id in registered(app)
