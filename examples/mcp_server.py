"""Serve the example's tools over MCP (streamable HTTP at http://127.0.0.1:8000/mcp).

    AAA_REDIS=redis://localhost:6379/0 python examples/mcp_server.py
"""

from __future__ import annotations

import uvicorn

from aaa_celery.contrib.mcp import GuardedMCPServer

from mcp_tools import app, handler

server = GuardedMCPServer(handler, app, name="shop", tenant="acme")

if __name__ == "__main__":
    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=8000)
