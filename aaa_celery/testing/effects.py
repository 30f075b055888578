"""What a tool really did, written by the test's fake of the system the tool calls.

A tool's effect (a refund at the payment provider) goes through a client that a test
replaces with a fake. The fake records each body run and each try of the effect here, so
:func:`~aaa_celery.testing.check_history` can tell whether the effect happened once::

    from aaa_celery.testing import effects

    class FakePSP:
        def refund(self, ctx, order_id, amount):
            effects.started(ctx)                            # a body run began
            done = effects.apply(ctx, order_id=order_id)    # once per ctx.idempotency_key
            return effects.returned(ctx, {"order_id": order_id, "new": done})

In a worker process the entries go to the Redis :class:`~aaa_celery.testing.EffectLedger`
named by ``AAA_TEST_LEDGER_URL`` (the pytest plugin's fleet sets it), so every worker
writes to one place; without it (eager tests, one process) they go to a process-wide
:class:`~aaa_celery.testing.ledger.MemoryEffectLedger`.
"""

from __future__ import annotations

import contextvars
import os
from typing import Any

from .ledger import END, START, BaseEffectLedger, EffectLedger, MemoryEffectLedger, new_exec_id

#: Env var naming the Redis URL of the shared effect ledger (set by the plugin's fleet).
LEDGER_ENV = "AAA_TEST_LEDGER_URL"
#: The key prefix of the shared ledger in that Redis.
LEDGER_PREFIX = "aaa:test:effects"

_memory = MemoryEffectLedger()
_opened: dict[tuple[int, str], EffectLedger] = {}
_run: contextvars.ContextVar[tuple[str, int, str] | None] = contextvars.ContextVar("aaa_effect_run", default=None)


def ledger() -> BaseEffectLedger:
    """The ledger of this process: the shared Redis one if ``AAA_TEST_LEDGER_URL`` is set."""
    url = os.environ.get(LEDGER_ENV)
    if not url:
        return _memory
    key = (os.getpid(), url)  # a forked pool child opens its own connection
    found = _opened.get(key)
    if found is None:
        found = _opened[key] = EffectLedger(url, prefix=LEDGER_PREFIX)
    return found


def _exec_id(ctx: Any) -> str:
    run = _run.get()
    if run is None or run[:2] != (ctx.call_id, ctx.attempt):
        return started(ctx)
    return run[2]


def started(ctx: Any, **fields: Any) -> str:
    """Record that a body run of ``ctx``'s call began; returns the run's id."""
    exec_id = new_exec_id()
    _run.set((ctx.call_id, ctx.attempt, exec_id))
    ledger().record(START, ctx.call_id, exec_id, attempt=ctx.attempt, fence=ctx.fence, **fields)
    return exec_id


def apply(ctx: Any, key: str | None = None, **fields: Any) -> bool:
    """Apply the call's effect under ``key`` (default: ``ctx.idempotency_key``) at most once,
    as a provider that honours idempotency keys does: True if this try applied it, False if
    an earlier try had. Every try is recorded."""
    return ledger().apply_effect(key or ctx.idempotency_key, ctx.call_id, _exec_id(ctx), attempt=ctx.attempt,
                                 fence=ctx.fence, **fields)


def returned(ctx: Any, value: Any) -> Any:
    """Record that the body run returns ``value`` (the checker compares it with the stored
    result), and give ``value`` back."""
    ledger().record(END, ctx.call_id, _exec_id(ctx), attempt=ctx.attempt, fence=ctx.fence, value=value)
    return value


def entries() -> list[dict[str, Any]]:
    """Every entry of this process's ledger (the shared one if it is set)."""
    return ledger().entries()


def clear() -> None:
    """Forget every entry and applied effect (the plugin does it before each test)."""
    ledger().clear()
