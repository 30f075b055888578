"""ToolRegistry: the tools one algorithm may call, by name."""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import ConfigError
from .tool import Tool


class ToolRegistry:
    """Tools by name. Two different tools may not share a name."""

    def __init__(self, tools: list[Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools or []:
            self.add(t)

    def add(self, t: Tool) -> Tool:
        if not isinstance(t, Tool):
            raise ConfigError(
                f"ToolRegistry: {t!r} is not a Tool; decorate the function with @tool first"
            )
        existing = self._tools.get(t.name)
        if existing is not None and existing is not t:
            raise ConfigError(
                f"tool name {t.name!r} is used by two different tools; rename one with @tool(name=...)"
            )
        self._tools[t.name] = t
        return t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def specs(self) -> list[dict]:
        """Every tool as the model sees it."""
        return [t.spec() for t in self]
