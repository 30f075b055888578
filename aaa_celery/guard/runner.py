"""The attempt runner: one delivery of a call, run under the guard. Plain Python over a Store.

Each delivery asks the store what to do (``begin``):

* ``Claimed``: run the body as attempt *n* under a :class:`Watchdog` (heartbeat and
  timeout), then record the one result (``finish``, retried while the store is
  down); a result from a superseded attempt is fenced out.
* ``Busy``: another live worker holds the call. Drop this copy without a result at
  once, unless the holder's lease lapses within a few ``wait_poll_s`` (then re-check
  every ``wait_poll_s`` for that short while): the store, not the broker, brings the call back if the holder dies, so a
  duplicate never holds a worker slot for long.
* ``Finished``: answer with the recorded result; nothing runs.
* ``Refused``: the delivery policy forbids another attempt; the recorded
  ``OutcomeUnknown`` / ``ExecutionAbandoned`` is the result.

A delivery ends in one of four ways: the body's value is returned; its error (or a
recorded failure) is raised; :class:`Dropped` (this copy ends without a result, the
call lives on elsewhere); or :class:`HandBack` (the store was unreachable: give the
message back to the broker for a later try). The adapter (``GuardedTask`` for
Celery) maps the last two onto its framework. Nothing here imports Celery.
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..config import GuardConfig, RetryPolicy
from ..context import running_attempt
from ..errors import STORE_UNREACHABLE, TOOL_ERRORS, LeaseLost, StoreUnavailable, ToolError, ToolTimeout
from ..lifecycle import (FENCED, RECONCILED, RETRIED, STALE_RESULT, STARTED, Accepted, Busy, CallSpec, Claimed,
                         Finished, Lease, Outcome, Refused, Slot, SlotPlan, busy_outcome, lapsed)
from ..stores.base import GuardStore, ResultCopy, new_token
from ..stores.blame import data_error, describe
from .lease import AttemptLease
from .reconcile import RECONCILE_TIMEOUT_S, Reconcile, reconcile_lost
from .slots import SlotHeld
from .watchdog import BodyTimedOut, LeaseCancelled, Watchdog

log = logging.getLogger("aaa_celery.guard")

#: How many ``wait_poll_s`` periods a delivery waits on a busy call before dropping its copy.
BUSY_POLLS = 4


class DeliveryEnded(Exception):  # noqa: N818 - a control-flow signal, not an error
    """A delivery ends without giving the caller a result; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Dropped(DeliveryEnded):
    """This copy ends without a result: a live holder has the call, or this attempt
    was fenced out. The store brings the call back if its holder dies."""


class HandBack(DeliveryEnded):
    """The store could not be reached: nothing ran, or the result is not recorded.
    Give the message back to the broker for a later try."""


class SlotBusy(DeliveryEnded):
    """Every slot of the call's concurrency key is held, and its rule says ``wait``: nothing
    ran and nothing was recorded. Hand the message back to come again later, with backoff
    (``slots.wait_s``); ``holders`` are the calls that hold the slots."""

    def __init__(self, reason: str, holders: tuple[str, ...] = ()) -> None:
        super().__init__(reason)
        self.holders = holders


class Emit(Protocol):
    """Sends an audit event to monitors (never raises; the store's trail is the record)."""

    def __call__(self, audit_type: str, attempt: int | None, **fields: Any) -> None: ...


def _no_emit(audit_type: str, attempt: int | None, **fields: Any) -> None:
    return None


class Codec(Protocol):
    """How a body's value is kept in the store: ``encode`` makes it JSON data (or raises
    ``TypeError``/``ValueError``), ``decode`` gives back the value a caller sees."""

    def encode(self, value: Any) -> Any: ...

    def decode(self, stored: Any) -> Any: ...


class PlainJSON:
    """Values that are JSON data already (the default)."""

    def encode(self, value: Any) -> Any:
        return value

    def decode(self, stored: Any) -> Any:
        return stored


def error_for(outcome: Outcome) -> BaseException:
    """The exception a failed outcome raises for a caller: the recorded type when it is
    one of ours or a builtin exception, else a ``ToolError`` naming it."""
    cls = TOOL_ERRORS.get(outcome.error or "")
    if cls is not None:
        return cls(outcome.message)
    builtin = getattr(builtins, outcome.error or "", None)
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        return builtin(outcome.message)
    return ToolError(f"{outcome.error}: {outcome.message}")


#: What ``json`` raises for a spec that does not encode (the call's own data).
_ENCODING_ERRORS = (TypeError, ValueError, UnicodeError)


#: The body of one attempt: called with the attempt number, returns the value (or a
#: coroutine of it, for an ``async def`` tool).
Body = Callable[[int], Any]

#: What an exception the body raised means, for the framework that runs it: ``"hand_on"``
#: when the body asked to run again (a retry: the attempt ends without a result and the
#: call goes on in its next delivery), else None (the exception is the call's recorded
#: failure, as any other; ``raise_for`` maps it back for later deliveries).
Control = Callable[[BaseException], str | None]


def _no_control(error: BaseException) -> str | None:
    return None


@dataclass
class GuardRunner:
    """Runs deliveries of calls under one guard configuration.

    Args:
        store: the store shared by every worker of the fleet.
        config: the call's guard configuration.
        timeout_s: bound on the body's run time, or None.
        result_retry: how ``finish`` is retried while the store is down.
        emit: sends audit events to monitors (Celery task events, for instance).
        codec: how values are kept in the store (the app's result serializer, for Celery).
        control: what the framework's control-flow exceptions mean (see :data:`Control`).
        raise_for: the exception a recorded failure raises for a caller.
    """

    store: GuardStore
    config: GuardConfig
    timeout_s: float | None = None
    result_retry: RetryPolicy = RetryPolicy()
    emit: Emit = _no_emit
    codec: Codec = PlainJSON()
    control: Control = _no_control
    raise_for: Callable[[Outcome], BaseException] = error_for
    #: Asks the called system whether a lost attempt's effect happened (see ``reconcile.py``).
    reconcile: Reconcile | None = None
    #: A copy of a success for the store to write with it, if it can (:class:`ResultCopy`),
    #: made from the body's value; None, or a function that returns None: no copy. It never
    #: raises (an error there is not the call's).
    copy_result: Callable[[Any], ResultCopy | None] | None = None
    #: The copy sent with the success the store accepted from this runner's attempt (a runner
    #: runs one delivery), once it did: the call's one result, so a caller may write the copy
    #: itself if the store did not (``written``). None for any other ending.
    copy: ResultCopy | None = field(default=None, init=False)
    #: The concurrency slot the call holds to run (``policy.Concurrency``), or None.
    slot: Slot | None = None
    #: How this delivery's claimed attempt ended, for its slot: None (no claim), "lost" (its
    #: lease was lost, or it is running), "ended".
    _claimed: str | None = field(default=None, init=False)

    def run(self, call: CallSpec, worker: str, body: Body) -> Any:
        """One delivery of ``call`` by ``worker``: take its slot (if it has a concurrency
        rule), claim, run, record, answer."""
        if self.slot is None:
            return self._run(call, worker, body)
        taken, self._claimed = self._take_slot(call), None
        try:
            return self._run(call, worker, body)
        finally:
            # Freed once the attempt ends, unless it lost its lease (the slot is then its call's
            # next attempt's, or lapses); a delivery that claimed nothing frees only a slot it took.
            if self._claimed is None and taken == "taken" or self._claimed == "ended":
                self._free_slot(call)

    def _run(self, call: CallSpec, worker: str, body: Body) -> Any:
        busy_until = time.monotonic() + BUSY_POLLS * self.config.wait_poll_s
        token = _unanswered.take(call.call_id) or new_token()
        while True:
            decision = self._begin(call, worker, token)
            if isinstance(decision, Claimed):
                self.emit(STARTED, decision.lease.attempt, worker=worker)
                if self.slot is not None:
                    self._keep_slot(call, decision.lease)
                return self._holding(call, decision.lease, body)
            if isinstance(decision, Finished):
                if decision.result.ok:
                    return self.codec.decode(decision.result.value)
                raise self.raise_for(decision.result)
            if isinstance(decision, Refused):
                refusal = self.reconciled(call, decision.result)
                if refusal.ok:
                    return self.codec.decode(refusal.value)
                self.emit(refusal.event_type, refusal.attempt, error=refusal.error, message=refusal.message)
                raise self.raise_for(refusal)
            assert isinstance(decision, Busy)
            if time.monotonic() >= busy_until or not self._may_lapse(decision):
                raise Dropped(f"held by {decision.holder}")
            time.sleep(self.config.wait_poll_s)

    def _holding(self, call: CallSpec, lease: Lease, body: Body) -> Any:
        """Run a claimed attempt, noting for a slot whether it ended or lost its lease."""
        self._claimed = "lost"
        try:
            value = self.attempt(call, lease, body)
        except Dropped:
            raise
        except BaseException:
            self._claimed = "ended"
            raise
        self._claimed = "ended"
        return value

    def _take_slot(self, call: CallSpec) -> str:
        """Take the call's slot before its attempt is claimed; every slot held: ``wait`` hands
        the message back (:class:`SlotBusy`), ``skip`` and ``reject`` record the call's one
        outcome, naming the rule, and raise it, for a call no attempt has claimed (one that has
        its outcome is answered with it by the ``begin`` that follows; a copy of one whose
        attempt runs is dropped)."""
        slot = self.slot
        assert slot is not None
        plan = self._slot_plan(call, slot)
        if plan.reply != "full":
            return plan.reply
        if slot.on_busy == "wait":
            if self._has_result(call):
                return "full"  # a redelivery of a finished call: the begin answers with its outcome
            raise SlotBusy(f"every slot of {slot.rule!r} is held ({len(plan.holders)}): waiting", plan.holders)
        outcome = busy_outcome(call.name or call.call_id, slot, plan.holders)
        try:
            # "fenced" at attempt 0: only a call no attempt has claimed is skipped or refused; a
            # delivery of a call whose attempt runs (its slot lapsed, or lost) never ends it
            recorded = self.store.record(call, outcome, "fenced")
        except Exception as e:  # noqa: BLE001 - never leave a refused call without its outcome
            _log_trouble("record", call.call_id, e)
            raise HandBack("aaa store unavailable while recording the call's concurrency outcome") from None
        if recorded:
            self.emit(outcome.event_type, 0, error=outcome.error, message=outcome.message, slot=slot.rule)
            raise self.raise_for(outcome)
        if self._has_result(call):
            return "full"  # the begin that follows answers with the call's outcome
        raise Dropped(f"every slot of {slot.rule!r} is held, and an attempt of this call exists")

    def _keep_slot(self, call: CallSpec, lease: Lease) -> None:
        """Take the slot again once the attempt is claimed, before its body runs: from then
        on the slot outlives the lease (every renewal renews both, the slot last, and a slot
        lapses a grace after its lease), so the body never runs beside the key's holders. A
        claim that came late (``begin`` tried again while the store was away) may find the
        slot gone to another call: ``wait`` hands the call on to its next delivery (the
        message comes back later), ``skip`` and ``reject`` end the attempt with the rule's
        outcome."""
        slot = self.slot
        assert slot is not None
        try:
            plan = self._slot_plan(call, slot)
        except HandBack:
            self._let_go(lease)
            raise
        if plan.reply != "full":
            return
        if slot.on_busy == "wait":
            try:
                self.store.hand_on(lease)
            except Exception as e:  # noqa: BLE001 - unhanded, the lease lapses: the message still comes back
                _log_trouble("hand_on", call.call_id, e)
            self.emit(RETRIED, lease.attempt, worker=lease.worker, slot=slot.rule)
            raise SlotBusy(f"every slot of {slot.rule!r} went to other calls before the body ran: waiting",
                           plan.holders)
        outcome = replace(busy_outcome(call.name or call.call_id, slot, plan.holders), attempt=lease.attempt)
        if not isinstance(self.finish(lease, outcome), Accepted):
            raise Dropped("a newer attempt owns the call")
        self.emit(outcome.event_type, lease.attempt, error=outcome.error, message=outcome.message, slot=slot.rule)
        raise self.raise_for(outcome)

    def _let_go(self, lease: Lease) -> None:
        try:
            self.store.release(lease)
        except Exception as e:  # noqa: BLE001 - best effort: the store is why we give up
            log.debug("aaa: could not release %s: %r", lease.call_id, e)

    def _slot_plan(self, call: CallSpec, slot: Slot) -> SlotPlan:
        """``take_slot``, retried while the store is unreachable for up to a lease TTL, as
        ``begin`` is (a take is idempotent: the call holds the slot or not); past that, the
        message goes back to the broker."""
        give_up = time.monotonic() + self.config.lease_ttl_s
        delay = min(0.2, self.config.wait_poll_s)
        while True:
            started = time.monotonic()
            try:
                return self.store.take_slot(slot.key, call.call_id, slot.limit, self.config.lease_ttl_s)
            except Exception as e:  # noqa: BLE001 - any store error: never run without the slot
                _log_trouble("take_slot", call.call_id, e)
                if time.monotonic() >= give_up:
                    raise HandBack("aaa store unavailable while taking the call's concurrency slot") from None
            time.sleep(max(0.0, min(delay - (time.monotonic() - started), give_up - time.monotonic())))
            delay = min(delay * 2, 2.0)

    def _has_result(self, call: CallSpec) -> bool:
        try:
            return self.store.result(call.call_id) is not None
        except Exception as e:  # noqa: BLE001 - any store error: the message comes back later
            _log_trouble("result", call.call_id, e)
            raise HandBack("aaa store unavailable while taking the call's concurrency slot") from None

    def _free_slot(self, call: CallSpec) -> None:
        slot = self.slot
        assert slot is not None
        try:
            self.store.free_slot(slot.key, call.call_id)
        except Exception as e:  # noqa: BLE001 - best effort: an unfreed slot lapses within the TTL
            _log_trouble("free_slot", call.call_id, e)

    def reconciled(self, call: CallSpec, refusal: Outcome) -> Outcome:
        """The refusal as it stands once ``reconcile`` (if any) asked about an unknown outcome."""
        if self.reconcile is None or refusal.error != "OutcomeUnknown":
            return refusal
        reconcile, timeout_s = self.reconcile, self.timeout_s or RECONCILE_TIMEOUT_S
        bounded = lambda attempt: run_unguarded(self.config, timeout_s, lambda: reconcile(attempt))  # noqa: E731
        settled = reconcile_lost(self.store, call, refusal, bounded, self.codec.encode)
        self.emit(RECONCILED, refusal.attempt, ok=settled.ok, error=settled.error)
        return settled

    def _may_lapse(self, busy: Busy) -> bool:
        """Whether the holder's lease may lapse within this delivery's short wait: only then
        is waiting worth a worker slot. A fresh lease (or a PostgreSQL session lock, which
        has no expiry) means a live holder: this copy is dropped at once, and the store
        brings the call back if that holder dies."""
        if busy.expires_at is None:
            return False
        try:
            return lapsed(busy.expires_at, self.store.now() + BUSY_POLLS * self.config.wait_poll_s)
        except StoreUnavailable:
            return False

    def _begin(self, call: CallSpec, worker: str, token: str) -> Any:
        """``begin``, retried with the same ``token`` while the store is unreachable, for up to
        a lease TTL: a try whose write landed but whose reply was lost is then recognized by
        its token and claims (``begin`` is idempotent), so no attempt is wasted. Past that,
        the message goes back to the broker; a later delivery in this process reuses the
        token, so even a claim that lapsed meanwhile is claimed again, not refused."""
        try:
            # Every store keeps the spec as JSON (memory keeps it to send the call again): one
            # that does not encode is refused here, for all of them, before anything is claimed.
            call.to_json()
        except _ENCODING_ERRORS as e:
            raise self._unwritable(call, e) from e
        give_up = time.monotonic() + self.config.lease_ttl_s
        delay = min(0.2, self.config.wait_poll_s)
        while True:
            started = time.monotonic()
            try:
                return self.store.begin(call, worker, self.config, token)
            except Exception as e:  # noqa: BLE001 - any store error (READONLY, OOM, ...) is store trouble
                unwritable = data_error(e)
                if unwritable is not None:
                    # The call itself cannot be written (its spec does not encode): no retry
                    # can help, and handing the message back would bring it back forever.
                    raise self._unwritable(call, unwritable) from e
                # Never run without a claim, and never make store trouble the call's result.
                _log_trouble("begin", call.call_id, e)
                if time.monotonic() >= give_up:
                    _unanswered.put(call.call_id, token)
                    raise HandBack("aaa store unavailable at begin") from None
                time.sleep(max(0.0, min(delay - (time.monotonic() - started), give_up - time.monotonic())))
                delay = min(delay * 2, 2.0)

    def _unwritable(self, call: CallSpec, error: BaseException) -> BaseException:
        """A call the store cannot write fails once: its failure becomes its recorded result
        (when it was registered; nothing ran), with its ``aaa.tool.failed`` event, and the
        caller gets that error."""
        outcome = _refused_data(f"the guard could not record this call: {describe(error)}", error, 0)
        log.error("aaa: call %s cannot be written to the store (%s); it fails without running",
                  call.call_id, describe(error))
        try:
            # registered or not (another producer's message is not), and never over an attempt:
            # "fenced" at attempt 0 records only while no attempt has claimed the call
            self.store.record(CallSpec(call.call_id, call.name), outcome, "fenced")
        except Exception as e:  # noqa: BLE001 - best effort: the caller hears the error either way
            _log_trouble("abandon", call.call_id, e)
        self.emit(outcome.event_type, 0, error=outcome.error, message=outcome.message)
        return self.raise_for(outcome)

    def attempt(self, call: CallSpec, lease: Lease, body: Body) -> Any:
        """Run a claimed attempt under its watchdog and record its outcome. The heartbeat
        goes on until the outcome is recorded (or given up), so the lease outlives the body
        by as long as recording its result takes."""
        watchdog = Watchdog(SlotHeld.wrap(self.store, self.slot), lease, self.config, self.timeout_s)
        try:
            return self._attempt(call, lease, body, watchdog)
        finally:
            watchdog.close()

    def _attempt(self, call: CallSpec, lease: Lease, body: Body, watchdog: Watchdog) -> Any:
        error: BaseException | None = None
        value: Any = None
        try:
            with running_attempt(AttemptLease(SlotHeld.wrap(self.store, self.slot), lease, watchdog)):
                value = watchdog.run(lambda: body(lease.attempt), keep_renewing=True)
            outcome = self._success(call, value, lease.attempt)
            if not outcome.ok:
                error = TypeError(outcome.message)
        except (LeaseCancelled, LeaseLost) as e:
            unproved = watchdog.lost_cause == STORE_UNREACHABLE or (isinstance(e, LeaseLost) and not watchdog.lost)
            self._fenced(call, lease, STORE_UNREACHABLE if unproved else None)
            self.emit(FENCED, lease.attempt, worker=lease.worker)
            raise Dropped("lease lost; attempt cancelled") from None
        except BodyTimedOut:
            error = ToolTimeout(f"{call.name or call.call_id}: timed out after {self.timeout_s} s")
            outcome = Outcome.failure("ToolTimeout", str(error), lease.attempt)
        except Exception as e:  # noqa: BLE001 - every failure is a recorded fact
            if self.control(e) == "hand_on":
                self.store.hand_on(lease)
                self.emit(RETRIED, lease.attempt, worker=lease.worker)
                raise
            error = e
            outcome = Outcome.failure(type(e).__name__, str(e), lease.attempt)
        copy = self.copy_result(value) if outcome.ok and self.copy_result is not None else None
        finished = self.finish(lease, outcome, copy)
        if isinstance(finished, Substituted):  # the store could not hold the outcome: a failure instead
            outcome, copy, finished, value = finished.outcome, None, finished.result, None
            error = self.raise_for(outcome)
        if not isinstance(finished, Accepted):
            self.emit(STALE_RESULT, lease.attempt, worker=lease.worker)
            raise Dropped("a newer attempt owns the call; this result is audit only")
        self.copy = copy
        extra = {} if outcome.ok else {"error": outcome.error, "message": outcome.message}
        self.emit(outcome.event_type, lease.attempt, worker=lease.worker, **extra)
        if error is not None:
            raise error
        return value

    def _fenced(self, call: CallSpec, lease: Lease, cause: str | None) -> None:
        """Record the fenced attempt, with ``cause``. An attempt that gave up because the
        store could not be reached says so once the store answers again (tried for a while),
        so that a refusal of the call names the store, not a lost worker, as the cause."""
        give_up = time.monotonic() + (max(30.0, 4 * lease.ttl_s) if cause == STORE_UNREACHABLE else 0.0)
        while True:
            try:
                self.store.fenced(lease, cause)
                return
            except Exception as e:  # noqa: BLE001 - the audit is best effort; the store's trouble is why we are here
                if time.monotonic() >= give_up:
                    log.warning("aaa: could not record the fenced attempt %s of %s: %r", lease.attempt, call.call_id, e)
                    return
            time.sleep(0.25)

    def _success(self, call: CallSpec, value: Any, attempt: int) -> Outcome:
        """The outcome of a body that returned ``value``: a value the store cannot keep
        fails the call once, naming its type, and is never run again."""
        try:
            return Outcome.success(self.codec.encode(value), attempt)
        except (TypeError, ValueError, OverflowError) as e:
            message = (f"{call.name or call.call_id}: the result, of type {type(value).__name__}, "
                       f"cannot be serialized for the result store: {e}")
            return Outcome.failure("TypeError", message, attempt)

    def finish(self, lease: Lease, outcome: Outcome, copy: ResultCopy | None = None) -> Any:
        """Record the outcome, retrying with backoff while the store is unreachable (the
        lease is renewed meanwhile). Each try starts its delay after the previous one
        started: a try that waited out a socket timeout is followed at once, so a store
        that pauses finds a ``finish`` queued when it resumes. When the tries run out, the
        lease is given back (on PostgreSQL, the lock is held until then) and the message
        goes back to the broker. An outcome the store refuses as data (see
        :mod:`..stores.blame`) is replaced, once, by a failure that says so, and returned as
        :class:`Substituted`."""
        delays: list[float] | None = None  # worked out on the first failure only
        substitute: Outcome | None = None
        while True:
            started = time.monotonic()
            try:
                if substitute is not None:
                    return Substituted(self.store.finish(lease, substitute, self.config), substitute)
                if copy is None:  # a store written for 0.1 takes no copy
                    return self.store.finish(lease, outcome, self.config)
                return self.store.finish(lease, outcome, self.config, copy)
            except Exception as e:  # noqa: BLE001 - any store error (READONLY, OOM, ...) is store trouble
                refused = data_error(e)
                if refused is not None and substitute is None:
                    # The store cannot hold this outcome (a NUL in the value, say): the call
                    # fails with that instead, once; retrying the same data never helps.
                    log.error("aaa: the outcome of %s cannot be written to the store (%s); it is "
                              "recorded as a failure", lease.call_id, describe(refused))
                    substitute = _refused_data(f"the store cannot hold this call's outcome: {describe(refused)}",
                                               refused, lease.attempt)
                    continue
                _log_trouble("finish", lease.call_id, e)
                if delays is None:
                    delays = self.result_retry.delays()
                if not delays:
                    self._let_go(lease)
                    raise HandBack("aaa store unavailable at finish") from None
                time.sleep(max(0.0, delays.pop(0) - (time.monotonic() - started)))


@dataclass(frozen=True)
class Substituted:
    """What :meth:`GuardRunner.finish` returns when the store refused the outcome as data and
    took ``outcome``, a failure naming the refusal, in its place (``result``: its answer)."""

    result: Any
    outcome: Outcome


#: The error a call records when the store refused its data (see :mod:`..stores.blame`)
#: and the refusal was not one of Python's own errors.
_UNSTORABLE = "ValueError"


def _refused_data(message: str, error: BaseException, attempt: int) -> Outcome:
    """The failure a call records when the store refused its data: Python's own error type
    (``TypeError``, ``UnicodeEncodeError`` ...) when it was one, else ``ValueError``."""
    name = type(error).__name__
    kind = name if isinstance(getattr(builtins, name, None), type) else _UNSTORABLE
    return Outcome.failure(kind, message, attempt)


def _log_trouble(op: str, call_id: str, error: BaseException) -> None:
    """Store trouble is retried, never a call's result; an error that is not an outage
    (a bug, a misconfigured server) is logged with its traceback."""
    if isinstance(error, StoreUnavailable):
        log.info("aaa: %s of %s: %s (retrying)", op, call_id, error)
    else:
        log.warning("aaa: %s of %s failed (treated as store trouble, retrying): %r", op, call_id, error,
                    exc_info=error)


class _Unanswered:
    """Tokens of ``begin`` calls whose answer never came, by call id: the next delivery of
    that call in this process retries with the same token (see ``GuardRunner._begin``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[str, str] = {}

    def put(self, call_id: str, token: str) -> None:
        with self._lock:
            if len(self._tokens) >= 10_000:
                self._tokens.pop(next(iter(self._tokens)))
            self._tokens[call_id] = token

    def take(self, call_id: str) -> str | None:
        if not self._tokens:  # the usual case; a token put meanwhile is for another delivery
            return None
        with self._lock:
            return self._tokens.pop(call_id, None)


_unanswered = _Unanswered()


def run_unguarded(config: GuardConfig, timeout_s: float | None, body: Callable[[], Any]) -> Any:
    """Run a body with its timeout only: no lease, no attempt record (``enabled=False``)."""
    try:
        return Watchdog(None, None, config, timeout_s).run(body)
    except BodyTimedOut:
        raise ToolTimeout(f"timed out after {timeout_s} s") from None
