"""The Redis store: a TTL lease on the server's clock, one Lua script (one round trip) per operation.

**Plans.** Lifecycle plans each write for the state the call is expected in; a script
(``lua/``, helpers and the one ``apply`` of a plan's writes in ``lua/_lib.lua``) gets the
writes (:func:`_pack`) with that state, and applies them only if the call is in it. Else it
writes nothing and replies the state, which lifecycle plans again. ``finish`` gets only a
lease, so the store remembers the spec of the calls it began; a ``finish`` from another
store instance costs one more round trip.

**Shards.** A call's keys, ``<p>:{<p>:<shard>}:<call_id>:<name>`` with ``shard =
crc32(call_id) % shards``, share their shard's hash tag with its two recovery indexes
(``running``, by lease expiry; ``unclaimed``, by registration time), so every script
touches one slot. On Redis Cluster (``redis+cluster://``) each script goes to the node that
owns its slot, and a lease is judged only by that node's clock. ``docs/stores.md`` has the
operator's side: durability, ``replicas`` and failover, Cluster, where to put the store.
Connections are lent to threads (:mod:`.client`).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Literal, cast

import redis

from ...config import GuardConfig
from ...errors import ConfigError, StoreUnavailable
from ...lifecycle import (Accepted, BeginResult, Busy, CallSpec, CallState, Checkpoint, Claimed, Draft, Event,
                          Finished, FinishResult, Lease, RECORD_KINDS, plan_resolve, Outcome, RecordKind, Refused,
                          SlotPlan, Spend, Stale, Writes, compact_json, fresh_event, joined, merge_spec, plan_begin,
                          plan_checkpoint, plan_fenced, plan_finish, plan_hand_on, plan_record, plan_purge,
                          plan_recovery_claim, plan_release, plan_settle, plan_renew, plan_slot, plan_spend,
                          replaces_below, spec_rank)
from ..base import ResultCopy, Store, StoreVersion, new_token, wrap_errors
from ..budgets import check_spend
from ..ops import CallRecord
from .client import CLUSTER_SCHEMES, CONNECT_ERRORS, ERRORS, SOCKET_TIMEOUT_S, evalsha, lua, ms, server_of
from . import format_version
from .runs import RedisRuns

#: Stands for a call's result where a plan needs only to know that there is one (a recovery
#: claim, a purge): the scripts reply whether a call has a result, not the result itself.
_SOME_RESULT = Outcome.failure("", "")
#: ``finish.lua``'s copy arguments when there is no copy to write.
_NO_COPY = ["", "", ""]
#: The scripts that run alone, without ``lua/_lib.lua``.
_BARE = ("spend", "slot")
_CALL_KEYS = ("spec", "attempts", "result", "lease", "events")
_INDEXES = ("running", "unclaimed")
#: How many calls' specs a store remembers, to plan ``finish``'s events in one round trip.
_KNOWN_SPECS = 4096
#: Round trips an operation may take while the call's state keeps changing under it.
_TRIES = 8
#: Round trips a spend may take: each but the first finds that another spend changed the
#: budget between its read and its write (a busy budget shared by a fleet).
_SPEND_TRIES = 100


def _json(record: CallSpec | Outcome) -> str:
    """``record.to_json()`` without ``dataclasses.asdict``'s deep copy (the same JSON:
    the fields in order, each already JSON data); a third of a call's client CPU."""
    return compact_json(record.__dict__)


def _spec_args(call: CallSpec) -> list[Any]:
    return [_json(call), call.name, call.idempotency_key, str(spec_rank(call)), str(replaces_below(call))]


def _expected(state: CallState, spec: CallSpec) -> list[Any]:
    """begin.lua's compare-and-set value: the state ``state`` a plan was made for, with the
    name and idempotency key of ``spec``, the spec in force its events were built from."""
    live = "1" if state.holder_live else "0"
    return [f"{state.attempts}:{state.handed_on}:{state.handed}:{live}", state.token, spec.name,
            spec.idempotency_key, state.lost_cause]


def _pack(writes: Writes, state: CallState | None, retention_s: int) -> list[Any]:
    """``writes`` (planned for ``state``; None: a state that proves no event fresh) as
    ``lua/_lib.lua``'s apply reads them."""
    args: list[Any] = []
    if (lease := writes.claim) is not None:
        args += ["claim", lease.attempt, lease.token, lease.worker, ms(lease.ttl_s)]
    if writes.record is not None:
        args += ["record", _json(writes.record), retention_s]
    if writes.settle is not None:
        args += ["settle", _json(writes.settle)]
    if (event := writes.event) is not None:
        args += ["event", event.id, event.to_json(), "1" if state and fresh_event(event, state) else "0"]
    if writes.let_go is not None:
        args += ["let_go", writes.let_go]
    if writes.hand_on is not None:
        args += ["hand_on", writes.hand_on.attempt]
    if writes.checkpoint is not None:
        args += ["checkpoint", writes.checkpoint]
    if writes.renew is not None:
        args += ["renew", ms(writes.renew.ttl_s)]
    return args


def _event(raw: str) -> Event:
    """An event from its entry in the events list (``lua/_lib.lua``'s push_event)."""
    entry = json.loads(raw)
    return Draft.from_json(entry["event"]).stamp(float(entry["at"]))


class RedisStore(RedisRuns, Store):
    """Leases, attempts, results and events of tool calls in Redis or Redis Cluster.

    Args:
        url: ``redis://`` or ``rediss://`` URL of a server, or ``redis+cluster://`` or
            ``rediss+cluster://`` URL of one node of a Redis Cluster.
        retention_s: seconds a finished call's result and events are kept.
        key_prefix: the first part of every key.
        shards: how many shards (hash tags, each with its own recovery indexes) the
            calls are spread over. The same for every worker of a fleet.
        replicas: how many replicas must acknowledge each write of a call (``WAIT``,
            in the script's round trip) before the guard goes on: a claim before the body
            runs, a result before the message is acked, a renewal before it counts. A
            write that fewer replicas acknowledged within ``replicas_timeout_s`` raises
            :class:`~aaa_celery.errors.StoreUnavailable` (store trouble: retried, never
            run on). With 1 or more, a failover to an acknowledging replica loses no
            write of a call. 0 (the default): replication stays asynchronous.
        replicas_timeout_s: seconds a write waits for its replicas (default 1).
        **kw: passed to :meth:`redis.Redis.from_url` (``socket_timeout``, ...) or
            :meth:`redis.cluster.RedisCluster.from_url` (``startup_nodes``, ...).
            ``socket_timeout`` and ``socket_connect_timeout`` default to
            :data:`SOCKET_TIMEOUT_S` (redis-py's own default is no timeout at all); keep
            them well below the lease TTL (``?socket_timeout=`` in the URL works too).
    """

    kind = "redis"

    def __init__(
        self, url: str, *, retention_s: float = 7 * 24 * 3600, key_prefix: str = "aaa",
        shards: int = 16, replicas: int = 0, replicas_timeout_s: float = 1.0, **kw: Any,
    ) -> None:
        if shards < 1:
            raise ValueError(f"shards must be at least 1, not {shards}")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ConfigError(f"redis store: replicas must be an int of at least 0, not {replicas!r}: the "
                              "replicas that must acknowledge each write of a call before the guard goes on")
        if not isinstance(replicas_timeout_s, (int, float)) or replicas_timeout_s <= 0:
            raise ConfigError(f"redis store: replicas_timeout_s must be a number of seconds above 0, not "
                              f"{replicas_timeout_s!r}")
        #: Replicas that acknowledge each write of a call (``WAIT``) before it counts as made.
        self.replicas = replicas
        self._wait = (replicas, max(1, round(replicas_timeout_s * 1000))) if replicas else None
        self.url = url
        self.retention_s = max(1, math.ceil(retention_s))
        self.key_prefix = key_prefix
        self.shards = shards
        self._tags = [f"{key_prefix}:{{{key_prefix}:{n}}}" for n in range(shards)]
        self._indexes = [[f"{tag}:{name}" for name in _INDEXES] for tag in self._tags]
        self._client: Any = None
        #: The server this store's client reaches (:func:`.client.server_of`); None on a cluster.
        self._server: tuple[Any, ...] | None = None
        self._scripts: dict[str, Any] = {}
        self._specs: OrderedDict[str, CallSpec] = OrderedDict()
        self._specs_lock = threading.Lock()
        #: call id -> (token, state, spec) of a claim sent whose reply never came: the state the
        #: call is in if it landed, which a ``begin`` retried with that token plans for.
        self._unanswered: OrderedDict[str, tuple[str, CallState, CallSpec]] = OrderedDict()
        #: Each budget as this store's last spend left it (window, total), with the server's
        #: clock less this host's then: the next spend plans on them (``spend.lua`` checks).
        self._budgets_seen: dict[str, tuple[str, str, float]] = {}
        self._connect_lock = threading.Lock()
        self._held = threading.local()  # .lent: this thread's _Lent connection
        scheme, sep, rest = url.partition("://")
        cluster_scheme = CLUSTER_SCHEMES.get(scheme.lower())
        #: True when the URL names a Redis Cluster.
        self.cluster = cluster_scheme is not None
        if self.cluster and replicas:
            raise ConfigError("redis store: replicas is for a single primary with replicas; on a Redis Cluster "
                              "each node's replicas are its own (leave replicas at 0)")
        options = {"socket_timeout": SOCKET_TIMEOUT_S, "socket_connect_timeout": SOCKET_TIMEOUT_S,
                   **kw, "decode_responses": True}
        if cluster_scheme is None:
            self._open(lambda: redis.Redis.from_url(url, **options))
        else:  # RedisCluster discovers the cluster as it is built: do that at first use.
            self._connect = lambda: redis.RedisCluster.from_url(f"{cluster_scheme}{sep}{rest}", **options)

    def _open(self, connect: Any) -> Any:
        client = connect()
        if not self.cluster:
            pool = client.connection_pool
            self._server = server_of({**pool.connection_kwargs, "connection_class": pool.connection_class})
        self._client = client
        return client

    @property
    def _redis(self) -> Any:
        """The client: a :class:`redis.Redis`, or a :class:`redis.cluster.RedisCluster`
        connected on first use (raises StoreUnavailable if no node answers)."""
        client = self._client
        if client is None:
            with self._connect_lock, wrap_errors(self.kind, *CONNECT_ERRORS):
                client = self._client or self._open(self._connect)
        return client

    # -- Format version (format_version.py) ------------------------------------------------------

    def schema_version(self) -> StoreVersion:
        return self._format(format_version.version)

    def migrate(self) -> StoreVersion:
        return self._format(format_version.upgrade)

    def _format(self, run: Callable[[Any, str, list[str]], StoreVersion]) -> StoreVersion:
        """``run`` on the client, the key prefix and every index a call or a run of the prefix is in."""
        client = self._redis
        indexes = [f"{tag}:calls" for tag in self._tags] + [f"{self._run_tag(n)}:runs" for n in range(self.shards)]
        with wrap_errors(self.kind, *ERRORS):
            return run(client, self.key_prefix, indexes)

    def key(self, call_id: str, name: str) -> str:
        """The key ``name`` (``lease``, ``result``, ...) of a call."""
        return f"{self._tags[self.shard(call_id)]}:{call_id}:{name}"

    def index_keys(self, shard: int) -> list[str]:
        """The recovery indexes (``running``, ``unclaimed``) of a shard."""
        return list(self._indexes[shard])

    def _keys(self, call_id: str) -> list[str]:
        """A call's keys, as the scripts take them (``lua/_lib.lua``)."""
        shard = self.shard(call_id)
        tag = self._tags[shard]
        call = f"{tag}:{call_id}"
        # last, the shard's calls index: its time index (stores/ops.py)
        return [*[f"{call}:{k}" for k in _CALL_KEYS], *self._indexes[shard], f"{call}:recovery", f"{tag}:calls"]

    def _script(self, name: str) -> Any:
        """``lua/<name>.lua`` (after ``lua/_lib.lua`` unless it runs alone), registered on first use."""
        script = self._scripts.get(name)
        if script is None:
            body = lua(name) if name in _BARE or name.startswith("run_") else lua("_lib") + lua(name)
            script = self._scripts[name] = self._redis.register_script(body)
        return script

    def _run(self, script: str, call_id: str, *args: Any, more_keys: tuple[Any, ...] = ()) -> Any:
        return self._eval(script, [*self._keys(call_id), *more_keys], [call_id, *args], call_id)

    def _eval(self, name: str, keys: list[str], args: list[Any], subject: str,
              wrote: Callable[[Any], bool] = lambda reply: True) -> Any:
        """Script ``name`` on the thread's connection. With ``replicas``, a reply that ``wrote``
        counts only once that many replicas have the write (``WAIT``, in the same round trip):
        else StoreUnavailable, naming the script and its ``subject`` (a call id, a key)."""
        with wrap_errors(self.kind, *ERRORS):
            client, script = self._redis, self._script(name)
            if self.cluster:
                return script(keys=keys, args=args, client=client)
            if self._wait is None:
                return evalsha(client, self._held, script, keys, args)
            reply, acked = evalsha(client, self._held, script, keys, args, self._wait)
        if acked < self.replicas and wrote(reply):
            raise StoreUnavailable(f"redis store: {name} of {subject!r} reached {acked} of {self.replicas} replicas "
                                   f"within {self._wait[1]} ms (aaa_store_options replicas): not counted as made")
        return reply

    def _known_spec(self, call_id: str) -> CallSpec | None:
        """The spec in force of a call, as this store last saw it (name and key only)."""
        with self._specs_lock:
            return self._specs.get(call_id)

    def _remember(self, spec: CallSpec) -> None:
        with self._specs_lock:
            self._specs[spec.call_id] = CallSpec(spec.call_id, spec.name, spec.idempotency_key)
            self._specs.move_to_end(spec.call_id)
            if len(self._specs) > _KNOWN_SPECS:
                self._specs.popitem(last=False)

    def _unanswered_claim(self, call_id: str, token: str, landed: CallState, spec: CallSpec) -> None:
        with self._specs_lock:
            self._unanswered[call_id] = (token, landed, spec)
            if len(self._unanswered) > _KNOWN_SPECS:
                self._unanswered.popitem(last=False)

    def begin(self, call: CallSpec, worker: str, config: GuardConfig, token: str | None = None) -> BeginResult:
        token = token or new_token()
        spec = merge_spec(self._known_spec(call.call_id), call)
        state = CallState()  # a new call: its first delivery is by far the most common begin
        with self._specs_lock:
            sent = self._unanswered.get(call.call_id)
        if sent is not None and sent[0] == token:  # retried after its reply was lost: planned as landed
            _, state, spec = sent
        delivered = _spec_args(call)
        for _ in range(_TRIES):
            writes = plan_begin(state, spec, worker, config, token, None)  # the lease's expiry: the server's
            if writes.claim is None and writes.record is None:
                break  # finished or busy: nothing to write (the state came from a reply)
            try:
                reply = self._run("begin", call.call_id, *delivered, *_expected(state, spec),
                                  *_pack(writes, state, self.retention_s))
            except Exception:
                if writes.claim is not None:  # it may have landed: a retry with this token plans for that
                    self._unanswered_claim(call.call_id, token, CallState(
                        writes.claim.attempt, None, True, worker, None, state.handed_on, state.handed, token), spec)
                raise
            if sent is not None:
                with self._specs_lock:
                    self._unanswered.pop(call.call_id, None)
                sent = None
            if reply[0] == 1:
                break
            _, result, attempts, handed_on, handed, held, holder, expires, cause, name, ikey = reply
            live = expires > 0
            state = CallState(int(attempts), Outcome.from_json(result) if result else None, live, holder,
                              expires / 1000 if live else None, int(handed_on), int(handed), held, cause)
            spec = CallSpec(call.call_id, name, ikey)
        else:
            raise RuntimeError(f"the state of {call.call_id!r} kept changing while it was begun")
        if (lease := writes.claim) is not None:  # claimed: the lease lapses when the server's clock says
            self._remember(spec)
            return Claimed(Lease(lease.call_id, lease.attempt, worker, token, lease.ttl_s, reply[1] / 1000))
        if writes.record is not None:  # refused
            self._remember(spec)
        begun = writes.reply
        assert isinstance(begun, (Busy, Finished, Refused))
        return begun

    def _as_holder(self, lease: Lease, plan: Callable[[bool], Writes], expect: Literal["holds", "known", ""]) -> Any:
        """Apply ``plan(holds)`` (``holds``: whether ``lease`` is live and holds the call) by
        ``lease.lua``: the plan for a holding lease if ``expect`` is ``holds``, applied only
        while it holds, else the plan for a lease that does not hold, applied in the state
        ``expect`` names (``known``: the call is known). Its reply."""
        if expect == "holds":
            held = plan(True)
            if self._run("lease", lease.call_id, "holds", lease.token, *_pack(held, None, self.retention_s)):
                return held.reply
            expect = "known"
        writes = plan(False)
        if args := _pack(writes, None, self.retention_s):
            self._run("lease", lease.call_id, expect, lease.token, *args)
        return writes.reply

    def renew(self, lease: Lease) -> bool:
        return bool(self._as_holder(lease, lambda holds: plan_renew(lease, holds), "holds"))

    def finish(self, lease: Lease, outcome: Outcome, config: GuardConfig,
               copy: ResultCopy | None = None) -> FinishResult:
        spec = self._known_spec(lease.call_id) or CallSpec(lease.call_id)
        state, raw = CallState(lease.attempt), ""  # the common case: this attempt is the last, no result
        bare = _json(CallSpec(lease.call_id))
        copy_args, copy_key = self._copy_args(copy if outcome.ok else None)
        for _ in range(_TRIES):
            writes = plan_finish(state, spec, lease, outcome, config)
            if writes.record is None and writes.event is None:
                break  # this very outcome is recorded already
            # the copy goes only with the outcome accepted as the call's result
            accepting = isinstance(writes.reply, Accepted) and writes.record is not None
            copying, keys = (copy_args, copy_key) if accepting else (_NO_COPY, ())
            reply = self._run("finish", lease.call_id, bare, raw, state.attempts, spec.name, *copying,
                              *_pack(writes, state, self.retention_s), more_keys=keys)
            if reply[0] == 1:
                if keys and reply[1:] == [1]:
                    assert copy is not None
                    copy.written = True
                break
            _, result, attempts, name = reply
            raw = result or ""
            state = CallState(int(attempts), Outcome.from_json(raw) if raw else None)
            if name != spec.name:
                spec = CallSpec(lease.call_id, name)
                self._remember(spec)
        else:
            raise RuntimeError(f"the state of {lease.call_id!r} kept changing while it was finished")
        finished = writes.reply
        assert isinstance(finished, (Accepted, Stale))
        return finished

    def _copy_args(self, copy: ResultCopy | None) -> tuple[list[Any], tuple[Any, ...]]:
        """``finish.lua``'s copy arguments (db, value, TTL) and key: none unless the copy goes
        to this store's own server, as the same user (its database may differ)."""
        server = self._server
        if copy is None or copy.server is None or server is None or server_of(copy.server) != server:
            return _NO_COPY, ()
        return [int(copy.server.get("db") or 0), copy.value, copy.ttl_s or 0], (copy.key,)

    def release(self, lease: Lease) -> None:
        self._as_holder(lease, lambda holds: plan_release(lease), "")

    def fenced(self, lease: Lease, cause: str | None = None) -> None:
        self._as_holder(lease, lambda holds: plan_fenced(lease, cause), "known")

    def hand_on(self, lease: Lease) -> None:
        self._as_holder(lease, lambda holds: plan_hand_on(lease, holds), "holds")

    def register(self, call: CallSpec) -> None:
        self._run("register", call.call_id, *_spec_args(call))

    def register_many(self, calls: list[CallSpec]) -> None:
        if self.cluster or len(calls) < 2:  # a cluster's pipeline would split by node anyway
            return super().register_many(calls)
        with wrap_errors(self.kind, *ERRORS):
            script = self._script("register")
            pipe = self._redis.pipeline(transaction=False)  # one round trip for them all
            for call in calls:
                keys = self._keys(call.call_id)
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, call.call_id, *_spec_args(call))
            if self._wait is not None:
                pipe.execute_command("WAIT", *self._wait)
            replies = pipe.execute(raise_on_error=False)
        if self._wait is not None and not (isinstance(replies[-1], int) and replies.pop() >= self.replicas):
            raise StoreUnavailable(f"redis store: register of {len(calls)} calls did not reach {self.replicas} "
                                   f"replicas within {self._wait[1]} ms (aaa_store_options replicas)")
        for call, reply in zip(calls, replies):
            if isinstance(reply, Exception):  # NOSCRIPT (a restarted server), ...: alone, loaded
                self.register(call)

    def claim_recovery(self, call_id: str, worker: str, hold_s: float, max_hold_s: float | None = None) -> int:
        # The record Redis keeps is deleted by a claim, so its count is always the current
        # attempt's: planned at attempts 0. First for the state a sweep usually finds: a known
        # call without a result or a live lease, no record (nothing held, at any time); the
        # script adds its clock to the hold.
        state: CallState | None = CallState()
        seen, held_until, now = ("0", "0"), 0.0, 0.0
        for _ in range(_TRIES):
            claim = plan_recovery_claim(state, (0, int(seen[0])), held_until, now, hold_s, max_hold_s)
            if claim is None:
                return 0
            assert state is not None
            tries, until = claim
            hold = ms(until - now)
            expected = f"1:{int(state.result is not None)}:{int(state.holder_live)}:{':'.join(seen)}"
            reply = self._run("claim_recovery", call_id, expected, worker, tries, hold,
                              max(self.retention_s, math.ceil(hold / 1000) * 2))
            if not isinstance(reply, list):
                return int(reply)
            known, result, live, *record, clock = reply
            state = CallState(result=_SOME_RESULT if result == "1" else None,
                              holder_live=live == "1") if known == "1" else None
            seen, held_until, now = (record[0], record[1]), int(record[1]) / 1000, clock / 1000
        raise RuntimeError(f"the recovery record of {call_id!r} kept changing while it was claimed")

    def record(self, call: CallSpec, outcome: Outcome, kind: RecordKind = "first") -> bool:
        if kind not in RECORD_KINDS:
            raise ValueError(f"record kind must be one of {RECORD_KINDS}, not {kind!r}")
        spec = merge_spec(self._known_spec(call.call_id), call)
        register = ["", "", "", "", ""] if kind == "abandon" else _spec_args(call)
        # Planned first for the state a call recorded from outside usually is in: known, no
        # result, ``outcome.attempt`` attempts, no live lease.
        known, state = True, CallState(outcome.attempt)
        for _ in range(_TRIES):
            if not known:
                return False  # recovery's call, never created here
            writes = plan_record(kind, state, spec, outcome)
            expected = f"1:{int(state.result is not None)}:{state.attempts}:{int(state.holder_live)}"
            reply = self._run("record", call.call_id, *register, expected, spec.name,
                              *_pack(writes, state, self.retention_s))
            if reply[0] == 1:
                return bool(writes.reply)
            _, is_known, result, attempts, live, spec_json = reply
            known = is_known == "1"
            state = CallState(int(attempts), Outcome.from_json(result) if result else None, live == "1")
            if spec_json:
                spec = CallSpec.from_json(spec_json)
        raise RuntimeError(f"the state of {call.call_id!r} kept changing while its outcome was recorded")

    def save_checkpoint(self, lease: Lease, checkpoint: str) -> bool:
        return bool(self._as_holder(lease, lambda holds: plan_checkpoint(lease, holds, checkpoint), "holds"))

    def last_checkpoint(self, call_id: str) -> Checkpoint | None:
        with wrap_errors(self.kind, *ERRORS):
            raw = self._redis.hget(self.key(call_id, "spec"), "checkpoint")
        return Checkpoint.from_json(raw) if raw else None

    def events(self, call_id: str) -> list[Event]:
        # one round trip: both keys share a slot
        raw, result = self._pipe(lambda pipe: (pipe.lrange(self.key(call_id, "events"), 0, -1),
                                               pipe.get(self.key(call_id, "result"))))
        return joined([_event(e) for e in raw], Outcome.from_json(result) if result else None)

    def result(self, call_id: str) -> Outcome | None:
        with wrap_errors(self.kind, *ERRORS):
            raw = self._redis.get(self.key(call_id, "result"))
        return Outcome.from_json(raw) if raw else None

    def expired(self, now: float | None = None, unclaimed_grace_s: float = 60.0) -> list[CallSpec]:
        now = self.now() if now is None else now
        lapsed_ms, registered_ms = now * 1000, (now - unclaimed_grace_s) * 1000
        # Non-transactional pipelines: one round trip on a server, one per node on a cluster
        # (each shard's indexes sit on the node that owns its slot).
        found = self._pipe(lambda pipe: [(pipe.zrangebyscore(running, "-inf", lapsed_ms),
                                          pipe.zrangebyscore(unclaimed, "-inf", registered_ms))
                                         for running, unclaimed in self._indexes])
        ids = list(dict.fromkeys(call_id for listed in found for call_id in listed))
        specs = self._pipe(lambda pipe: [pipe.hget(self.key(i, "spec"), "json") for i in ids]) if ids else []
        # A spec missing here expired with its call's retention: nothing to bring back.
        return [CallSpec.from_json(raw) for raw in specs if raw]

    def now(self) -> float:
        with wrap_errors(self.kind, *ERRORS):
            seconds, micros = cast(tuple[int, int], self._redis.time())  # redis-py: a union of reply shapes
        return seconds + micros / 1_000_000

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    # -- Budgets (stores/budgets.py) ----------------------------------------------------

    def budget_key(self, key: str, kind: str = "budget") -> str:
        """The Redis key of budget ``key`` (or of a concurrency key's holders, ``kind="slot"``): a
        digest of it as its own hash tag (any text may be a key, and each can live on any node of
        a cluster)."""
        return f"{self.key_prefix}:{kind}:{{{hashlib.sha256(key.encode('utf-8')).hexdigest()[:32]}}}"

    def spend(self, key: str, token: str, amount: float, limit: float, window_s: float) -> bool:
        check_spend(key, token, amount, limit, window_s)
        keys, window = [self.budget_key(key)], repr(float(window_s))
        seen, plan, offset = "?", Spend(False, 0), cast(float | None, None)
        known = self._budgets_seen.get(key)
        if known is not None:
            # Plan on the budget as this store last left it (a new token: not counted yet) and
            # on the server's clock as last seen: one round trip unless either moved on.
            found, total, offset = known
            seen = f"{found} {total} 0"
            plan = plan_spend(int(found), float(total), False, amount, limit, window_s, time.time() + offset)
        for _ in range(_SPEND_TRIES):
            count = "" if plan.count is None else repr(plan.count)
            expires = math.ceil((plan.window + 1) * float(window_s) * 1000) + 1000
            args = [token, window, seen, str(plan.window), "1" if plan.restart else "0", count, str(expires)]
            reply = self._run_script("spend", keys, args)
            if reply[0] == "done":
                if offset is not None:
                    if len(self._budgets_seen) >= _KNOWN_SPECS:
                        self._budgets_seen.clear()
                    self._budgets_seen[key] = (reply[1], reply[2], offset)
                return plan.reply
            now_ms, found, total, counted = reply[1:]
            offset = int(now_ms) / 1000 - time.time()
            plan = plan_spend(None if found == "-" else int(found), 0.0 if total == "-" else float(total),
                              counted == 1, amount, limit, window_s, int(now_ms) / 1000)
            seen = f"{found} {total} {counted}"
        raise RuntimeError(f"the budget {key!r} kept changing while it was spent")

    # -- Concurrency slots (base.Slots) ---------------------------------------------------

    def slot_key(self, key: str) -> str:
        """The Redis key of a concurrency key's holders (:meth:`budget_key`)."""
        return self.budget_key(key, "slot")

    def take_slot(self, key: str, call_id: str, limit: int, ttl_s: float) -> SlotPlan:
        keys, args = [self.slot_key(key)], ["?", call_id, ""]
        plan = SlotPlan("full")  # planned once the holders are read (the first reply)
        for _ in range(_SPEND_TRIES):
            # with ``replicas``, a slot taken counts once that many replicas have it (as a call's writes)
            reply = self._eval("slot", keys, args, key, lambda reply: bool(reply[0] == "done"))
            if reply[0] == "done":
                return plan
            now_ms, held = int(reply[1]), [str(v) for v in reply[2]]
            holders = {held[i]: float(held[i + 1]) / 1000 for i in range(0, len(held), 2)}
            plan = plan_slot(holders, call_id, limit, ttl_s, now_ms / 1000)
            if plan.put is None and not plan.drop:
                return plan  # full, nothing lapsed: nothing to write
            put = "" if plan.put is None else str(ms(plan.put))
            args = ["\n".join(held), call_id, put, *plan.drop]
        raise RuntimeError(f"the holders of {key!r} kept changing while a slot was taken")

    def free_slot(self, key: str, call_id: str) -> None:
        with wrap_errors(self.kind, *ERRORS):
            self._redis.zrem(self.slot_key(key), call_id)

    def slot_holders(self, key: str) -> list[str]:
        with wrap_errors(self.kind, *ERRORS):
            now_ms = ms(self.now())
            # live strictly before its expiry (lifecycle.lapsed): scores above now
            held = self._redis.zrangebyscore(self.slot_key(key), f"({now_ms}", "+inf")
        return sorted(str(c) for c in held)

    # -- Operators' verbs (stores/ops.py): each shard's ``calls`` index -------------------

    def _shard_ids(self, shard: int, since_ms: str, until_ms: str) -> Iterator[tuple[float, str]]:
        """A shard's ``calls`` index between the two scores, newest first: (seen at (s), call id)."""
        entries = self._newest_first(f"{self._tags[shard]}:calls", until_ms, since_ms, _OPS_PAGE)
        return ((score / 1000, call_id) for score, call_id in entries)

    def calls(self, since: float | None = None, until: float | None = None) -> Iterator[CallRecord]:
        since_ms = "-inf" if since is None else str(ms(since))
        until_ms = str(ms(self.now() if until is None else until))
        merged = heapq.merge(*(self._shard_ids(n, since_ms, until_ms) for n in range(self.shards)),
                             key=lambda entry: (-entry[0], entry[1]))
        while batch := list(itertools.islice(merged, _OPS_PAGE)):
            with wrap_errors(self.kind, *ERRORS):
                pipe = self._redis.pipeline(transaction=False)
                for _, call_id in batch:
                    pipe.hmget(self.key(call_id, "spec"), "json", "resolved")
                    pipe.get(self.key(call_id, "attempts"))
                    pipe.get(self.key(call_id, "result"))
                    pipe.hget(self.key(call_id, "lease"), "worker")
                replies = pipe.execute()
            for n, (seen_at, call_id) in enumerate(batch):
                (spec, resolved), attempts, result, holder = replies[4 * n: 4 * n + 4]
                if spec is None:
                    continue  # its keys expired with their retention
                yield CallRecord(call_id, CallSpec.from_json(spec), seen_at, int(attempts or 0),
                                 Outcome.from_json(result) if result else None, holder, bool(resolved))

    def resolve(self, call_id: str, verdict: Literal["completed", "failed"], note: str, by: str,
                value: Any = None) -> Outcome:
        for _ in range(_TRIES):
            # one round trip: both keys share a slot
            raw_spec, raw = self._pipe(lambda pipe: (pipe.hget(self.key(call_id, "spec"), "json"),
                                                     pipe.get(self.key(call_id, "result"))))
            spec = CallSpec.from_json(raw_spec) if raw_spec else CallSpec(call_id)
            writes = plan_resolve(spec, Outcome.from_json(raw) if raw else None, verdict, note, by, value)
            if self._run("resolve", call_id, raw, "1", *_pack(writes, None, self.retention_s))[0] == 1:
                outcome = writes.reply
                assert isinstance(outcome, Outcome)
                return outcome
        raise RuntimeError(f"the result of {call_id!r} kept changing while it was resolved")

    def settle(self, call_id: str, expected: Outcome, outcome: Outcome, event: Draft) -> bool:
        # lifecycle.plan_settle, planned for the result being ``expected``, which resolve.lua
        # compares as JSON (lifecycle.same_outcome) in the step that writes; in any other state
        # the plan is to write nothing.
        writes = plan_settle(expected, expected, outcome, event)
        return bool(self._run("resolve", call_id, _json(expected), "0", *_pack(writes, None, self.retention_s))[0] == 1)

    def purge(self, before: float) -> int:
        cutoff, purged = ms(before), 0
        for shard in range(self.shards):
            key, offset = f"{self._tags[shard]}:calls", 0
            while True:
                with wrap_errors(self.kind, *ERRORS):
                    listed = self._redis.zrangebyscore(key, "-inf", f"({cutoff}", start=offset, num=_OPS_PAGE,
                                                       withscores=True)
                kept = 0
                for call_id, seen in listed:
                    done = self._purge_one(call_id, int(seen), cutoff)
                    purged += done == "call"
                    kept += done is None
                if len(listed) < _OPS_PAGE:
                    break
                offset += kept
        return purged

    def _purge_one(self, call_id: str, seen: int | None, cutoff: int) -> str | None:
        """Purge one call listed as seen at ``seen`` (ms) by ``lifecycle.plan_purge``, planned
        first for a known, finished call; what it deleted (None: nothing)."""
        known, result = True, cast("Outcome | None", _SOME_RESULT)
        for _ in range(_TRIES):
            what = plan_purge(known, result, seen, cutoff)
            if what is None:
                return None
            reply = self._run("purge", call_id, f"{int(known)}:{int(result is not None)}", seen, what)
            if reply == 1:
                return what
            known, result = reply[0] == 1, _SOME_RESULT if reply[1] == 1 else None
            seen = None if reply[2] is None else int(float(reply[2]))
        raise RuntimeError(f"the state of {call_id!r} kept changing while it was purged")


#: Index entries read per round trip by ``calls()`` and ``purge()``.
_OPS_PAGE = 500
