"""The SQL stores: PostgreSQL (:mod:`.postgres`) and SQLite (:mod:`.sqlite`).

Laid out by job: :mod:`.schema` (the tables), :mod:`.queries` (every statement on
calls, budgets and operators' verbs, by name), :mod:`.store` (:class:`SQLStore`,
the logic both backends share), :mod:`.runs` (run records), then one module per
backend, which says what makes a lease live.
"""

from __future__ import annotations

from .postgres import PostgresStore
from .schema import metadata
from .sqlite import SQLiteStore
from .store import SQLStore

__all__ = ["PostgresStore", "SQLStore", "SQLiteStore", "metadata"]
