"""``search_tool``: expose a document index to the model as a retrieval tool."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigError
from .tool import Tool

_WORD = re.compile(r"\w+", re.UNICODE)


def _terms(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Hit:
    document: Document
    score: float


@runtime_checkable
class Index(Protocol):
    """Anything that ranks documents for a query (keyword, vector, hybrid)."""

    def search(self, query: str, k: int) -> list[Hit]: ...


class KeywordIndex:
    """An in-memory BM25 keyword index."""

    def __init__(self, documents: list[Document] | dict[str, str] | None = None, *, k1: float = 1.5, b: float = 0.75):
        self.k1, self.b = k1, b
        self._docs: list[Document] = []
        self._tf: list[Counter[str]] = []
        self._df: Counter[str] = Counter()
        items = documents.items() if isinstance(documents, dict) else ((d.id, d) for d in documents or [])
        for doc_id, doc in items:
            self.add(doc if isinstance(doc, Document) else Document(doc_id, doc))

    def add(self, doc: Document) -> None:
        tf = Counter(_terms(doc.text))
        self._docs.append(doc)
        self._tf.append(tf)
        self._df.update(tf.keys())

    def search(self, query: str, k: int) -> list[Hit]:
        n = len(self._docs)
        if not n:
            return []
        avg = sum(sum(tf.values()) for tf in self._tf) / n
        hits = []
        for doc, tf in zip(self._docs, self._tf, strict=True):
            length, score = sum(tf.values()), 0.0
            for term in set(_terms(query)):
                f = tf.get(term, 0)
                if not f:
                    continue
                idf = math.log(1 + (n - self._df[term] + 0.5) / (self._df[term] + 0.5))
                score += idf * f * (self.k1 + 1) / (f + self.k1 * (1 - self.b + self.b * length / avg))
            if score > 0:
                hits.append(Hit(doc, score))
        hits.sort(key=lambda h: (-h.score, h.document.id))
        return hits[:k]


def search_tool(index: Index, *, name: str = "search_documents", k: int = 5, max_chars: int = 800) -> Tool[[str], str]:
    """Expose ``index`` as a read-only retrieval tool returning the top ``k`` passages."""
    if not isinstance(index, Index):
        raise ConfigError("search_tool: index must have a search(query, k) method, e.g. KeywordIndex(...)")
    if k < 1 or max_chars < 1:
        raise ConfigError(f"search_tool: k and max_chars must be >= 1 (got k={k}, max_chars={max_chars})")

    def search_documents(query: str) -> str:
        hits = index.search(query, k)
        if not hits:
            return "no documents match"
        parts = []
        for hit in hits:
            text = hit.document.text
            if len(text) > max_chars:
                text = text[: max_chars - 1] + "…"
            parts.append(f"[{hit.document.id}] {text}")
        return "\n\n".join(parts)

    search_documents.__doc__ = f"Search the documents; returns the {k} best passages for the query."
    return Tool(search_documents, name=name)


__all__ = ["Document", "Hit", "Index", "KeywordIndex", "search_tool"]
