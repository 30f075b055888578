"""Views: the pages and JSON endpoints of agent runs (see ``urls.py``).

Pages are rendered by Django's template engine (autoescaped) and carry no inline script;
every response has a Content-Security-Policy with ``script-src 'self'``. POSTs go through
Django's CSRF protection (``csrf_protect``, so it holds even without the middleware): the
pages' script sends the token in the ``X-CSRFToken`` header, an API client reads it from
``GET csrf`` (which also sets the CSRF cookie). Each view asks the ``AUTHORIZE`` hook.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import get_token
from django.shortcuts import redirect
from django.template import Context, Engine
from django.urls import reverse
from django.views.decorators.csrf import csrf_protect, ensure_csrf_cookie
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from ...runtime import PendingApproval
from ...runtime.sync import SyncRunHandle
from .._pages import SECURITY_HEADERS, static, template
from .._web import AgentRuns, TenantRefused, body_too_large, etag
from .runs import get_runs

#: Django's template engine on its own (autoescaping on), for the two pages only.
_templates = Engine(autoescape=True)
#: The form field Django's CSRF protection reads.
CSRF_FIELD = "csrfmiddlewaretoken"


def _body(request: HttpRequest) -> dict[str, Any]:
    if request.content_type == "application/json":
        try:
            data = json.loads(request.body or b"{}")
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}
    return request.POST.dict()


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _forbidden() -> JsonResponse:
    return _error(403, "AUTHORIZE(request, run, call) refused this request")


def _secured(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Add the pages' security headers (CSP without inline script) to the view's responses."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    return wrapped


def _runs_view(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Pass the process's runs; an unknown run or call is a 404."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, get_runs(), *args, **kwargs)
        except KeyError as e:
            raise Http404(str(e.args[0] if e.args else e)) from None

    return wrapped


def _run(runs: AgentRuns, request: HttpRequest, run_id: str) -> SyncRunHandle | None:
    """The run (``KeyError`` if unknown), or None if this request may not see it."""
    handle = runs.handle(run_id, request)
    return handle if runs.allowed(request, handle) else None


def _base() -> str:
    return reverse("aaa_celery:index").rstrip("/")


def _page(request: HttpRequest, name: str, **values: str) -> HttpResponse:
    context = Context({"base": _base(), "csrf": get_token(request), "csrf_field": CSRF_FIELD, **values})
    return HttpResponse(_templates.from_string(template(name)).render(context))


@require_GET
@_secured
@ensure_csrf_cookie
@_runs_view
def index(request: HttpRequest, runs: AgentRuns) -> HttpResponse:
    """Page: start a run, pending approvals, runs."""
    if not runs.allowed(request):
        return _forbidden()
    return _page(request, "index")


@require_GET
@_secured
@ensure_csrf_cookie
def csrf(request: HttpRequest) -> HttpResponse:
    """JSON: the CSRF token to send back in ``X-CSRFToken`` (the CSRF cookie comes with it)."""
    return JsonResponse({"csrf_token": get_token(request)})


@require_GET
@_secured
def static_file(request: HttpRequest, name: str) -> HttpResponse:
    """The pages' script and stylesheet."""
    try:
        body, content_type = static(name)
    except KeyError:
        raise Http404(name) from None
    return HttpResponse(body, content_type=content_type)


@require_http_methods(["GET", "POST"])
@_secured
@csrf_protect
@_runs_view
def runs_view(request: HttpRequest, runs: AgentRuns) -> HttpResponse:
    """GET: every run the request may see (JSON). POST: start a run from ``task``, in the app's
    tenant (``TENANT(request)``; a ``tenant`` in the body must be that one, else 403)."""
    if not runs.allowed(request):
        return _forbidden()
    if request.method != "POST":
        return JsonResponse({"runs": runs.runs(request)})
    try:
        length: int | None = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = None
    too_large = body_too_large(runs.settings, length)
    if too_large is not None:
        return _error(413, too_large)
    body = _body(request)
    if not body.get("task"):
        return _error(400, "'task' is required")
    try:
        tenant = runs.tenant_for(request, body.get("tenant"))
    except TenantRefused as e:
        return _error(403, str(e))
    handle = runs.start(str(body["task"]), tenant)
    url = reverse("aaa_celery:run", args=[handle.run_id])
    if request.content_type == "application/json":
        return JsonResponse({"run_id": handle.run_id, "url": url}, status=201)
    return redirect(url)


@require_GET
@_secured
@ensure_csrf_cookie
@_runs_view
def show_run(request: HttpRequest, runs: AgentRuns, run_id: str) -> HttpResponse:
    """Page: a run's live events, its pending approvals with Approve/Deny, its calls' attempts."""
    if _run(runs, request, run_id) is None:
        return _forbidden()
    return _page(request, "run", run_id=run_id)


@require_GET
@_secured
@_runs_view
def events(request: HttpRequest, runs: AgentRuns, run_id: str) -> HttpResponse:
    """JSON: status, events after ``?after=N``, pending approvals, result."""
    if _run(runs, request, run_id) is None:
        return _forbidden()
    try:
        after = int(request.GET.get("after", 0))
    except ValueError:
        after = 0
    return JsonResponse(runs.run(run_id, after, request))


@require_GET
@_secured
@_runs_view
def attempts(request: HttpRequest, runs: AgentRuns, run_id: str) -> HttpResponse:
    """JSON: each call's audit trail from the store."""
    if _run(runs, request, run_id) is None:
        return _forbidden()
    return JsonResponse({"calls": runs.attempts(run_id, request)})


@require_GET
@_secured
@_runs_view
def approvals(request: HttpRequest, runs: AgentRuns) -> HttpResponse:
    """JSON: a page of the pending approvals of the runs the request may see (``?limit=N&after=C``,
    ``next``: the cursor of the next page), with an ETag (a poll that finds nothing new: 304)."""
    if not runs.allowed(request):
        return _forbidden()
    try:
        page = runs.approvals_page(request, request.GET.get("limit"), request.GET.get("after"))
    except ValueError as e:
        return _error(400, str(e))
    tag = etag(page)
    if tag in [t.strip() for t in request.headers.get("If-None-Match", "").split(",")]:
        response: HttpResponse = HttpResponse(status=304)
    else:
        response = JsonResponse(page)
    response.headers["ETag"] = tag
    response.headers["Cache-Control"] = "no-cache"
    return response


@require_POST
@_secured
@csrf_protect
@_runs_view
def decide(request: HttpRequest, runs: AgentRuns, run_id: str, call_id: str) -> HttpResponse:
    """A person's decision: ``decision`` approve|deny, ``digest`` (required: what was shown) and ``reason``."""
    handle = _run(runs, request, run_id)
    if handle is None:
        return _forbidden()
    pending: PendingApproval = runs.pending(run_id, call_id, request)
    if not runs.allowed(request, handle, pending):
        return _forbidden()
    body = _body(request)
    try:
        runs.decide(run_id, call_id, str(body.get("decision", "")), digest=body.get("digest"),
                    reason=str(body.get("reason") or ""), request=request)
    except ValueError as e:
        return _error(409, str(e))
    if request.content_type == "application/json":
        return JsonResponse({"run_id": run_id, "call_id": call_id, "decision": body.get("decision")})
    return redirect(reverse("aaa_celery:run", args=[run_id]))
