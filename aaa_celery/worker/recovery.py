"""Recovery: bring back calls whose holder died or whose message was lost, without floods.

Over Redis, kombu redelivers an unacked message only after ``visibility_timeout``
(one hour by default), and a message popped by a worker that then dies frozen
can be lost outright. The store knows every call that was published or started,
so a sweep in every worker republishes, under the same task id, the calls that
need it, and only those:

* A call whose lease **lapsed** without a result (its holder died): republished at
  once, unless a copy of its message already waits in a queue. After the sweep could not
  reach the store, a lapsed lease is left alone for its task's ``lease_ttl_s`` from the
  sweep's first reach of the store again: a holder that was cut off too records why it gave
  up (``store_unreachable``) before a republished attempt is refused, so the refusal names
  the store, not a lost worker, whichever worker reaches the store first.
* A call **registered but never claimed**: over the Redis broker the sweep looks for
  its message (:mod:`.broker`). One still queued is left alone (a healthy backlog costs
  nothing); one the broker has nowhere, at two looks ``aaa_lost_check_s`` apart once the
  call is ``aaa_lost_after_s`` old, is republished (a lost message comes back in about a
  minute); one a worker took but has not started, or any unclaimed call on another
  broker, is republished once it is ``aaa_unclaimed_grace_s`` old.

Each republish is claimed in the store (:meth:`~aaa_celery.stores.Store.claim_recovery`),
atomically with a check that the call still has no result and no live lease, so one
worker republishes it, once per hold, and never a call another worker just claimed.
The holds back off: the first republish holds the call for twice its base wait, each
next one twice as long, up to ``aaa_recovery_max_hold_s``. A claim of the call ends the
hold and the count. After ``aaa_recovery_max_tries`` republishes that no worker claimed
(an unknown task name, a queue nobody consumes, a message lost again and again), the
call ends failed with ``ExecutionAbandoned`` naming why, instead of being republished
forever. A republished delivery goes through ``begin`` like any other: it becomes
attempt *n+1*, or ``OutcomeUnknown`` / ``ExecutionAbandoned``.

The sweeper uses the very store the workers use (``aaa_store_url`` with
``aaa_store_options``, or the store pinned by ``use_store``), so it reads the keys
the workers write whatever their ``key_prefix`` and ``shards``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from celery import Celery

from ..errors import ConfigError, StoreError, StoreUnavailable
from ..lifecycle import STARTED, CallSpec, Outcome
from ..stores.base import RecoveryStore
from .broker import ABSENT, QUEUED, TAKEN, RedisBrokerProbe
from .calls import aaa_headers, with_message
from .clock import guarded_tasks, longest_lease_s
from .codec import CODEC
from .publish import as_sent, expires_at, not_before, republish
from .setting_names import spelled
from .stores import app_store

log = logging.getLogger("aaa_celery.recovery")

DEFAULT_INTERVAL_S = 2.0
DEFAULT_UNCLAIMED_GRACE_S = 300.0
#: The base wait between republishes of a call whose lease lapsed: a claim of the
#: republished call ends the hold, so a second crash right after a takeover is
#: recovered at the next sweep; the hold only matters when the copy is lost.
DEFAULT_HOLD_S = 10.0
DEFAULT_LOST_AFTER_S = 20.0
DEFAULT_LOST_CHECK_S = 5.0
DEFAULT_MAX_HOLD_S = 1800.0
DEFAULT_MAX_TRIES = 5
#: ``expired``'s grace that no registered call reaches: lists the lapsed calls only.
_NEVER = 1e12


@dataclass
class StoreOutage:
    """Whether a sweeper's last sweep could not reach the store, and when (monotonic) a sweep
    reached it again after it could not; the sweeper keeps it across the :class:`Recovery`
    objects it builds (one is rebuilt after a broker error)."""

    lost: bool = False
    regained_at: float = -math.inf


@dataclass(frozen=True)
class RecoverySettings:
    """The sweep's settings, from the app's ``aaa_*`` configuration (seconds)."""

    #: ``aaa_recovery_interval_s``: seconds between sweeps.
    interval_s: float = DEFAULT_INTERVAL_S
    #: ``aaa_unclaimed_grace_s``: age of a never-claimed call that may still be waiting
    #: (taken by a worker, or on a broker that cannot be looked into) before it is republished.
    grace_s: float = DEFAULT_UNCLAIMED_GRACE_S
    #: ``aaa_recovery_hold_s``: base wait between republishes of a lapsed call.
    hold_s: float = DEFAULT_HOLD_S
    #: ``aaa_lost_after_s``: age from which a never-claimed call's message is looked for
    #: in a Redis broker (it is republished when found nowhere twice).
    lost_after_s: float = DEFAULT_LOST_AFTER_S
    #: ``aaa_lost_check_s``: seconds between those looks.
    lost_check_s: float = DEFAULT_LOST_CHECK_S
    #: ``aaa_recovery_max_hold_s``: the longest hold between two republishes.
    max_hold_s: float = DEFAULT_MAX_HOLD_S
    #: ``aaa_recovery_max_tries``: republishes without a claim before the call ends failed.
    max_tries: int = DEFAULT_MAX_TRIES

    @classmethod
    def of(cls, app: Celery) -> RecoverySettings:
        conf = app.conf

        def get(name: str, default: float) -> float:
            value = conf.get(name)
            if value is None:
                return default
            try:
                return float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{spelled(app, name)}: {value!r} is not a number (seconds, or a count)") from None

        return cls(
            interval_s=get("aaa_recovery_interval_s", DEFAULT_INTERVAL_S),
            grace_s=get("aaa_unclaimed_grace_s", DEFAULT_UNCLAIMED_GRACE_S),
            hold_s=get("aaa_recovery_hold_s", DEFAULT_HOLD_S),
            lost_after_s=get("aaa_lost_after_s", DEFAULT_LOST_AFTER_S),
            lost_check_s=get("aaa_lost_check_s", DEFAULT_LOST_CHECK_S),
            max_hold_s=get("aaa_recovery_max_hold_s", DEFAULT_MAX_HOLD_S),
            max_tries=int(get("aaa_recovery_max_tries", DEFAULT_MAX_TRIES)),
        )


def due(message: dict[str, Any], grace_s: float, now: float | None = None) -> bool:
    """Whether Celery itself would run this message now: never before its ``eta`` (plus the
    grace that a healthy worker has to take it), never once it ``expires``."""
    now = time.time() if now is None else now
    eta = not_before(message)
    if eta is not None and now < eta + grace_s:
        return False
    expires = expires_at(message)
    return expires is None or now < expires


def queues_of(call: CallSpec) -> list[str]:
    """The queues a call's message goes to, as sent (or as its worker received it)."""
    request = call.request
    message = request.get("message") or {}
    names = list(message.get("queues") or ())
    if not names and message.get("routing_key") and not message.get("exchange"):
        names.append(message["routing_key"])  # the default exchange routes by queue name
    if request.get("queue"):
        names.append(request["queue"])
    return names


class Recovery:
    """One worker's recovery: :meth:`sweep` republishes what needs it (see the module doc).

    Args:
        app: the Celery app (settings, producer, task registry).
        store: the store the workers use.
        worker: this sweeper's name, recorded with its republish claims.
        producer: a kombu producer of the caller's own; else one of the app's pool.
        probe: looks for messages in a Redis broker; None for other brokers.
    """

    def __init__(self, app: Celery, store: RecoveryStore, worker: str, producer: Any = None,
                 probe: RedisBrokerProbe | None = None, outage: StoreOutage | None = None) -> None:
        self.app, self.store, self.worker = app, store, worker
        self.producer, self.probe = producer, probe
        self.outage = outage if outage is not None else StoreOutage()
        self.settings = RecoverySettings.of(app)
        #: call id -> when (monotonic) a look first found its message nowhere
        self._absent: dict[str, float] = {}
        self._looked = -math.inf
        #: calls this sweeper registered from a worker's unacked message (bounded)
        self._adopted: dict[str, None] = {}
        #: How many calls this sweeper ended as abandoned (for tests and operators).
        self.abandoned = 0

    def _left_to_holder(self, call: CallSpec) -> bool:
        """Whether ``call``'s lapsed lease is still left to its holder after an outage: for
        its task's ``lease_ttl_s`` (the longest of the app's, for a task unknown here)."""
        since = time.monotonic() - self.outage.regained_at
        if since == math.inf:
            return False
        config = getattr(self.app.tasks.get(call.request.get("task") or call.name), "guard_config", None)
        return since < (config.lease_ttl_s if config is not None else longest_lease_s(guarded_tasks(self.app)))

    def sweep(self) -> list[str]:
        """One sweep; returns the ids of the calls it republished or ended."""
        s, probe = self.settings, self.probe
        lapsed = self.store.expired(unclaimed_grace_s=_NEVER)
        lapsed_ids = {c.call_id for c in lapsed}
        if self.outage.lost:  # it answers again
            self.outage.lost, self.outage.regained_at = False, time.monotonic()
        # Never-claimed calls: over a Redis broker, looked for every lost_check_s from
        # lost_after_s on; over other brokers, every sweep from the grace on.
        look = probe is not None and time.monotonic() - self._looked >= s.lost_check_s
        waiting: list[CallSpec] = []
        if probe is None or look:
            grace = s.lost_after_s if look else s.grace_s
            waiting = [c for c in self.store.expired(unclaimed_grace_s=grace) if c.call_id not in lapsed_ids]
        where: dict[str, int] = {}
        if probe is not None and (lapsed or waiting):
            candidates = lapsed + waiting
            queues = {q for c in candidates for q in queues_of(c)} | set(self.app.amqp.queues)
            where = probe.find([c.call_id for c in candidates], queues)
        if look:
            self._adopt_orphans()
            self._looked = time.monotonic()
            self._absent = {k: v for k, v in self._absent.items() if k in {c.call_id for c in waiting}}
        sent = []
        for call in lapsed:
            # unless a copy of it waits in a queue already, or its holder may yet say why it gave up
            if where.get(call.call_id) != QUEUED and not self._left_to_holder(call):
                sent += self._bring_back(call, s.hold_s, "its lease lapsed", where.get(call.call_id))
        old: set[str] | None = None if look else {c.call_id for c in waiting}
        for call in waiting:
            found = where.get(call.call_id)
            if found == QUEUED:  # a healthy backlog: it will be delivered
                self._absent.pop(call.call_id, None)
            elif found == ABSENT:  # lost, if a later look finds it nowhere again
                if call.call_id not in self._absent:
                    self._absent[call.call_id] = time.monotonic()
                else:
                    del self._absent[call.call_id]
                    sent += self._bring_back(call, s.lost_after_s, "the broker lost its message", found)
            else:  # taken but not started, or the broker cannot tell: wait for the grace
                self._absent.pop(call.call_id, None)
                if old is None:
                    old = {c.call_id for c in self.store.expired(unclaimed_grace_s=s.grace_s)}
                if call.call_id in old:
                    sent += self._bring_back(call, s.grace_s, "nobody claimed it", found)
        if sent:
            log.info("aaa recovery brought back %d call(s): %s", len(sent), ", ".join(sent[:10]))
        return sent

    def _adopt_orphans(self) -> None:
        """Register the calls of guarded tasks whose message a worker took more than
        ``aaa_lost_after_s`` ago and never acked, and which the store never heard of (a
        publish while the store was down is sent but not registered; if the worker that
        took it then dies, the message waits in kombu's ``unacked`` for the visibility
        timeout, an hour by default). Registered, each is recovered like any unclaimed
        call that a worker took: republished once it is ``aaa_unclaimed_grace_s`` old.
        Registering a known call changes nothing."""
        assert self.probe is not None
        for message, exchange, routing_key in self.probe.taken_before(time.time() - self.settings.lost_after_s):
            headers = message.get("headers")
            call_id, name = (headers.get("id"), headers.get("task")) if isinstance(headers, dict) else (None, None)
            if not isinstance(call_id, str) or not isinstance(name, str):
                continue  # not a message of ours: its headers are whatever its sender wrote
            task = self.app.tasks.get(name)
            spec_of = getattr(task, "call_spec", None)
            config = getattr(task, "guard_config", None)
            if not call_id or call_id in self._adopted or spec_of is None or not getattr(config, "enabled", False):
                continue
            queues = [routing_key] if routing_key in self.app.amqp.queues else []
            sent = as_sent(message, exchange, routing_key, queues)
            if sent is None:
                continue
            args, kwargs, _ = sent["body"]
            if not isinstance(args, list | None) or not isinstance(kwargs, dict | None):
                continue
            spec = spec_of(call_id, list(args or ()), dict(kwargs or {}), routing_key, aaa_headers(headers))
            self.store.register(with_message(spec, sent))
            self._adopted[call_id] = None
            if len(self._adopted) > 10_000:
                self._adopted.pop(next(iter(self._adopted)))

    def _bring_back(self, call: CallSpec, base_s: float, why: str, found: int | None) -> list[str]:
        """Republish ``call`` if this worker wins its republish claim; end it failed once it
        was republished ``max_tries`` times without a claim, unless the broker shows that a
        worker holds its message (``found``: where the probe saw it; None: not looked)."""
        s, request = self.settings, call.request
        message = request.get("message")
        if not request.get("task") or (message is not None and not due(message, base_s)):
            return []
        tries = self.store.claim_recovery(call.call_id, self.worker, 2 * base_s, s.max_hold_s)
        if not tries:
            return []
        if tries > s.max_tries:
            if found == TAKEN:  # a worker holds a copy (prefetched, or a dead holder's until kombu restores it)
                return []
            return [call.call_id] if self._abandon(call, tries - 1) else []
        if message is not None:
            with self.app.producer_or_acquire(self.producer) as p:
                republish(self.app, p, message)
        else:  # registered by a worker from its request (the message was sent without the guard)
            options: dict[str, Any] = {"task_id": call.call_id, "headers": request.get("headers") or {}}
            if request.get("queue"):
                options["queue"] = request["queue"]
            self.app.send_task(request["task"], args=CODEC.decode(request.get("args")) or [],
                               kwargs=CODEC.decode(request.get("kwargs")) or {}, producer=self.producer, **options)
        log.debug("aaa recovery republished %s (try %d: %s)", call.call_id, tries, why)
        return [call.call_id]

    def _abandon(self, call: CallSpec, tries: int) -> bool:
        task = call.request.get("task") or call.name
        attempts = max((e.attempt for e in self.store.events(call.call_id) if e.type == STARTED), default=0)
        queues = ", ".join(repr(q) for q in queues_of(call)) or "its queue"
        unknown = "" if task in self.app.tasks else f"; task {task!r} is not registered on this worker"
        reason = (f"recovery gave up on {call.call_id}: republished {tries} times after "
                  f"{'attempt ' + str(attempts) if attempts else 'registration'} and no worker claimed it "
                  f"(is task {task!r} registered on a worker that consumes {queues}?){unknown}")
        if not self.store.abandon(call, Outcome.failure("ExecutionAbandoned", reason, attempts)):
            return False
        self.abandoned += 1
        log.warning("aaa %s", reason)
        return True


class Sweeper:
    """Runs :class:`Recovery` every ``interval_s`` in a daemon thread of its own.

    The thread has its own broker connection (and broker probe), so a sweep never
    blocks the worker's event loop, and nothing the event loop does (a consumer
    restart, a timer entry dropped) can stop the sweeps. It uses the app's store, the
    one the workers use. An error in one sweep is logged and the broker connection is
    opened again for the next one.
    """

    def __init__(self, app: Celery, name: str, interval_s: float) -> None:
        self.app, self.name, self.interval_s = app, name, interval_s
        self.sweeps = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._recovery: Recovery | None = None
        self._conn: Any = None
        self._outage = StoreOutage()

    def start(self) -> Sweeper:
        self._thread = threading.Thread(target=self._loop, name="aaa-recovery", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval_s):
                self.sweep_once()
        finally:
            self._close()

    def sweep_once(self) -> list[str]:
        """One sweep; never raises (a failed sweep is logged and retried next period)."""
        try:
            if self._recovery is None:
                self._conn = self.app.connection_for_write()
                producer = self.app.amqp.Producer(self._conn)
                self._recovery = Recovery(self.app, app_store(self.app), self.name, producer,
                                          RedisBrokerProbe.for_app(self.app), self._outage)
            sent = self._recovery.sweep()
            self.sweeps += 1
            return sent
        except StoreError as e:
            log.warning("aaa recovery sweep skipped: %s", e)
            if isinstance(e, StoreUnavailable):  # once it answers, a lapsed lease waits one lease
                self._outage.lost = True
        except Exception:  # noqa: BLE001 - a sweep must never end the sweeper
            log.exception("aaa recovery sweep failed")
            self._close()
        return []

    def _close(self) -> None:
        recovery, self._recovery = self._recovery, None
        conn, self._conn = self._conn, None
        if recovery is not None and recovery.probe is not None:
            with contextlib.suppress(Exception):
                recovery.probe.close()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.release()
