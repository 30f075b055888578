"""Tools with side effects: delivery policy, idempotency keys, and fencing, all configurable.

``python examples/refund.py`` runs with a scripted model. ``--model openai`` or
``--model anthropic`` asks a real one: the key comes from OPENAI_API_KEY or
ANTHROPIC_API_KEY, the server from OPENAI_BASE_URL or ANTHROPIC_BASE_URL (vLLM,
Ollama...), the model's name from AAA_MODEL.
"""

import argparse
import asyncio
import os
from collections.abc import Callable

from aaa_celery.algos import ToolLoop
from aaa_celery.llm import FakeLLMClient, LLMClient, LLMHandler, LLMRequest, LLMResponse
from aaa_celery.llm.fake import text, tool_call
from aaa_celery.runtime import Engine
from aaa_celery.tools import GuardConfig, ToolContext, ToolHandler, ToolRegistry, tool


@tool(  # a payment must never run twice: report a lost attempt instead of retrying it
    delivery="at_most_once",
    idempotency_key=lambda args: f"refund:{args['order_id']}",  # a business key, not a call id
)
async def refund(order_id: str, ctx: ToolContext) -> str:
    """Refund an order."""
    # Pass the key to the payment provider so even a repeated attempt cannot repeat the effect:
    #   await stripe.refunds.create(..., idempotency_key=ctx.idempotency_key)
    return (
        f"refunded {order_id} (key={ctx.idempotency_key}, attempt={ctx.attempt}, fence={ctx.fence})"
    )


@tool  # inherits the handler default: re-run a lost call, at most 3 attempts
async def search(query: str) -> str:
    """Search."""
    return f"results for {query}"


def model(request: LLMRequest) -> LLMResponse:
    last = request.messages[-1]
    return tool_call("refund", order_id="A-100") if last.role == "user" else text(last.content)


def model_client(choice: str) -> LLMClient:
    """The scripted model by default; a vendor's client when its key is set."""
    if choice == "fake":
        return FakeLLMClient(model)
    from aaa_celery.llm import AnthropicMessagesClient, OpenAIChatClient

    vendors: dict[str, tuple[Callable[[str], LLMClient], str, str]] = {
        "openai": (OpenAIChatClient, "OPENAI_API_KEY", "gpt-4.1-mini"),
        "anthropic": (AnthropicMessagesClient, "ANTHROPIC_API_KEY", "claude-sonnet-4-5"),
    }
    client, key_env, name = vendors[choice]
    if not os.environ.get(key_env):
        raise SystemExit(f"--model {choice}: set {key_env} (the key is read from the environment only)")
    return client(os.environ.get("AAA_MODEL", name))


async def main(choice: str = "fake") -> None:
    client = model_client(choice)
    registry = ToolRegistry([refund, search])
    guard = GuardConfig(lease_ttl_s=30, max_attempts=3)  # handler-wide default; tools override it
    handler = ToolHandler(registry, guard=guard)
    print(
        "refund  ->",
        handler.config_for(refund).delivery.value,
        "| max_attempts =",
        handler.config_for(refund).max_attempts,
    )
    print(
        "search  ->",
        handler.config_for(search).delivery.value,
        "| max_attempts =",
        handler.config_for(search).max_attempts,
    )
    async with Engine() as engine:
        LLMHandler(client).attach(engine)
        handler.attach(engine)
        outcome = await engine.run(ToolLoop(registry), {"task": "refund order A-100"})
    print(outcome.value["text"] if outcome.status == "completed" else f"run failed: {outcome.error}")


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", choices=["fake", "openai", "anthropic"], default="fake")
asyncio.run(main(parser.parse_args().model))
