"""The shop's own views: one starts a run, one approves its pending cancellation."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_POST

from aaa_celery.contrib.django import get_runs


@require_POST
def request_refund(request: HttpRequest, order_id: str) -> HttpResponse:
    """Start an agent run that checks the order and asks to cancel it."""
    handle = get_runs().start(f"cancel order {order_id}", tenant=request.POST.get("customer"))
    return JsonResponse({"run_id": handle.run_id, "page": f"/aaa/runs/{handle.run_id}"}, status=201)


@require_POST
def approve_refund(request: HttpRequest, run_id: str, call_id: str) -> HttpResponse:
    """A person approves the pending cancellation (put your staff check here)."""
    get_runs().decide(run_id, call_id, "approve", digest=request.POST.get("digest"))
    return JsonResponse({"approved": call_id})
