"""Every value a tool call can carry either round-trips through a store unchanged, or is
refused before it is published, with a ``ToolArgsError`` naming the argument (issue 35, item 2).

Hypothesis draws tool arguments as a model or another producer might send them: NUL
characters, lone surrogates, very large integers, float edge cases (``NaN``, infinities,
``-0.0``, subnormals, the largest double), nesting up to and past the depth limit, and long
keys. Each is put through the tool argument check (:func:`aaa_celery.tools.args.check_limits`,
what ``apply_async`` and the engine run before publishing); one it accepts goes through
``register`` (read back as recovery reads it), ``begin`` and ``finish`` (the value is the
call's result) and must come back equal, within a bound far below a lease TTL: none loops.

Cost: about a second per backend under ``CI=true`` (derandomized); three times the examples locally;
``AAA_STORE_VALUES_EXAMPLES`` raises the number of examples for a long run.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aaa_celery.config import GuardConfig
from aaa_celery.errors import ToolArgsError
from aaa_celery.guard import GuardRunner
from aaa_celery.lifecycle import CallSpec
from aaa_celery.tools.args import DEFAULT_POLICY, check_limits

_LONG_RUN = int(os.environ.get("AAA_STORE_VALUES_EXAMPLES", "0"))
_CI = os.environ.get("CI") == "true"
EXAMPLES = {"memory": 60, "sqlite": 30, "redis": 30, "redis-cluster": 15, "postgresql": 25}

TRICKY_TEXT = ["\x00", "a\x00b", "\ud800", "x\udfff", "\u2028", "é", "\U0001f600", '"', "\\", "\\u0000",
               "", "\x1b[31m", "\x7f"]
HUGE_INTS = [2**53 + 1, -(2**53) - 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30]
EDGE_FLOATS = [float("nan"), float("inf"), float("-inf"), -0.0, 5e-324, 2.2250738585072014e-308,
               1.7976931348623157e308, 0.1, 1e16, 123456789.12345679]

texts = st.one_of(st.sampled_from(TRICKY_TEXT), st.text(max_size=12),
                  st.builds(lambda a, b: a + b, st.sampled_from(TRICKY_TEXT), st.text(max_size=4)))
keys = st.one_of(texts, st.builds(lambda c, n: c * n, st.sampled_from(["k", "é", "\x00", "\U0001f600"]),
                                  st.integers(30, 400)))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.sampled_from(HUGE_INTS),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(EDGE_FLOATS), texts)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(keys, inner, max_size=3)), max_leaves=12)


def nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = [value]
    return value


deep = st.builds(nested, st.integers(DEFAULT_POLICY.max_args_depth - 3, DEFAULT_POLICY.max_args_depth + 2))
arguments = st.dictionaries(keys, st.one_of(values, deep), min_size=1, max_size=4)


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON data, with ``-0.0`` kept apart from ``0.0`` and types kept (``1`` is not
    ``1.0``, ``True`` is not ``1``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _names_the_argument(message: str, args: dict[str, Any]) -> bool:
    shown = ["".join(c if c.isprintable() else "?" for c in (k if len(k) <= 40 else k[:39] + "…")) for k in args]
    return message.startswith("t: ") and (any(f": {s}" in message for s in shown) or "arguments larger" in message)


def test_every_value_round_trips_or_is_refused_before_publish(backend: str, store) -> None:
    config = GuardConfig(lease_ttl_s=15, wait_poll_s=0.25)

    @settings(max_examples=_LONG_RUN or (EXAMPLES[backend] if _CI else 3 * EXAMPLES[backend]), deadline=None,
              database=None, derandomize=_CI,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(args=arguments)
    def check(args: dict[str, Any]) -> None:
        try:
            check_limits("t", args)
        except ToolArgsError as e:
            assert _names_the_argument(str(e), args), (str(e), ascii(list(args)))
            assert "\n" not in str(e)
            return
        call_id = f"v-{uuid.uuid4().hex}"
        request = {"task": "t", "args": [], "kwargs": {"arguments": args}, "queue": "q"}
        store.register(CallSpec(call_id, "t", f"key/{call_id}", request))
        kept = [c for c in store.expired(unclaimed_grace_s=0.0) if c.call_id == call_id]
        assert kept and _same(kept[0].request, request), ascii(args)  # as recovery would resend it
        started = time.monotonic()
        value = GuardRunner(store, config).run(CallSpec(call_id, "t", f"key/{call_id}", request), "w1", lambda attempt: args)
        assert time.monotonic() - started < 10.0
        assert _same(value, args), ascii(args)
        recorded = store.result(call_id)
        assert recorded is not None and recorded.ok and _same(recorded.value, args), ascii(args)

    check()
