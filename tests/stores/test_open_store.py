"""Selecting a store by URL."""

from __future__ import annotations

import builtins

import pytest

from aaa_celery import open_store
from aaa_celery.errors import ConfigError
from aaa_celery.stores import BACKENDS, backend_for
from aaa_celery.stores.memory import MemoryStore


def test_each_scheme_maps_to_its_store_class():
    assert backend_for("memory://") is MemoryStore
    assert backend_for("redis://localhost/0").__name__ == "RedisStore"
    assert backend_for("rediss://localhost/0").__name__ == "RedisStore"
    assert backend_for("postgresql+psycopg://u@h/db").__name__ == "PostgresStore"
    assert backend_for("postgresql://u@h/db").__name__ == "PostgresStore"
    assert backend_for("sqlite:///tmp/x.db").__name__ == "SQLiteStore"
    assert backend_for("redis+cluster://127.0.0.1:7000/").__name__ == "RedisStore"
    assert set(BACKENDS) == {
        "memory", "redis", "rediss", "redis+cluster", "rediss+cluster", "postgresql", "postgresql+psycopg", "sqlite",
    }


def test_unknown_scheme_says_did_you_mean():
    with pytest.raises(ConfigError) as e:
        open_store("reddis://localhost:6379/0")
    assert "did you mean 'redis'?" in str(e.value)
    assert "memory://" in str(e.value)  # lists the known schemes
    with pytest.raises(ConfigError, match="unknown scheme 'mongodb'"):
        open_store("mongodb://x")


def test_memory_store_opens_without_a_server():
    store = open_store("memory://")
    assert isinstance(store, MemoryStore)
    assert store.events("nothing") == [] and store.result("nothing") is None


def test_a_missing_postgres_driver_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def no_psycopg(name, *args, **kwargs):
        if name == "psycopg" or name.startswith("psycopg."):
            raise ImportError("No module named 'psycopg'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_psycopg)
    with pytest.raises((ConfigError, ImportError)) as e:
        open_store("postgresql+psycopg://postgres@127.0.0.1:1/postgres")
    assert "aaa_celery[postgres]" in str(e.value)
