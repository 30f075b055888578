"""Results kept in the store as kombu's JSON encodes them, so a guarded task may return
whatever a plain Celery task may (``datetime``, ``Decimal``, ``UUID``, bytes ...)."""

from __future__ import annotations

import json
from typing import Any

from celery.result import ResultBase
from kombu.utils import json as kombu_json


class KombuJSON:
    """Encode a value as kombu's JSON does (a tagged object for the types it knows);
    decode it back to the same Python value a plain Celery caller would get."""

    def encode(self, value: Any) -> Any:
        if value is None or type(value) in (str, int, bool):
            return value  # the common case, already JSON data
        if isinstance(value, ResultBase):
            value = value.as_tuple()  # as Celery's result backend stores a returned result
        return json.loads(kombu_json.dumps(value))

    def decode(self, stored: Any) -> Any:
        if stored is None or type(stored) in (str, int, bool, float):
            return stored
        return kombu_json.loads(json.dumps(stored))


CODEC = KombuJSON()
