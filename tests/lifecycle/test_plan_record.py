"""lifecycle.plan_record: an outcome recorded from outside an attempt, decided once for every
store (pure: no store, no clock)."""

from __future__ import annotations

import pytest

from aaa_celery.lifecycle import FAILED, CallSpec, CallState, Outcome, plan_record, record_allowed

CALL = CallSpec("c-1", "refund")
REVOKED = Outcome.failure("TaskRevokedError", "revoked")


def test_first_records_unless_the_call_has_a_result():
    writes = plan_record("first", CallState(attempts=2, holder_live=True), CALL, REVOKED)
    assert writes.reply is True and writes.record == REVOKED
    assert writes.event is not None and writes.event.type == FAILED and writes.event.id == "c-1:result"
    assert writes.claim is None and writes.let_go is None  # no lease is taken or forged
    done = CallState(attempts=1, result=Outcome.success(1, 1))
    assert plan_record("first", done, CALL, REVOKED) == plan_record("first", done, CALL, REVOKED)
    assert plan_record("first", done, CALL, REVOKED).reply is False
    assert plan_record("first", done, CALL, REVOKED).event is None  # no stale_result noise


@pytest.mark.parametrize("attempts, allowed", [(0, True), (1, True), (2, False)])
def test_fenced_ends_only_its_own_attempt(attempts, allowed):
    limit = Outcome.failure("TimeLimitExceeded", "hard time limit (1s) exceeded", 1)
    assert record_allowed("fenced", CallState(attempts=attempts), limit) is allowed


@pytest.mark.parametrize("state, allowed", [
    (CallState(attempts=1), True),
    (CallState(attempts=1, holder_live=True), False),  # a live lease holds it
    (CallState(attempts=2), False),  # another attempt started since the outcome was built
    (CallState(attempts=1, result=Outcome.success(1, 1)), False),
])
def test_abandon_only_a_call_nobody_holds_at_the_attempt_count_it_was_built_for(state, allowed):
    gave_up = Outcome.failure("ExecutionAbandoned", "gave up", 1)
    assert record_allowed("abandon", state, gave_up) is allowed


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="record kind"):
        plan_record("whatever", CallState(), CALL, REVOKED)  # type: ignore[arg-type]
