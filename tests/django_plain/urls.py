"""One async view that sends a guarded ``async def`` task and waits for it: under eager test
settings the task runs inside the view's running event loop."""

from django.http import HttpRequest, JsonResponse
from django.urls import path

from .celery_app import lookup


async def order(request: HttpRequest, order_id: str) -> JsonResponse:
    result = lookup.delay(order_id)
    return JsonResponse({"id": result.id, "value": result.get(timeout=10)})


urlpatterns = [path("orders/<str:order_id>", order)]
