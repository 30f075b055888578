"""Views: the pages and JSON endpoints of agent runs (see ``urls.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse, HttpResponseForbidden, JsonResponse
from django.middleware.csrf import get_token
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from .._web import AgentRuns, page
from .runs import get_runs


def _body(request: HttpRequest) -> dict[str, Any]:
    if request.content_type == "application/json":
        try:
            data = json.loads(request.body or b"{}")
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}
    return request.POST.dict()


def _allowed(action: str) -> Callable[..., Any]:
    """Run the view only if ``AUTHORIZE(request, action)`` allows it; pass it the runs."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            runs = get_runs()
            if not runs.allowed(request, action):
                return HttpResponseForbidden()
            try:
                return view(request, runs, *args, **kwargs)
            except KeyError as e:
                raise Http404(str(e)) from None

        wrapped.__name__ = view.__name__
        wrapped.__doc__ = view.__doc__
        return wrapped

    return decorate


def _base() -> str:
    return reverse("aaa_celery:index").rstrip("/")


@require_GET
@_allowed("view")
def index(request: HttpRequest, runs: AgentRuns) -> HttpResponse:
    """Page: start a run, pending approvals, runs."""
    return HttpResponse(page("index", base=_base(), csrf=get_token(request)))


@require_http_methods(["GET", "POST"])
def runs_view(request: HttpRequest) -> HttpResponse:
    """GET: every run (JSON). POST: start a run from ``task`` (and ``tenant``)."""
    return _start(request) if request.method == "POST" else _list(request)


@_allowed("view")
def _list(request: HttpRequest, runs: AgentRuns) -> HttpResponse:
    return JsonResponse({"runs": runs.runs()})


@_allowed("start")
def _start(request: HttpRequest, runs: AgentRuns) -> HttpResponse:
    body = _body(request)
    if not body.get("task"):
        return JsonResponse({"error": "'task' is required"}, status=400)
    handle = runs.start(str(body["task"]), body.get("tenant"))
    url = reverse("aaa_celery:run", args=[handle.run_id])
    if request.content_type == "application/json":
        return JsonResponse({"run_id": handle.run_id, "url": url}, status=201)
    return redirect(url)


@require_GET
@_allowed("view")
def show_run(request: HttpRequest, runs: AgentRuns, run_id: str) -> HttpResponse:
    """Page: a run's live events, its pending approvals with Approve/Deny, its calls' attempts."""
    runs.engine.get(run_id)
    get_token(request)  # sets the CSRF cookie the page's buttons send back
    return HttpResponse(page("run", base=_base(), run_id=run_id))


@require_GET
@_allowed("view")
def events(request: HttpRequest, runs: AgentRuns, run_id: str) -> HttpResponse:
    """JSON: status, events after ``?after=N``, pending approvals, result."""
    try:
        after = int(request.GET.get("after", 0))
    except ValueError:
        after = 0
    return JsonResponse(runs.run(run_id, after))


@require_GET
@_allowed("view")
def attempts(request: HttpRequest, runs: AgentRuns, run_id: str) -> HttpResponse:
    """JSON: each call's audit trail from the store."""
    return JsonResponse({"calls": runs.attempts(run_id)})


@require_GET
@_allowed("view")
def approvals(request: HttpRequest, runs: AgentRuns) -> HttpResponse:
    """JSON: every pending approval."""
    return JsonResponse({"approvals": runs.approvals()})


@require_POST
@_allowed("decide")
def decide(request: HttpRequest, runs: AgentRuns, run_id: str, call_id: str) -> HttpResponse:
    """A person's decision: ``decision`` approve|deny, optional ``digest`` (what was shown) and ``reason``."""
    body = _body(request)
    try:
        runs.decide(run_id, call_id, str(body.get("decision", "")), digest=body.get("digest"),
                    reason=str(body.get("reason") or ""))
    except ValueError as e:
        return JsonResponse({"error": str(e)}, status=409)
    if request.content_type == "application/json":
        return JsonResponse({"run_id": run_id, "call_id": call_id, "decision": body.get("decision")})
    return redirect(reverse("aaa_celery:run", args=[run_id]))
