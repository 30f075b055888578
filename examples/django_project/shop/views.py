"""The shop's own views: one starts a run, one approves its pending cancellation.

Both are POSTs under Django's CSRF protection: send the token from ``GET /aaa/csrf`` in the
``X-CSRFToken`` header, with the CSRF cookie (see README.md).
"""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_POST

from aaa_celery.contrib.django import get_runs

from .auth import authorize


@require_POST
def request_refund(request: HttpRequest, order_id: str) -> HttpResponse:
    """Start an agent run that checks the order and asks to cancel it, in the app's tenant for
    this person (``TENANT``): a ``customer`` that names another one is refused."""
    runs = get_runs()
    try:
        tenant = runs.tenant_for(request, request.POST.get("customer"))
    except PermissionError as e:
        return JsonResponse({"error": str(e)}, status=403)
    handle = runs.start(f"cancel order {order_id}", tenant=tenant)
    return JsonResponse({"run_id": handle.run_id, "page": f"/aaa/runs/{handle.run_id}"}, status=201)


@require_POST
def approve_refund(request: HttpRequest, run_id: str, call_id: str) -> HttpResponse:
    """A person approves the pending cancellation they were shown (its ``digest``)."""
    runs = get_runs()
    try:
        run, call = runs.handle(run_id), runs.pending(run_id, call_id)
    except KeyError:
        raise Http404("no such pending call") from None
    if not authorize(request, run, call):
        return JsonResponse({"error": "not allowed"}, status=403)
    try:
        runs.decide(run_id, call_id, "approve", digest=request.POST.get("digest"))
    except ValueError as e:
        return JsonResponse({"error": str(e)}, status=409)
    return JsonResponse({"approved": call_id})
