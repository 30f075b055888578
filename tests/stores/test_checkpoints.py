"""The conformance suite of ``Checkpoints`` (stores/base.py), on every backend."""

from __future__ import annotations

from aaa_celery.lifecycle import Checkpoint, checkpoint_json

from .test_conformance import LONG_TTL_S, SHORT_TTL_S, claim, config, new_call


def test_a_checkpoint_is_kept_for_the_next_attempt_and_only_its_holder_writes_it(store_factory, lose_lease):
    """Issue 13, item 5: ``ctx.checkpoint`` is a store op, fenced by the lease."""
    a, b = store_factory(), store_factory()
    call, cfg = new_call(), config(lease_ttl_s=SHORT_TTL_S)
    assert a.last_checkpoint(call.call_id) is None
    # Given attempt 1 saves its progress twice (the later one wins)
    old = claim(a, call, "worker-a", cfg).lease
    assert a.save_checkpoint(old, checkpoint_json(1, {"page": 3}))
    assert a.save_checkpoint(old, checkpoint_json(1, {"page": 4, "seen": ["x"]}))
    # When attempt 1 loses its lease and attempt 2 takes over
    lose_lease(a, old)
    new = claim(b, call, "worker-b", cfg.model_copy(update={"lease_ttl_s": LONG_TTL_S})).lease
    # Then attempt 2 reads attempt 1's last checkpoint, and the stale attempt can no longer write one
    assert b.last_checkpoint(call.call_id) == Checkpoint(1, {"page": 4, "seen": ["x"]})
    assert not a.save_checkpoint(old, checkpoint_json(1, {"page": 99}))
    assert b.save_checkpoint(new, checkpoint_json(2, {"page": 5}))
    assert a.last_checkpoint(call.call_id) == Checkpoint(2, {"page": 5})


def test_every_store_keeps_a_checkpoint_as_lifecycle_plans_it(store):
    """lifecycle.plan_checkpoint, on every backend: a checkpoint is stamped with the attempt
    of the lease that saves it, and one over MAX_CHECKPOINT_BYTES (or not a checkpoint's
    JSON) is refused with ValueError, whether or not the lease holds the call (each store
    kept whatever it was given)."""
    import pytest

    from aaa_celery.lifecycle import MAX_CHECKPOINT_BYTES, compact_json

    call = new_call()
    lease = claim(store, call, "w", config()).lease
    assert store.save_checkpoint(lease, checkpoint_json(7, {"page": 1}))
    assert store.last_checkpoint(call.call_id) == Checkpoint(1, {"page": 1})
    huge = compact_json({"attempt": 1, "data": "x" * MAX_CHECKPOINT_BYTES})
    for bad in (huge, "[1, 2]", "not json"):
        with pytest.raises(ValueError):
            store.save_checkpoint(lease, bad)
    assert store.last_checkpoint(call.call_id) == Checkpoint(1, {"page": 1})
