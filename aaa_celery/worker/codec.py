"""Results and arguments kept in the store as kombu's JSON encodes them, so a guarded task
may take and return whatever a plain Celery task may (``datetime``, ``Decimal``, ``UUID``,
bytes ...); results no larger than the guard's ``max_result_bytes``."""

from __future__ import annotations

import json
from typing import Any

from celery.result import ResultBase
from kombu.utils import json as kombu_json

from ..errors import ResultTooLarge


class KombuJSON:
    """Encode a value as kombu's JSON does (a tagged object for the types it knows);
    decode it back to the same Python value a plain Celery caller would get."""

    def encode(self, value: Any) -> Any:
        if value is None or type(value) in (str, int, bool):
            return value  # the common case, already JSON data
        if isinstance(value, ResultBase):
            # as Celery's result backend stores a returned result (celery-types gives ResultBase
            # no as_tuple: AsyncResult and GroupResult have it, and Celery's backend assumes it)
            value = value.as_tuple()  # type: ignore[attr-defined]
        return json.loads(kombu_json.dumps(value))

    def decode(self, stored: Any) -> Any:
        if stored is None or type(stored) in (str, int, bool, float):
            return stored
        return kombu_json.loads(json.dumps(stored))


CODEC = KombuJSON()


def _surely_within(data: Any, max_bytes: int) -> bool:
    """A cheap answer for the common small values (a JSON character takes at most 6 bytes)."""
    return data is None or type(data) in (bool, int) or (type(data) is str and len(data) * 6 + 2 <= max_bytes)


class SizedJSON(KombuJSON):
    """:class:`KombuJSON` that refuses a result whose JSON, as the store keeps it, is larger
    than ``max_bytes`` (``ResultTooLarge``: the call fails once and nothing large is stored)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    def encode(self, value: Any) -> Any:
        data = super().encode(value)
        if not _surely_within(data, self.max_bytes):
            size = len(json.dumps(data, separators=(",", ":")).encode("utf-8"))
            if size > self.max_bytes:
                raise ResultTooLarge(
                    f"the result, of type {type(value).__name__}, is {size} bytes as JSON, above the limit of "
                    f"{self.max_bytes} (guard option max_result_bytes): return less, e.g. where the data is kept"
                )
        return data


_SIZED: dict[int, SizedJSON] = {}


def result_codec(max_bytes: int | None) -> KombuJSON:
    """The codec of a guarded call's results under ``max_bytes`` (None: no limit)."""
    if max_bytes is None:
        return CODEC
    codec = _SIZED.get(max_bytes)
    if codec is None:
        codec = _SIZED[max_bytes] = SizedJSON(max_bytes)
    return codec


def stored_arguments(args: list[Any], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """A call's arguments as a worker's spec keeps them: as kombu's JSON encodes them (bytes,
    ``datetime``, ``Decimal`` ... arrive as such from a JSON message, and the store writes
    the spec as JSON); recovery decodes them before sending them again. (A spec registered
    at publish keeps the message as sent instead, already encoded, and no raw arguments:
    they may be objects the task's serializer turns into JSON, such as pydantic models.)"""
    if _plain_json(args) and _plain_json(kwargs):
        return args, kwargs  # the common case, and the hot path: no encoding round trip
    return CODEC.encode(args), CODEC.encode(kwargs)


def _plain_json(value: Any) -> bool:
    """Whether ``value`` is JSON data as it is (no type that kombu's JSON tags)."""
    kind = type(value)
    if value is None or kind in (str, int, float, bool):
        return True
    if kind in (list, tuple):
        return all(map(_plain_json, value))
    if kind is dict:
        return all(type(k) is str and _plain_json(v) for k, v in value.items())
    return False
