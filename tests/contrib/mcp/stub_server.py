"""A stub remote MCP server written with the official SDK, run as its own process:
``python -m tests.contrib.mcp.stub_server PORT LOG``. Each ``tools/call`` it receives is
appended to LOG (one JSON line) before the tool runs. Tools:

- ``pay(to, amount)``: destructive (the defaults); sleeps 30 s, so a test can kill the server mid-call;
- ``balance(account)``: read-only; sleeps ``AAA_STUB_READ_S`` seconds (default 0).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server


def main() -> None:
    port, log = int(sys.argv[1]), sys.argv[2]

    async def list_tools(ctx: ServerRequestContext[Any, Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[
            types.Tool(name="pay", input_schema={"type": "object"}),
            types.Tool(name="balance", input_schema={"type": "object"},
                       annotations=types.ToolAnnotations(read_only_hint=True)),
        ])

    async def call_tool(ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        with open(log, "a") as f:
            f.write(json.dumps({"tool": params.name, "arguments": params.arguments, "pid": os.getpid()}) + "\n")
        if params.name == "pay":
            await asyncio.sleep(30)
            return types.CallToolResult(content=[types.TextContent(type="text", text="paid")])
        await asyncio.sleep(float(os.environ.get("AAA_STUB_READ_S", "0")))
        return types.CallToolResult(content=[types.TextContent(type="text", text="balance 42")],
                                    structured_content={"balance": 42})

    server: Server[Any] = Server("stub", on_list_tools=list_tools, on_call_tool=call_tool)
    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
