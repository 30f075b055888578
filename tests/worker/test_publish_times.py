"""Recovery's reading of a captured message's ``eta`` and ``expires``: a protocol 2 message
keeps them in its headers, a protocol 1 message (``task_protocol=1``) in its object body."""

from __future__ import annotations

from datetime import datetime

from aaa_celery.worker.publish import expires_at, not_before

ETA = "2030-01-02T03:04:05+00:00"
EXPIRES = "2030-01-02T04:04:05+00:00"


def stamp(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def test_protocol_2_headers():
    stored = {"body": [[1], {}, {}], "headers": {"id": "c-1", "eta": ETA, "expires": EXPIRES}}
    assert not_before(stored) == stamp(ETA) and expires_at(stored) == stamp(EXPIRES)


def test_protocol_1_body():
    stored = {"body": {"task": "t", "id": "c-1", "args": [1], "kwargs": {}, "eta": ETA, "expires": EXPIRES},
              "headers": {}}
    assert not_before(stored) == stamp(ETA) and expires_at(stored) == stamp(EXPIRES)


def test_neither():
    stored = {"body": [[1], {}, {}], "headers": {"id": "c-1"}}
    assert not_before(stored) is None and expires_at(stored) is None
