"""The Redis store's client side: its errors, its scripts' sources, and connections
lent to threads.

**Connections.** Each thread runs the scripts on a connection of the client's pool
lent to it (:func:`evalsha`) from its first script until the thread (or greenlet) ends:
no pool checkout, readiness poll or ``execute_command`` layers per script. So a
process holds one connection per live thread that used the store (mind a pool's
``max_connections``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
from importlib import resources
from collections.abc import Callable, Mapping
from typing import Any

import redis

#: The driver's errors that mean "the store cannot be reached now" (StoreUnavailable).
ERRORS = (
    redis.ConnectionError, redis.TimeoutError,  # MaxConnectionsError is a ConnectionError
    redis.exceptions.ClusterError,  # CLUSTERDOWN, MASTERDOWN
    redis.exceptions.TryAgainError,  # TRYAGAIN: a slot being migrated
    redis.exceptions.SlotNotCoveredError,
    # READONLY: a replica (a primary demoted by a failover) cannot take the write now
    redis.exceptions.ReadOnlyError,
)
#: Raised while a cluster client discovers the cluster (no seed node answers).
CONNECT_ERRORS = (*ERRORS, redis.exceptions.RedisClusterException)
#: URL scheme of a Redis Cluster -> the scheme redis-py's RedisCluster.from_url takes.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
#: Seconds a command (and a connect) may wait on the server before it fails as
#: StoreUnavailable: a stalled server must not hang a renewal, a ``finish`` or recovery
#: for good. Well below the default lease TTL (15 s); the watchdog proves each lease on
#: its own clock, so a slow renewal costs that call only, never another's heartbeat.
SOCKET_TIMEOUT_S = 5.0


def lua(name: str) -> str:
    """The source of script ``lua/<name>.lua``."""
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


def ms(seconds: float) -> int:
    """Whole milliseconds, at least 1 (Redis TTLs and scores are in ms)."""
    return max(1, round(seconds * 1000))


def server_of(params: Mapping[str, Any]) -> tuple[Any, ...]:
    """Which server a client with redis-py connection parameters ``params`` reaches, and as
    whom: its TCP address (TLS or not) or Unix socket, and its user and password. The same
    from a store's connection pool and from Celery's ``RedisBackend.connparams``."""
    cls = params.get("connection_class") or redis.Connection
    if params.get("path"):
        where: tuple[Any, ...] = ("unix", params["path"])
    else:
        tls = isinstance(cls, type) and issubclass(cls, redis.SSLConnection)
        where = ("tls" if tls else "tcp", params.get("host") or "localhost", int(params.get("port") or 6379))
    return (*where, params.get("username") or None, params.get("password") or None)


try:  # hiredis (a dependency) packs a command in C; redis-py's own packer is the fallback
    import hiredis

    _pack: Callable[..., bytes] | None = hiredis.pack_command
except ImportError:  # pragma: no cover
    _pack = None


class _Lent:
    """A connection of the pool lent to one thread, given back when the thread ends (its
    thread-local slot is dropped; under gevent or eventlet, when its greenlet ends)."""

    __slots__ = ("conn", "pending", "pid", "pool", "sock")

    def __init__(self, pool: Any) -> None:
        self.pool, self.pid = pool, os.getpid()
        self.conn = pool.get_connection()
        #: The connection's socket last given kernel timeouts (a reconnect makes a new one).
        self.sock: Any = None
        #: A command was sent and its reply not read (an exception came in between): the
        #: connection is out of step, and is reconnected before it is used again.
        self.pending = False

    def __del__(self) -> None:
        try:
            if self.pid == os.getpid():  # never touch a connection a forked child inherited
                if self.pending:
                    self.conn.disconnect()
                self.pool.release(self.conn)
        except Exception:  # noqa: BLE001 - at interpreter exit the pool may be half gone
            pass


def _kernel_timeouts(sock: Any, timeout_s: float | None) -> Any:
    """Let the kernel time out ``sock``'s sends and receives: a socket with a Python
    timeout polls before every ``send`` and ``recv``, and each poll lets go of the GIL,
    so a round trip hands the GIL over four times instead of two (on a threads pool each
    hand-off is a wake-up of another thread). redis-py reports the kernel's receive
    timeout as a ``ConnectionError`` over a ``BlockingIOError``; :func:`evalsha` raises
    it as the ``TimeoutError`` it is. TLS sockets keep Python's timeouts."""
    if type(sock) is socket.socket and timeout_s:
        whole = int(timeout_s)
        timeval = struct.pack("ll", whole, int((timeout_s - whole) * 1_000_000))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
        sock.settimeout(None)
    return sock


def evalsha(client: Any, held: threading.local, script: Any, keys: list[str], args: list[Any],
            wait: tuple[int, int] | None = None) -> Any:
    """Run ``script`` by EVALSHA on the connection this thread has on loan from ``client``'s
    pool, with the connection's retry policy and reply parser, but without
    ``Redis.execute_command``'s layers (observability hooks, a second retry wrapper, reply
    callbacks) and the pool's per-command checkout (a lock and a readiness ``poll``). On a
    trivial call these cost as much CPU as the round trip itself: 60 -> 36 µs per script
    here. A thread keeps the connection from its first script until it ends (a forked child
    takes its own); ``close()`` ends it with the pool. Loads the script on NOSCRIPT, as
    redis-py's ``Script`` does.

    ``wait=(replicas, timeout_ms)`` sends ``WAIT`` after the script, in the same round trip
    and on the same connection (``WAIT`` counts the replicas that have this connection's
    writes), and returns ``(reply, replicas that acknowledged)``."""
    lent: _Lent | None = getattr(held, "lent", None)
    if lent is None or lent.pid != os.getpid():
        lent = held.lent = _Lent(client.connection_pool)
    conn = lent.conn
    if lent.pending:
        conn.disconnect()
        lent.pending = False
    sock = conn._sock
    if sock is not lent.sock and sock is not None:
        lent.sock = _kernel_timeouts(sock, conn.socket_timeout)
    commands = [("EVALSHA", script.sha, len(keys), *keys, *args)]
    if wait is not None:
        commands.append(("WAIT", *wait))
    packed = [_pack(c) for c in commands] if _pack is not None else conn.pack_commands(commands)

    def send() -> Any:
        lent.pending = True
        conn.send_packed_command(packed, check_health=False)
        try:
            try:
                reply = conn.read_response()
            except redis.ResponseError:
                if wait is not None:
                    with contextlib.suppress(redis.ResponseError):
                        conn.read_response()  # WAIT's reply: the connection stays in step
                lent.pending = False
                raise
            acked = None
            if wait is not None:
                try:
                    acked = conn.read_response()
                except redis.ResponseError:  # refused: the server became a replica; none has the write
                    acked = 0
        except redis.ConnectionError as e:
            if isinstance(e.__context__, BlockingIOError):  # the kernel's receive timeout
                raise redis.TimeoutError("Timeout reading from socket") from None
            raise
        lent.pending = False
        return reply if wait is None else (reply, acked)

    try:
        return conn.retry.call_with_retry(send, lambda error: conn.disconnect())
    except redis.exceptions.NoScriptError:
        lent.pending = False  # the error was the whole reply
    # The server lost its scripts (a restart, SCRIPT FLUSH): load and run.
    if wait is not None:  # on this connection again, so that WAIT counts its writes
        client.script_load(script.script)
        return conn.retry.call_with_retry(send, lambda error: conn.disconnect())
    return script(keys=keys, args=args, client=client)
