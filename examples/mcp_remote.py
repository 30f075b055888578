"""A remote MCP server's tools as guarded tools on your fleet.

    celery --workdir examples -A mcp_remote worker -c 2
"""

from __future__ import annotations

import os

from celery import Celery

from aaa_celery.contrib.mcp import RemoteServer, remote_tool
from aaa_celery.tools import ToolHandler, ToolRegistry

REDIS = os.environ.get("AAA_REDIS", "redis://localhost:6379/0")

payments = RemoteServer(
    "payments", "https://payments.example.com/mcp",
    trusted=False,  # its annotations are not believed: every unpinned tool runs at_most_once
    pins={"get_balance": "at_least_once"},  # the operator knows this one is a read
)
handler = ToolHandler(ToolRegistry([remote_tool(payments, "pay"), remote_tool(payments, "get_balance")]))
app = Celery("mcp_remote_example", broker=REDIS, backend=REDIS)
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"], aaa_store_url=REDIS,
                worker_prefetch_multiplier=1)
handler.bind(app)
# handler.task("payments_pay").delay(arguments={"to": "ACME", "amount_cents": 500})
