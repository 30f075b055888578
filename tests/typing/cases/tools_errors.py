"""A user's mistakes that mypy must report (tests/typing/test_typing.py).

A line ending in ``# E:`` followed by ``[code] text`` must get that error code from mypy,
with ``text`` in its message (a line may expect several); every other line must get none.
"""

from __future__ import annotations

from aaa_celery.tools import ToolContext, ToolHandler, ToolRegistry, tool


@tool(delivery="at_most_once", idempotency_key=lambda a: f"refund:{a['order_id']}")
async def refund(order_id: str, ctx: ToolContext) -> str:
    """Refund an order."""
    return order_id


@tool
def add(a: int, b: int = 1) -> int:
    """Add."""
    return a + b


async def typos_and_wrong_arguments() -> None:
    print(refund.nmae)  # E: [attr-defined] has no attribute "nmae"
    await refund(order_id=100, ctx=ToolContext.direct())  # E: [arg-type] "order_id" to "__call__" of "Tool"
    await refund(order="A-1", ctx=ToolContext.direct())  # E: [call-arg] Unexpected keyword argument "order"
    await add("1")  # E: [arg-type] incompatible type "str"; expected "int"
    await add(1, 2, 3)  # E: [call-arg] Too many arguments
    total: str = await add(1)  # E: [assignment] expression has type "int"
    print(total)


def wrong_options() -> None:
    @tool(timeout_s="fast")  # E: [call-overload] No overload variant of "tool"  # E: [untyped-decorator]
    def slow() -> None: ...

    @tool(pool="slow", requires_approval="yes")  # E: [call-overload] No overload variant of "tool"  # E: [untyped-decorator]
    def ask() -> None: ...

    @tool(idempotency_key="refund")  # E: [call-overload] No overload variant of "tool"  # E: [untyped-decorator]
    def keyed() -> None: ...


def handles(handler: ToolHandler) -> None:
    result = handler.task("refund").delay(order_id="A-1")
    print(result.stauts)  # E: [attr-defined] "AsyncResult[Any]" has no attribute "stauts"
    ToolRegistry([refund, add, "search"])  # E: [list-item]
