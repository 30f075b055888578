"""The rules of a ``GuardPolicy``: which tenant may call which tool, with what arguments,
how often, and for how much.

Rules are declarative and validated when they are made (a bad one raises
:class:`~aaa_celery.errors.ConfigError` naming the rule, the field and the fix)::

    from aaa_celery.policy import Allow, Budget, Concurrency, Deny, RateLimit, Where

    GuardPolicy(rules=[
        Deny(tools="delete_account"),                          # for everyone
        Deny(tools="refund", tenants="trial-*"),               # per tool and tenant (globs)
        Where(tools="refund", check="amount <= 500"),          # argument constraints
        Where(tools="send_email", check="to matches '*@example.com'"),
        RateLimit(tools="send_email", calls=10, per_s=60),     # per tool, per tenant
        Budget(tools="refund", amount="amount", limit=500, per_s=86400, by="customer_id"),
        Concurrency(tools="sync_inventory", key="shop_id", limit=1, on_busy="skip"),
    ])

How a call is judged (:func:`check` and :func:`admit`), in this order:

1. ``denied_tools``, then the :class:`Allow` / :class:`Deny` rules in order: the first one
   that matches the tool and the tenant decides; none: ``GuardPolicy.default_access``.
2. Every :class:`Where` rule that matches must hold for the (validated) arguments.
3. In the worker, just before an attempt is claimed: every :class:`RateLimit`, then every
   :class:`Budget`, is counted in the store (``Store.spend``), atomically, once per call
   (a redelivered call never counts twice), so concurrent calls cannot overspend.
4. When the attempt is claimed: the first :class:`Concurrency` rule that matches, held in the
   store with the call's lease (``lifecycle.plan_slot``).

A call that a rule refuses raises :class:`~aaa_celery.errors.PolicyDenied`, naming the
rule: at send time (rules 1-2; nothing is stored or published) or in the worker (all
rules; no attempt is taken, and the call's one outcome is that failure).

This module is pure: the store is passed in as a ``spend`` function.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import ConfigError, PolicyDenied

#: ``spend(key, token, amount, limit, window_s) -> bool``: ``Store.spend``.
Spend = Callable[[str, str, float, float, float], bool]


def describe_error(error: ValidationError, where: str) -> str:
    """A ConfigError message for a pydantic error: each field, what is wrong, the input."""
    lines = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "(rule)"
        msg = str(item["msg"]).removeprefix("Value error, ")
        got = item.get("input")
        hint = f" (got {got!r})" if item["type"] != "missing" and not isinstance(got, dict) else ""
        lines.append(f"{where}.{field}: {msg}{hint}")
    return "invalid guard policy:\n  " + "\n  ".join(lines)


def _patterns(value: Any) -> Any:
    return (value,) if isinstance(value, str) else value


class Rule(BaseModel):
    """What every rule has: the tools and tenants it applies to, and a name for messages."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    tools: tuple[str, ...] = ("*",)
    """Tool names (globs, ``fnmatch`` style) the rule applies to; a str is one name."""

    tenants: tuple[str, ...] = ("*",)
    """Tenants (globs) the rule applies to; ``"*"`` also matches a call without a tenant."""

    name: str | None = None
    """How denials name the rule; by default a description of it."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise ConfigError(describe_error(e, type(self).__name__)) from None

    @field_validator("tools", "tenants", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        value = _patterns(value)
        if isinstance(value, Iterable) and not isinstance(value, Mapping):
            value = tuple(value)
            if not value or not all(isinstance(v, str) and v for v in value):
                raise ValueError("must be a non-empty list of names or globs, e.g. ['refund', 'pay_*']")
        return value

    def covers(self, tool: str) -> bool:
        """Whether this rule is about ``tool`` (for some tenant)."""
        return any(fnmatchcase(tool, p) for p in self.tools)

    def applies(self, tool: str, tenant: str | None) -> bool:
        """Whether this rule is about ``tool`` called for ``tenant``."""
        return self.covers(tool) and any(fnmatchcase(tenant or "", p) for p in self.tenants)

    @property
    def label(self) -> str:
        """The rule's name in a denial."""
        return self.name or self.describe()

    def scope(self) -> str:
        tools = ",".join(self.tools)
        return tools if self.tenants == ("*",) else f"{tools} for tenant {','.join(self.tenants)}"

    def describe(self) -> str:
        return f"{type(self).__name__}({self.scope()})"


class Allow(Rule):
    """Let the tools be called by the tenants (the first matching Allow/Deny decides)."""

    kind: Literal["allow"] = "allow"


class Deny(Rule):
    """Refuse the tools to the tenants (the first matching Allow/Deny decides)."""

    kind: Literal["deny"] = "deny"


_CHECK = re.compile(
    r"\s*(?P<path>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*(?P<op><=|>=|==|!=|<|>|not\s+in\b|in\b|matches\b)\s*(?P<value>.+?)\s*"
)
_ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_check(text: str) -> tuple[str, str, Any]:
    """``"amount <= 500"`` as ``("amount", "<=", 500)``; raises ValueError with the fix."""
    found = _CHECK.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        raise ValueError(
            f"{text!r} is not '<argument> <op> <value>'; the ops are <, <=, >, >=, ==, !=, in, not in and "
            "matches, e.g. 'amount <= 500', \"to matches '*@example.com'\", \"currency in ['EUR', 'USD']\""
        )
    path, op, raw = found["path"], " ".join(found["op"].split()), found["value"]
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        raise ValueError(f"{raw!r} is not a literal (a number, a quoted string, or a list of them)") from None
    if op in _ORDER and not _finite(value):
        raise ValueError(f"{op} needs a finite number, got {value!r}")
    if op == "matches" and not isinstance(value, str):
        raise ValueError(f"matches needs a quoted glob such as '*@example.com', got {value!r}")
    if op in ("in", "not in"):
        if not isinstance(value, list | tuple | set | frozenset):
            raise ValueError(f"{op} needs a list such as ['EUR', 'USD'], got {value!r}")
        value = tuple(value)
    return path, op, value


def value_at(arguments: Any, path: str) -> tuple[bool, Any]:
    """``(found, value)`` of a dotted argument path (dicts and attribute objects alike)."""
    value = arguments
    for part in path.split("."):
        if isinstance(value, Mapping):
            if part not in value:
                return False, None
            value = value[part]
        elif hasattr(value, part) and not part.startswith("_"):
            value = getattr(value, part)
        else:
            return False, None
    return True, value


def _holds(op: str, actual: Any, expected: Any) -> bool:
    if op in _ORDER:
        return _finite(actual) and _ORDER[op](actual, expected)
    if op == "==":
        return bool(actual == expected)
    if op == "!=":
        return bool(actual != expected)
    if op == "in":
        return actual in expected
    if op == "not in":
        return actual not in expected
    return isinstance(actual, str) and fnmatchcase(actual, expected)


class Where(Rule):
    """An argument constraint the call must meet, e.g. ``check="amount <= 500"``.

    ``<argument> <op> <value>``: the argument is a name or a dotted path into a nested
    one; the ops are ``<``, ``<=``, ``>``, ``>=`` (finite numbers only: NaN fails), ``==``,
    ``!=``, ``in`` and ``not in`` (a list), and ``matches`` (a glob, case-sensitive). An
    argument the call lacks fails the check.
    """

    kind: Literal["where"] = "where"
    check: str
    """The constraint, parsed when the rule is made."""

    @field_validator("check")
    @classmethod
    def _parses(cls, value: str) -> str:
        parse_check(value)
        return value

    def describe(self) -> str:
        return f"Where({self.scope()}: {self.check})"

    def violation(self, arguments: Any) -> str | None:
        """Why the arguments break this constraint, or None."""
        path, op, expected = parse_check(self.check)
        found, actual = value_at(arguments, path)
        if not found:
            return f"the call has no argument {path!r}"
        try:
            ok = _holds(op, actual, expected)
        except TypeError:
            ok = False
        return None if ok else f"{path}={_short(actual)} does not satisfy {self.check!r}"


class RateLimit(Rule):
    """At most ``calls`` calls of the tools per ``per_s`` seconds, for each tenant (and each
    tool): counted in the store when an attempt is about to be claimed."""

    kind: Literal["rate_limit"] = "rate_limit"
    calls: int = Field(ge=1)
    """How many calls a window admits."""
    per_s: float = Field(gt=0, allow_inf_nan=False)
    """The window, in seconds (fixed windows, aligned to the store's clock)."""

    def describe(self) -> str:
        return f"RateLimit({self.scope()}: {self.calls} per {self.per_s:g} s)"


class Budget(Rule):
    """At most ``limit`` of the argument ``amount`` summed over the calls of each window of
    ``per_s`` seconds, per tenant, tool and the ``by`` arguments (e.g. per customer per
    day): counted atomically in the store when an attempt is about to be claimed."""

    kind: Literal["budget"] = "budget"
    amount: str
    """The argument (name or dotted path) whose value is spent; it must be a finite number >= 0."""
    limit: float = Field(ge=0, allow_inf_nan=False)
    """The most a window may spend."""
    per_s: float = Field(default=86400.0, gt=0, allow_inf_nan=False)
    """The window, in seconds (default: a day; fixed windows, aligned to the store's clock)."""
    by: tuple[str, ...] = ()
    """Arguments that split the budget (each value has its own), e.g. ``"customer_id"``."""

    @field_validator("amount")
    @classmethod
    def _path(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", value):
            raise ValueError(f"{value!r} is not an argument name or dotted path, e.g. 'amount'")
        return value

    @field_validator("by", mode="before")
    @classmethod
    def _by(cls, value: Any) -> Any:
        value = _patterns(value)
        for path in value:
            cls._path(path)
        return value

    def describe(self) -> str:
        per = f" by {','.join(self.by)}" if self.by else ""
        return f"Budget({self.scope()}: {self.amount} <= {self.limit:g} per {self.per_s:g} s{per})"


class Concurrency(Rule):
    """At most ``limit`` calls with one ``key`` run at once, per tool and tenant: a call holds
    one of the key's slots with its lease, from the claim of its attempt to its result, and
    the slot of a holder that died frees when its lease lapses (within its TTL and a second).

    ``key``: argument names (or dotted paths) whose values make the key, e.g. ``"shop_id"``,
    or a function of the arguments that returns it; none (the default): one key for the tool.
    ``on_busy``: what a call does when every slot is held: ``"wait"`` (its message goes back
    to the broker, to come back later with backoff; no worker process waits), ``"skip"`` (it
    ends without running, with a recorded ``CallSkipped``) or ``"reject"`` (``PolicyDenied``).
    The first ``Concurrency`` rule that matches a call applies."""

    kind: Literal["concurrency"] = "concurrency"
    key: tuple[str, ...] | Callable[[Any], Any] = ()
    """Argument names or dotted paths (a str is one), or a function of the arguments."""
    limit: int = Field(default=1, ge=1)
    """How many calls with one key may run at once."""
    on_busy: Literal["wait", "skip", "reject"] = "wait"
    """What a call does when ``limit`` calls with its key run already."""

    @field_validator("key", mode="before")
    @classmethod
    def _key(cls, value: Any) -> Any:
        if callable(value):
            return value
        value = _patterns(value)
        if not isinstance(value, Iterable) or isinstance(value, Mapping):
            raise ValueError("must be argument names, e.g. ('shop_id',), or a function of the arguments")
        value = tuple(value)
        for path in value:
            if not isinstance(path, str) or not re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", path):
                raise ValueError(f"{path!r} is not an argument name or dotted path, e.g. 'shop_id'; "
                                 "pass names, or a function of the arguments")
        return value

    def describe(self) -> str:
        key = getattr(self.key, "__name__", "key") + "()" if callable(self.key) else ",".join(self.key)
        by = f" by {key}" if key else ""
        return f"Concurrency({self.scope()}: {self.limit} at once{by}, {self.on_busy})"

    def slot_key(self, tool: str, tenant: str | None, arguments: Any) -> str:
        """The store's key of this rule's slots for one call: a digest of the rule, the tool,
        the tenant and the key's values (so a key a caller supplies never reaches a store
        without its tool and tenant, and no two distinct ones share a key).

        Raises:
            PolicyDenied: the key function raised, or the call lacks a key argument.
        """
        if callable(self.key):
            try:
                values: Any = self.key(arguments)
            except Exception as e:  # noqa: BLE001 - the user's function: its failure refuses the call
                raise _denied(tool, self.label, f"its key function raised {type(e).__name__}: {e}") from e
        else:
            values = []
            for path in self.key:
                found, value = value_at(arguments, path)
                if not found:
                    raise _denied(tool, self.label, f"the call has no argument {path!r} for its key")
                values.append(value)
        identity = json.dumps(["Concurrency", self.describe(), tool, tenant, values], default=repr, sort_keys=True)
        return f"aaa:slot:{hashlib.sha256(identity.encode('utf-8')).hexdigest()}"


def concurrency_rule(policy: Any, tool: str, tenant: str | None) -> Concurrency | None:
    """The :class:`Concurrency` rule that applies to calls of ``tool`` for ``tenant``: the first
    that matches, or None."""
    for rule in policy.rules:
        if isinstance(rule, Concurrency) and rule.applies(tool, tenant):
            return rule
    return None


#: Every kind of rule, as ``GuardPolicy.rules`` takes them.
AnyRule = Allow | Deny | Where | RateLimit | Budget | Concurrency


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _denied(tool: str, rule: str, why: str) -> PolicyDenied:
    return PolicyDenied(f"{tool}: denied by the guard policy's rule {rule!r}: {why}", rule=rule)


def check(policy: Any, tool: str, tenant: str | None, arguments: Any) -> None:
    """Judge a call by the rules that need no store (access and argument constraints);
    raise :class:`PolicyDenied` naming the rule that refuses it."""
    if tool in policy.denied_tools:
        raise _denied(tool, "denied_tools", "this tool is denied")
    decided = None
    for rule in policy.rules:
        if isinstance(rule, Allow | Deny) and rule.applies(tool, tenant):
            decided = rule
            break
    if isinstance(decided, Deny):
        raise _denied(tool, decided.label, f"the tool is denied{_for(tenant)}")
    if decided is None and policy.default_access == "deny":
        raise _denied(tool, "default_access", f"no Allow rule lets this tool be called{_for(tenant)}")
    for rule in policy.rules:
        if isinstance(rule, Where) and rule.applies(tool, tenant):
            why = rule.violation(arguments)
            if why is not None:
                raise _denied(tool, rule.label, why)


def _for(tenant: str | None) -> str:
    return f" for tenant {tenant!r}" if tenant else ""


def budget_key(rule: RateLimit | Budget, tool: str, tenant: str | None, values: tuple[Any, ...] = ()) -> str:
    """The store's key of a rule's count for one tool, tenant and ``by`` values: a digest of
    them all (with the rule), so no two distinct ones share a key, whatever text they hold."""
    identity = json.dumps([type(rule).__name__, rule.describe(), tool, tenant, list(values)], default=repr)
    return f"aaa:policy:{hashlib.sha256(identity.encode('utf-8')).hexdigest()}"


def admit(policy: Any, tool: str, tenant: str | None, arguments: Any, call_id: str, spend: Spend) -> None:
    """Judge a call by every rule, counting its rate limits and budgets (``spend``, the
    store's, once per ``call_id``); raise :class:`PolicyDenied` naming the rule that refuses
    it. Called just before an attempt is claimed."""
    check(policy, tool, tenant, arguments)
    for rule in policy.rules:
        if isinstance(rule, RateLimit) and rule.applies(tool, tenant):
            if not spend(budget_key(rule, tool, tenant), call_id, 1, rule.calls, rule.per_s):
                raise _denied(tool, rule.label, f"more than {rule.calls} calls in {rule.per_s:g} s{_for(tenant)}")
    for rule in policy.rules:
        if isinstance(rule, Budget) and rule.applies(tool, tenant):
            found, amount = value_at(arguments, rule.amount)
            if not found or not _finite(amount) or amount < 0:
                raise _denied(tool, rule.label, f"{rule.amount}={_short(amount)} is not an amount >= 0")
            values = tuple(value_at(arguments, path)[1] for path in rule.by)
            if not spend(budget_key(rule, tool, tenant, values), call_id, float(amount), rule.limit, rule.per_s):
                by = ", ".join(f"{p}={_short(v)}" for p, v in zip(rule.by, values, strict=True))
                raise _denied(tool, rule.label, f"{rule.amount}={_short(amount)} would exceed the budget of "
                              f"{rule.limit:g} per {rule.per_s:g} s{_for(tenant)}{' for ' + by if by else ''}")


__all__ = ["Allow", "AnyRule", "Budget", "Concurrency", "Deny", "RateLimit", "Rule", "Where", "admit", "check"]
