"""Whose fault a store error is: one call's data, or the store.

A store refuses some values a caller can send: PostgreSQL holds no NUL character in text or
JSON (``UntranslatableCharacter``), no driver encodes a lone surrogate, a driver refuses a
value of a type it cannot send (redis-py's ``DataError``). Such an error is that call's bad
input: trying again can never help, so the call fails once, with the error as its recorded
outcome. Every other error is the store's (a lost connection, a timeout, a read-only
replica, a shutdown, and anything not known to be the data's): the guard retries it and
never makes it a call's result.

This is the one place the difference is decided; the guard's ``begin`` and ``finish`` and
the producer's ``register`` all ask :func:`data_error`.
"""

from __future__ import annotations

from ..errors import StoreError

#: Python's own errors for a value that does not encode (``json``, a driver's encoder).
_ENCODING = (TypeError, ValueError, UnicodeError, OverflowError)

#: The drivers' errors for a value the server or the driver refused, by (package, class):
#: psycopg's and SQLAlchemy's ``DataError`` (SQLSTATE class 22), ``sqlite3.DataError`` and
#: redis-py's ``DataError`` (an argument of a type it cannot send). Named, not imported:
#: each driver is optional.
_DRIVER_DATA_ERRORS = frozenset({("psycopg", "DataError"), ("sqlalchemy", "DataError"),
                                 ("sqlite3", "DataError"), ("redis", "DataError")})

#: SQLSTATE class 22, "data exception": the value, not the server (``22P05`` untranslatable
#: character, ``22021`` a byte sequence invalid in the encoding, ``22003`` out of range).
_DATA_SQLSTATE = "22"


def _is_data(error: BaseException) -> bool:
    if isinstance(error, _ENCODING):
        return True
    sqlstate = getattr(error, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate.startswith(_DATA_SQLSTATE):
        return True
    return any((cls.__module__.partition(".")[0], cls.__name__) in _DRIVER_DATA_ERRORS for cls in type(error).__mro__)


def data_error(error: BaseException) -> BaseException | None:
    """The error behind ``error`` that blames one call's data, or None if it is the store's.

    Looks at ``error``, the driver error SQLAlchemy wraps (``orig``) and the cause, so a
    refusal is recognized however a store raised it.
    """
    if isinstance(error, StoreError):  # the store's own verdict: unreachable, outdated, unsafe
        return None
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and len(seen) < 4 and all(current is not s for s in seen):
        if _is_data(current):
            return current
        seen.append(current)
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return None


def describe(error: BaseException) -> str:
    """One line about a data error, safe to record: its type and its first line, with no
    control character (a driver may quote the value)."""
    text = str(error).splitlines()[0] if str(error) else ""
    text = "".join(c if c.isprintable() else "?" for c in text)[:200]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


__all__ = ["data_error", "describe"]
