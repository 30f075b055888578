"""Bounded inflation of compressed messages in a worker that runs guarded tasks.

kombu inflates a message with a ``compression`` header inside ``Message.__init__``, in
the worker's *main* process, before any strategy (so before :mod:`.messages`'s size
check) sees it: a message of a few hundred KiB that inflates to gigabytes kills the
worker through lack of memory, and comes back to kill the next one. So a guarded worker
replaces kombu's decoders (its registry is process-wide) with bounded ones:

* a compressed body larger than ``aaa_max_message_bytes`` is refused before inflating;
* it is inflated at most to ``aaa_max_message_bytes`` + 1 bytes, and refused beyond;
* a compression that cannot be inflated with a bound (brotli, or a decoder an app
  registered) is refused.

A refusal is a decoding error to kombu, and Celery's consumer logs it and acks the message
(it never comes back); :func:`record_refusals` also records a guarded call's outcome
(``ToolArgsError``), as for any other malformed message. The bound holds for every
compressed message the worker takes, plain tasks' too: raise ``aaa_max_message_bytes`` for
plain tasks that send larger compressed bodies.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from typing import Any

from kombu import compression
from kombu.utils.encoding import ensure_bytes

#: A bounded decompressor per kombu content type: ``make().decompress(data, max_length)``.
_DECOMPRESSORS: dict[str, Callable[[], Any]] = {
    "application/x-gzip": zlib.decompressobj,  # kombu's "gzip" is the zlib format
    "application/x-bz2": bz2.BZ2Decompressor,
    "application/x-lzma": lzma.LZMADecompressor,
}
try:  # kombu registers zstd from here when it is there
    from backports import zstd as _zstd  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover
    pass
else:  # pragma: no cover
    _DECOMPRESSORS["application/zstd"] = _zstd.ZstdDecompressor

#: The bound of this process's decoders (None until a guarded worker installs them).
_limit: int | None = None


class InflateRefused(ValueError):
    """A compressed message that would inflate past ``aaa_max_message_bytes`` (or that
    cannot be inflated with a bound)."""


def inflate(body: Any, content_type: str, limit: int) -> bytes:
    """``body`` inflated as ``content_type``, at most ``limit`` bytes; else :class:`InflateRefused`."""
    data = ensure_bytes(body)
    make = _DECOMPRESSORS.get(content_type)
    if make is None:
        raise InflateRefused(f"the body is compressed as {content_type!r}, which cannot be inflated with a bound "
                             f"(a guarded worker takes {', '.join(sorted(_DECOMPRESSORS))})")
    if len(data) > limit:
        raise InflateRefused(f"the compressed body has {len(data)} bytes, more than aaa_max_message_bytes={limit}")
    out = make().decompress(data, limit + 1)
    if len(out) > limit:
        raise InflateRefused(f"the body would inflate past aaa_max_message_bytes={limit} "
                             f"({len(data)} bytes compressed as {content_type!r})")
    return out  # type: ignore[no-any-return]


def _decoder(content_type: str) -> Callable[[Any], bytes]:
    def decode(body: Any) -> bytes:
        assert _limit is not None
        return inflate(body, content_type, _limit)

    return decode


def install(limit: int) -> None:
    """Bound every decoder of kombu's registry in this process to ``limit`` bytes (the
    smallest bound asked for wins, when several apps' workers share the process)."""
    global _limit
    _limit = limit if _limit is None else min(_limit, limit)
    decoders: dict[str, Any] = compression._decoders  # type: ignore[attr-defined] # kombu's registry
    for content_type in list(decoders):
        if getattr(decoders[content_type], "_aaa_bounded", False):
            continue
        decode = _decoder(content_type)
        decode._aaa_bounded = True  # type: ignore[attr-defined]
        decoders[content_type] = decode


def record_refusals(consumer: Any, refuse: Callable[[Any, str], None]) -> None:
    """Have ``consumer``'s task consumer call ``refuse(message, reason)`` for a message whose
    inflation was refused, before Celery's own handling (a log line and an ack)."""
    task_consumer = getattr(consumer, "task_consumer", None)
    handler = getattr(task_consumer, "on_decode_error", None)
    if task_consumer is None or handler is None or getattr(handler, "_aaa_bounded", False):
        return

    def on_decode_error(message: Any, exc: BaseException) -> None:
        if isinstance(exc, InflateRefused):
            refuse(message, str(exc))
        handler(message, exc)

    on_decode_error._aaa_bounded = True  # type: ignore[attr-defined]
    task_consumer.on_decode_error = on_decode_error
