"""Wire names that the runtime, the worker and the web pages share, and the call id's format.

A *call id* is the guard's name for one call, everywhere: the Celery task id, the
store's key, ``ctx.call_id``, the ``call_id`` of every ``aaa.*`` event and page.
The engine mints it (:func:`mint_call_id`); the model's own id for a tool call is its
*tool call id*, which only threads the transcript (``ctx.tool_call_id``,
``Message.tool_call_id``) and is never part of a key.

The call id carries its tenant and run (see ``docs/call-identity-and-tenants.md``)::

    <tenant>:<run id>:<local>        e.g.  acme:run_8c1f2e3d4b5a:0.1.9f2c1ab3e4d5f607

- ``<tenant>`` and ``<run id>`` are escaped so that each is one segment of
  ``[A-Za-z0-9._-]`` and ``~XX`` (one per UTF-8 byte of any other character); a call
  without a tenant has ``~`` there. The escaping is one-to-one, so two distinct
  (tenant, run) pairs never give one id (``a:b`` + ``c`` and ``a`` + ``b:c`` differ).
- ``<local>`` names the call inside its run: the engine's is ``<turn>.<position>.<digest>``
  (the n-th ``call_tools`` of the run, the call's place in it, and a digest of the tool's
  name and arguments), so the same call of the same run gets the same id when a run is
  driven again, and any other call gets another one.

The tenant of a call is a function of its id (:func:`tenant_of`): a worker takes it from
the id, and a message whose tenant (or run) header disagrees with its id is refused
(:func:`check_call`). A header can therefore never point a call at another tenant's record.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
import uuid
from dataclasses import dataclass
from typing import Any

from .errors import ForeignCall, InvalidId

#: Message headers the engine sets on a tool call; plain tasks fall back to Celery's ids.
RUN_HEADER = "aaa_run_id"
TOOL_CALL_HEADER = "aaa_tool_call_id"
TENANT_HEADER = "aaa_tenant"
HEADERS = (RUN_HEADER, TOOL_CALL_HEADER, TENANT_HEADER)
#: How many times a call has waited for a concurrency slot (``on_busy="wait"``): its next
#: wait backs off from it. Celery's own ``retries`` stays the task's.
WAITS_HEADER = "aaa_waits"

#: Task names of tools: ``aaa.tool.<tool name>``.
TASK_PREFIX = "aaa.tool."
#: Queue names of pools: ``aaa.<pool>``.
QUEUE_PREFIX = "aaa."

#: Longest tenant, run id and call id accepted, in UTF-8 bytes. A minted call id of the
#: longest tenant and run id (every byte escaped) stays below ``MAX_CALL_ID_BYTES``.
MAX_TENANT_BYTES = 128
MAX_RUN_ID_BYTES = 256
MAX_CALL_ID_BYTES = 1280
#: Longest ``<local>`` part of a tenant-scoped call id (characters of ``[A-Za-z0-9._-]``).
MAX_LOCAL_CHARS = 64

#: Unicode categories refused in ids: control and format characters (newlines that forge
#: log lines, bidi overrides), lone surrogates (no UTF-8 form) and line/paragraph separators.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_RAW = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_NO_TENANT = "~"
_SEGMENT = r"(?:[A-Za-z0-9._-]|~[0-9A-F]{2})+"
_SCOPED = re.compile(rf"({_NO_TENANT}|{_SEGMENT}):({_SEGMENT}):([A-Za-z0-9._-]{{1,{MAX_LOCAL_CHARS}}})")
_ENGINE_LOCAL = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.([0-9a-f]{16})")


def task_name(tool_name: str) -> str:
    """The Celery task name of a tool."""
    return f"{TASK_PREFIX}{tool_name}"


# -- validation ------------------------------------------------------------------------------


def check_id(value: Any, what: str, max_bytes: int) -> str:
    """``value`` if it is a usable id, else raise :class:`~aaa_celery.errors.InvalidId`.

    An id is a non-empty ``str`` of at most ``max_bytes`` UTF-8 bytes without control or
    format characters, lone surrogates, or line and paragraph separators.

    Args:
        value: the id to check.
        what: its name in the error (``"call id"``, ``"tenant"``, ...).
        max_bytes: the longest accepted, in UTF-8 bytes.
    """
    if not isinstance(value, str):
        raise InvalidId(f"{what} must be a str, not {type(value).__name__}", field=what)
    if not value:
        raise InvalidId(f"{what} must not be empty", field=what)
    if value.isascii() and value.isprintable():
        # the usual id, checked without a look-up per character: the only refused ASCII
        # characters are the controls (Cc), which are exactly the unprintable ones
        size = len(value)
    else:
        for position, char in enumerate(value):
            if unicodedata.category(char) in _REFUSED_CATEGORIES:
                raise InvalidId(
                    f"{what} must not contain control or format characters: {char!a} at position {position} "
                    f"of {value[:64]!a}", field=what,
                )
        size = len(value.encode("utf-8"))
    if size > max_bytes:
        raise InvalidId(f"{what} is {size} bytes long, more than the {max_bytes} allowed: {value[:64]!a}…",
                        field=what)
    return value


def check_call_id(call_id: Any) -> str:
    """``call_id`` if it is a usable call id (task id, store key), else raise ``InvalidId``."""
    return check_id(call_id, "call id", MAX_CALL_ID_BYTES)


def check_run_id(run_id: Any) -> str:
    """``run_id`` if it is a usable run id, else raise ``InvalidId``."""
    return check_id(run_id, "run id", MAX_RUN_ID_BYTES)


def check_tenant(tenant: Any) -> str | None:
    """``tenant`` if it is None (no tenant) or a usable tenant, else raise ``InvalidId``."""
    return None if tenant is None else check_id(tenant, "tenant", MAX_TENANT_BYTES)


def usable_tool_call_id(tool_call_id: Any) -> bool:
    """Whether the model's id of a call may travel in the ``aaa_tool_call_id`` header (it only
    threads the transcript; an unusable one is left out, never part of any key)."""
    return _usable(tool_call_id, MAX_CALL_ID_BYTES)


# -- the call id -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallIdentity:
    """What a tenant-scoped call id says about its call.

    Attributes:
        tenant: the call's tenant (None: no tenant).
        run_id: the run it belongs to.
        local: its name inside the run; for the engine's calls ``<turn>.<position>.<digest>``.
    """

    tenant: str | None
    run_id: str
    local: str

    @property
    def turn(self) -> int | None:
        """The engine's turn number (the n-th ``call_tools`` of the run, from 0), else None."""
        found = _ENGINE_LOCAL.fullmatch(self.local)
        return int(found.group(1)) if found else None

    @property
    def position(self) -> int | None:
        """The call's place in its turn (from 0), for the engine's calls, else None."""
        found = _ENGINE_LOCAL.fullmatch(self.local)
        return int(found.group(2)) if found else None


def _escape(value: str) -> str:
    return "".join(c if c in _RAW else "".join(f"~{b:02X}" for b in c.encode("utf-8")) for c in value)


def _unescape(segment: str) -> str | None:
    """The value of an escaped segment, or None if the segment is not in its one canonical form."""
    raw = bytearray()
    i = 0
    while i < len(segment):
        if segment[i] == "~":
            raw.append(int(segment[i + 1:i + 3], 16))
            i += 3
        else:
            raw.append(ord(segment[i]))
            i += 1
    try:
        value = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return value if _escape(value) == segment else None


def call_id(tenant: str | None, run_id: str, local: str | None = None) -> str:
    """The call id of call ``local`` of run ``run_id`` of ``tenant`` (``local``: a fresh
    random one by default). For a plain ``apply_async`` that carries a tenant::

        task.apply_async(kwargs, task_id=call_id("acme", "billing"), headers={TENANT_HEADER: "acme"})

    Raises ``InvalidId`` for an unusable tenant, run id or local part.
    """
    check_tenant(tenant)
    check_run_id(run_id)
    local = uuid.uuid4().hex if local is None else local
    if not re.fullmatch(rf"[A-Za-z0-9._-]{{1,{MAX_LOCAL_CHARS}}}", local):
        raise InvalidId(f"a call's local id must be 1 to {MAX_LOCAL_CHARS} characters of [A-Za-z0-9._-], "
                        f"not {local[:80]!a}", field="local")
    return f"{_NO_TENANT if tenant is None else _escape(tenant)}:{_escape(run_id)}:{local}"


def scope_prefix(tenant: str | None, name: str | None) -> str:
    """``<tenant>:<name>:``, each part escaped as a call id's tenant and run are (``~`` for no
    tenant): the start of a key kept for one tenant and one name (a tool's), so that no two
    distinct (tenant, name) pairs, whatever text they hold, give one prefix. ``name`` None
    gives ``*``, which no name escapes to (a key of the tenant for any name)."""
    check_tenant(tenant)
    if name is not None and (not isinstance(name, str) or not name):
        raise InvalidId(f"a scope's name must be a non-empty str, not {name!r}", field="name")
    return f"{_NO_TENANT if tenant is None else _escape(tenant)}:{'*' if name is None else _escape(name)}:"


def arguments_digest(tool: str, arguments: Any) -> str:
    """A stable 64-bit hex digest of a tool's name and arguments (canonical JSON).

    Unkeyed, so ``arguments`` must hold nothing secret: the engine passes them with every
    secret left out (``Tool.identity``), since the id is shown in logs, events and keys."""
    try:
        shown = json.dumps([tool, arguments], sort_keys=True, separators=(",", ":"), default=repr)
    except (TypeError, ValueError, RecursionError):  # keys of mixed types, too deep: still one digest
        shown = json.dumps([tool, f"<unencodable {type(arguments).__name__}>"])
    return hashlib.sha256(shown.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def mint_call_id(tenant: str | None, run_id: str, turn: int, position: int, tool: str, arguments: Any) -> str:
    """The engine's id for the ``position``-th call of the ``turn``-th ``call_tools`` of a run.

    Deterministic: the same (tenant, run, turn, position, tool, arguments) gives the same
    id, so driving a run again finds each call's recorded result; two model calls that
    differ in any of them are two calls, whatever ids the model gave them.
    """
    if turn < 0 or position < 0:
        raise ValueError(f"turn and position must be >= 0, not {turn}, {position}")
    return call_id(tenant, run_id, f"{turn}.{position}.{arguments_digest(tool, arguments)}")


def parse_call_id(call_id: str) -> CallIdentity | None:
    """The tenant, run and local part of a tenant-scoped call id; None for any other id
    (a plain task id such as Celery's default UUID: no tenant)."""
    found = _SCOPED.fullmatch(call_id) if isinstance(call_id, str) else None
    if found is None:
        return None
    tenant_part, run_part, local = found.groups()
    run_id = _unescape(run_part)
    tenant = None if tenant_part == _NO_TENANT else _unescape(tenant_part)
    if run_id is None or (tenant is None and tenant_part != _NO_TENANT):
        return None
    return CallIdentity(tenant, run_id, local)


def tenant_of(call_id: str) -> str | None:
    """The tenant a call id belongs to (None: no tenant, including every plain task id)."""
    identity = parse_call_id(call_id)
    return None if identity is None else identity.tenant


def check_call(call_id: Any, tenant: Any = None, run_id: Any = None) -> CallIdentity | None:
    """Check a call as a worker receives it: its id, and the tenant and run headers it came with.

    The tenant is part of the call id, so it is the id that says whose call this is. A
    tenant header (or, for a tenant-scoped id, a run header) that names another tenant (or
    run) than the id raises :class:`~aaa_celery.errors.ForeignCall`: a header can never
    point a call at another tenant's record. A tenant header on a plain task id is refused
    too (its key would not hold the tenant); mint the id with :func:`call_id`.

    Returns:
        the parsed id, or None for a plain task id.
    Raises:
        InvalidId: an unusable call id.
        ForeignCall: a tenant or run header that disagrees with the call id, or is unusable
            (a header never makes the worker write a failure under an id that may be another's).
    """
    check_call_id(call_id)
    identity = parse_call_id(call_id)
    if tenant is None and run_id is None:
        return identity  # the usual plain task: nothing to compare
    shown = ascii(call_id[:200])
    if tenant is not None:
        if not _usable(tenant, MAX_TENANT_BYTES):
            raise ForeignCall(f"call {shown} came with an unusable tenant header", call_id=call_id)
        if identity is None or identity.tenant != tenant:
            raise ForeignCall(
                f"call {shown} does not belong to the tenant its message names; a tenant's "
                "call id must be minted for it (aaa_celery.protocol.call_id)", call_id=call_id,
            )
    if run_id is not None:
        if not _usable(run_id, MAX_RUN_ID_BYTES):
            raise ForeignCall(f"call {shown} came with an unusable run header", call_id=call_id)
        if identity is not None and identity.run_id != run_id:
            raise ForeignCall(f"call {shown} does not belong to the run its message names", call_id=call_id)
    return identity


def _usable(value: Any, max_bytes: int) -> bool:
    try:
        check_id(value, "id", max_bytes)
    except InvalidId:
        return False
    return True
