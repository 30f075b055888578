"""GuardPolicy's rules (aaa_celery.policy): made and validated at definition, then judged."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel

from aaa_celery import ConfigError, GuardPolicy, PolicyDenied
from aaa_celery.policy import Allow, Budget, Deny, RateLimit, Where, admit, check
from aaa_celery.stores.memory import MemoryStore


@pytest.mark.parametrize("make, says", [
    (lambda: Where(tools="refund", check="amount <== 500"), "Where.check"),
    (lambda: Where(tools="refund", check="amount <= 'lots'"), "needs a finite number"),
    (lambda: Where(tools="refund", check="amount <= nan"), "not a literal"),
    (lambda: Where(tools="refund", check="amount <= float('inf')"), "not a literal"),
    (lambda: Where(tools="email", check="to matches 5"), "quoted glob"),
    (lambda: Where(tools="pay", check="currency in 'EUR'"), "needs a list"),
    (lambda: Where(tools="pay", check="__import__('os') == 1"), "Where.check"),
    (lambda: Where(tools="pay"), "Where.check: Field required"),
    (lambda: Deny(tools=[]), "Deny.tools"),
    (lambda: Deny(tools=["ok", 5]), "Deny.tools"),
    (lambda: Deny(tool="x"), "Extra inputs"),
    (lambda: RateLimit(tools="x", calls=0, per_s=60), "RateLimit.calls"),
    (lambda: RateLimit(tools="x", calls=5, per_s=math.inf), "RateLimit.per_s"),
    (lambda: Budget(tools="refund", amount="amount", limit=math.nan), "Budget.limit"),
    (lambda: Budget(tools="refund", amount="amount", limit=-1), "Budget.limit"),
    (lambda: Budget(tools="refund", amount="amount()", limit=5), "Budget.amount"),
    (lambda: Budget(tools="refund", amount="amount", limit=5, by="customer id"), "Budget.by"),
    (lambda: GuardPolicy(default_access="maybe"), "GuardPolicy.default_access"),
    (lambda: GuardPolicy(rules=["deny refund"]), "GuardPolicy.rules"),
])
def test_a_bad_rule_fails_at_definition_naming_the_field(make, says):
    with pytest.raises(ConfigError, match="invalid guard policy") as err:
        make()
    assert says in str(err.value)


def denial(policy, tool, arguments, tenant=None) -> PolicyDenied:
    with pytest.raises(PolicyDenied) as err:
        check(policy, tool, tenant, arguments)
    return err.value


def test_access_rules_per_tool_and_tenant_first_match_decides():
    policy = GuardPolicy(denied_tools={"wipe"}, rules=[
        Allow(tools="refund", tenants="acme", name="acme refunds"),
        Deny(tools=["refund", "pay_*"], tenants="trial-*", name="no money for trials"),
        Deny(tools="refund", tenants="*"),
    ])
    check(policy, "refund", "acme", {})
    check(policy, "lookup", "trial-1", {})
    check(policy, "lookup", None, {})
    assert denial(policy, "wipe", {}).rule == "denied_tools"
    err = denial(policy, "pay_card", {}, "trial-7")
    assert err.rule == "no money for trials" and "'no money for trials'" in str(err) and "trial-7" in str(err)
    assert denial(policy, "refund", {}, "globex").rule == "Deny(refund)"
    assert denial(policy, "refund", {}).rule == "Deny(refund)"  # no tenant: only "*" matches it


def test_default_access_deny_makes_the_allow_rules_an_allow_list():
    policy = GuardPolicy(default_access="deny", rules=[Allow(tools=["lookup", "search_*"])])
    check(policy, "lookup", None, {})
    check(policy, "search_orders", "acme", {})
    assert denial(policy, "refund", {}).rule == "default_access"


class Address(BaseModel):
    country: str


@pytest.mark.parametrize("rule, arguments, ok", [
    ("amount <= 500", {"amount": 500}, True),
    ("amount <= 500", {"amount": 500.5}, False),
    ("amount <= 500", {"amount": math.nan}, False),
    ("amount <= 500", {"amount": math.inf}, False),
    ("amount <= 500", {"amount": "400"}, False),
    ("amount <= 500", {}, False),
    ("amount > 0", {"amount": 0.01}, True),
    ("to matches '*@example.com'", {"to": "ann@example.com"}, True),
    ("to matches '*@example.com'", {"to": "ann@example.com.evil.io"}, False),
    ("to matches '*@example.com'", {"to": ["ann@example.com"]}, False),
    ("currency in ['EUR', 'USD']", {"currency": "EUR"}, True),
    ("currency not in ['RUB']", {"currency": "RUB"}, False),
    ("mode == 'dry'", {"mode": "dry"}, True),
    ("mode != 'live'", {"mode": "live"}, False),
    ("address.country in ['DE', 'FR']", {"address": {"country": "DE"}}, True),
    ("address.country in ['DE', 'FR']", {"address": Address(country="US")}, False),
])
def test_where_constraints_judge_the_arguments(rule, arguments, ok):
    policy = GuardPolicy(rules=[Where(tools="*", check=rule)])
    if ok:
        check(policy, "t", None, arguments)
    else:
        assert denial(policy, "t", arguments).rule == f"Where(*: {rule})"


def test_rate_limits_and_budgets_count_in_the_store_once_per_call_per_tenant():
    store = MemoryStore()
    policy = GuardPolicy(rules=[
        RateLimit(tools="refund", calls=3, per_s=60),
        Budget(tools="refund", amount="amount", limit=500, by="customer_id", name="refunds per customer"),
    ])

    def call(call_id, tenant, customer, amount):
        admit(policy, "refund", tenant, {"customer_id": customer, "amount": amount}, call_id, store.spend)

    call("c1", "acme", "K-1", 300)
    call("c1", "acme", "K-1", 300)  # a redelivery of c1 counts nothing more
    with pytest.raises(PolicyDenied) as err:
        call("c2", "acme", "K-1", 201)
    assert err.value.rule == "refunds per customer" and "exceed the budget of 500" in str(err.value)
    call("c3", "acme", "K-2", 500)  # another customer has a budget of its own
    with pytest.raises(PolicyDenied) as err:  # c2 counted against the rate limit: c4 is the 4th call
        call("c4", "acme", "K-3", 1)
    assert err.value.rule == "RateLimit(refund: 3 per 60 s)"
    call("c5", "globex", "K-1", 500)  # another tenant: its own rate limit and budgets
    with pytest.raises(PolicyDenied, match="is not an amount"):
        call("c6", "globex", "K-9", math.nan)
