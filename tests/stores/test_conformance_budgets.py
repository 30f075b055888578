"""The store conformance suite, budgets: ``Store.spend`` (lifecycle.plan_spend) on every backend.

A budget counts amounts against a limit in fixed windows of time, atomically, and each
token (a call id) at most once per window: the store half of GuardPolicy's Budget and
RateLimit rules (issue 12, item 8).
"""

from __future__ import annotations

import math
import os
import threading
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aaa_celery.lifecycle import admits


#: A window no test crosses (about three years).
LONG = 10**8


def budget() -> str:
    return f"budget:{uuid.uuid4().hex[:10]}"


def test_spend_counts_amounts_until_the_limit(store):
    key = budget()
    # Given a limit of 5, When 2 + 2 are spent, Then a third 2 does not fit but a 1 does
    assert store.spend(key, "c1", 2, 5, LONG)
    assert store.spend(key, "c2", 2, 5, LONG)
    assert not store.spend(key, "c3", 2, 5, LONG)
    assert store.spend(key, "c4", 1, 5, LONG)
    assert not store.spend(key, "c5", 0.5, 5, LONG)
    # an amount of zero always fits; float sums are within a limit they reach
    assert store.spend(key, "c6", 0, 5, LONG)
    other = budget()
    assert store.spend(other, "a", 0.1, 0.3, LONG) and store.spend(other, "b", 0.2, 0.3, LONG)


def test_spend_counts_a_token_once_per_window(store_factory):
    a, b = store_factory(), store_factory()
    key = budget()
    assert a.spend(key, "call-1", 3, 5, LONG)
    # a redelivery of the same call, on another worker, is admitted and adds nothing
    assert b.spend(key, "call-1", 3, 5, LONG)
    assert b.spend(key, "call-2", 2, 5, LONG)
    assert not a.spend(key, "call-3", 1, 5, LONG)
    # a refused token was not counted: it is refused again, and counts once it fits
    assert not b.spend(key, "call-3", 1, 5, LONG)


def test_budgets_with_other_keys_are_independent(store):
    first, second = budget(), budget()
    assert store.spend(first, "t", 5, 5, LONG)
    assert not store.spend(first, "u", 1, 5, LONG)
    assert store.spend(second, "u", 5, 5, LONG)
    # any text is a key, including hash-tag braces and a newline
    hostile = "tenant:{x}\n" + "é" * 200
    assert store.spend(hostile, "t", 1, 1, LONG) and not store.spend(hostile, "u", 1, 1, LONG)


def test_concurrent_spenders_never_overspend(store_factory):
    key, results = budget(), []
    stores = [store_factory() for _ in range(4)]
    barrier = threading.Barrier(20)

    def spend(n: int) -> None:
        barrier.wait()
        results.append(stores[n % len(stores)].spend(key, f"call-{n}", 1, 5, LONG))

    threads = [threading.Thread(target=spend, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [False] * 15 + [True] * 5


def test_a_new_window_starts_empty(store):
    key, window_s = budget(), 1.0
    # start right after a window boundary, so that both spends fall in one window
    time.sleep(window_s - store.now() % window_s + 0.05)
    assert store.spend(key, "a", 1, 1, window_s) and not store.spend(key, "b", 1, 1, window_s)
    time.sleep(window_s - store.now() % window_s + 0.05)
    assert store.spend(key, "b", 1, 1, window_s)


@pytest.mark.parametrize("bad", [
    {"amount": -1}, {"amount": math.nan}, {"amount": math.inf}, {"limit": -5}, {"limit": math.nan},
    {"window_s": 0}, {"window_s": -1}, {"key": ""}, {"token": ""}, {"amount": True},
])
def test_spend_refuses_amounts_no_budget_can_take(store, bad):
    args = {"key": budget(), "token": "t", "amount": 1, "limit": 5, "window_s": 60, **bad}
    with pytest.raises(ValueError):
        store.spend(**args)


@settings(max_examples=20, deadline=None, derandomize=os.environ.get("CI") == "true",
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(limit=st.integers(0, 10), spends=st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d", "e"]), st.integers(0, 6) | st.sampled_from([0.5, 2.5])),
    max_size=12))
def test_spend_agrees_with_the_budget_rule_on_random_histories(store, limit, spends):
    """A history of spends in one window, against a model of lifecycle.plan_spend's rule."""
    key, total, counted = budget(), 0.0, set()
    for token, amount in spends:
        if token in counted:
            expected = True
        elif admits(total, amount, limit):
            expected, total = True, total + amount
            counted.add(token)
        else:
            expected = False
        assert store.spend(key, token, amount, limit, LONG) is expected, (token, amount, total)
