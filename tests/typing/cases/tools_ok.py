"""A user's typed code: mypy --strict must accept every line (tests/typing/test_typing.py).

Each ``assert_type`` is what a type checker must infer from ``@tool``, ``Tool`` and the
task handles; each assignment to a declared type is a conversion that must be allowed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, assert_type

from celery import Celery, Signature, chain
from celery.result import AsyncResult

from aaa_celery import GuardedTask
from aaa_celery.tools import GuardConfig, Tool, ToolContext, ToolHandler, ToolRegistry, tool
from aaa_celery.tools.handler import ToolTask


@tool
async def search(query: str, k: int = 5) -> list[str]:
    """Search."""
    return [query] * k


@tool(delivery="at_most_once", idempotency_key=lambda a: f"refund:{a['order_id']}",
      guard={"lease_ttl_s": 10}, timeout_s=30)
async def refund(order_id: str, ctx: ToolContext) -> str:
    """Refund an order."""
    return f"refunded {order_id} ({ctx.idempotency_key})"


@tool(name="add", requires_approval=True, pool="slow", guard=GuardConfig(max_attempts=2))
def add(a: int, b: int = 1) -> int:
    """A sync tool."""
    return a + b


def shout(text: str) -> str:
    """Made a tool without the decorator."""
    return text.upper()


async def direct_calls() -> None:
    # awaited, a tool gives its function's result: an async def's and a def's alike
    assert_type(await search("refunds"), list[str])
    assert_type(await search(query="refunds", k=2), list[str])
    assert_type(await add(1), int)
    assert_type(await add(a=1, b=2), int)
    assert_type(await refund(order_id="A-1", ctx=ToolContext.direct()), str)
    assert_type(await Tool(shout)("hi"), str)
    assert_type(await tool(shout, name="shout")("hi"), str)


def signatures() -> None:
    # a tool is assignable where its function's signature is expected
    typed_search: Tool[[str, int], list[str]] = search
    typed_add: Callable[[int, int], Any] = add.fn
    assert_type(search.name, str)
    assert_type(search.schema, dict[str, Any])
    assert_type(refund.delivery, str | None)
    assert typed_search is search and typed_add is add.fn


def handles(app: Celery) -> None:
    registry = ToolRegistry([search, refund, add])
    kept: list[Tool[..., Any]] = [search, refund]  # a list in a variable: its type said (docs/typing.md)
    assert len(ToolRegistry(kept)) == 2
    shouted: Tool[[str], str] = registry.add(Tool(shout))
    assert_type(registry["add"], Tool[..., Any])
    assert shouted.name == "shout"
    handler = ToolHandler(registry, pools={"default": 8, "slow": 2})
    handler.bind(app)
    handle = handler.task("refund")
    assert_type(handle.delay(order_id="A-1"), AsyncResult[Any])
    assert_type(handle.apply_async({"order_id": "A-2"}, countdown=10), AsyncResult[Any])
    assert_type(handle.s(query="refund policy"), Signature[Any])
    assert_type(handle.task, ToolTask)
    assert_type(handle.task.apply_async(kwargs={"arguments": {"order_id": "A-3"}}), AsyncResult[Any])
    chain(handler.task("search").s(query="refunds"), handle.s(order_id="A-4")).delay()


def guarded_tasks(app: Celery) -> None:
    # celery-types types a task made with base= as that base class: its sends take any
    # arguments and give AsyncResult[Any] (docs/typing.md)
    @app.task(base=GuardedTask, delivery="at_most_once", idempotency_key=lambda a: f"charge:{a['order_id']}")
    def charge(order_id: str, ctx: ToolContext) -> str:
        return f"charged {order_id} ({ctx.idempotency_key})"

    assert_type(charge, GuardedTask)
    assert_type(charge.delay("A-1"), AsyncResult[Any])
    assert_type(charge.apply_async(("A-1",), countdown=5), AsyncResult[Any])

