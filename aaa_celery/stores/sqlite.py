"""The 0.1.0 import path of :class:`~aaa_celery.stores.sql.sqlite.SQLiteStore`."""

from __future__ import annotations

from .sql.sqlite import SQLiteStore

__all__ = ["SQLiteStore"]
