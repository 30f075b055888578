"""The invariant checker: the store's audit trail plus the effect ledger, call by call.

``check_history(store, ledger, calls)`` returns every :class:`Violation` of:

* **I1** Every call sent reaches exactly one recorded result: completed, failed,
  ``OutcomeUnknown`` or ``ExecutionAbandoned``. Nothing is lost, nothing has two
  results (and no attempt starts after the result).
* **I2** No two body executions of one call overlap in time while both hold a
  valid lease. The ledger shows when a body really ran (its ``tick`` entries).
  With ``on_lost_lease=cancel``, once a later execution has started, an earlier
  one may go on only for the window the guide allows a stalled worker: until its
  next heartbeat, so ``heartbeat_s`` plus ``slack_s`` from the moment it next
  runs. With ``on_lost_lease=finish`` the earlier one may run to its end, but
  only if its lease could have lapsed: it must have been silent (frozen) for at
  least ``lease_ttl_s - heartbeat_s - slack_s`` just before the later one started.
  On a session store (PostgreSQL) a lease also ends, with no silence first, when a
  fault ends its holder's session (``pg_kill``): given as a :class:`LeaseEnd`, such
  an overlap is still reported, marked ``outside`` the guarantee, and :func:`excuse`
  counts it apart.
* **I3** ``at_most_once``: at most one body start per call (and one attempt record).
* **I4** ``at_least_once``: at most ``max_attempts`` body starts; attempt numbers
  are contiguous from 1, each body run has its attempt record, and no attempt
  runs twice.
* **I5** A result from a superseded attempt appears only as ``stale_result``:
  the recorded result comes from the newest attempt started before it.
* **I6** For calls whose tool passes ``ctx.idempotency_key`` to the ledger's effect
  table, a completed call's effect is applied exactly once.
* **I7** A completed call's recorded result equals the value that the attempt
  which wrote it returned (the ledger's ``end`` entry of that attempt). A call an
  operator resolved (``aaa.tool.resolved``) has the operator's result instead: I1 and I7
  take it as given.
* **I8** No ``OutcomeUnknown`` or ``ExecutionAbandoned``, and no second body start,
  without a lost attempt. An attempt is lost when a fault killed its holder, froze it
  past its lease, or cut it off from the store (a :class:`Loss`: which processes, and
  when). A worker whose clock is wrong, a duplicate delivery or a slow call loses
  nothing, so such a call must run its body once and complete. Checked only when the
  caller passes ``losses`` (the chaos workload knows what its faults did).
* **I9** At most ``slot_limit`` calls with one concurrency key (``Call.slot``:
  ``policy.Concurrency``) run their bodies at once. When a body starts, every body of
  another call with its key that runs on beyond the stalled-worker window of I2 (a holder
  frozen past its lease may run until its next heartbeat once it wakes) counts as running.

Some faults are outside the guarantee (docs/guarantees.md says so): a Redis failover without
AOF can lose a write that the old primary acknowledged. :func:`excuse` moves the
violations of the calls such a fault touched into :class:`DocumentedException` records,
which a report counts apart, next to the reason; they are never dropped silently. It
also moves the violations the checker itself marked ``outside`` (the I2 overlap of an
``on_lost_lease=finish`` call whose lease a :class:`LeaseEnd` ended), and only those.

With ``store=None`` the checker works from the ledger alone (the plain-Celery
baseline, which has no store): a call's results are its bodies' ``end`` entries,
executions are numbered in start order, any overlap counts for I2, and I5/I7,
which need the audit trail, are not checked.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from ..lifecycle import COMPLETED, FAILED, FENCED, RESOLVED, STALE_RESULT, STARTED, Event, Outcome
from .ledger import EFFECT, END, START, BaseEffectLedger

INVARIANTS = ("I1", "I2", "I3", "I4", "I5", "I6", "I7", "I8", "I9")
#: The in-doubt results, which only a lost attempt may cause (I8).
IN_DOUBT = ("OutcomeUnknown", "ExecutionAbandoned")
LEDGER_ONLY = ("I1", "I2", "I3", "I4", "I6", "I9")


@dataclass(frozen=True)
class Violation:
    invariant: str
    call_id: str
    message: str
    #: Why this violation is outside the guarantee (a named fault), or "" when it counts.
    #: Set by the checker only for a case the guarantee documents; :func:`excuse` counts
    #: such a violation apart.
    outside: str = ""

    def __str__(self) -> str:
        return f"{self.invariant} {self.call_id}: {self.message}"


@dataclass(frozen=True)
class DocumentedException:
    """A violation the guarantee does not cover, with the documented reason."""

    violation: Violation
    reason: str

    def __str__(self) -> str:
        return f"{self.violation} [documented exception: {self.reason}]"


def excuse(violations: Iterable[Violation],
           excused: dict[str, str] | None = None) -> tuple[list[Violation], list[DocumentedException]]:
    """Split ``violations`` into those that count and the documented exceptions: the
    violations of the calls in ``excused`` (call id -> the documented reason, e.g. the
    fault outside the guarantee that touched the call), and those the checker marked
    ``outside`` the guarantee (with their own reason)."""
    excused = excused or {}
    kept: list[Violation] = []
    exceptions: list[DocumentedException] = []
    for v in violations:
        if v.call_id in excused:
            exceptions.append(DocumentedException(v, excused[v.call_id]))
        elif v.outside:
            exceptions.append(DocumentedException(v, v.outside))
        else:
            kept.append(v)
    return kept, exceptions


@dataclass(frozen=True)
class LeaseEnd:
    """A fault that ended an attempt's lease at a known moment, with no silence first.

    On a session store (PostgreSQL) the lease is the holder session's advisory lock: a
    terminated backend (``pg_kill``) frees it at once, and the next delivery may start
    the next attempt. Under ``on_lost_lease=finish`` the holder's body then runs to its
    end, as documented (its result is fenced as ``stale_result``)."""

    call_id: str
    #: The attempt whose lease the fault ended.
    attempt: int
    #: When, on the ledger's clock (epoch seconds), no later than the fault itself.
    at: float
    #: The fault, named, for the documented exception.
    reason: str


@dataclass(frozen=True)
class PathCut:
    """A fault that cut (or slowed past its renewal budget) one worker's path to the store,
    from ``start`` to ``end`` (the ledger's clock, epoch seconds).

    A body running on that worker (its pid in ``pids``: the main process and its pool
    children) while the path was cut cannot renew its lease, so the lease runs out with no
    silence first, as a killed session's does. Under ``on_lost_lease=finish`` the body then
    runs to its end, as documented, while the next attempt may start: :meth:`lease_ends`
    names those leases for the checker."""

    pids: frozenset[int]
    start: float
    end: float
    reason: str

    def lease_ends(self, runs: dict[str, list[Execution]]) -> list[LeaseEnd]:
        """A :class:`LeaseEnd` for each attempt whose body ran on the cut worker during the cut."""
        return [LeaseEnd(run.call_id, run.attempt, max(self.start, run.first_at), self.reason)
                for call_runs in runs.values() for run in call_runs
                if run.attempt is not None and run.pid in self.pids
                and run.first_at <= self.end and run.last_at >= self.start]


@dataclass(frozen=True)
class Loss:
    """A fault that lost the attempts it struck (I8): their holder killed, frozen past its
    lease, or cut off from the store, from ``start`` to ``end`` (the ledger's clock, epoch
    seconds). ``pids``: the processes it struck (a worker's main process and its pool
    children); ``None`` for a fault of the store itself, which strikes every worker."""

    start: float
    end: float
    reason: str
    pids: frozenset[int] | None = None

    def struck(self, run: Execution, slack_s: float) -> bool:
        """Whether ``run`` was running where and when this fault struck."""
        return ((self.pids is None or run.pid in self.pids)
                and run.first_at <= self.end + slack_s and run.last_at >= self.start - slack_s)

    def near(self, at: float, ttl_s: float, slack_s: float) -> bool:
        """Whether an attempt claimed at ``at`` (the store's clock) with no body in the
        ledger could have been lost to this fault: it struck within a lease of the claim."""
        return self.start - ttl_s - slack_s <= at <= self.end + slack_s


@dataclass(frozen=True)
class Call:
    """One call the workload sent: what the checker must know about its tool."""

    call_id: str
    delivery: str = "at_least_once"
    max_attempts: int = 3
    keyed: bool = False
    on_lost_lease: str = "cancel"
    task: str = ""
    duration_s: float = 0.0
    sent_at: float = 0.0
    #: The call's concurrency key (any label the workload gives it), "" for none; I9.
    slot: str = ""
    #: How many calls with that key may run at once.
    slot_limit: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class AuditTrail(Protocol):
    def events(self, call_id: str) -> list[Event]: ...

    def result(self, call_id: str) -> Outcome | None: ...


class RecordedStore:
    """A store's audit trail as plain data (crafted histories, or a saved report)."""

    def __init__(self, events: dict[str, list[Event]] | None = None,
                 results: dict[str, Outcome] | None = None) -> None:
        self._events = {k: list(v) for k, v in (events or {}).items()}
        self._results = dict(results or {})

    def events(self, call_id: str) -> list[Event]:
        return list(self._events.get(call_id, []))

    def result(self, call_id: str) -> Outcome | None:
        return self._results.get(call_id)

    @classmethod
    def snapshot(cls, store: AuditTrail, call_ids: Iterable[str]) -> RecordedStore:
        ids = list(call_ids)
        results = {c: r for c in ids if (r := store.result(c)) is not None}
        return cls({c: store.events(c) for c in ids}, results)


@dataclass
class Execution:
    """One body run, from the ledger."""

    exec_id: str
    call_id: str
    attempt: int | None
    pid: int | None
    host: str | None
    start_at: float | None = None
    points: list[float] = field(default_factory=list)
    ended: bool = False
    value: Any = None
    end_at: float | None = None

    @property
    def first_at(self) -> float:
        return self.start_at if self.start_at is not None else min(self.points)

    @property
    def last_at(self) -> float:
        return max(self.points)


def executions(entries: Sequence[dict[str, Any]]) -> dict[str, list[Execution]]:
    """The ledger's body runs, grouped by call, each call's in start order."""
    runs: dict[str, Execution] = {}
    for e in entries:
        ex = runs.get(e["exec"])
        if ex is None:
            ex = runs[e["exec"]] = Execution(e["exec"], e["call_id"], e.get("attempt"), e.get("pid"), e.get("host"))
        ex.points.append(float(e["at"]))
        if e["kind"] == START:
            ex.start_at = float(e["at"])
        elif e["kind"] == END:
            ex.ended, ex.value, ex.end_at = True, e.get("value"), float(e["at"])
    by_call: dict[str, list[Execution]] = defaultdict(list)
    for ex in runs.values():
        by_call[ex.call_id].append(ex)
    for runs_of_call in by_call.values():
        runs_of_call.sort(key=lambda x: x.first_at)
    return by_call


def _norm(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def check_history(
    store: AuditTrail | None,
    ledger: BaseEffectLedger | Sequence[dict[str, Any]],
    calls: Iterable[Call | str],
    *,
    heartbeat_s: float = 5.0,
    slack_s: float = 1.0,
    lease_ttl_s: float | None = None,
    lease_ends: Iterable[LeaseEnd] = (),
    losses: Iterable[Loss] | None = None,
) -> list[Violation]:
    """Every violation of I1..I7 in the history of ``calls``.

    ``ledger`` is a :class:`~aaa_celery.testing.ledger.BaseEffectLedger` or its entries.
    ``heartbeat_s`` is the guard's renewal period (the window a stalled attempt may
    still run after waking, I2) and ``lease_ttl_s`` the lease's TTL (default
    ``3 * heartbeat_s``); ``slack_s`` absorbs scheduling and clock jitter.
    ``lease_ends``: leases that faults ended without silence (see :class:`LeaseEnd`);
    the overlaps they explain are reported marked ``outside`` (see :func:`excuse`).
    ``losses``: the faults that lost attempts (see :class:`Loss`); I8 is checked only when given.
    ``store=None``: ledger-only (baseline) mode, see the module docstring.
    """
    ended: dict[str, list[LeaseEnd]] = defaultdict(list)
    for end in lease_ends:
        ended[end.call_id].append(end)
    entries = ledger.entries() if isinstance(ledger, BaseEffectLedger) else list(ledger)
    runs = executions(entries)
    effects: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in entries:
        if e["kind"] == EFFECT:
            effects[e["call_id"]].append(e)
    out: list[Violation] = []
    by_slot: dict[str, list[tuple[Call, list[Execution]]]] = defaultdict(list)
    for c in calls:
        call = Call(c) if isinstance(c, str) else c
        execs = runs.get(call.call_id, [])
        if call.slot:
            by_slot[call.slot].append((call, execs))
        if store is None:
            out += _check_ledger_only(call, execs, effects.get(call.call_id, []))
        else:
            ttl = 3 * heartbeat_s if lease_ttl_s is None else lease_ttl_s
            if call.on_lost_lease == "finish":
                claims = {e.attempt: e.at for e in store.events(call.call_id) if e.type == STARTED}
                i2 = _overlaps(call.call_id, execs, 0.0, min_silence_s=max(0.0, ttl - heartbeat_s - slack_s),
                               ended=ended.get(call.call_id, ()), claims=claims)
            else:
                i2 = _overlaps(call.call_id, execs, heartbeat_s + slack_s)
            out += _check_guarded(call, store, execs, effects.get(call.call_id, []), i2)
            if losses is not None:
                out += _unexplained(call, store, execs, list(losses), ttl, slack_s)
    for slot, members in by_slot.items():
        out += _slot_overruns(slot, members, heartbeat_s + slack_s)
    return out


def _slot_overruns(slot: str, members: list[tuple[Call, list[Execution]]], window_s: float) -> list[Violation]:
    """I9: when a body of a call with concurrency key ``slot`` starts, the bodies of other
    calls with that key that run on beyond ``window_s`` from their first activity since that
    start (the stalled-worker window of I2) are running with it: at most ``slot_limit`` in all."""
    v = []
    bodies = [(call, x) for call, execs in members for x in execs if x.start_at is not None]
    for call, b in bodies:
        start = b.first_at
        running = [b]
        for other, a in bodies:
            if other.call_id == call.call_id or a.first_at > start:
                continue
            during = sorted(t for t in a.points if t > start)
            if during and during[-1] - during[0] > window_s:
                running.append(a)
        limit = call.slot_limit or 1
        if len(running) > limit:
            held = ", ".join(f"{x.call_id} (attempt {x.attempt}, pid {x.pid})" for x in running[1:])
            v.append(Violation("I9", call.call_id, f"{len(running)} calls with concurrency key {slot!r} "
                                                   f"(limit {limit}) ran at once: it started while {held} ran"))
    return v


def _unexplained(call: Call, store: AuditTrail, execs: list[Execution], losses: list[Loss],
                 ttl_s: float, slack_s: float) -> list[Violation]:
    """I8: an in-doubt result or a second body start needs a lost attempt: a body run a
    :class:`Loss` struck, or an attempt claimed (on the store's clock) whose body never
    started, near a loss."""
    result = store.result(call.call_id)
    in_doubt = result is not None and not result.ok and result.error in IN_DOUBT
    starts = [x for x in execs if x.start_at is not None]
    if not in_doubt and len(starts) <= 1:
        return []
    bodies = {x.attempt for x in starts}
    trail = store.events(call.call_id)
    claimed = [e for e in trail if e.type == STARTED and e.attempt not in bodies]
    if any(loss.struck(x, slack_s) for x in execs for loss in losses) \
            or any(loss.near(e.at, ttl_s, slack_s) for e in claimed for loss in losses):
        return []
    cause = re.search(r"\(cause: (\w+)\)\s*$", result.message) if in_doubt and result is not None else None
    what = [f"{result.error}" + (f" ({cause.group(1)})" if cause else "") if in_doubt and result is not None else "",
            f"{len(starts)} body starts" if len(starts) > 1 else ""]
    return [Violation("I8", call.call_id, " and ".join(w for w in what if w) + " with no lost attempt "
                      f"(no fault killed, froze or cut off a holder: runs on pids {[x.pid for x in execs]} "
                      f"from {[round(x.first_at, 2) for x in execs]} to {[round(x.last_at, 2) for x in execs]}; "
                      f"trail {[(e.type, e.attempt, round(e.at, 2)) for e in trail]})")]


# -- the guarded history (store + ledger) -----------------------------------------------


def _by_attempt(attempt: int | None) -> tuple[bool, int]:
    """Attempt numbers in order, a body that recorded none (None) last."""
    return attempt is None, attempt or 0


def _check_guarded(call: Call, store: AuditTrail, execs: list[Execution], effects: list[dict[str, Any]],
                   overlaps: list[Violation]) -> list[Violation]:
    cid = call.call_id
    v: list[Violation] = []
    events = store.events(cid)
    result = store.result(cid)
    results = [e for e in events if e.type in (COMPLETED, FAILED)]
    starts = [e for e in events if e.type == STARTED]

    # an operator's verdict (``celery aaa resolve``) replaced an in-doubt failure: the result
    # is theirs, so no attempt returned it and the trail's failure is what it replaced
    resolved = any(e.type == RESOLVED for e in events)

    # I1: exactly one result
    if result is None and not results:
        v.append(Violation("I1", cid, f"no result (lost): {len(starts)} attempt(s), {len(execs)} body run(s)"))
    elif len(results) > 1:
        v.append(Violation("I1", cid, f"{len(results)} results recorded: {[e.type for e in results]}"))
    elif result is None or not results:
        v.append(Violation("I1", cid, "the result and the audit trail disagree (one has no result)"))
    elif result.ok != (results[0].type == COMPLETED) and not resolved:
        v.append(Violation("I1", cid, f"recorded result ok={result.ok} but the trail says {results[0].type}"))
    if results:
        first = events.index(results[0])
        late = [e.attempt for e in events[first + 1:] if e.type == STARTED]
        if late:
            v.append(Violation("I1", cid, f"attempt(s) {late} started after the call had its result"))

    # I2: no overlap while both hold a valid lease
    v += overlaps

    attempts = [e.attempt for e in starts]
    body_attempts = Counter(x.attempt for x in execs if x.start_at is not None)
    twice = sorted((a for a, n in body_attempts.items() if n > 1), key=_by_attempt)
    if call.delivery == "at_most_once":
        # I3
        n_bodies = sum(body_attempts.values())
        if n_bodies > 1:
            v.append(Violation("I3", cid, f"at_most_once call ran its body {n_bodies} times"))
        if len(attempts) > 1:
            v.append(Violation("I3", cid, f"at_most_once call has {len(attempts)} attempt records {attempts}"))
    else:
        # I4
        n_bodies = sum(body_attempts.values())
        if n_bodies > call.max_attempts:
            v.append(Violation("I4", cid, f"{n_bodies} body starts > max_attempts={call.max_attempts}"))
        if attempts != list(range(1, len(attempts) + 1)):
            v.append(Violation("I4", cid, f"attempt numbers {attempts} are not contiguous from 1"))
        if len(attempts) > call.max_attempts:
            v.append(Violation("I4", cid, f"{len(attempts)} attempt records > max_attempts={call.max_attempts}"))
        if twice:
            v.append(Violation("I4", cid, f"attempt(s) {twice} ran their body more than once"))
    unrecorded = sorted({a for a in body_attempts if a not in attempts}, key=_by_attempt)
    if unrecorded:
        inv = "I3" if call.delivery == "at_most_once" else "I4"
        v.append(Violation(inv, cid, f"body ran as attempt(s) {unrecorded} without an attempt record"))

    # I5: a superseded attempt's result is only ever a stale_result
    if results:
        r = results[0]
        before = [e.attempt for e in events[: events.index(r)] if e.type == STARTED]
        newest = max(before, default=0)
        if r.attempt < newest:
            v.append(Violation("I5", cid, f"result of attempt {r.attempt} recorded as {r.type} "
                                          f"after attempt {newest} had started (should be stale_result)"))
        if r.attempt not in before:
            v.append(Violation("I5", cid, f"result of attempt {r.attempt}, which was never started"))
    if result is not None and results and result.attempt != results[0].attempt:
        v.append(Violation("I5", cid, f"recorded result is attempt {result.attempt}, trail says {results[0].attempt}"))
    for i, e in enumerate(events):
        # stale: a newer attempt exists, or the call already had its result (e.g. the
        # OutcomeUnknown recorded while this attempt was frozen)
        if e.type == STALE_RESULT and not any(s.attempt > e.attempt for s in starts) \
                and not any(x.type in (COMPLETED, FAILED) for x in events[:i]):
            v.append(Violation("I5", cid, f"attempt {e.attempt} was fenced as stale, but no newer attempt "
                                          "or earlier result exists"))

    # I6: a keyed effect is applied exactly once for a completed call
    completed = result is not None and result.ok
    v += _effects_once(call, effects, completed)

    # I7: the recorded value is what the writing attempt returned (or the operator gave)
    if completed and result is not None and not resolved:
        ends = [x for x in execs if x.ended and x.attempt == result.attempt]
        if not ends:
            v.append(Violation("I7", cid, f"completed by attempt {result.attempt}, but no body of that attempt returned"))
        elif not any(_norm(x.value) == _norm(result.value) for x in ends):
            v.append(Violation("I7", cid, f"recorded value {_norm(result.value)[:80]} != returned "
                                          f"{_norm(ends[0].value)[:80]} (attempt {result.attempt})"))
    return v


def _stale_first(x: Execution, y: Execution) -> tuple[Execution, Execution]:
    """The pair in the store's order: the lower attempt is the older one, whichever body
    started first (a worker frozen between its claim and its body starts it late); by
    body start when the attempt numbers do not tell (plain Celery, or a re-run)."""
    if x.attempt is not None and y.attempt is not None and x.attempt != y.attempt:
        return (x, y) if x.attempt < y.attempt else (y, x)
    return (x, y) if x.first_at <= y.first_at else (y, x)


def _overlaps(cid: str, execs: list[Execution], window_s: float, min_silence_s: float | None = None,
              ended: Sequence[LeaseEnd] = (), claims: Mapping[int, float] | None = None) -> list[Violation]:
    """I2: an execution active after a later one started, beyond ``window_s`` from its
    first activity since that start (the stalled-worker window; 0 in baseline mode).
    With ``min_silence_s`` (``on_lost_lease=finish``) it may run on to its end, if it
    was silent at least that long right before the later one started, counting from its
    attempt's claim (``claims``: the store's start time of each attempt) when its body
    had not started; or if a fault in ``ended`` ended its attempt's lease before the
    later one started, which is reported marked ``outside`` the guarantee, with the
    fault's reason."""
    v = []
    for i, x in enumerate(execs):
        for y in execs[i + 1:]:
            a, b = _stale_first(x, y)
            b_start, b_last = b.first_at, b.last_at
            during = sorted(t for t in a.points if b_start < t <= b_last)
            if not during:
                continue
            outside = ""
            if min_silence_s is not None:
                claimed = (claims or {}).get(a.attempt) if a.attempt is not None else None
                before = max((t for t in a.points if t <= b_start),
                             default=b_start if claimed is None else min(claimed, b_start))
                if b_start - before >= min_silence_s:
                    continue
                beyond = during
                end = min((e for e in ended if e.attempt == a.attempt and e.at <= b_start),
                          key=lambda e: e.at, default=None)
                if end is not None:
                    outside = (f"{end.reason}; attempt {a.attempt}'s lease ended "
                               f"{b_start - end.at:.2f} s before attempt {b.attempt} started")
            else:
                resumed = during[0]
                beyond = [t for t in during if t - resumed > window_s] if window_s > 0 else during
            if beyond:
                v.append(Violation(
                    "I2", cid,
                    f"run {a.exec_id} (attempt {a.attempt}, pid {a.pid}) was still running "
                    f"{beyond[-1] - b_start:.2f} s after run {b.exec_id} (attempt {b.attempt}, pid {b.pid}) started",
                    outside,
                ))
    return v


def _effects_once(call: Call, effects: list[dict[str, Any]], completed: bool) -> list[Violation]:
    if not call.keyed and not effects:
        return []
    applied = Counter(e["key"] for e in effects if e.get("applied"))
    v = [Violation("I6", call.call_id, f"effect {k!r} applied {n} times") for k, n in applied.items() if n > 1]
    if completed and call.keyed and not applied:
        v.append(Violation("I6", call.call_id, "the call completed but its keyed effect was never applied"))
    return v


# -- ledger only (plain Celery baseline) ------------------------------------------------


def _check_ledger_only(call: Call, execs: list[Execution], effects: list[dict[str, Any]]) -> list[Violation]:
    cid = call.call_id
    v: list[Violation] = []
    ends = [x for x in execs if x.ended]
    if not ends:
        v.append(Violation("I1", cid, f"no result (lost): {len(execs)} body run(s), none returned"))
    elif len(ends) > 1:
        v.append(Violation("I1", cid, f"completed {len(ends)} times"))
    v += _overlaps(cid, execs, 0.0)
    n = len([x for x in execs if x.start_at is not None])
    if call.delivery == "at_most_once" and n > 1:
        v.append(Violation("I3", cid, f"at_most_once call ran its body {n} times"))
    if call.delivery != "at_most_once" and n > call.max_attempts:
        v.append(Violation("I4", cid, f"{n} body starts > max_attempts={call.max_attempts}"))
    v += _effects_once(call, effects, bool(ends))
    return v


# -- counts for the report ----------------------------------------------------------------


def summarize(store: AuditTrail | None, ledger: BaseEffectLedger | Sequence[dict[str, Any]],
              calls: Sequence[Call], violations: Sequence[Violation]) -> dict[str, Any]:
    """Counts for the report table: results by kind, body starts, re-runs, effects."""
    entries = ledger.entries() if isinstance(ledger, BaseEffectLedger) else list(ledger)
    runs = executions(entries)
    results: Counter[str] = Counter()
    stale = fenced = 0
    for call in calls:
        execs = runs.get(call.call_id, [])
        if store is None:
            n = len([x for x in execs if x.ended])
            results["completed" if n == 1 else "no result" if n == 0 else "completed twice or more"] += 1
            continue
        r = store.result(call.call_id)
        results["no result" if r is None else "completed" if r.ok else (r.error or "failed")] += 1
        for e in store.events(call.call_id):
            stale += e.type == STALE_RESULT
            fenced += e.type == FENCED
    starts = [x for c in calls for x in runs.get(c.call_id, []) if x.start_at is not None]
    per_call = Counter(x.call_id for x in starts)
    effects = [e for e in entries if e["kind"] == EFFECT]
    return {
        "calls": len(calls),
        "results": dict(sorted(results.items())),
        "body_starts": len(starts),
        "calls_run_more_than_once": sum(1 for n in per_call.values() if n > 1),
        "bodies_returned": sum(1 for x in starts if x.ended),
        "calls_with_overlapping_runs": len({v.call_id for v in violations if v.invariant == "I2"}),
        "effects_applied": sum(1 for e in effects if e.get("applied")),
        "effects_deduplicated_by_key": sum(1 for e in effects if not e.get("applied")),
        "stale_results_fenced": stale,
        "attempts_cancelled_on_lost_lease": fenced,
        "violations": {inv: sum(1 for v in violations if v.invariant == inv) for inv in INVARIANTS},
    }
