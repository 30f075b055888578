"""The Redis store: a TTL lease, with one Lua script (one round trip) per operation.

Each script in ``lua/`` mirrors a decision of :mod:`aaa_celery.lifecycle` and
documents its KEYS, ARGV and return value; ``lua/_lib.lua`` holds the helpers
they share. Leases and event times use the server's clock, so workers with
skewed clocks agree.

Every key of a call shares the hash tag ``{<call_id>}`` (layout in
``lua/_lib.lua``). Recovery (:meth:`RedisStore.expired`) reads two sorted sets:
``<p>:{<p>}:running``, claimed calls without a result scored by lease expiry, and
``<p>:{<p>}:unclaimed``, registered calls scored by registration time (the grace
is the caller's, so it cannot be in the score). The scripts keep both in step in
the same round trip, which crosses slots: on Redis Cluster they fail with
CROSSSLOT. This store needs one Redis (a primary with replicas) for now.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from typing import Any

import redis

from ..config import Delivery, GuardConfig
from ..errors import ABANDONED_MESSAGE, OUTCOME_UNKNOWN_MESSAGE
from ..lifecycle import (
    FAILED,
    FENCED,
    STALE_RESULT,
    STARTED,
    Accepted,
    BeginResult,
    Busy,
    CallSpec,
    Claimed,
    Event,
    Finished,
    FinishResult,
    Lease,
    Outcome,
    Refused,
    Stale,
    fenced_data,
    stamped,
)
from .base import Store, new_token, wrap_errors

_SCRIPTS = ("begin", "renew", "finish", "release", "fenced", "register", "claim_recovery")
_CALL_KEYS = ("spec", "attempts", "result", "lease", "events")
_INDEXES = ("running", "unclaimed")
_ERRORS = (redis.ConnectionError, redis.TimeoutError)


def _lua(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


def _constants() -> str:
    """The event types of :mod:`lifecycle` as Lua locals, so they are written once."""
    names = {"STARTED": STARTED, "FAILED": FAILED, "FENCED": FENCED, "STALE_RESULT": STALE_RESULT}
    return "".join(f"local {k} = {json.dumps(v)}\n" for k, v in names.items())


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _tail(error: str | None, message: str) -> str:
    """The outcome-specific part of ``lifecycle.result_data``, as JSON members."""
    return json.dumps({"error": error, "message": message}, separators=(",", ":"))[1:-1]


def _outcome_tail(outcome: Outcome) -> str:
    if outcome.ok:
        return json.dumps({"value": outcome.value}, separators=(",", ":"))[1:-1]
    return _tail(outcome.error, outcome.message)


def _refusal(config: GuardConfig) -> tuple[int, str]:
    """begin.lua's view of ``decide_begin``'s refusal: the attempt count at which a
    lapsed call is refused, and the refusal's error JSON ("{attempts}" filled in Lua).

    Under at_most_once any started attempt ends the call, so the cap is 1.
    """
    if config.delivery is Delivery.AT_MOST_ONCE:
        return 1, _tail("OutcomeUnknown", OUTCOME_UNKNOWN_MESSAGE)
    return config.max_attempts, _tail("ExecutionAbandoned", ABANDONED_MESSAGE)


def _json(record: CallSpec | Outcome) -> str:
    """``record.to_json()`` without ``dataclasses.asdict``'s deep copy (the same JSON:
    the fields in order, each already JSON data); a third of a call's client CPU."""
    return json.dumps(record.__dict__, separators=(",", ":"))


def _spec_args(call: CallSpec) -> list[Any]:
    return [_json(call), call.name, call.idempotency_key, "1" if call.request else "0"]


class RedisStore(Store):
    """Leases, attempts, results and events of tool calls in Redis.

    Args:
        url: ``redis://`` or ``rediss://`` URL of the server.
        retention_s: seconds a finished call's result and events are kept.
        key_prefix: the first part of every key.
        **kw: passed to :meth:`redis.Redis.from_url` (``socket_timeout``, ...).
    """

    kind = "redis"

    def __init__(
        self, url: str, *, retention_s: float = 7 * 24 * 3600, key_prefix: str = "aaa", **kw: Any
    ) -> None:
        self.url = url
        self.retention_s = max(1, math.ceil(retention_s))
        self.key_prefix = key_prefix
        self._redis = redis.Redis.from_url(url, **{**kw, "decode_responses": True})
        self._indexes = [f"{key_prefix}:{{{key_prefix}}}:{name}" for name in _INDEXES]
        prelude = _constants() + _lua("_lib")
        self._scripts = {n: self._redis.register_script(prelude + _lua(n)) for n in _SCRIPTS}

    def key(self, call_id: str, name: str) -> str:
        """The key ``name`` (``lease``, ``result``, ...) of a call."""
        return f"{self.key_prefix}:{{{call_id}}}:{name}"

    def _run(self, script: str, call_id: str, *args: Any) -> Any:
        keys = [self.key(call_id, k) for k in _CALL_KEYS] + self._indexes
        keys.append(self.key(call_id, "recovery"))
        with wrap_errors(self.kind, *_ERRORS):
            return self._scripts[script](keys=keys, args=[call_id, *args])

    def begin(self, call: CallSpec, worker: str, config: GuardConfig) -> BeginResult:
        token, ttl_s = new_token(), config.lease_ttl_s
        reply = self._run(
            "begin", call.call_id, *_spec_args(call), worker, token, _ms(ttl_s),
            *_refusal(config), self.retention_s,
        )
        kind = reply[0]
        if kind == "finished":
            return Finished(Outcome.from_json(reply[1]))
        if kind == "busy":
            return Busy(reply[1], reply[2] / 1000)
        if kind == "refused":
            return Refused(Outcome.from_json(reply[1]))
        return Claimed(Lease(call.call_id, reply[1], worker, token, ttl_s, reply[2] / 1000))

    def renew(self, lease: Lease) -> bool:
        return bool(self._run("renew", lease.call_id, lease.token, _ms(lease.ttl_s)))

    def finish(self, lease: Lease, outcome: Outcome, config: GuardConfig) -> FinishResult:
        outcome = stamped(outcome, lease.attempt)
        reply = self._run(
            "finish", lease.call_id, lease.token, lease.attempt, _json(outcome),
            _outcome_tail(outcome), outcome.event_type, "1" if config.fence_results else "0",
            self.retention_s, _json(CallSpec(lease.call_id)),
        )
        if reply[0] == "accepted":
            return Accepted(outcome)
        current = reply[1] if len(reply) > 1 else None
        return Stale(Outcome.from_json(current) if current else None)

    def release(self, lease: Lease) -> None:
        self._run("release", lease.call_id, lease.token)

    def fenced(self, lease: Lease) -> None:
        data = json.dumps(fenced_data(lease), separators=(",", ":"))
        self._run("fenced", lease.call_id, lease.token, lease.attempt, data)

    def register(self, call: CallSpec) -> None:
        self._run("register", call.call_id, *_spec_args(call))

    def claim_recovery(self, call_id: str, worker: str, hold_s: float) -> bool:
        return bool(self._run("claim_recovery", call_id, worker, _ms(hold_s)))

    def events(self, call_id: str) -> list[Event]:
        with wrap_errors(self.kind, *_ERRORS):
            raw = self._redis.lrange(self.key(call_id, "events"), 0, -1)
        return [Event.from_json(e) for e in raw]

    def result(self, call_id: str) -> Outcome | None:
        with wrap_errors(self.kind, *_ERRORS):
            raw = self._redis.get(self.key(call_id, "result"))
        return Outcome.from_json(raw) if raw else None

    def expired(self, now: float | None = None, unclaimed_grace_s: float = 60.0) -> list[CallSpec]:
        now = self.now() if now is None else now
        running, unclaimed = self._indexes
        with wrap_errors(self.kind, *_ERRORS):
            pipe = self._redis.pipeline(transaction=False)
            pipe.zrangebyscore(running, "-inf", now * 1000)
            pipe.zrangebyscore(unclaimed, "-inf", (now - unclaimed_grace_s) * 1000)
            ids = [call_id for found in pipe.execute() for call_id in found]
            for call_id in ids:
                pipe.hget(self.key(call_id, "spec"), "json")
            specs = pipe.execute() if ids else []
        # A spec missing here expired with its call's retention: nothing to bring back.
        return [CallSpec.from_json(raw) for raw in specs if raw]

    def now(self) -> float:
        with wrap_errors(self.kind, *_ERRORS):
            seconds, micros = self._redis.time()
        return seconds + micros / 1_000_000

    def close(self) -> None:
        self._redis.close()
