"""Every rule of a call's lifecycle is decided in ``lifecycle.py`` only (issue 36).

:data:`RULES` names each rule and the function of ``lifecycle`` that decides it; the stores
apply plans. Where a backend must still evaluate a rule itself, for an index (a SQL
``WHERE`` over an index, a Redis sorted set) or to read what a reply carries, that image is
listed in :data:`PYTHON_IMAGES` or :data:`LUA_IMAGES` with its reason. The scans below fail
on any other comparison over a call's state in a store's module (Python, by its syntax tree)
or in a call script (Lua, line by line): a new predicate there moves to ``lifecycle`` or is
listed here, with a reason a reviewer can weigh.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from aaa_celery import lifecycle

STORES = Path(lifecycle.__file__).parent / "stores"

#: The rules of a call's lifecycle, each with the functions of ``lifecycle`` that decide it.
RULES: dict[str, tuple[str, ...]] = {
    "begin": ("decide_begin", "plan_begin"),
    "finish": ("decide_finish", "plan_finish"),
    "renew": ("plan_renew",),
    "record": ("record_allowed", "plan_record"),
    "purge": ("purgeable", "plan_purge"),
    "fenced": ("plan_fenced",),
    "release": ("plan_release",),
    "hand_on": ("plan_hand_on",),
    "checkpoint": ("plan_checkpoint",),
    "settle": ("plan_settle", "plan_resolve"),
    "lapsed": ("lapsed", "held_by"),
    "expire": ("awaits_recovery", "lost_cause_event"),
    "claim_recovery": ("plan_recovery_claim",),
    "spend": ("plan_spend",),
    "slot": ("plan_slot",),
    "spec": ("merge_spec", "replaces_below"),
}

#: The fields of a call's state, by the names the stores give them.
STATE = {"attempts", "result", "outcome", "handed_on", "handed", "holder_live", "expires_at", "lease_expires_at",
         "recovery_until", "registered_at", "seen_at", "lease_token", "held_until", "live"}

#: The stores' modules that apply plans (run records, budgets and operators' views aside).
BACKENDS = ("memory.py", "sql/store.py", "sql/sqlite.py", "sql/postgres.py", "sql/lease_sessions.py",
            "sql/pg_driver.py", "sql/statements.py", "sql/queries.py", "sql/schema.py", "redis/store.py",
            "redis/client.py")

#: Comparisons over a call's state that a backend may make, by module and source text: why.
PYTHON_IMAGES: dict[tuple[str, str], str] = {
    ("sql/queries.py", "expires_at > now"): "lapsed's SQL image (live_at), tests/lifecycle/test_lapsed.py",
    ("sql/queries.py", "expires_at <= now"): "lapsed's SQL image (lapsed_at), tests/lifecycle/test_lapsed.py",
    ("sql/queries.py", "calls.c.attempts > 0"): "awaits_recovery's SQL image over its index (select_unfinished)",
    ("sql/queries.py", "calls.c.handed_on != calls.c.attempts"): "awaits_recovery's SQL image (select_unfinished)",
    ("sql/queries.py", "calls.c.registered_at <= now - unclaimed_grace_s"):
        "awaits_recovery's SQL image, a range of an index (select_unfinished)",
    ("sql/queries.py", "calls.c.registered_at < before"): "purgeable's SQL image (select_finished_before)",
    ("sql/queries.py", "calls.c.lease_token == token"): "held_by's SQL image (lease_holds), liveness asked apart",
    ("sql/queries.py", "calls.c.registered_at >= since"): "an operator's listing filter, not a rule",
    ("sql/queries.py", "calls.c.registered_at <= until"): "an operator's listing filter, not a rule",
    ("sql/queries.py", "sa.tuple_(calls.c.registered_at, calls.c.call_id) < sa.tuple_(*after)"):
        "an operator's listing: the page after the last row",
    ("sql/schema.py", "calls.c.attempts == 0"): "the unclaimed index's predicate (awaits_recovery's second half)",
    ("sql/schema.py", "calls.c.handed_on == calls.c.attempts"): "the unclaimed index's predicate",
    ("sql/statements.py", "calls.c.lease_token == _p('token')"): "a write's condition: the lease with this token",
    ("sql/sqlite.py", "r.lease_token is not None"): "which rows have a lease at all, before lapsed decides",
    ("sql/store.py", "r.call_id not in live"): "the sweep's rows whose lease the backend found live",
    ("sql/store.py", "r.call_id in live"): "an operator's listing: who holds a live lease",
    ("sql/store.py", "r.outcome is None"): "an operator's listing: a result frees the lease (Writes.record)",
    ("memory.py", "rec.registered_at >= since"): "an operator's listing filter, not a rule",
    ("memory.py", "rec.registered_at <= until"): "an operator's listing filter, not a rule",
    ("redis/store.py", "live == '1'"): "reading a script's reply into a CallState",
    ("redis/store.py", "result == '1'"): "reading a script's reply into a CallState",
    ("redis/store.py", "state.result is not None"): "the expected state, written out for a script to compare",
    ("redis/store.py", "result is not None"): "the expected state, written out for a script to compare",
    ("sql/pg_driver.py", "result.status != expected"): "a libpq result's status, not a call's",
    ("sql/pg_driver.py", "result.status == pq.ExecStatus.FATAL_ERROR"): "a libpq result's status, not a call's",
}

#: The call scripts: each gets the call keys of ``_lib.lua`` (run records, budgets and slots
#: have their own scripts and rules).
CALL_SCRIPTS = ("_lib", "begin", "finish", "lease", "record", "register", "resolve", "purge", "claim_recovery")

#: A comparison in a call script that is not with an expected value (``ARGV``) or a plan's
#: tag: the line's text, and why it may stay.
LUA_IMAGES: dict[str, str] = {
    "return redis.call('HGET', LEASE, 'token') == token":
        "held_by's image: the lease with this token holds the call (a lapsed lease's key is gone)",
    "if redis.call('HGET', SPEC, 'token') == token then": "a write's condition: let_go forgets this claim's token",
    "if cjson.decode(e).id == id then return end": "a write's condition: an event is appended once per id",
    "if entry.id == fenced then": "reading the lost cause's event by its id (lifecycle.lost_cause_event)",
    "if type(data) == 'table' and type(data.cause) == 'string' then return data.cause end":
        "reading the lost cause from the event's data",
    "elseif tonumber(stored_req or '0') >= tonumber(below) then  -- not replaced: lifecycle.replaces_below":
        "merge_spec's threshold, decided in Python (replaces_below), compared with the stored spec's rank",
    "local live = pttl ~= -2 and '1' or '0'  -- -2: no lease key (a lapsed lease's key is gone)":
        "reading whether a lease is live (lapsed's image: the key expires with it)",
    "if not result and attempts ~= '0' and live == '0' then":
        "lost_cause_event's image: what begin's reply carries, read in the same round trip",
    "if live == '1' then": "what begin's reply carries for a busy call",
    "local live = redis.call('EXISTS', LEASE) == 1 and '1' or '0'": "reading whether a lease is live",
    "local function refused(reply) return type(reply) == 'table' and reply.err ~= nil end":
        "whether Redis refused the result copy's write",
    "if ttl > 0 then": "the result copy's TTL, an argument",
}

_LUA_COMPARISON = re.compile(r"==|~=|<=|>=|[^-<]<[^=]|[^->]>[^=]")
_HARMLESS = re.compile(r"ARGV|\bexpect\b|\bop == '|#fields")


def test_every_rule_has_its_deciding_functions_in_lifecycle():
    missing = [f"{rule}: {name}" for rule, names in RULES.items() for name in names
               if not callable(getattr(lifecycle, name, None))]
    assert missing == []


def _python_comparisons(module: str) -> list[str]:
    tree = ast.parse((STORES / module).read_text())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        names = {n.attr if isinstance(n, ast.Attribute) else n.id
                 for part in (node.left, *node.comparators) for n in ast.walk(part)
                 if isinstance(n, (ast.Attribute, ast.Name))}
        if names & STATE:
            found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize("module", BACKENDS)
def test_a_store_module_compares_a_calls_state_only_where_listed(module):
    unlisted = [text for text in _python_comparisons(module) if (module, text) not in PYTHON_IMAGES]
    assert unlisted == [], f"{module} decides over a call's state: move the rule to lifecycle, or list it here"


def test_every_listed_python_image_is_still_there():
    gone = [key for key in PYTHON_IMAGES if key[1] not in _python_comparisons(key[0])]
    assert gone == []


def _lua_comparisons(script: str) -> list[str]:
    text = (STORES / "redis" / "lua" / f"{script}.lua").read_text()
    return [line.strip() for line in text.splitlines()
            if not line.lstrip().startswith("--") and _LUA_COMPARISON.search(line.split(" --")[0])]


@pytest.mark.parametrize("script", CALL_SCRIPTS)
def test_a_call_script_compares_only_with_its_expected_state(script):
    unlisted = [line for line in _lua_comparisons(script) if not _HARMLESS.search(line) and line not in LUA_IMAGES]
    assert unlisted == [], f"{script}.lua decides over a call's state: plan it in lifecycle, or list it here"


def test_every_listed_lua_image_is_still_there():
    lines = {line for script in CALL_SCRIPTS for line in _lua_comparisons(script)}
    assert [line for line in LUA_IMAGES if line not in lines] == []


def test_the_call_scripts_are_all_scanned():
    scripts = {p.stem for p in (STORES / "redis" / "lua").glob("*.lua")}
    others = {"spend", "slot"} | {s for s in scripts if s.startswith("run_")}
    assert scripts - others == set(CALL_SCRIPTS)


def test_the_postgresql_heartbeat_makes_the_one_renew_write_of_statements():
    """One write, one text: PostgreSQL's heartbeat statement (run on the lease session, with its
    own checks around the write) is built from ``statements.RENEW_LEASE``, the renew write every
    SQL store applies, not written again by hand."""
    from aaa_celery.stores.sql.pg_driver import RENEW_OWN_LEASE
    from aaa_celery.stores.sql.statements import RENEW_LEASE

    assert RENEW_LEASE.postgresql in RENEW_OWN_LEASE
    assert RENEW_OWN_LEASE.count("UPDATE aaa_calls") == 1
