"""Hostile ids against the store keys, on every backend (issue 12: "a fuzz test of store key
handling with hostile ids").

Hypothesis draws call ids a model, a broker message or a careless app might produce:
separators (``:``, ``{``, ``}``, ``~``, ``%``, ``/``), control and format characters, lone
surrogates, line separators, non-ASCII text, prefixes of one another, and over-long
values; and call ids the engine mints from hostile tenants and run ids. Each id is either
refused by :func:`aaa_celery.protocol.check_call_id` with a clear ``InvalidId`` (as the
engine and the worker do before a store sees it), or the store keeps its call apart from
every other id: its own result, its own audit trail, no collision.

``AAA_HOSTILE_IDS_EXAMPLES`` raises the number of examples for a long run.
"""

from __future__ import annotations

import os
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aaa_celery.config import GuardConfig
from aaa_celery.errors import InvalidId
from aaa_celery.lifecycle import COMPLETED, STARTED, CallSpec, Claimed, Outcome
from aaa_celery.protocol import (
    MAX_CALL_ID_BYTES,
    call_id,
    check_call_id,
    mint_call_id,
    parse_call_id,
    tenant_of,
)

_LONG_RUN = int(os.environ.get("AAA_HOSTILE_IDS_EXAMPLES", "0"))
EXAMPLES = {"memory": 120, "sqlite": 40, "redis": 40, "redis-cluster": 25, "postgresql": 25}

#: Characters that matter to some key format or log, mixed with anything unicode has.
TRICKY = [":", "{", "}", "~", "%", "/", "\\", ".", "*", "?", "[", "]", "'", '"', " ", "-", "_",
          "\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85", "\u2028", "\u2029", "\u202e", "\u200b",
          "\ufeff", "\ud800", "\udfff", "é", "€", "\U0001f600", "ß", "İ", "a", "b", "c", "~41", "~~"]
pieces = st.lists(st.one_of(st.sampled_from(TRICKY), st.characters(codec=None, categories=None)),
                  max_size=8).map("".join)
long_ids = st.builds(lambda c, n: c * n, st.sampled_from(["a", "é", "\U0001f600", ":"]),
                     st.integers(MAX_CALL_ID_BYTES // 4 - 20, MAX_CALL_ID_BYTES + 20))
tenants = st.one_of(st.none(), pieces, st.sampled_from(["a:b", "a", "~", "~7E", "a~3Ab", "b:c"]))
runs = st.one_of(pieces, st.sampled_from(["c", "b:c", "a:b", "~", "c:0.0"]))


@st.composite
def raw_ids(draw: st.DrawFn) -> str:
    """A raw id, often built from another (prefixes, separators joining pieces)."""
    a, b = draw(pieces), draw(pieces)
    return draw(st.sampled_from([a, f"{a}:{b}", f"{a}{{{b}}}", f"{a}:", f":{a}", a + b]))


@st.composite
def minted_ids(draw: st.DrawFn) -> str | None:
    """An id the engine would mint for a hostile tenant and run (None: refused at minting)."""
    try:
        return mint_call_id(draw(tenants), draw(runs), draw(st.integers(0, 3)), draw(st.integers(0, 3)), "t", {})
    except InvalidId:
        return None


ids = st.lists(st.one_of(raw_ids(), minted_ids(), long_ids), min_size=2, max_size=5)


def checked(value: str) -> str | None:
    """The id if ``check_call_id`` accepts it, None if it refuses it with a clear error."""
    try:
        return check_call_id(value)
    except InvalidId as e:
        message = str(e)
        assert message.startswith("call id ") and any(
            why in message for why in ("must not be empty", "must not contain control", "bytes long")
        ), message
        assert "\n" not in message and "\r" not in message  # the error itself forges no log line
        return None


def test_hostile_ids_are_refused_clearly_or_kept_apart_by_the_store(backend: str, store) -> None:
    config = GuardConfig(lease_ttl_s=600)

    @settings(max_examples=_LONG_RUN or EXAMPLES[backend], deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(raws=ids)
    def check(raws: list[str | None]) -> None:
        nonce = f"{uuid.uuid4().hex[:10]}."  # each example's calls are new to the (shared) store
        accepted = []
        for raw in dict.fromkeys(r for r in raws if r is not None):
            if (cid := checked(nonce + raw)) is not None:
                accepted.append(cid)
        # Given every accepted id's call, each finished with its own id as its value
        for cid in accepted:
            spec = CallSpec(cid, "t", f"key/{cid}", {"task": "t", "args": [], "kwargs": {}, "queue": "q"})
            store.register(spec)
            claimed = store.begin(spec, "w1", config)
            assert isinstance(claimed, Claimed), (ascii(cid), claimed)
            store.finish(claimed.lease, Outcome(True, value=cid), config)
        # Then each reads back its own result and trail, untouched by any other id
        for cid in accepted:
            result = store.result(cid)
            assert result is not None and result.value == cid, ascii(cid)
            trail = store.events(cid)
            assert [(e.type, e.call_id, e.attempt) for e in trail] == [(STARTED, cid, 1), (COMPLETED, cid, 1)]
            assert trail[0].id == f"{cid}:attempt:1"

    check()


@settings(max_examples=_LONG_RUN or 400, deadline=None, database=None)
@given(st.lists(st.tuples(tenants, runs, st.sampled_from(["x", "0.0.0123456789abcdef", "a-b.c_d"])),
                min_size=2, max_size=6))
def test_minted_call_ids_are_one_to_one_and_say_their_tenant_and_run(parts: list[tuple[str | None, str, str]]) -> None:
    minted: dict[str, tuple[str | None, str, str]] = {}
    for tenant, run_id, local in parts:
        try:
            cid = call_id(tenant, run_id, local)
        except InvalidId as e:
            assert str(e).startswith(("tenant ", "run id ")), str(e)
            continue
        # Then a minted id is a valid id of safe characters, and reads back as what it was made of
        assert check_call_id(cid) == cid
        assert all(c.isascii() and (c.isalnum() or c in "._-~:") for c in cid), cid
        identity = parse_call_id(cid)
        assert identity is not None and (identity.tenant, identity.run_id, identity.local) == (tenant, run_id, local)
        assert tenant_of(cid) == tenant
        # and no two different (tenant, run, local) give one id: "a:b" + "c" is not "a" + "b:c"
        assert minted.setdefault(cid, (tenant, run_id, local)) == (tenant, run_id, local)


@pytest.mark.parametrize("plain", ["5f1c2d6e-0d6b-4c1e-9a53-0a1b2c3d4e5f", "orders", "a:b", "~:r", "a:b:c:d",
                                   "~4:r:x", "~61:r:x", "A~3a:r:x", ":r:x", "a:r:", "a:r:" + "x" * 65])
def test_ids_that_are_not_minted_ones_have_no_tenant(plain: str) -> None:
    # a plain task id, or one not in the minted form's one canonical spelling, names no tenant
    assert parse_call_id(plain) is None and tenant_of(plain) is None
