"""The test shop's orders table (Django): a refund adds to ``refunded_cents`` and counts ``refunds``."""

from django.db import models


class Order(models.Model):
    id = models.TextField(primary_key=True)
    refunded_cents = models.IntegerField(default=0)
    refunds = models.IntegerField(default=0)

    class Meta:
        app_label = "shop"
        db_table = "shop_orders"
