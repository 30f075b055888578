"""Call the example server with the official MCP client, as a task (the tasks extension).

    python examples/mcp_client.py
"""

from __future__ import annotations

import anyio
from mcp import Client

from aaa_celery.contrib.mcp import TasksExtension


async def main() -> None:
    async with Client("http://127.0.0.1:8000/mcp", extensions=[TasksExtension()]) as client:
        for t in (await client.list_tools()).tools:
            print(t.name, t.annotations)
        result = await client.call_tool("refund", {"order_id": "A-1", "amount_cents": 500})
        print(result.structured_content)


if __name__ == "__main__":
    anyio.run(main)
