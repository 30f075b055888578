"""Tool arguments are the model's: checked before anything is stored or sent, canonical,
within limits, and a refusal is a ``ToolArgsError`` fact, never a failed run (issue 12).

The defects these reproduce were seen on 23716a3 (run with ``PYTHONPATH=/work/main``
there): three idempotency keys for one ``order_id``, ``NaN`` reaching a ``float``
parameter, a list or a deeply nested object as arguments failing the whole run, and
``max_args_bytes`` counting ``repr`` characters in the worker after the call was
published and its spec stored.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from aaa_celery.algos import ToolLoop
from aaa_celery.errors import ToolArgsError
from aaa_celery.llm import FakeLLMClient, LLMHandler, LLMResponse, ToolCall
from aaa_celery.llm.fake import text
from aaa_celery.runtime import SyncEngine
from aaa_celery.tools import GuardPolicy, ToolContext, ToolHandler, ToolRegistry, tool
from aaa_celery.tools.args import check_limits


def deep(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


class Script:
    """A fake model that makes the calls it is given, then echoes the facts."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __call__(self, request: Any) -> LLMResponse:
        if request.messages[-1].role == "user":
            return LLMResponse(tool_calls=tuple(ToolCall(name, args) for name, args in self.calls))
        return text(" | ".join(m.content for m in request.messages if m.role == "tool"))


def facts(handle: Any) -> list[dict[str, Any]]:
    return [e["data"] for e in handle.events() if e["type"] in ("aaa.tool.completed", "aaa.tool.failed")]


@pytest.fixture(scope="module")
def engine():
    keys: list[str] = []
    received: list[dict[str, Any]] = []

    @tool(idempotency_key=lambda a: f"refund:{a['order_id']}")
    def refund(order_id: int, amount: float = 1.0, ctx: ToolContext = None) -> str:  # type: ignore[assignment]
        """Refund an order."""
        keys.append(ctx.idempotency_key)
        received.append({"order_id": order_id, "amount": amount})
        return f"refunded {order_id}"

    script = Script()
    sync = SyncEngine()
    LLMHandler(FakeLLMClient(script)).attach(sync)
    registry = ToolRegistry([refund, probe, note])
    handler = ToolHandler(ToolRegistry([refund, probe]))
    handler.attach(sync)
    note_handler = ToolHandler(ToolRegistry([note]), guards=NOTE_POLICY)
    note_handler.attach(sync)
    sync.script, sync.keys, sync.received, sync.registry = script, keys, received, registry
    sync.handler, sync.note_handler = handler, note_handler
    try:
        yield sync
    finally:
        sync.close()


def run(engine: SyncEngine, *calls: tuple[str, Any]) -> Any:
    engine.script.calls = list(calls)
    handle = engine.start(ToolLoop(engine.registry), {"task": "go"})
    outcome = handle.result(timeout=60)
    assert outcome.status == "completed", outcome  # nothing escapes into the run
    return handle


def test_one_order_id_in_three_spellings_gives_one_idempotency_key(engine):
    """Reproduces on 23716a3: ``100``, ``"0100"`` and ``100.0`` gave three keys, so three
    refunds at a provider that deduplicates by key."""
    engine.keys.clear()
    run(engine, ("refund", {"order_id": 100}), ("refund", {"order_id": "0100"}), ("refund", {"order_id": 100.0}))
    assert sorted(engine.keys) == ["refund:100"] * 3


def test_nan_and_infinity_never_reach_a_float_parameter(engine):
    """Reproduces on 23716a3: ``NaN`` and ``Infinity`` passed ``amount: float``."""
    engine.received.clear()
    handle = run(engine, ("refund", {"order_id": 1, "amount": float("nan")}),
                 ("refund", {"order_id": 2, "amount": "Infinity"}), ("refund", {"order_id": 3, "amount": "-inf"}))
    assert [f["error"] for f in facts(handle)] == ["ToolArgsError"] * 3
    assert engine.received == []


@pytest.mark.parametrize("arguments", [[1, 2], "order_id=1", None, 7, {"order_id": 1, "x": deep(100_000)}],
                         ids=["list", "str", "null", "int", "deep"])
def test_arguments_of_another_shape_become_a_fact_not_a_failed_run(engine, arguments):
    """Reproduces on 23716a3: a list (or a string) as arguments, or 100 000 levels of
    nesting, failed the whole run (``dict()`` and ``deepcopy`` raised in the engine)."""
    handle = run(engine, ("refund", arguments), ("refund", {"order_id": 5}))
    refused, fine = facts(handle)[0], facts(handle)[1]
    if refused.get("value"):  # facts arrive as the calls end: the refusal is first
        refused, fine = fine, refused
    assert refused["error"] == "ToolArgsError", refused
    assert fine["value"] == "refunded 5"
    requested = [e["data"]["arguments"] for e in handle.events() if e["type"] == "aaa.tool.requested"]
    assert requested[0].startswith("<refused: refund: ")  # never the raw (hostile) value


@tool
def note(text: str) -> str:
    """Keep a note."""
    return "kept"


#: ``note``'s handler: sizes up to 150 000 bytes, strings as long as the whole.
NOTE_POLICY = GuardPolicy(max_args_bytes=150_000, max_string_bytes=20_000_000)


def test_sizes_are_bytes_as_sent_and_checked_before_the_call_is_sent_or_stored(engine):
    """Reproduces on 23716a3: ``max_args_bytes`` counted ``repr`` characters (a 2-byte
    character counted 1) and only in the worker, after the call had been published
    and its spec, with the oversized arguments, stored. (Since issue 21 the size is that of
    the JSON as sent: an ``é`` is ``\u00e9``, 6 bytes.)"""
    handle = run(engine, ("note", {"text": "é" * 20_000}), ("note", {"text": "é" * 30_000}))
    kept, refused = sorted(facts(handle), key=lambda f: "error" in f)
    assert kept["value"] == "kept"
    assert refused["message"] == "note: arguments larger than 150000 bytes"
    # a plain send is refused before it is published or registered
    store, task = engine.store, engine.note_handler.task("note")
    registered = len(store.expired(unclaimed_grace_s=-1e9))
    for big in ("é" * 30_000, "x" * 12_500_000):  # 180 000 bytes sent in 30 000 characters; 12.5 MB
        with pytest.raises(ToolArgsError, match="arguments larger than 150000 bytes"):
            task.delay(text=big)
    assert len(store.expired(unclaimed_grace_s=-1e9)) == registered
    assert task.delay(text="é" * 20_000).get(timeout=30) == "kept"


def test_limits_on_depth_and_string_length_name_the_place():
    @tool
    def doc(body: dict[str, Any]) -> str:
        """A document."""
        return "ok"

    policy = GuardPolicy(max_args_depth=4, max_string_bytes=10)
    with pytest.raises(ToolArgsError, match=r"doc: body\.a\.b\.0: nested deeper than 4 levels"):
        doc.check({"body": {"a": {"b": [[1]]}}}, policy)
    with pytest.raises(ToolArgsError, match=r"doc: body\.s: a string longer than 10 bytes"):
        doc.check({"body": {"s": "ü" * 6}}, policy)
    with pytest.raises(ToolArgsError, match="unpaired surrogate"):
        doc.check({"body": {"s": "\ud800"}})
    with pytest.raises(ToolArgsError, match="integer beyond 64 bits"):
        doc.check({"body": {"n": 2**70}})
    assert doc.check({"body": {"a": {"b": [1]}}}, policy).canonical == {"body": {"a": {"b": [1]}}}


# -- the property: every input runs the tool with validated values, or is a ToolArgsError fact


class Address(BaseModel):
    street: str
    zip: int | None = None


@tool
def probe(order_id: int, amount: float, tags: list[str] | None = None, address: Address | None = None,
          mode: Literal["fast", "slow"] | int = "fast", note: str | None = None) -> str:
    """Check that every value is what the schema says."""
    assert type(order_id) is int and -(2**63) <= order_id < 2**64
    assert type(amount) is float and math.isfinite(amount)
    assert tags is None or all(type(t) is str for t in tags)
    assert address is None or (type(address) is Address and type(address.street) is str
                               and (address.zip is None or type(address.zip) is int))
    assert mode in ("fast", "slow") or type(mode) is int
    for s in [note or "", *(tags or []), address.street if address else ""]:
        s.encode("utf-8")  # no unpaired surrogate
    return "ok"


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**63, max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["nan", "Infinity", "-inf", "1e400", "0100"]),
    st.text(max_size=20), st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
    st.sampled_from([70_000, 40_000, 300_000]).map(lambda n: "é" * n if n == 40_000 else "x" * n),
)
surrogates = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3)
keys = st.text(max_size=5) | surrogates
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
                      max_leaves=12)
hostile = st.one_of(values, st.integers(1, 3000).map(deep), st.integers(30_000, 40_000).map(lambda n: [{"street": "x"}] * n))
arguments = st.one_of(
    st.fixed_dictionaries(
        {"order_id": st.one_of(st.integers(-5, 5), hostile), "amount": st.one_of(st.floats(-1, 1), hostile)},
        optional={"tags": st.one_of(st.lists(st.text(max_size=5), max_size=3), hostile),
                  "address": st.one_of(st.fixed_dictionaries({"street": st.text(max_size=5)},
                                                             optional={"zip": st.integers(0, 99999) | hostile}),
                                       hostile),
                  "mode": st.sampled_from(["fast", "slow", 3]) | hostile,
                  "note": st.none() | st.text(max_size=10) | hostile,
                  "extra": hostile}),
    hostile,  # not an object at all, most of the time
)


@settings(max_examples=int(os.environ.get("AAA_ARGS_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(arguments)
def test_adversarial_arguments_run_the_tool_validated_or_become_a_tool_args_error_fact(engine, args):
    # the engine: one fact per call, never an exception out of the run
    handle = run(engine, ("probe", args))
    [fact] = facts(handle)
    assert fact.get("value") == "ok" or fact["error"] == "ToolArgsError", fact
    # a plain send: sent, or refused with ToolArgsError before anything is published
    try:
        sent = engine.handler.task("probe").apply_async(args)
    except ToolArgsError:
        assert fact.get("error") == "ToolArgsError"
    else:
        assert sent.get(timeout=30) == "ok"


def test_max_args_bytes_counts_the_json_as_it_is_sent():
    """Reproduces on c79799f (issue 21, item 8): ``max_args_bytes`` counted raw UTF-8, not the
    JSON as sent; four strings of 60,000 NULs (240 KB raw, 1.44 MB of JSON, each NUL being
    ``\\u0000``) passed the 256 KiB check, then failed in the worker as a malformed message.
    (A NUL is now refused as such, no store holds it: ``\\x01``, also 6 bytes of JSON, stands in.)"""
    @tool
    def four(a: str, b: str, c: str, d: str) -> str:
        """Four strings."""
        return "ok"

    escaped = {k: "\x01" * 60_000 for k in "abcd"}
    with pytest.raises(ToolArgsError, match="arguments larger than 262144 bytes"):
        four.check(escaped)
    with pytest.raises(ToolArgsError, match=r"four: [abcd]: a string with a NUL character"):
        four.check({k: "\0" * 60_000 for k in "abcd"})
    # exactly the compact JSON kombu sends (ensure_ascii: é is \u00e9, a quote \", a tab \t,
    # an emoji a surrogate pair of 12 bytes)
    args = {"a": 'q"\\\t\x01é😀ok', "b": "x" * 10, "c": "", "d": "\x7f"}
    sent = len(json.dumps(args, separators=(",", ":")))
    assert four.check(args, GuardPolicy(max_args_bytes=sent)).canonical == args
    with pytest.raises(ToolArgsError, match=f"arguments larger than {sent - 1} bytes"):
        four.check(args, GuardPolicy(max_args_bytes=sent - 1))


_no_nul = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
_scalars = st.one_of(_no_nul, st.integers(-(2**63), 2**64 - 1), st.booleans(), st.none(),
                     st.floats(allow_nan=False, allow_infinity=False))


@given(st.dictionaries(_no_nul, st.one_of(_scalars, st.lists(_scalars, max_size=4),
                                          st.dictionaries(_no_nul, _scalars, max_size=3)), max_size=6))
@settings(max_examples=300, deadline=None)
def test_check_limits_counts_exactly_the_compact_json_kombu_sends(arguments):
    """``max_args_bytes`` is the size of the JSON as sent, to the byte: what ``check_limits``
    counts without encoding is ``json.dumps``'s length, for every scalar and container."""
    sent = len(json.dumps(arguments, separators=(",", ":")))
    check_limits("t", arguments, GuardPolicy(max_args_bytes=sent))
    with pytest.raises(ToolArgsError, match=f"arguments larger than {sent - 1} bytes"):
        check_limits("t", arguments, GuardPolicy(max_args_bytes=sent - 1))


@pytest.mark.postgres
def test_a_nul_character_from_the_model_is_a_fact_and_the_run_finishes_on_postgresql(postgres_url):
    """Reproduces on 03c27cd: PostgreSQL holds no NUL; the check let ``{"text": "A\\u0000B"}``
    through, ``begin`` retried the store's refusal as store trouble, and the run never finished."""
    from aaa_celery.stores import open_store

    script = Script()
    sync = SyncEngine(store=open_store(postgres_url))
    try:
        LLMHandler(FakeLLMClient(script)).attach(sync)
        ToolHandler(ToolRegistry([note])).attach(sync)
        script.calls = [("note", {"text": "A\u0000B"}), ("note", {"text": "AB"})]
        handle = sync.start(ToolLoop(ToolRegistry([note])), {"task": "go"})
        outcome = handle.result(timeout=30)
        assert outcome.status == "completed", outcome
        got = sorted(facts(handle), key=lambda f: "value" in f)
        assert got[0]["error"] == "ToolArgsError" and "text: a string with a NUL character" in got[0]["message"]
        assert got[1]["value"] == "kept"
    finally:
        sync.close()
