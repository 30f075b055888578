"""A tool call's arguments, checked: limits first, then the schema, then one canonical form.

Every string of a tool call is the model's, so arguments are checked before anything
is stored or published (by the engine, and by ``apply_async``/``delay`` of a tool's
task), and again by the worker before the tool runs:

1. :func:`check_limits` walks the raw value without recursion: it must be an object
   (a dict with string keys), at most ``max_args_depth`` deep, each string at most
   ``max_string_bytes`` UTF-8 bytes and the whole at most ``max_args_bytes`` bytes of
   its compact JSON as kombu sends it (``\u00e9`` for an ``é``); no ``NaN``/``Infinity``, no unpaired
   surrogate, no NUL character (PostgreSQL holds none), no integer beyond 64 bits: each store
   holds every value that passes, unchanged. So nothing below ever sees a hostile shape (a 100 000-deep list
   would overflow the recursion of ``deepcopy``, pydantic or ``json``).
2. The tool's pydantic model validates it (``extra="forbid"``, ``allow_inf_nan=False``).
3. :class:`CheckedArgs` holds the result three ways: ``values`` for the tool (secrets
   intact), ``canonical`` JSON data (what is sent: ``"0100"`` for ``order_id: int``
   becomes ``100``), and ``shown``, the canonical form with secrets redacted (what
   events, pages, logs and the idempotency key function see).

Each refusal is a :class:`~aaa_celery.errors.ToolArgsError` naming the tool and the
place (``items.3.name``), never the value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from ..config import GuardPolicy
from ..errors import ToolArgsError
from .secrets import REDACTED, clear_value

#: The limits when a tool's handler sets none (``GuardPolicy()``'s).
DEFAULT_POLICY = GuardPolicy()

_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
#: JSON bytes of the scalars that are not strings or numbers.
_CONST = {True: 4, False: 5, None: 4}
#: The containers the walk enters.
_CONTAINERS = (dict, list, tuple, set, frozenset)


def _part(part: Any) -> str:
    text = str(part)
    text = text if len(text) <= 40 else text[:39] + "…"
    return "".join(c if c.isprintable() else "?" for c in text)  # the model's keys: no forged lines


def _where(path: tuple[Any, ...]) -> str:
    """Where in the arguments: ``items.3.name`` (long paths elided in the middle)."""
    parts = [_part(p) for p in path]
    if len(parts) > 8:
        parts = [*parts[:4], "…", *parts[-3:]]
    return ".".join(parts) or "arguments"


def check_limits(name: str, arguments: Any, policy: GuardPolicy = DEFAULT_POLICY) -> None:
    """Refuse ``arguments`` unless they are a JSON object within ``policy``'s limits.

    An iterative walk that stops at the first problem, so its cost is bounded by
    ``max_args_bytes`` whatever the input's size or depth.
    """
    if not isinstance(arguments, dict):
        raise ToolArgsError(f"{name}: arguments must be an object, got {type(arguments).__name__}")
    max_bytes, max_depth, max_string = policy.max_args_bytes, policy.max_args_depth, policy.max_string_bytes
    total = 0
    stack: list[tuple[Any, tuple[Any, ...], int]] = [(arguments, (), 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            if len(value) > max_string:
                raise ToolArgsError(f"{name}: {_where(path)}: a string longer than {max_string} bytes")
            try:
                size = len(value.encode("utf-8"))
            except UnicodeEncodeError:
                raise ToolArgsError(f"{name}: {_where(path)}: a string with an unpaired surrogate") from None
            if size > max_string:
                raise ToolArgsError(f"{name}: {_where(path)}: a string longer than {max_string} bytes")
            if "\x00" in value:
                raise ToolArgsError(f"{name}: {_where(path)}: a string with a NUL character (U+0000), "
                                    "which a store cannot hold (PostgreSQL text and JSON refuse it)")
            # as sent: kombu's JSON escapes (a NUL is 6 bytes, \u0000; an é is \u00e9); printable
            # ASCII but for '"' and '\\' is one byte each
            plain = value.isascii() and value.isprintable() and '"' not in value and "\\" not in value
            total += size + 2 if plain else len(json.dumps(value))
        elif isinstance(value, bool) or value is None:
            total += _CONST[value]
        elif isinstance(value, int):
            if not _INT_MIN <= value <= _INT_MAX:
                raise ToolArgsError(f"{name}: {_where(path)}: an integer beyond 64 bits")
            total += len(str(value))
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ToolArgsError(f"{name}: {_where(path)}: {value} is not a finite number")
            total += len(repr(value))
        elif isinstance(value, _CONTAINERS):
            if depth > max_depth:
                raise ToolArgsError(f"{name}: {_where(path)}: nested deeper than {max_depth} levels")
            total += 2 + max(0, len(value) - 1)
            if isinstance(value, dict):
                for key, item in value.items():
                    if not isinstance(key, str):
                        raise ToolArgsError(f"{name}: {_where(path)}: a key that is not a string")
                    at = (*path, key)
                    stack.append((key, at, depth))
                    stack.append((item, at, depth + 1))
                    total += 1
            else:
                stack.extend((item, (*path, i), depth + 1) for i, item in enumerate(value))
        else:
            total += 8  # a Python value (datetime, Decimal, UUID ...): the schema decides
        if total > max_bytes:
            raise ToolArgsError(f"{name}: arguments larger than {max_bytes} bytes")


@dataclass(frozen=True)
class CheckedArgs:
    """A call's arguments after :func:`check`.

    Attributes:
        values: the validated values, as the tool receives them (secrets intact).
        canonical: the same as JSON data, secrets in clear: what is sent to a worker
            (once the secrets are sealed, see :mod:`aaa_celery.tools.secrets`).
        shown: ``canonical`` with every secret redacted: what events, pages, logs
            and the idempotency key function see.
    """

    values: dict[str, Any]
    canonical: dict[str, Any]
    shown: dict[str, Any]


def _problems(name: str, error: ValidationError) -> ToolArgsError:
    problems = "; ".join(f"{_where(tuple(err['loc']))}: {err['msg']}" for err in error.errors(include_input=False))
    return ToolArgsError(f"{name}: bad arguments: {problems}")


def check(name: str, model: type[BaseModel], secrets: frozenset[str], arguments: Any,
          policy: GuardPolicy = DEFAULT_POLICY) -> CheckedArgs:
    """Check ``arguments`` against the limits and ``model``; raises ToolArgsError."""
    check_limits(name, arguments, policy)
    try:
        validated = model.model_validate(arguments)
    except ValidationError as e:
        raise _problems(name, e) from None
    except (RecursionError, ValueError, TypeError) as e:  # a validator of the tool's own
        raise ToolArgsError(f"{name}: bad arguments: {type(e).__name__}") from None
    values = {k: getattr(validated, k) for k in type(validated).model_fields}
    try:
        canonical = validated.model_dump(mode="json")
    except (PydanticSerializationError, ValueError, TypeError) as e:
        raise ToolArgsError(f"{name}: arguments that cannot be sent as JSON: {type(e).__name__}") from None
    shown = dict(canonical)
    for field in secrets:
        if values.get(field) is not None:
            canonical[field] = clear_value(values[field])
            shown[field] = REDACTED
    # A nested model of the tool's own may let NaN in (its config, not ours): the form
    # that travels must be within the limits as well.
    check_limits(name, shown, policy)
    return CheckedArgs(values, canonical, shown)


__all__ = ["DEFAULT_POLICY", "CheckedArgs", "check", "check_limits"]
