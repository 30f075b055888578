"""The store interfaces, by job: the only things the guard, recovery, operators, policies
and the engine ask of a backend.

- :class:`CallStore` (10 verbs): a call's lease, attempts, one result and audit trail.
- :class:`Checkpoints` (2): what a tool keeps for its call's next attempt.
- :class:`RecoveryIndex` (3): the calls to bring back, and the right to bring one back.
- :class:`Operations` (4) and :class:`Budgets` (1): operators' verbs and policy counters.
- :class:`Slots` (3): the slots of concurrency keys (``policy.Concurrency``).
- :class:`~.runs.RunRecords` (8) and :class:`~.runs.RunJournal` (6): agent runs.

Each consumer is typed by what it uses of them, never by the whole :class:`Store`:

- :class:`GuardStore`: the guard (``GuardRunner``, its watchdog and lease, reconciliation);
- :class:`RecoveryStore`: the recovery sweep;
- :class:`OperatorStore`: operators (``celery aaa`` commands, ``doctor``, :func:`check_version`);
- :class:`RunStore`: the engine's runs.

:class:`Store` is all of them, with a clock (:class:`Clock`). The decisions live in
:mod:`aaa_celery.lifecycle`; a store reads a call's state and applies them atomically.
Each interface has its own conformance suite (``tests/stores/test_interfaces.py``).
"""

from __future__ import annotations

import abc
import os
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal
from contextlib import contextmanager
from dataclasses import dataclass

from ..config import GuardConfig
from ..errors import StoreOutdated, StoreUnavailable
from ..lifecycle import (BeginResult, CallSpec, Checkpoint, Draft, Event, FinishResult, Lease, Outcome, RecordKind,
                         SlotPlan)
from .runs import RunJournal, RunRecords

if TYPE_CHECKING:
    from .ops import CallRecord


#: Tokens drawn from the OS at once. ``os.urandom`` lets go of the GIL for its system
#: call: once per call, that is one more GIL hand-off per ``begin`` on a threads pool.
_TOKENS_PER_DRAW = 256


class _Tokens(threading.local):
    """This thread's tokens not yet handed out (dropped in a forked child)."""

    def __init__(self) -> None:
        self.left: list[str] = []


_tokens = _Tokens()
os.register_at_fork(after_in_child=lambda: _tokens.left.clear())  # a child never reuses its parent's


def new_token() -> str:
    """A claim's token: 128 random bits from the OS as 32 hex digits (a uuid4's size,
    without building one), drawn :data:`_TOKENS_PER_DRAW` tokens at a time."""
    left = _tokens.left
    if not left:
        digits = os.urandom(16 * _TOKENS_PER_DRAW).hex()
        left.extend(digits[i:i + 32] for i in range(0, len(digits), 32))
    return left.pop()


@dataclass
class ResultCopy:
    """A copy of a call's accepted success for a store to write in the same step, where it
    can: Celery's result of the call, which a Redis store on the result backend's own server
    writes with the result (``SET`` with the backend's expiry, then ``PUBLISH`` on the key),
    saving the worker a round trip. A store that does not write it leaves ``written`` False,
    and the worker writes it itself.

    ``server`` is where the copy goes, as redis-py's connection parameters name it (Celery's
    ``RedisBackend.connparams``: ``host``, ``port`` or ``path``, ``username``, ``password``,
    ``connection_class``, ``db``); None when no store may write it.
    """

    key: str | bytes
    value: str | bytes
    #: Seconds the copy is kept (None: for good).
    ttl_s: int | None
    server: Mapping[str, Any] | None
    #: Set by the store that wrote the copy with the accepted result.
    written: bool = False
    #: The copy as a row of a SQL result backend's table (Celery's database backend), for a
    #: SQL store on the same database; ``key`` and ``value`` are then unused.
    row: ResultRow | None = None


@dataclass(frozen=True)
class ResultRow:
    """Celery's result of a call as a SQL result backend writes it: the row of ``table`` keyed
    by ``task_id``, that a PostgreSQL store on the same ``database`` (``host``, ``port``,
    ``dbname``, ``user``) inserts, or updates unless it holds a SUCCESS, in ``finish``'s own
    transaction.

    ``columns`` are (name, SQL type, value), each value as the backend's driver receives it;
    ``id`` is the primary key's expression, if it is not the column's default (a sequence);
    ``keep`` the columns an update leaves as they are (written when the row is inserted only,
    as django-celery-results' ``date_created``)."""

    database: tuple[str | None, int | None, str | None, str | None]
    table: tuple[str | None, str]
    columns: tuple[tuple[str, str, Any], ...]
    id: tuple[str, str] | None = None
    keep: tuple[str, ...] = ()

    @staticmethod
    def database_of(url: Any) -> tuple[str | None, int | None, str | None, str | None]:
        """The database a SQLAlchemy URL names, as ``database`` compares it: host (or the
        socket directory of a ``host`` query parameter), port (5432 by default), name, user."""
        host = url.host or url.query.get("host")
        return (None if host is None else str(host), url.port or 5432, url.database, url.username)


@dataclass(frozen=True)
class StoreVersion:
    """Which schema (SQL: the Alembic revision; Redis: the format number) a store holds,
    and which one this release runs on.

    ``current`` is None for a store written by 0.1.0, which kept no version, and for a
    store with nothing in it yet (``empty``)."""

    current: str | None
    latest: str
    #: The revisions this release knows, oldest first (a ``current`` outside is newer).
    known: tuple[str, ...] = ()
    empty: bool = False

    @property
    def outdated(self) -> bool:
        """An older store, that ``migrate`` upgrades."""
        return not self.empty and self.current != self.latest and not self.newer

    @property
    def newer(self) -> bool:
        """A store that a later release upgraded: this release must not write to it."""
        return self.current is not None and self.current not in self.known

    def describe(self) -> str:
        if self.empty:
            return f"empty (it starts at {self.latest})"
        current = self.current or "0.1.0 (unversioned)"
        if self.newer:
            return f"{current}, newer than this release's {self.latest}"
        return current if current == self.latest else f"{current}, this release needs {self.latest}"


def check_version(store: OperatorStore, auto_migrate: bool, command: str = "celery -A proj aaa migrate") -> StoreVersion:
    """Refuse a store whose schema is not this release's, naming the way out: ``command``
    for an older one (or, with ``auto_migrate``, upgrade it now, under the store's schema
    lock), a newer release for a newer one."""
    version = store.schema_version()
    if version.newer:
        raise StoreOutdated(
            f"the {store.kind} store is at schema {version.current}, which a newer release of aaa_celery "
            f"wrote; this release runs on {version.latest} and will not write to it: upgrade aaa_celery on "
            "this worker (docs/upgrading.md)",
            current=version.current, latest=version.latest)
    if not version.outdated:
        return version
    if auto_migrate:
        return store.migrate()
    raise StoreOutdated(
        f"the {store.kind} store is at schema {version.describe()}: upgrade it with `{command}` "
        "(docs/upgrading.md), or set aaa_store_auto_migrate=True to let the worker upgrade it at start",
        current=version.current, latest=version.latest)


class Clock(abc.ABC):
    """A store's name and clock."""

    #: A human name for messages ("redis", "postgresql", ...).
    kind: str = "store"

    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock, in seconds."""


class CallStore(Clock):
    """A call's lease, attempts, result and audit trail: the guard's own verbs (the hot
    path is ``begin`` then ``finish``). Every write is planned by :mod:`aaa_celery.lifecycle`.

    ``worker`` arguments are free-form holder names (``hostname/pid``). Times are
    seconds; a store may use its server's clock. ``expires_at`` values are only
    comparable with the same store's ``now()``.
    """

    #: Whether a lease lapses after its TTL (False: bound to a live session).
    ttl_leases: bool = True

    @abc.abstractmethod
    def register(self, call: CallSpec) -> None:
        """Remember a call at publish time, so recovery finds it even if the broker loses it.

        Registering a call that is already known changes nothing.
        """

    def register_many(self, calls: list[CallSpec]) -> None:
        """:meth:`register` each call, in as few round trips as the store can (Redis: one
        pipeline); what ``registered_together`` uses for calls sent in bulk."""
        for call in calls:
            self.register(call)

    @abc.abstractmethod
    def begin(self, call: CallSpec, worker: str, config: GuardConfig, token: str | None = None) -> BeginResult:
        """Claim the call for a new attempt, or say why not.

        ``token`` (default: a new one) names this claim. A ``begin`` retried with the
        token of one whose write landed but whose reply was lost claims that same attempt
        again (never ``Busy``, no attempt wasted): pass the same token to every retry of
        one delivery's ``begin``, and a new one to each delivery.

        On ``Claimed`` the ``aaa.tool.started`` event ``<call>:attempt:<n>`` is
        durable before this returns. On ``Refused`` the failure is recorded as the
        call's one result. The call's ``request`` is stored for recovery.
        """

    @abc.abstractmethod
    def renew(self, lease: Lease) -> bool:
        """Extend the lease by its TTL; False if this lease no longer holds the call."""

    @abc.abstractmethod
    def finish(self, lease: Lease, outcome: Outcome, config: GuardConfig,
               copy: ResultCopy | None = None) -> FinishResult:
        """Record ``outcome`` as the call's result, first writer wins, and free the lease.

        With ``config.fence_results`` a result from an attempt that a newer one
        superseded is kept only as an ``aaa.tool.stale_result`` event. Retrying a
        ``finish`` whose first write landed returns ``Accepted`` and writes nothing.

        ``copy`` (a success only): a write to make with the accepted result in the same step,
        if this store can (it then sets ``copy.written``); any store may ignore it. Callers
        pass it only when it is there, so a store written for 0.1 keeps its signature.
        """

    @abc.abstractmethod
    def release(self, lease: Lease) -> None:
        """Give the lease back without a result (the attempt counts as lost)."""

    @abc.abstractmethod
    def hand_on(self, lease: Lease) -> None:
        """End ``lease``'s attempt without a result, handing the call on to its next
        delivery (a retry the body asked for): the lease is freed and ``aaa.tool.retried``
        recorded; the next delivery claims the next attempt, under at_most_once too
        (the attempt was not lost), and it does not count toward ``max_attempts``."""

    @abc.abstractmethod
    def fenced(self, lease: Lease, cause: str | None = None) -> None:
        """Record ``aaa.tool.fenced`` for an attempt that lost its lease and was cancelled;
        ``cause`` (``errors.STORE_UNREACHABLE``, ...) is kept with it, and a refusal of the
        call after that attempt names it (``lifecycle.CallState.lost_cause``)."""

    @abc.abstractmethod
    def record(self, call: CallSpec, outcome: Outcome, kind: RecordKind = "first") -> bool:
        """Record ``outcome`` as the call's one result from outside an attempt, with its
        result event, atomically, if :func:`~aaa_celery.lifecycle.plan_record` allows it for
        ``kind`` (``first``: the call has no result; ``fenced``: nor an attempt later than
        ``outcome.attempt``; ``abandon``: a known call, no live lease, exactly
        ``outcome.attempt`` attempts). The result frees the call's lease, whoever holds it.
        ``call`` is registered first (``first`` and ``fenced``; as :meth:`register`), so its
        events carry its name. True if recorded; False, writing no outcome, if not.
        """

    @abc.abstractmethod
    def events(self, call_id: str) -> list[Event]:
        """The call's audit trail, oldest first."""

    @abc.abstractmethod
    def result(self, call_id: str) -> Outcome | None:
        """The call's recorded result, if it has one."""


class Checkpoints(abc.ABC):
    """What a tool saves for the next attempt of its call (``ctx.checkpoint``)."""

    @abc.abstractmethod
    def save_checkpoint(self, lease: Lease, checkpoint: str) -> bool:
        """Keep ``checkpoint`` (``lifecycle.checkpoint_json``) as the call's last checkpoint
        if ``lease`` still holds the call; True if kept. It outlives the attempt, for the
        next one to read, and is dropped with the call's record."""

    @abc.abstractmethod
    def last_checkpoint(self, call_id: str) -> Checkpoint | None:
        """The call's last checkpoint, if any attempt saved one."""


class RecoveryIndex(abc.ABC):
    """The calls to bring back, and the right to bring each back once (the recovery sweep)."""

    @abc.abstractmethod
    def expired(self, now: float | None = None, unclaimed_grace_s: float = 60.0) -> list[CallSpec]:
        """Calls to bring back: running without a result whose lease lapsed, and
        calls registered more than ``unclaimed_grace_s`` ago that were never claimed."""

    @abc.abstractmethod
    def claim_recovery(self, call_id: str, worker: str, hold_s: float, max_hold_s: float | None = None) -> int:
        """Take the right to republish a call, with backoff.

        Returns *n* ≥ 1, this being the call's *n*-th republish since it was last claimed,
        to exactly one caller per hold; the *n*-th holds the call for
        ``hold_s * 2**(n-1)`` seconds, at most ``max_hold_s``. Returns 0 when the call is
        unknown, has a result, is held by a live lease (checked atomically with the claim,
        so a call that a worker has just claimed is never republished) or by an earlier
        republish. A claim (``begin``) ends the hold and restarts the count.
        """

    @abc.abstractmethod
    def abandon(self, call: CallSpec, outcome: Outcome) -> bool:
        """Record ``outcome`` (a failure) as the result of a call that recovery gives up on,
        only if the call is known, has no result and no live lease, and has exactly
        ``outcome.attempt`` attempts; True if recorded (a store: ``record(..., "abandon")``)."""


class Operations:
    """The operators' verbs (:mod:`.ops`; the ``celery aaa`` commands), and the
    reconciliation's compare-and-set. Optional: a store without them refuses each."""

    def calls(self, since: float | None = None, until: float | None = None) -> Iterator[CallRecord]:
        """The calls first seen between ``since`` and ``until`` (store clock, None: open),
        newest first, read through the store's index of calls by time (never a key scan)."""
        raise NotImplementedError(f"{type(self).__name__} has no index of calls")

    def resolve(self, call_id: str, verdict: Literal["completed", "failed"], note: str, by: str,
                value: Any = None) -> Outcome:
        """Settle a call in doubt (``OutcomeUnknown`` / ``ExecutionAbandoned``) as an operator's
        ``verdict``, atomically, with an ``aaa.tool.resolved`` event; returns the new result.
        Raises :class:`~aaa_celery.errors.NotResolvable` for any other call."""
        raise NotImplementedError(f"{type(self).__name__} cannot resolve calls")

    def settle(self, call_id: str, expected: Outcome, outcome: Outcome, event: Draft) -> bool:
        """If the call's result is ``expected``, make it ``outcome`` and append ``event``, atomically;
        False (nothing written) if the result is another. ``outcome`` may be ``expected`` (an
        audit only). The guard's reconciliation settles an ``OutcomeUnknown`` with it."""
        raise NotImplementedError(f"{type(self).__name__} cannot settle calls")

    def purge(self, before: float) -> int:
        """Delete the calls with a result first seen before ``before`` (store clock), with
        everything kept of them (events, result, checkpoint, recovery count); returns how
        many. Calls without a result are kept."""
        raise NotImplementedError(f"{type(self).__name__} cannot purge calls")


class Budgets:
    """Counters for ``GuardPolicy``'s ``Budget`` and ``RateLimit`` rules (:mod:`.budgets`).
    Optional: a store without them refuses each spend."""

    def spend(self, key: str, token: str, amount: float, limit: float, window_s: float) -> bool:
        """Atomically count ``amount`` against budget ``key`` in the current window of
        ``window_s`` seconds, if the window's total stays within ``limit``; True if counted.

        A ``token`` (the call id) counts once per window: spending again with it answers
        True and adds nothing. Windows are fixed, aligned to the store clock's epoch.
        Raises ``ValueError`` for a negative or non-finite amount or limit.
        """
        raise NotImplementedError(f"{type(self).__name__} keeps no budgets")


class Slots:
    """The slots of ``policy.Concurrency`` keys: which calls hold one, decided by
    :func:`~aaa_celery.lifecycle.plan_slot`. Optional: a store without them refuses each take."""

    def take_slot(self, key: str, call_id: str, limit: int, ttl_s: float) -> SlotPlan:
        """Take one of ``limit`` slots of ``key`` for ``call_id`` (or renew the one it holds),
        atomically, as :func:`~aaa_celery.lifecycle.plan_slot` plans at the store's clock;
        returns the plan applied (``reply``: ``taken``, ``held`` or ``full``)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no concurrency slots")

    def free_slot(self, key: str, call_id: str) -> None:
        """Free the slot of ``key`` that ``call_id`` holds, if it holds one."""
        raise NotImplementedError(f"{type(self).__name__} keeps no concurrency slots")

    def slot_holders(self, key: str) -> list[str]:
        """The calls that hold a live slot of ``key``, by id (operators, tests)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no concurrency slots")


class SchemaVersions:
    """Which schema a store holds, and its upgrade (docs/upgrading.md): the operator's
    ``aaa migrate`` and the check at worker start (:func:`check_version`)."""

    def schema_version(self) -> StoreVersion:
        """The store's schema version, and this release's (a store that keeps nothing
        across processes, as the memory store, is always current)."""
        return StoreVersion("1", "1", ("1",))

    def migrate(self) -> StoreVersion:
        """Upgrade the store to this release's schema, under the store's schema lock (a
        no-op on a current one); returns the version it is at now. Raises StoreOutdated
        for a store a newer release wrote."""
        return self.schema_version()


# -- The interfaces by consumer: what each one uses, and no verb of their own ----------------


class GuardStore(CallStore, Checkpoints, Operations, Slots):
    """What the guard uses: a call's lease, attempts, result and audit trail, its checkpoints,
    the reconciliation's ``settle`` (:mod:`aaa_celery.guard`), its concurrency slots, and the
    store's clock."""


class RecoveryStore(RecoveryIndex, CallStore):
    """What the recovery sweep uses: the calls to bring back and the right to bring each back,
    and a call's registration and audit trail (:mod:`aaa_celery.worker.recovery`)."""


class OperatorStore(Clock, Operations, SchemaVersions):
    """What operators use: the ``celery aaa`` commands, ``doctor`` and the schema check at
    start (:func:`check_version`)."""


class RunStore(RunRecords, RunJournal, CallStore):
    """What the engine's runs use: their records and journal, and their calls' results and
    audit trails (:mod:`aaa_celery.runtime`)."""


class Store(GuardStore, RecoveryStore, OperatorStore, RunStore, Budgets):
    """A backend: every interface above, the records of agent runs (:mod:`.runs`), its
    clock and its connections. Each interface has its own conformance suite in
    ``tests/stores`` (``tests/stores/test_interfaces.py`` names them)."""

    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock, in seconds."""

    def abandon(self, call: CallSpec, outcome: Outcome) -> bool:
        return self.record(call, outcome, "abandon")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free connections."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextmanager
def wrap_errors(kind: str, *errors: type[BaseException]) -> Iterator[None]:
    """Turn a driver's connection errors into StoreUnavailable, keeping the cause."""
    try:
        yield
    except errors as e:
        raise StoreUnavailable(f"{kind} store unavailable: {e}") from e
