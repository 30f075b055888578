"""A TCP proxy on loopback for the partition nemesis: one :class:`Link` per network path.

The chaos run puts a link between each worker and the store, and between each worker and
the broker (the worker is given the link's address instead of the server's). The nemesis
then breaks one path and heals it:

- :meth:`Link.cut` holds the traffic of one direction or both, as a dropped route does:
  the bytes wait (TCP retransmits) and arrive after :meth:`Link.heal`, unless the client
  gave up and closed the connection first;
- :meth:`Link.reset` resets every connection (an RST on both sides) and refuses new ones
  until healed;
- :meth:`Link.slow` delays every chunk by that many seconds, each way, order kept.

All links of a :class:`ProxyHub` run on one asyncio loop in one thread; their methods are
safe to call from any other thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

#: The directions of a path: towards the server (requests) and back (replies).
UP, DOWN = "up", "down"
DIRECTIONS = (UP, DOWN)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (linger 0), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Link:
    """One proxied path to ``host:port``, listening on ``127.0.0.1:<port>``."""

    def __init__(self, hub: ProxyHub, host: str, port: int) -> None:
        self.hub, self.target = hub, (host, port)
        self.port = 0
        self.delay_s = 0.0
        self.refusing = False
        self._flowing: dict[str, asyncio.Event] = {}
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._server: asyncio.AbstractServer | None = None

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by this link's."""
        parts = urlsplit(url)
        auth = parts.netloc.rpartition("@")[0]
        netloc = f"{auth}@127.0.0.1:{self.port}" if auth else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    # -- the nemesis's verbs (any thread) ---------------------------------------------
    def cut(self, direction: str = "both") -> None:
        """Hold the traffic going ``up`` (to the server), ``down`` (its replies) or ``both``."""
        held = DIRECTIONS if direction == "both" else (direction,)
        if not set(held) <= set(DIRECTIONS):
            raise ValueError(f"direction: one of up, down, both, not {direction!r}")
        for d in held:
            self.hub.call(self._flowing[d].clear)

    def reset(self) -> None:
        """Reset every connection and refuse new ones until :meth:`heal`."""
        self.refusing = True
        self.hub.call(self._reset_all)

    def slow(self, delay_s: float) -> None:
        """Delay every chunk ``delay_s`` seconds in each direction."""
        self.delay_s = delay_s

    def heal(self) -> None:
        """Let everything through again, at once (held bytes go on)."""
        self.delay_s, self.refusing = 0.0, False
        for d in DIRECTIONS:
            self.hub.call(self._flowing[d].set)

    # -- on the hub's loop ----------------------------------------------------------------
    async def _start(self) -> None:
        self._flowing = {d: asyncio.Event() for d in DIRECTIONS}
        for event in self._flowing.values():
            event.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._reset_all()

    def _reset_all(self) -> None:
        for client, server in list(self._pairs):
            _abort(client)
            _abort(server)
        self._pairs.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            _abort(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _abort(writer)
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        pumps = [asyncio.ensure_future(self._pump(reader, up_writer, UP)),
                 asyncio.ensure_future(self._pump(up_reader, writer, DOWN))]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for p in pumps:
                p.cancel()
            self._pairs.discard(pair)
            for w in pair:
                with contextlib.suppress(Exception):
                    w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        """Copy one direction, holding and delaying it as the link says; order is kept."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def send() -> None:
            flowing = self._flowing[direction]
            while (item := await chunks.get()) is not None:
                read_at, data = item
                await flowing.wait()
                wait = read_at + self.delay_s - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                await flowing.wait()
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            while not sender.done() and (data := await reader.read(65536)):
                chunks.put_nowait((loop.time(), data))
            chunks.put_nowait(None)
            await sender
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            sender.cancel()


class ProxyHub:
    """The loop that runs every :class:`Link`; :meth:`stop` closes them all."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.links: list[Link] = []
        self._thread = threading.Thread(target=self.loop.run_forever, name="chaos-proxy", daemon=True)
        self._thread.start()

    def call(self, fn: Any) -> None:
        """Run ``fn()`` on the loop (from any thread)."""
        self.loop.call_soon_threadsafe(fn)

    def link(self, url: str) -> Link:
        """A new link to the server of ``url`` (``redis://host:port/0``...)."""
        parts = urlsplit(url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"a proxied URL needs a host and a port: {url!r}")
        link = Link(self, parts.hostname, parts.port)
        asyncio.run_coroutine_threadsafe(link._start(), self.loop).result(10)
        self.links.append(link)
        return link

    def stop(self) -> None:
        for link in self.links:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(link._close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        with contextlib.suppress(Exception):
            self.loop.close()
