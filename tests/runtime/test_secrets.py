"""Secret arguments on the embedded engine over a Redis store: redacted in run events,
approvals, the store and the idempotency key; intact in the tool (issue 12).

Reproduces on 23716a3: there was no way to mark an argument secret, and a password
argument appeared in the run events and in the store's spec (kept for recovery).
The fleet side (Celery events, worker log, Flask pages, recovery) is
``tests/worker/test_fleet_secrets.py``.
"""

from __future__ import annotations

import asyncio
import secrets as pysecrets
from typing import Annotated, Any

import pytest
import redis
from celery import Celery
from pydantic import BaseModel, SecretStr

from aaa_celery import open_store
from aaa_celery.algos import ToolLoop
from aaa_celery.errors import ConfigError, ToolArgsError
from aaa_celery.llm import FakeLLMClient, LLMHandler, LLMResponse, ToolCall
from aaa_celery.llm.fake import text
from aaa_celery.runtime import Engine
from aaa_celery.runtime.approvals import APPROVAL_GRANTED
from aaa_celery.tools import Secret, ToolContext, ToolHandler, ToolRegistry, tool

pytestmark = [pytest.mark.redis]


def redis_dump(url: str) -> str:
    """Every key of the database and every value in it, as one text to grep."""
    client = redis.Redis.from_url(url)
    out = []
    read = {
        "string": lambda k: client.get(k),
        "hash": lambda k: client.hgetall(k),
        "list": lambda k: client.lrange(k, 0, -1),
        "set": lambda k: client.smembers(k),
        "zset": lambda k: client.zrange(k, 0, -1, withscores=True),
        "stream": lambda k: client.xrange(k),
    }
    for key in client.scan_iter(count=1000):
        value: Any = read.get(client.type(key).decode(), lambda k: b"")(key)
        out.append(f"{key!r} {value!r}")
    client.close()
    return "\n".join(out)


received: list[dict[str, Any]] = []


@tool(idempotency_key=lambda a: f"login:{a['user']}:{a['password']}")
def login(user: str, password: Annotated[str, Secret], token: SecretStr | None = None,
          ctx: ToolContext = None) -> str:  # type: ignore[assignment]
    """Log in."""
    received.append({"user": user, "password": password, "token": token, "key": ctx.idempotency_key})
    return f"logged in {user}"


@tool(requires_approval=True)
def pay(amount: int, card: SecretStr) -> str:
    """Pay (a person approves)."""
    received.append({"amount": amount, "card": card.get_secret_value()})
    return f"paid {amount}"


def test_a_secret_reaches_the_tool_intact_and_nothing_else_in_clear(redis_url):
    password, token, card = (f"pw-{pysecrets.token_hex(8)}" for _ in range(3))
    received.clear()

    def model(request: Any) -> LLMResponse:
        if request.messages[-1].role == "user":
            return LLMResponse(tool_calls=(
                ToolCall("login", {"user": "ann", "password": password, "token": token}),
                ToolCall("pay", {"amount": "30", "card": card}),
            ))
        return text(" | ".join(m.content for m in request.messages if m.role == "tool"))

    async def main() -> Any:
        async with Engine(store=open_store(redis_url)) as engine:
            LLMHandler(FakeLLMClient(model)).attach(engine)
            ToolHandler(ToolRegistry([login, pay])).attach(engine)
            handle = engine.start(ToolLoop(ToolRegistry([login, pay])), {"task": "go"})
            while not handle.pending_approvals():
                await asyncio.sleep(0.02)
            [pending] = handle.pending_approvals()
            shown = pending.to_dict()
            handle.signal(APPROVAL_GRANTED, {"call_id": pending.call_id, "digest": pending.digest})
            outcome = await handle.result()
            return handle, shown, outcome

    handle, shown, outcome = asyncio.run(main())
    assert outcome.value["text"] == "logged in ann | paid 30"
    # the tool got every secret intact, and its key saw the password redacted
    by_tool = {("user" in r): r for r in received}
    assert by_tool[True]["password"] == password and by_tool[True]["token"].get_secret_value() == token
    assert by_tool[True]["key"] == "login:ann:**********"
    assert by_tool[False]["card"] == card
    # a person approves what they see, the secret redacted
    assert shown["arguments"] == {"amount": 30, "card": "**********"}
    everything = f"{handle.events()!r}\n{redis_dump(redis_url)}"
    requested = [e["data"]["arguments"] for e in handle.events() if e["type"] == "aaa.tool.requested"]
    assert requested[0] == {"user": "ann", "password": "**********", "token": "**********"}
    for secret in (password, token, card):
        assert secret not in everything


def test_a_secret_sent_around_apply_async_is_refused_by_the_worker_not_run():
    received.clear()

    async def main() -> Any:
        async with Engine() as engine:
            LLMHandler(FakeLLMClient([text("nothing")])).attach(engine)
            ToolHandler(ToolRegistry([login])).attach(engine)
            await engine.run(ToolLoop(ToolRegistry([login])), {"task": "go"})  # starts the worker
            sent = engine.app.send_task("aaa.tool.login", kwargs={"arguments": {"user": "a", "password": "clear"}},
                                        queue=f"aaa-embedded-{engine.id}.default")
            return await asyncio.to_thread(sent.get, timeout=30, propagate=False)

    value = asyncio.run(main())
    assert isinstance(value, ToolArgsError) and "arrived in clear" in str(value)
    assert received == []


class Creds(BaseModel):
    user: str
    password: SecretStr


def test_secret_marks_are_checked_when_the_tool_is_defined_and_bound():
    with pytest.raises(ConfigError, match="holds a secret inside it"):
        @tool
        def nested(creds: Creds) -> str:
            """Nested."""
            return ""

    with pytest.raises(ConfigError, match=r"Annotated\[str, Secret\]"):
        @tool
        def pin(code: Annotated[int, Secret]) -> str:
            """A number is no secret string."""
            return ""

    app = Celery("no-key", broker="redis://127.0.0.1:1/0", set_as_current=False)
    with pytest.raises(ConfigError, match="aaa_secret_key"):
        ToolHandler(ToolRegistry([login])).bind(app)
    app.conf.aaa_secret_key = "not a key"
    with pytest.raises(ConfigError, match="aaa_secret_key: not a Fernet key"):
        ToolHandler(ToolRegistry([login])).bind(app)


def test_a_policy_rule_that_reads_a_secret_argument_is_refused_at_bind():
    """Reproduces on 62aa5e8: a ``Where`` rule on a secret argument quoted its clear value in
    the ``PolicyDenied`` that the store records and the model reads; a ``Budget`` by a
    secret kept it in a store key."""
    from cryptography.fernet import Fernet

    from aaa_celery.config import GuardPolicy
    from aaa_celery.policy import Budget, Where

    app = Celery("rules", broker="memory://", set_as_current=False)
    app.conf.aaa_store_url = "memory://"
    app.conf.aaa_secret_key = Fernet.generate_key().decode()
    for rule in (Where(tools="login", check="password != 'hunter2'"),
                 Budget(tools="pay", amount="amount", by="card", limit=100, per_s=60)):
        handler = ToolHandler(ToolRegistry([login, pay]), guards=GuardPolicy(rules=[rule]))
        with pytest.raises(ConfigError, match="secret argument") as e:
            handler.bind(app)
        assert "guards" in str(e.value) and "inside the tool" in str(e.value)
    fine = GuardPolicy(rules=[Where(tools="login", check="user != 'root'"), Where(tools="pay", check="amount <= 9")])
    ToolHandler(ToolRegistry([login, pay]), guards=fine).bind(app)


def test_a_direct_call_takes_the_secret_in_clear():
    received.clear()
    assert asyncio.run(login(user="bo", password="pw")) == "logged in bo"
    assert received[0]["password"] == "pw"


def test_a_secret_in_a_chained_signature_travels_sealed(redis_url):
    """A chain's later steps travel inside the first step's message (kept in the store's
    spec for recovery): their secrets are sealed when the signature is made."""
    from celery import chain

    received.clear()
    first, second = (f"pw-{pysecrets.token_hex(8)}" for _ in range(2))

    async def main() -> Any:
        async with Engine(store=open_store(redis_url)) as engine:
            LLMHandler(FakeLLMClient([text("nothing")])).attach(engine)
            handler = ToolHandler(ToolRegistry([login]))
            handler.attach(engine)
            await engine.run(ToolLoop(ToolRegistry([login])), {"task": "go"})  # starts the worker
            task = handler.task("login")
            steps = chain(task.s(user="a", password=first, token="t1"),
                          engine.app.tasks["aaa.tool.login"].si(arguments={"user": "b", "password": second}))
            return await asyncio.to_thread(steps.apply_async().get, timeout=30)

    assert asyncio.run(main()) == "logged in b"
    assert sorted((r["user"], r["password"]) for r in received) == [("a", first), ("b", second)]
    dump = redis_dump(redis_url)
    assert "aaa_sealed" in dump
    assert first not in dump and second not in dump


def test_keys_rotate_the_first_seals_every_one_opens():
    from cryptography.fernet import Fernet

    from aaa_celery.tools.secrets import Sealer

    old, new = Fernet.generate_key(), Fernet.generate_key()
    sealed_before = Sealer(old).seal("pw")
    rotated = Sealer([new, old])
    assert rotated.unseal(sealed_before) == "pw"  # calls sealed before the rotation still run
    assert Sealer(new).unseal(rotated.seal("pw2")) == "pw2"  # new calls use the new key
    with pytest.raises(ToolArgsError, match="no key of aaa_secret_key opens"):
        Sealer(new).unseal(sealed_before)


def test_a_recorded_model_turn_keeps_secrets_sealed_and_replays_them_exactly():
    """A durable run records each model answer in the store, to replay it on a resume: its
    tool calls' secrets are sealed there, and open to exactly what the model sent (the
    call's id is a digest of its arguments, so a replay finds the call's result)."""
    async def main() -> Any:
        async with Engine() as engine:
            ToolHandler(ToolRegistry([login, pay])).attach(engine)
            turn = {"text": "", "usage": None, "tool_calls": [
                {"name": "login", "arguments": {"user": "a", "password": "pw-1", "token": None}, "id": "c1"},
                {"name": "pay", "arguments": {"amount": 3, "card": 4111}, "id": "c2"},  # not a string: refused anyway
                {"name": "nope", "arguments": [1], "id": "c3"},
            ]}
            kept = engine.tools.keepable_turn(turn)
            return turn, kept, engine.tools.keepable_turn(kept, opened=True)

    turn, kept, opened = asyncio.run(main())
    assert "pw-1" not in repr(kept) and "4111" not in repr(kept)
    assert kept["tool_calls"][0]["arguments"]["password"]["aaa_sealed"]
    assert opened["tool_calls"][0] == turn["tool_calls"][0]
    assert opened["tool_calls"][1]["arguments"] == {"amount": 3, "card": "**********"}
    assert opened["tool_calls"][2] == turn["tool_calls"][2]
