"""Agent algorithms that the engine runs."""

from __future__ import annotations

from typing import Any

from ..llm.types import LLMRequest, Message
from ..tools.registry import ToolRegistry


class ToolLoop:
    """Ask the model; run the tool calls it makes (concurrently); repeat until it answers.

    The input is ``{"task": "..."}`` (or a plain string). The outcome's value is
    ``{"text": final answer, "turns": n}``. Failed tool calls reach the model as
    tool messages flagged ``is_error``, never as exceptions.
    """

    def __init__(self, registry: ToolRegistry, *, system: str | None = None, max_turns: int = 8) -> None:
        self.registry = registry
        self.system = system
        self.max_turns = max_turns

    async def run(self, run: Any, input: Any) -> dict[str, Any]:
        task = input.get("task", "") if isinstance(input, dict) else str(input)
        messages: list[Message] = [Message("system", self.system)] if self.system else []
        messages.append(Message("user", task))
        for turn in range(1, self.max_turns + 1):
            response = await run.complete(LLMRequest(list(messages), self.registry.specs()))
            if not response.tool_calls:
                return {"text": response.text, "turns": turn}
            messages.append(Message("assistant", response.text, tool_calls=response.tool_calls))
            facts = await run.call_tools(response.tool_calls)
            for call, fact in zip(response.tool_calls, facts, strict=True):
                messages.append(
                    Message("tool", fact.content, tool_call_id=call.id, name=call.name, is_error=not fact.ok)
                )
        return {"text": "", "turns": self.max_turns, "stopped": "max_turns"}


__all__ = ["ToolLoop"]
