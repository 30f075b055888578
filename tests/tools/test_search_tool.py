"""search_tool over a keyword index: ranking, k and truncation."""

from __future__ import annotations

import asyncio

import pytest

from aaa_celery.errors import ConfigError
from aaa_celery.tools import Tool, search_tool
from aaa_celery.tools.search import Document, KeywordIndex

DOCS = {
    "refunds": "Refunds are issued to the original card within five days. Refunds need an order id.",
    "shipping": "Shipping takes two days. Express shipping is next day.",
    "returns": "Returns are accepted for thirty days; a refund follows the return.",
    "privacy": "We never sell your data.",
}


def test_ranking_puts_the_best_match_first():
    hits = KeywordIndex(DOCS).search("refunds order", k=3)
    assert [h.document.id for h in hits][0] == "refunds"
    assert all(hits[i].score >= hits[i + 1].score for i in range(len(hits) - 1))
    assert "privacy" not in [h.document.id for h in hits]


def test_k_bounds_the_number_of_passages():
    t = search_tool(KeywordIndex(DOCS), k=1)
    out = asyncio.run(t(query="shipping refunds days"))
    assert out.count("[") == 1
    t3 = search_tool(KeywordIndex(DOCS), k=3)
    assert asyncio.run(t3(query="days")).count("\n\n") == 2


def test_max_chars_truncates_each_passage():
    long = KeywordIndex([Document("big", "needle " + "x" * 5000)])
    out = asyncio.run(search_tool(long, max_chars=50)(query="needle"))
    assert out.startswith("[big] needle")
    assert len(out) == len("[big] ") + 50 and out.endswith("…")


def test_search_tool_is_a_tool_with_a_query_schema():
    t = search_tool(KeywordIndex(DOCS), name="kb")
    assert isinstance(t, Tool) and t.name == "kb"
    assert list(t.schema["properties"]) == ["query"]
    assert asyncio.run(t(query="unrelated zebra")) == "no documents match"


def test_search_tool_rejects_bad_options():
    with pytest.raises(ConfigError, match="k and max_chars"):
        search_tool(KeywordIndex(DOCS), k=0)
    with pytest.raises(ConfigError, match="search"):
        search_tool(object())  # type: ignore[arg-type]
