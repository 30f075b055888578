"""The MCP tests' tools served over stdio: ``python -m tests.contrib.mcp.stdio_server``
(``AAA_MCP_REDIS``: the fleet's Redis)."""

from __future__ import annotations

import anyio

from aaa_celery.contrib.mcp import GuardedMCPServer

from . import mcp_app

if __name__ == "__main__":
    app = mcp_app.make_app(mcp_app.ledger().url)
    anyio.run(GuardedMCPServer(mcp_app.HANDLER, app, name="shop-stdio", poll_s=0.1).run_stdio)
