"""Tools and a counting fake model for the resume tests (imported by the test process and by
the child process that is kill -9ed: tests/runtime/resume_child.py).

Every body run and every model request is appended, as one JSON line, to the file named by
``AAA_RESUME_LOG``, so the test counts them across processes.
"""

from __future__ import annotations

import json
import os
import time
from typing import Annotated, Any

from aaa_celery.llm import LLMRequest, LLMResponse, ToolCall
from aaa_celery.llm.fake import text
from aaa_celery.tools import Secret, ToolRegistry, tool

LOG_ENV = "AAA_RESUME_LOG"


def note(kind: str, **fields: Any) -> None:
    with open(os.environ[LOG_ENV], "a", encoding="utf-8") as f:
        f.write(json.dumps({"kind": kind, "pid": os.getpid(), "at": time.time(), **fields}) + "\n")
        f.flush()


def notes(kind: str | None = None) -> list[dict[str, Any]]:
    path = os.environ[LOG_ENV]
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        found = [json.loads(line) for line in f if line.strip()]
    return [n for n in found if kind in (None, n["kind"])]


@tool
def lookup(order: str) -> str:
    """Read an order (quick)."""
    note("lookup", order=order)
    return f"order {order}: paid 30 EUR"


@tool(guard={"lease_ttl_s": 2.0}, timeout_s=120)
def slow_report(order: str) -> str:
    """A long call: sleeps ``AAA_RESUME_SLOW_S`` seconds (default 1)."""
    note("slow_report.start", order=order)
    time.sleep(float(os.environ.get("AAA_RESUME_SLOW_S", "1")))
    note("slow_report.end", order=order)
    return f"report on {order}"


@tool(requires_approval=True, delivery="at_most_once")
def refund(order: str, amount: int) -> str:
    """Refund money (a person approves; never twice)."""
    note("refund", order=order, amount=amount)
    return f"refunded {amount} EUR on {order}"


@tool(delivery="at_most_once")
def unlock(user: str, pin: Annotated[str, Secret]) -> str:
    """Unlock a user's account with their PIN (an effect: never twice)."""
    note("unlock", user=user)
    return f"unlocked {user}"


REGISTRY = ToolRegistry([lookup, slow_report, refund])
#: The tools of SECRET_PLAN (run by 0.1.0 too: tests/runtime/test_resume_from_0_1_0.py).
SECRET_REGISTRY = ToolRegistry([unlock, refund])


def scripted(*plan: list[tuple[str, dict[str, Any]]] | str):
    """A fake model that answers turn n with ``plan[n]`` (tool calls, or a final text), and
    notes every request it gets (the "stub model server" counts its requests)."""

    def model(request: LLMRequest) -> LLMResponse:
        turn = sum(1 for m in request.messages if m.role == "assistant")
        note("model", turn=turn)
        step = plan[turn]
        if isinstance(step, str):
            facts = " | ".join(m.content for m in request.messages if m.role == "tool")
            return text(f"{step}: {facts}")
        return LLMResponse(tool_calls=tuple(ToolCall(name, args, id=f"m{turn}.{n}")
                                            for n, (name, args) in enumerate(step)))

    return model


#: lookup, then the long report, then done.
LONG_PLAN = ([("lookup", {"order": "A-100"})], [("slow_report", {"order": "A-100"})], "done")
#: lookup, then a refund a person approves, then done.
REFUND_PLAN = ([("lookup", {"order": "A-100"})], [("refund", {"order": "A-100", "amount": 30})], "done")
#: an unlock with a secret PIN, then a refund a person approves, then done.
SECRET_PLAN = ([("unlock", {"user": "bob", "pin": "4821"})], [("refund", {"order": "A-100", "amount": 30})], "done")
