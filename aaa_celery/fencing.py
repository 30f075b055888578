"""Effect-side fencing: the called system itself rejects a write from a superseded attempt.

The guard numbers every attempt of a call, and the number is its fence (``ctx.fence``): a
later attempt always has a higher one. A worker frozen past its lease (a GC pause, a
SIGSTOP, a stalled VM) may wake up and write after a newer attempt took the call over;
nothing on the worker's side can stop that write in time. The resource can: it keeps the
highest fence it has seen for a key and refuses a write whose fence is lower. These
helpers do that in one atomic step, in your database or your Redis.

SQL (SQLAlchemy), inside your own transaction::

    fence = SQLFence()                      # table aaa_fences(key, fence)
    fence.create(engine)                    # once, like any table
    with engine.begin() as conn:
        fence.check(conn, ctx.call_id, ctx.fence)   # raises StaleFence
        conn.execute(orders.update()...)                  # runs only if the fence held

The check takes the key's row lock until your transaction ends, so a stale write and a
newer one are serialized, and the stale one is rolled back with everything else in it.

Redis (one Lua script: the check and your command, atomically)::

    RedisFence(client).execute(ctx.call_id, ctx.fence, "HSET", "order:7", "state", "paid",
                               keys=["order:7"])

On Redis Cluster the fence key (``<prefix><key>``) and your command's keys must share a
hash slot: put the same ``{hash tag}`` in both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import AAACeleryError

if TYPE_CHECKING:
    from sqlalchemy.dialects.postgresql import Insert as PostgresInsert
    from sqlalchemy.dialects.sqlite import Insert as SQLiteInsert


class StaleFence(AAACeleryError):
    """The resource has seen a newer attempt of this call: this attempt's write is refused."""

    def __init__(self, key: str, fence: int, highest: int | None = None) -> None:
        seen = f" (highest seen: {highest})" if highest is not None else ""
        super().__init__(f"fence {fence} for {key!r} is stale{seen}: a newer attempt has written")
        self.key, self.fence, self.highest = key, fence, highest


class SQLFence:
    """Fences kept in a SQL table, checked inside the caller's transaction.

    Args:
        table: the table's name (created by :meth:`create`).
        metadata: a ``sqlalchemy.MetaData`` to define the table in (your app's, to have it
            created and migrated with your own tables); a new one by default.
    """

    def __init__(self, table: str = "aaa_fences", metadata: Any = None) -> None:
        try:
            import sqlalchemy as sa
        except ImportError as e:  # pragma: no cover - sqlalchemy is a dependency
            raise ImportError("SQLFence needs SQLAlchemy: pip install sqlalchemy") from e
        self.metadata = metadata if metadata is not None else sa.MetaData()
        self.table = sa.Table(
            table,
            self.metadata,
            sa.Column("key", sa.String, primary_key=True),
            sa.Column("fence", sa.BigInteger, nullable=False),
        )

    def create(self, bind: Any) -> None:
        """Create the table if it does not exist (an Engine or a Connection)."""
        self.table.create(bind, checkfirst=True)

    def check(self, conn: Any, key: str, fence: int) -> None:
        """Raise :class:`StaleFence` unless ``fence`` is at least the highest seen for ``key``;
        record it as the highest. Call it in the transaction that makes the write: the key's
        row stays locked until that transaction ends."""
        import sqlalchemy as sa

        t = self.table
        dialect = conn.dialect.name
        if dialect in ("postgresql", "sqlite"):
            upsert: PostgresInsert | SQLiteInsert
            if dialect == "postgresql":
                from sqlalchemy.dialects.postgresql import insert as postgres_insert
                upsert = postgres_insert(t).values(key=key, fence=fence)
            else:
                from sqlalchemy.dialects.sqlite import insert as sqlite_insert
                upsert = sqlite_insert(t).values(key=key, fence=fence)
            stmt = upsert.on_conflict_do_update(
                index_elements=[t.c.key], set_={"fence": upsert.excluded.fence},
                where=t.c.fence <= upsert.excluded.fence,
            ).returning(t.c.fence)
            if conn.execute(stmt).first() is not None:  # a row inserted or updated
                return
        else:  # any other database: lock the row, then compare and write
            row = conn.execute(sa.select(t.c.fence).where(t.c.key == key).with_for_update()).first()
            if row is None:
                conn.execute(t.insert().values(key=key, fence=fence))
                return
            if row.fence <= fence:
                conn.execute(t.update().where(t.c.key == key).values(fence=fence))
                return
        highest = conn.execute(sa.select(t.c.fence).where(t.c.key == key)).scalar_one_or_none()
        raise StaleFence(key, fence, highest)


#: KEYS[1] the fence key, KEYS[2..] the command's keys (for routing only).
#: ARGV[1] the fence, ARGV[2..] the command. Refuses the command (an error reply starting
#: STALEFENCE and the highest fence seen) if a higher fence was seen for the key; else
#: records the fence and runs the command, returning its reply.
_FENCED_LUA = """
local fence = tonumber(ARGV[1])
local highest = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence < highest then
  return redis.error_reply('STALEFENCE ' .. highest)
end
redis.call('SET', KEYS[1], ARGV[1])
return redis.call(unpack(ARGV, 2))
"""


class RedisFence:
    """Fences kept in Redis: a command runs only if its fence is at least the highest seen.

    Args:
        client: a ``redis.Redis`` (or ``RedisCluster``) client of the resource.
        prefix: the fence keys' prefix (``<prefix><key>``).
    """

    def __init__(self, client: Any, prefix: str = "aaa:fence:") -> None:
        self.client, self.prefix = client, prefix
        self._script = client.register_script(_FENCED_LUA)

    def execute(self, key: str, fence: int, *command: Any, keys: list[str] | tuple[str, ...] = ()) -> Any:
        """Run ``command`` (``"SET", "k", "v"``...) if ``fence`` is at least the highest seen
        for ``key``, and record it; raise :class:`StaleFence` otherwise. ``keys``: the
        command's key names (needed to route it on a cluster)."""
        import redis

        if not command:
            raise ValueError("RedisFence.execute needs a command to run under the fence")
        try:
            return self._script(keys=[self.prefix + key, *keys], args=[fence, *command], client=self.client)
        except redis.ResponseError as e:
            text = str(e)
            if "STALEFENCE" not in text:
                raise
            highest = text.rsplit(" ", 1)[-1]
            raise StaleFence(key, fence, int(highest) if highest.isdigit() else None) from None
