"""ToolRegistry: the tools one algorithm may call, by name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError
from .tool import P, R, Tool


class ToolRegistry:
    """Tools by name. Two different tools may not share a name."""

    def __init__(self, tools: list[Tool[..., Any]] | None = None) -> None:
        self._tools: dict[str, Tool[..., Any]] = {}
        for t in tools or []:
            self.add(t)

    def add(self, t: Tool[P, R]) -> Tool[P, R]:
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

    def get(self, name: str) -> Tool[..., Any] | None:
        return self._tools.get(name)

    def __getitem__(self, name: str) -> Tool[..., Any]:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool[..., Any]]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def specs(self) -> list[dict[str, Any]]:
        """Every tool as the model sees it."""
        return [t.spec() for t in self]
