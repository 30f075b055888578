"""What the web integrations share: settings, one engine per process, the ``authorize`` hook, JSON views.

The Flask extension and the Django app are thin adapters over :class:`AgentRuns`.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
import importlib
import inspect
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, overload

from ..algos import ToolLoop
from ..errors import ConfigError
from ..lifecycle import TOOL_REQUESTED
from ..llm import LLMHandler
from ..runtime import ANY_TENANT, Engine, PendingApproval, SyncEngine
from ..runtime.approvals import DEFAULT_APPROVAL_TTL_S, check_ttl
from ..runtime.sync import SyncRunHandle

logger = logging.getLogger("aaa_celery.contrib")

#: Allowed decisions on a pending approval, as posted by a person.
DECISIONS = ("approve", "deny")
#: Pending approvals per page of ``GET approvals`` (``?limit=``: at most :data:`MAX_PAGE`).
DEFAULT_PAGE, MAX_PAGE = 100, 500


def load(value: Any) -> Any:
    """``"pkg.module:attr"`` (or ``"pkg.module.attr"``) → the object; anything else as is."""
    if not isinstance(value, str):
        return value
    module, sep, attr = value.partition(":")
    if not sep:
        module, _, attr = value.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ImportError(f"aaa_celery: cannot import {value!r} (use 'package.module:attribute')") from e


@dataclass
class Settings:
    """How a web app drives agent runs (Flask: ``AAA_CELERY_<FIELD>``; Django: ``AAA_CELERY = {FIELD: ...}``)."""

    app: Any = None
    """The fleet's Celery app, or its import path (``"proj.celery:app"``). None: the embedded engine."""
    tools: Any = None
    """A ``ToolHandler``, a list of them, or an import path: the tools of every run."""
    llm: Any = None
    """The model client (with ``async complete(request)``) or an ``LLMHandler``, or an import path."""
    algorithm: Any = None
    """The algorithm of every run, or an import path. Default: ``ToolLoop`` over every tool."""
    authorize: Any = None
    """``authorize(request, run, call) -> bool``, or its import path: whether ``request`` may see or act.
    ``run`` is the run concerned (a ``SyncRunHandle``; None to list or start runs), ``call`` the
    ``PendingApproval`` being approved or denied (None unless deciding). Required: without it the
    routes refuse to serve, unless ``allow_anonymous`` is set."""
    tenant: Any = None
    """``tenant(request) -> str | None``, or its import path: the tenant of the runs ``request``
    starts, from the app's own knowledge of the person (their session, their account), never
    from what the request says. A request whose body names another tenant is refused (403).
    Unset: runs have no tenant, and a body that names one is refused (unless ``allow_anonymous``)."""
    allow_anonymous: bool = False
    """Development only: serve every route, approvals included, to anyone who can reach them (logs a
    warning). Never in production: an approval must come from a person you know."""
    approval_ttl_s: float = DEFAULT_APPROVAL_TTL_S
    """How long a call waits for a person, in seconds (default 24 h); then it fails as ApprovalExpired."""
    max_body_bytes: int = 64 * 1024
    """The largest body of ``POST /runs`` (starting a run), in bytes; a larger one is refused (413)."""
    url_prefix: str = "/aaa"
    """Flask only: where the blueprint's routes live."""
    auto_resume: bool = False
    """Resume, in this process, runs whose process died (``Engine(auto_resume=True)``,
    docs/durable-runs.md): with several web processes, a deploy or a crash loses no run."""
    run_lease_s: float = 30.0
    """How long a run's lease lasts without its driver's heartbeat (``Engine(run_lease_s=...)``)."""

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], prefix: str = "") -> Settings:
        """Read ``<prefix><FIELD>`` keys (upper case), ignoring the rest."""
        found = {f.name: values[prefix + f.name.upper()] for f in fields(cls) if prefix + f.name.upper() in values}
        unknown = sorted(k for k in values if k.startswith(prefix) and k[len(prefix):].lower() not in found)
        if prefix == "" and unknown:
            raise ValueError(f"AAA_CELERY: unknown keys {unknown}; known: {[f.name.upper() for f in fields(cls)]}")
        return cls(**found)


ANONYMOUS_REFUSED = (
    "aaa_celery: the agent-run routes need an AUTHORIZE hook, authorize(request, run, call) -> bool, that "
    "says who may see runs and approve or deny calls (Flask: AAA_CELERY_AUTHORIZE; Django: "
    "AAA_CELERY['AUTHORIZE']). For development only, ALLOW_ANONYMOUS=True serves them to anyone."
)


def check_authorize(settings: Settings) -> Callable[[Any, Any, Any], Any] | None:
    """The settings' ``authorize`` hook, loaded and checked; None when anonymous access is allowed.

    Raises:
        ConfigError: no hook and no ``allow_anonymous``, or a hook that does not take
            ``(request, run, call)``.
    """
    hook = load(settings.authorize)
    if hook is None:
        if settings.allow_anonymous is not True:
            raise ConfigError(ANONYMOUS_REFUSED)
        logger.warning("aaa_celery: ALLOW_ANONYMOUS is set: anyone who reaches the agent-run routes can "
                       "approve calls. Set AUTHORIZE for anything but development.")
        return None
    return _checked_hook(hook, "AUTHORIZE", "authorize(request, run, call) -> bool", 3,
                         "; the older (request, action) hook is gone: a call is being decided when call is not None")


def _checked_hook(hook: Any, name: str, shape: str, arity: int, why: str) -> Callable[..., Any]:
    """``hook`` if it is a function that takes ``arity`` arguments, else ``ConfigError`` naming the shape."""
    if not callable(hook):
        raise ConfigError(f"aaa_celery: {name} must be a function {shape}, got {hook!r}")
    try:
        inspect.signature(hook).bind(*[None] * arity)
    except TypeError:
        raise ConfigError(f"aaa_celery: {name} {hook!r} must take ({shape.split('(')[1].split(')')[0]}){why}") from None
    except ValueError:  # no signature to read (a builtin): trust it
        pass
    return hook  # type: ignore[no-any-return]


class TenantRefused(PermissionError):
    """A request that names a tenant for its run other than the app's (403)."""


def check_tenant_hook(settings: Settings) -> Callable[[Any], Any] | None:
    """The settings' ``tenant`` hook, loaded and checked (``ConfigError`` naming the fix)."""
    hook = load(settings.tenant)
    if hook is None:
        return None
    return _checked_hook(hook, "TENANT", "tenant(request) -> str | None", 1,
                         ": it says the tenant of the runs the request starts")


def _whole(value: Any, name: str) -> int:
    try:
        return int(str(value))
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {str(value)[:40]!r}") from None


def _place(p: dict[str, Any]) -> tuple[float, str]:
    """Where a pending approval stands in the pages: oldest first, then by call id."""
    return float(p.get("since") or 0.0), str(p.get("call_id"))


def _encode_cursor(place: tuple[float, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps([place[0], place[1]]).encode()).decode().rstrip("=")


def _cursor(text: Any) -> tuple[float, str]:
    """A page cursor (``next``) read back; ``ValueError`` for anything else."""
    try:
        raw = str(text)
        since, call_id = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        return float(since), str(call_id)
    except (ValueError, TypeError, binascii.Error):
        raise ValueError("after must be the 'next' cursor of the page before") from None


def etag(payload: Any) -> str:
    """A strong ETag of a JSON response: a poll that finds nothing new gets a 304."""
    body = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return '"' + hashlib.sha256(body.encode("utf-8", "surrogatepass")).hexdigest()[:32] + '"'


def body_too_large(settings: Settings, length: int | None) -> str | None:
    """Why a body of ``length`` bytes is refused (413), or None."""
    bound = settings.max_body_bytes
    if length is not None and length > bound:
        return f"the body has {length} bytes, more than MAX_BODY_BYTES={bound}"
    return None


@overload
def _plain(value: dict[str, Any]) -> dict[str, Any]: ...


@overload
def _plain(value: list[Any]) -> list[Any]: ...


def _plain(value: dict[str, Any] | list[Any]) -> dict[str, Any] | list[Any]:
    """A JSON-ready copy (anything unknown becomes its ``str``)."""
    plain: dict[str, Any] | list[Any] = json.loads(json.dumps(value, default=str))
    return plain


class AgentRuns:
    """One process's agent runs for a web app: a :class:`SyncEngine` plus JSON views of runs."""

    def __init__(self, settings: Settings) -> None:
        if settings.tools is None or settings.llm is None:
            raise ValueError("aaa_celery: set TOOLS (a ToolHandler) and LLM (a model client) to run agents")
        self.settings = settings
        self._authorize = check_authorize(settings)
        self._tenant = check_tenant_hook(settings)
        ttl_s = check_ttl(settings.approval_ttl_s, "APPROVAL_TTL_S")
        self.engine = SyncEngine(Engine(app=load(settings.app), approval_ttl_s=ttl_s,
                                        run_lease_s=settings.run_lease_s, auto_resume=settings.auto_resume))
        tools = load(settings.tools)
        for handler in tools if isinstance(tools, list | tuple) else [tools]:
            load(handler).attach(self.engine)
        llm = load(settings.llm)
        (llm if isinstance(llm, LLMHandler) else LLMHandler(llm)).attach(self.engine)
        algorithm = load(settings.algorithm)
        self.algorithm = algorithm if algorithm is not None else ToolLoop(self.engine.engine.tools.registry)
        self.engine.add_algo(self.algorithm)  # so this process can resume the runs of any process

    def allowed(self, request: Any, run: SyncRunHandle | None = None, call: PendingApproval | None = None) -> bool:
        """Whether ``request`` may list or start runs (no ``run``), see ``run``, or decide ``call``
        (the ``authorize`` hook; True for anyone when anonymous access is allowed)."""
        return True if self._authorize is None else self._authorize(request, run, call) is True

    def tenant_for(self, request: Any, named: Any = None) -> str | None:
        """The tenant of a run ``request`` starts: the app's ``TENANT(request)``, never the request's.

        ``named`` is the tenant the request's body names, if any: it must be that one.

        Raises:
            TenantRefused: ``named`` is another tenant (or there is no ``TENANT`` hook to say
                whose the person is, and anonymous access is not allowed).
        """
        asked = None if named in (None, "") else str(named)
        if self._tenant is None:
            if asked is None or self.settings.allow_anonymous is True:
                return asked  # development (ALLOW_ANONYMOUS): anyone may do anything
            raise TenantRefused(f"a run's tenant is the app's: set the TENANT hook, tenant(request) -> str, "
                                f"to start runs in tenant {asked!r}")
        tenant = self._app_tenant(self._tenant, request)
        if asked is not None and asked != tenant:
            raise TenantRefused(f"this request may not start a run in tenant {asked!r}: its tenant is the "
                                f"app's (TENANT(request))")
        return tenant

    def handle(self, run_id: str, request: Any = None) -> SyncRunHandle:
        """The run ``run_id`` (``KeyError`` if unknown). Where the id names runs of several
        tenants (a store written before run ids were one tenant's, or two starts that raced),
        the run of ``request``'s tenant (``TENANT(request)``), else ``KeyError`` (a 404)."""
        try:
            return self.engine.get(run_id)
        except KeyError:
            if self._tenant is None or request is None:
                raise
            return self.engine.get(run_id, tenant=self._tenant(request))

    @staticmethod
    def _app_tenant(hook: Callable[[Any], Any], request: Any) -> str | None:
        """``TENANT(request)``, checked (an empty one is no tenant)."""
        tenant = hook(request)
        if tenant is not None and not isinstance(tenant, str):
            raise ConfigError(f"aaa_celery: TENANT must return a tenant (str) or None, got {tenant!r}")
        return tenant or None

    def listed_tenant(self, request: Any) -> Any:
        """Whose runs a list for ``request`` reads: ``TENANT(request)``'s with a ``TENANT`` hook,
        so a poll costs that tenant's runs, not every tenant's; every tenant's without one (or
        without a request). ``authorize`` still sees each run listed."""
        if self._tenant is None or request is None:
            return ANY_TENANT
        return self._app_tenant(self._tenant, request)

    def pending(self, run_id: str, call_id: str, request: Any = None) -> PendingApproval:
        """The call ``call_id`` of run ``run_id`` that waits for a person (``KeyError`` if none)."""
        for p in self.handle(run_id, request).pending_approvals():
            if p.call_id == call_id:
                return p
        raise KeyError(f"no pending approval for call_id {call_id!r} in run {run_id!r}")

    def start(self, task: str, tenant: str | None = None) -> SyncRunHandle:
        """Start a run of the algorithm on ``{"task": task}``."""
        return self.engine.start(self.algorithm, {"task": task}, tenant=tenant or None)

    def run(self, run_id: str, after: int = 0, request: Any = None) -> dict[str, Any]:
        """A run's status, events (``seq > after``), pending approvals and outcome (``KeyError`` if unknown)."""
        handle = self.handle(run_id, request)
        outcome = handle.outcome
        return _plain({
            "run_id": run_id,
            "tenant": handle.tenant,
            "status": handle.status,
            "resumed": handle.resumed,
            "events": handle.events(after),
            "pending": [p.to_dict() for p in handle.pending_approvals()],
            "result": None if outcome is None else {"value": outcome.value, "error": outcome.error},
        })

    def runs(self, request: Any = None) -> list[dict[str, Any]]:
        """The newest runs (of ``request``'s tenant, :meth:`listed_tenant`, that it may see, when
        given), newest first: id, tenant and status."""
        return [{"run_id": h.run_id, "tenant": h.tenant, "status": h.status, "resumed": h.resumed}
                for h in self.engine.runs(tenant=self.listed_tenant(request))
                if request is None or self.allowed(request, h)]

    def approvals(self, request: Any = None) -> list[dict[str, Any]]:
        """Every pending approval (of the runs of ``request``'s tenant, :meth:`listed_tenant`, that
        it may see, when given), oldest first: tool, arguments, run, tenant, since, expiry and digest."""
        seen: dict[tuple[str | None, str], bool] = {}

        def visible(p: PendingApproval) -> bool:
            key = (p.tenant, p.run_id)  # a run id may name runs of several tenants (see ``handle``)
            if key not in seen:
                try:
                    seen[key] = self.allowed(request, self.engine.get(p.run_id, tenant=p.tenant))
                except KeyError:  # the run ended since it was listed
                    seen[key] = False
            return seen[key]

        pending = self.engine.pending_approvals(tenant=self.listed_tenant(request))
        return _plain([p.to_dict() for p in pending if request is None or visible(p)])

    def approvals_page(self, request: Any, limit: Any = None, after: Any = None) -> dict[str, Any]:
        """A page of :meth:`approvals`: at most ``limit`` (default 100, at most 500) after the
        cursor ``after`` (the ``next`` of the page before), and the ``next`` cursor (None at the
        end). ``ValueError`` for a bad limit or cursor (a 400)."""
        size = DEFAULT_PAGE if limit in (None, "") else _whole(limit, "limit")
        if not 1 <= size <= MAX_PAGE:
            raise ValueError(f"limit must be 1 to {MAX_PAGE}, got {size}")
        every = sorted(self.approvals(request), key=_place)
        start = 0 if after in (None, "") else bisect.bisect_right([_place(p) for p in every], _cursor(after))
        page = every[start:start + size]
        more = start + size < len(every)
        return {"approvals": page, "next": _encode_cursor(_place(page[-1])) if more and page else None}

    def decide(self, run_id: str, call_id: str, decision: str, *, digest: str | None, reason: str = "",
               tenant: str | None = None, request: Any = None) -> None:
        """A person's decision on a pending call, bound to the request shown by its ``digest``.

        ``tenant``, when given, must be the run's tenant (an app's own view passes the
        tenant of the person deciding).

        Raises ``KeyError`` (no such run or pending call, or another tenant's) or
        ``ValueError`` (another decision, no digest, or the digest of something else than
        was shown).
        """
        if decision not in DECISIONS:
            raise ValueError(f"decision must be one of {DECISIONS}, got {decision!r}")
        handle = self.handle(run_id, request) if tenant is None else self.engine.get(run_id, tenant=tenant)
        if tenant is not None and tenant != handle.tenant:
            raise KeyError(f"no run {run_id!r} for tenant {tenant!r}")
        if not isinstance(digest, str) or not digest:
            raise ValueError("a decision must carry the 'digest' of the approval shown (see GET approvals)")
        if decision == "approve":
            handle.approve(call_id, digest)
        else:
            handle.deny(call_id, digest, reason)

    def attempts(self, run_id: str, request: Any = None) -> list[dict[str, Any]]:
        """Each tool call of the run with its audit trail from the store (attempts, result)."""
        handle = self.handle(run_id, request)
        requested = [e["data"] for e in handle.events() if e["type"] == TOOL_REQUESTED]
        store = self.engine.store
        out = []
        for call in requested:
            call_id = call["call_id"]
            trail = [{"type": e.type, "attempt": e.attempt, "at": e.at, "data": e.data} for e in store.events(call_id)]
            out.append({"call_id": call_id, "tool_call_id": call.get("tool_call_id"), "name": call["name"],
                        "task_id": call_id, "trail": trail})
        return _plain(out)

    def close(self) -> None:
        """Stop the engine (cancels the runs still going)."""
        self.engine.close()
