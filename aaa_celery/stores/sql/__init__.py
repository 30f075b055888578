"""The SQL stores: PostgreSQL (:mod:`.postgres`) and SQLite (:mod:`.sqlite`).

Laid out by job: :mod:`.schema` (the tables), :mod:`.queries` (every statement on
calls, budgets and operators' verbs, by name), :mod:`.store` (:class:`SQLStore`,
the logic both backends share), :mod:`.runs` (run records), then one module per
backend, which says what makes a lease live.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .schema import metadata
from .sqlite import SQLiteStore
from .store import SQLStore

if TYPE_CHECKING:
    from .postgres import PostgresStore

__all__ = ["PostgresStore", "SQLStore", "SQLiteStore", "metadata"]


def __getattr__(name: str) -> Any:
    # PostgreSQL needs psycopg (the ``postgres`` extra): imported when it is asked for
    if name == "PostgresStore":
        from .postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
