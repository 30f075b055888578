"""An OpenAI Agents SDK agent whose tools run as guarded Celery tasks, offline.

The model is a local stub server that speaks the Chat Completions wire format on
loopback (no network, no key); tracing is off. Redis is the broker, the result backend
and the store (``AAA_REDIS_URL``, default ``redis://localhost:6379/0``)::

    python examples/openai_agents_refund.py worker     # terminal 1: a worker of the fleet
    python examples/openai_agents_refund.py            # terminal 2: the agent

The agent searches (``at_least_once``) and refunds (``at_most_once``); run it twice and
the second run finds both calls' recorded results: the refund is not made again.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from celery import Celery

from aaa_celery.tools import ToolHandler, ToolRegistry, tool

URL = os.environ.get("AAA_REDIS_URL", "redis://localhost:6379/0")


def search(query: str) -> str:
    """Search the order book."""
    return f"order A-100: 30 EUR, paid ({query})"


def refund(order_id: str, amount: int) -> str:
    """Refund an order (never twice)."""
    print(f"REFUND {amount} EUR on {order_id}", flush=True)
    return f"refunded {amount} EUR on {order_id}"


handler = ToolHandler(ToolRegistry([tool(search, delivery="at_least_once"),
                                    tool(refund, delivery="at_most_once")]))
app = Celery("openai_agents_refund", broker=URL, backend=URL)
app.conf.update(task_serializer="json", result_serializer="json", accept_content=["json"], aaa_store_url=URL,
                worker_prefetch_multiplier=1)
handler.bind(app)


class StubModel(BaseHTTPRequestHandler):
    """``POST /v1/chat/completions``: first the two tool calls, then a text with their outputs."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        tool_outputs = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if not tool_outputs:
            message["tool_calls"] = [
                {"id": "call_1", "type": "function",
                 "function": {"name": "search", "arguments": json.dumps({"query": "A-100"})}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "refund", "arguments": json.dumps({"order_id": "A-100", "amount": 30})}},
            ]
        else:
            message["content"] = "Done: " + "; ".join(tool_outputs)
        reply = json.dumps({"id": "stub", "object": "chat.completion", "created": int(time.time()),
                            "model": "stub", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


async def main() -> None:
    # the web process's imports: a worker runs the tools and never needs the SDK
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    from aaa_celery.contrib.openai_agents import AgentTools

    set_tracing_disabled(True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), StubModel)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    model = OpenAIChatCompletionsModel(
        model="stub", openai_client=AsyncOpenAI(base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
                                                api_key="offline"))
    guard = AgentTools(app, handler)
    agent = Agent(name="support", instructions="Refund paid orders.", tools=list(guard.function_tools()),
                  model=model)
    with guard.run(run_id="ticket-4711", tenant="acme"):
        result = await Runner.run(agent, "Please refund order A-100.")
    print(result.final_output)
    server.shutdown()


if __name__ == "__main__":
    if sys.argv[1:] == ["worker"]:
        app.worker_main(["worker", "-Q", "aaa.default", "-c", "2", "--loglevel", "INFO"])
    else:
        asyncio.run(main())
