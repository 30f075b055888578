"""A model server on a loopback port that speaks a vendor's wire format, for tests.

``StubModelServer("openai", model)`` answers ``POST /v1/chat/completions``;
``StubModelServer("anthropic", model)`` answers ``POST /v1/messages``. ``model`` is a
list of replies (served in order) or a function of the request body. Every request is
recorded with its exact JSON body and headers, so a test can assert what the client sent
and count how often the model was asked.

    with StubModelServer("openai", [openai_reply(text="hi")]) as server:
        client = OpenAIChatClient("m", base_url=server.base_url)  # OPENAI_API_KEY set by the test
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}


@dataclass
class Reply:
    """One HTTP answer: ``status``, a JSON ``body``, ``headers``; ``delay_s`` before answering."""

    body: dict[str, Any]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


Model = Callable[[dict[str, Any]], Reply] | list[Reply]


class StubModelServer:
    def __init__(self, vendor: Literal["openai", "anthropic"], model: Model) -> None:
        self.vendor = vendor
        self.path = PATHS[vendor]
        self.requests: list[Recorded] = []
        self._model = model
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"stub-{vendor}", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        """What the vendor's SDK takes as ``base_url`` (OpenAI's includes ``/v1``)."""
        root = f"http://127.0.0.1:{self.port}"
        return root + "/v1" if self.vendor == "openai" else root

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.requests]

    def __enter__(self) -> StubModelServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _reply(self, body: dict[str, Any]) -> Reply:
        if callable(self._model):
            return self._model(body)
        if not self._model:
            return Reply({"error": {"message": "the stub's script is used up"}}, status=500,
                         headers={"x-should-retry": "false"})
        return self._model.pop(0)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.path != server.path:
                    self._send(Reply({"error": {"message": f"no route {self.path}"}}, status=404))
                    return
                body = json.loads(raw)
                with server._lock:
                    server.requests.append(Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    reply = server._reply(body)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                self._send(reply)

            def _send(self, reply: Reply) -> None:
                data = json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


# -- replies in each vendor's wire format --------------------------------------------
def openai_reply(
    text: str | None = None, tool_calls: list[tuple[str, str, str]] = (), usage: tuple[int, int] = (11, 7)
) -> Reply:
    """A chat completion: ``text``, and ``tool_calls`` as ``(id, name, arguments JSON text)``."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in tool_calls
        ]
    return Reply({
        "id": "chatcmpl-stub", "object": "chat.completion", "created": int(time.time()), "model": "stub-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    })


def anthropic_reply(
    text: str | None = None, tool_uses: list[tuple[str, str, Any]] = (), usage: tuple[int, int] = (13, 5)
) -> Reply:
    """A message: ``text``, and ``tool_uses`` as ``(id, name, input)``."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": i, "name": n, "input": x} for i, n, x in tool_uses]
    return Reply({
        "id": "msg_stub", "type": "message", "role": "assistant", "model": "stub-model", "content": content,
        "stop_reason": "tool_use" if tool_uses else "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    })


def error_reply(status: int, **headers: str) -> Reply:
    """An API error (``429``, ``503``, ``529``...) in the shape both vendors use."""
    kind = {429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
    return Reply({"type": "error", "error": {"type": kind, "message": f"stub says {status}"}}, status=status,
                 headers={k.replace("_", "-"): v for k, v in headers.items()})


__all__ = ["Recorded", "Reply", "StubModelServer", "anthropic_reply", "error_reply", "openai_reply"]
