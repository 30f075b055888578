from django.urls import include, path

from shop import views

urlpatterns = [
    path("aaa/", include("aaa_celery.contrib.django.urls")),
    path("refunds/<str:order_id>", views.request_refund, name="request-refund"),
    path("refunds/<str:run_id>/approve/<str:call_id>", views.approve_refund, name="approve-refund"),
]
