"""Both vendors' clients against a stub server that speaks their wire format: full agent
runs on the embedded engine, retries, timeouts, malformed calls and call-id threading."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from aaa_celery.errors import OUTCOME_UNKNOWN_MESSAGE, ConfigError, OutcomeUnknown
from aaa_celery.llm import LLMError, LLMRequest, Message
from aaa_celery.tools import ToolRegistry, tool

from .conftest import Raw, Result, Vendor, echo_results, run_agent
from .stub_server import error_reply


def _lookup_registry(ran: list[str]) -> ToolRegistry:
    @tool
    def lookup(query: str) -> str:
        """Look something up."""
        ran.append(query)
        return f"found {query}"

    return ToolRegistry([lookup])


def test_parallel_tool_calls_in_one_turn_run_and_come_back_threaded_by_the_models_ids(vendor: Vendor):
    ran: list[str] = []
    first = vendor.calls(("id_a", "lookup", {"query": "a"}), ("id_b", "lookup", {"query": "b"}))
    with vendor.server(echo_results(vendor, first)) as server:
        handle, outcome = asyncio.run(run_agent(vendor.client(server), _lookup_registry(ran)))

    assert outcome.status == "completed", outcome.error
    assert outcome.value == {"text": "found a | found b", "turns": 2}
    assert sorted(ran) == ["a", "b"]  # each body ran once
    assert len(server.requests) == 2  # the model was asked twice, no more
    # the second request carries both results, in the turn's order, under the model's own ids
    assert vendor.results(server.bodies[1]) == [
        Result("id_a", "found a", False), Result("id_b", "found b", False),
    ]
    assert vendor.call_ids(server.bodies[1]) == ["id_a", "id_b"]
    events = handle.events()
    requested = [e["data"] for e in events if e["type"] == "aaa.tool.requested"]
    assert [d["tool_call_id"] for d in requested] == ["id_a", "id_b"]
    assert len({d["call_id"] for d in requested}) == 2  # two calls of the engine's, one per model call
    # token usage, as the stub reported it, is in the run's events
    completed = [e["data"] for e in events if e["type"] == "aaa.llm.completed"]
    expected_usage = {"input_tokens": 11, "output_tokens": 7} if vendor.name == "openai" else {
        "input_tokens": 13, "output_tokens": 5}
    assert [d["usage"] for d in completed] == [expected_usage, expected_usage]
    assert [d["tool_calls"] for d in completed] == [2, 0]


def test_a_malformed_tool_call_becomes_a_tool_args_error_fact_not_a_crash(vendor: Vendor):
    """Arguments that are not a JSON object, and a tool that does not exist, each end as a
    ToolArgsError fact the model reads (flagged as an error); the run goes on, and a good
    call of the same turn runs."""
    ran: list[str] = []
    bad = Raw('{"query": "x"') if vendor.name == "openai" else Raw(["not", "an", "object"])
    first = vendor.calls(
        ("id_bad", "lookup", bad), ("id_unknown", "launch_rockets", {"n": 3}), ("id_ok", "lookup", {"query": "ok"}),
    )
    with vendor.server(echo_results(vendor, first)) as server:
        handle, outcome = asyncio.run(run_agent(vendor.client(server), _lookup_registry(ran)))

    assert outcome.status == "completed", outcome.error
    assert ran == ["ok"]  # neither malformed call reached a worker
    events = handle.events()
    model_id = {e["data"]["call_id"]: e["data"]["tool_call_id"] for e in events if e["type"] == "aaa.tool.requested"}
    failed = {model_id[e["data"]["call_id"]]: e["data"] for e in events if e["type"] == "aaa.tool.failed"}
    assert set(failed) == {"id_bad", "id_unknown"}
    assert {d["error"] for d in failed.values()} == {"ToolArgsError"}
    if vendor.name == "openai":
        assert failed["id_bad"]["message"].startswith("lookup: the arguments are not valid JSON")
    else:
        assert failed["id_bad"]["message"].startswith("lookup: the arguments must be a JSON object, got list")
    assert "unknown tool 'launch_rockets'" in failed["id_unknown"]["message"]
    back = vendor.results(server.bodies[1])
    assert [(r.id, r.is_error) for r in back] == [("id_bad", True), ("id_unknown", True), ("id_ok", False)]
    assert all("ToolArgsError: " in r.content for r in back[:2])
    assert back[2].content == "found ok"


def test_outcome_unknown_reaches_the_model_as_an_error_with_its_guidance(vendor: Vendor):
    @tool
    def pay(amount: int) -> str:
        """Pay."""
        raise OutcomeUnknown("the gateway timed out")

    first = vendor.calls(("id_pay", "pay", {"amount": 5}))
    with vendor.server(echo_results(vendor, first)) as server:
        _, outcome = asyncio.run(run_agent(vendor.client(server), ToolRegistry([pay])))

    assert outcome.status == "completed", outcome.error
    [result] = vendor.results(server.bodies[1])
    assert result.id == "id_pay" and result.is_error
    assert "OutcomeUnknown: " in result.content and OUTCOME_UNKNOWN_MESSAGE in result.content
    assert "the gateway timed out" in result.content


def test_a_server_that_reuses_a_call_id_gets_a_fresh_one_in_the_history(vendor: Vendor):
    """Some compatible servers number calls per turn (``call_0`` every time). The history
    sent back must name each call once, or the results thread to the wrong call (and
    Anthropic refuses duplicate ``tool_use`` ids): the second call gets a fresh id."""
    ran: list[str] = []
    script = [
        vendor.calls(("call_0", "lookup", {"query": "first"})),
        vendor.calls(("call_0", "lookup", {"query": "second"})),
        vendor.text("done"),
    ]
    with vendor.server(script) as server:
        _, outcome = asyncio.run(run_agent(vendor.client(server), _lookup_registry(ran)))

    assert outcome.status == "completed", outcome.error
    assert ran == ["first", "second"]
    ids = vendor.call_ids(server.bodies[2])
    assert ids[0] == "call_0" and ids[1] != "call_0" and len(set(ids)) == 2
    assert [r.content for r in vendor.results(server.bodies[2])] == ["found second"]
    assert [r.id for r in vendor.results(server.bodies[2])] == [ids[1]]


def _ask(client) -> str:
    return asyncio.run(client.complete(LLMRequest([Message("user", "hi")]))).text


def test_429_and_5xx_are_retried_with_backoff_then_succeed(vendor: Vendor):
    overloaded = 529 if vendor.name == "anthropic" else 503
    script = [error_reply(429, retry_after_ms="20"), error_reply(overloaded), vendor.text("hello")]
    with vendor.server(script) as server:
        started = time.monotonic()
        assert _ask(vendor.client(server)) == "hello"
        took = time.monotonic() - started

    assert len(server.requests) == 3
    assert server.bodies[0] == server.bodies[1] == server.bodies[2]  # the same request, re-sent
    assert [r.headers["x-stainless-retry-count"] for r in server.requests] == ["0", "1", "2"]
    assert took >= 0.3  # the 5xx waited the SDK's backoff (0.5 s, less up to 25 % jitter)


def test_retries_end_in_an_llm_error_naming_the_status(vendor: Vendor):
    with vendor.server([error_reply(429, retry_after_ms="1")] * 3) as server, pytest.raises(LLMError) as caught:
        _ask(vendor.client(server, max_retries=2))
    assert len(server.requests) == 3
    assert caught.value.status_code == 429 and "HTTP 429" in str(caught.value) and "after 2 retries" in str(caught.value)

    with vendor.server([error_reply(400)]) as server, pytest.raises(LLMError) as caught:
        _ask(vendor.client(server))  # a client error is not retried
    assert len(server.requests) == 1 and caught.value.status_code == 400


def test_a_request_that_outlasts_timeout_s_is_retried_then_fails(vendor: Vendor):
    slow = vendor.text("too late")
    slow.delay_s = 6.0
    with vendor.server(lambda body: slow) as server:
        started = time.monotonic()
        with pytest.raises(LLMError) as caught:
            _ask(vendor.client(server, timeout_s=0.3, max_retries=1))
        took = time.monotonic() - started
    assert len(server.requests) == 2
    assert caught.value.status_code is None and "Timeout" in str(caught.value)
    assert took < 5.5  # it did not wait for the slow answer


def test_failed_model_call_fails_the_run_with_the_llm_error(vendor: Vendor):
    with vendor.server([error_reply(401)]) as server:
        _, outcome = asyncio.run(run_agent(vendor.client(server), _lookup_registry([])))
    assert outcome.status == "failed" and outcome.error.startswith("LLMError: ")
    assert f"{vendor.name} model 'stub-model': HTTP 401" in outcome.error


def test_the_key_comes_from_the_environment(vendor: Vendor, monkeypatch: pytest.MonkeyPatch):
    with vendor.server([vendor.text("hi")]) as server:
        _ask(vendor.client(server))
    headers = server.requests[0].headers
    key = "sk-test-openai" if vendor.name == "openai" else "sk-test-anthropic"
    # the SDK's own header: x-api-key, or a bearer token
    assert key in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer "))
    # no constructor argument takes a key; a missing variable fails at construction, naming it
    monkeypatch.delenv(vendor.key_env)
    with pytest.raises(ConfigError, match=vendor.key_env):
        vendor.client_class("m")
    with pytest.raises(TypeError):
        vendor.client_class("m", api_key="sk-in-source")


def test_one_client_serves_several_event_loops(vendor: Vendor):
    """A client is built once (at app start) and used from runs on different loops (an
    ``asyncio.run`` per request, a SyncEngine thread): pooled connections stay per loop."""
    with vendor.server([vendor.text("one"), vendor.text("two"), vendor.text("three")]) as server:
        client = vendor.client(server)
        assert _ask(client) == "one"
        assert _ask(client) == "two"
        got: list[str] = []
        t = threading.Thread(target=lambda: got.append(_ask(client)))
        t.start()
        t.join(30)
        assert got == ["three"]


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"model": ""}, "model"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"max_retries": -1}, "max_retries"),
        ({"params": {"messages": []}}, "params['messages']"),
        ({"params": {"model": "other"}}, "params['model']"),
    ],
)
def test_bad_options_fail_at_construction_naming_the_field(vendor: Vendor, options: dict, named: str):
    options = {"model": "m", **options}
    with pytest.raises(ConfigError) as caught:
        vendor.client_class(options.pop("model"), **options)
    assert named in str(caught.value)


def test_anthropic_needs_a_positive_max_tokens():
    from aaa_celery.llm import AnthropicMessagesClient

    with pytest.raises(ConfigError, match="max_tokens"):
        AnthropicMessagesClient("m", max_tokens=0)
    with pytest.raises(ConfigError, match=r"params\['system'\]"):
        AnthropicMessagesClient("m", params={"system": "x"})
