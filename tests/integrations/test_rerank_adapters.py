"""earm in a reranker's slot, against a live earm over loopback HTTP whose upstream reranker is a
loopback stand-in: earm's LangChain and LlamaIndex adapters, LlamaIndex's CohereRerank and Mem0's
Cohere reranker unchanged."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from langchain_core.documents import Document
from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode

from service.client import EarmClient
from service.http.app import create_app
from service.integrations.langchain import EarmRerank as LangChainRerank
from service.integrations.llamaindex import EarmRerank as LlamaIndexRerank
from service.settings import Settings
from service.testing import LoopbackServer, rerank_app

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [
    "Alice moved to Porto in 2021.",
    "Alice runs a half marathon every spring.",
    "Alice is allergic to peanuts and carries an EpiPen.",
    "Alice loves the sushi bar by the river.",
]
QUERY = "Is Alice allergic to peanuts?"
PEANUTS = 2
KEY = "earm_rerank-adapters-key-0123456789abcdefgh"


@dataclass
class Upstream:
    """The real reranker behind earm: a score per document from the words it shares with the
    query, and how many documents it was sent."""

    sent: list[int] = field(default_factory=list)

    def rerank(self, query: str, documents: list[str]) -> list[float | None]:
        self.sent.append(len(documents))
        words = set(re.findall(r"\w+", query.lower()))
        return [
            min(1.0, 0.05 + 0.2 * len(words & set(re.findall(r"\w+", d.lower()))))
            for d in documents
        ]


@dataclass(frozen=True)
class Live:
    url: str
    upstream: Upstream


@pytest.fixture
def earm(clean_database: str) -> Iterator[Live]:
    """earm with one key (namespace ``tour``) whose scorer is the loopback upstream reranker."""
    upstream = Upstream()
    with LoopbackServer(rerank_app(upstream.rerank)) as judge:
        settings = Settings(
            database_url=clean_database,
            api_keys=f"{KEY}=tour",
            embedder="local",
            scorer="rerank",
            scorer_base_url=judge.url,
            scorer_max_retries=0,
            _env_file=None,
        )
        with LoopbackServer(create_app(settings, refit_in_request=True)) as server:
            yield Live(server.url, upstream)


def feedback_on(live: Live, query_id: int | None, memory_id: int | None) -> tuple[int, int]:
    assert query_id is not None and memory_id is not None
    with EarmClient(live.url, api_key=KEY) as client:
        result = client.feedback("tour", query_id, {memory_id: 1.0})
    return result.recorded, result.replaced


# ------------------------------------------------------------------------------- LangChain


def langchain_documents() -> list[Document]:
    return [Document(page_content=text, metadata={"n": i}) for i, text in enumerate(DOCUMENTS)]


def test_langchain_rerank_returns_the_top_n_best_first_with_relevance_and_earm_ids(
    earm: Live,
) -> None:
    reranker = LangChainRerank(url=earm.url, api_key=KEY, namespace="tour", top_n=2)
    compressed = reranker.compress_documents(langchain_documents(), QUERY)
    assert len(compressed) == 2 and compressed[0].metadata["n"] == PEANUTS
    assert compressed[0].page_content == DOCUMENTS[PEANUTS]
    scores = [d.metadata["relevance_score"] for d in compressed]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    best = compressed[0].metadata
    assert feedback_on(earm, best["query_id"], best["memory_id"]) == (1, 1)


def test_langchain_rerank_leaves_the_callers_documents_unchanged(earm: Live) -> None:
    documents = langchain_documents()
    LangChainRerank(url=earm.url, api_key=KEY, namespace="tour").compress_documents(
        documents, QUERY
    )
    assert [d.metadata for d in documents] == [{"n": i} for i in range(len(DOCUMENTS))]


def test_langchain_rerank_async_answers_as_sync_and_a_repeat_costs_no_upstream_call(
    earm: Live,
) -> None:
    reranker = LangChainRerank(url=earm.url, api_key=KEY, namespace="tour")
    first = reranker.compress_documents(langchain_documents(), QUERY)
    sent = sum(earm.upstream.sent)
    again = asyncio.run(reranker.acompress_documents(langchain_documents(), QUERY))
    assert [d.metadata["n"] for d in again] == [d.metadata["n"] for d in first]
    assert [d.metadata["memory_id"] for d in again] == [d.metadata["memory_id"] for d in first]
    assert sum(earm.upstream.sent) == sent == len(DOCUMENTS)


def test_langchain_rerank_of_no_documents_is_empty_without_a_call(earm: Live) -> None:
    reranker = LangChainRerank(url=earm.url, api_key=KEY, namespace="tour")
    assert reranker.compress_documents([], QUERY) == []
    assert earm.upstream.sent == []


# ------------------------------------------------------------------------------- LlamaIndex


def llamaindex_nodes() -> list[NodeWithScore]:
    return [
        NodeWithScore(node=TextNode(text=text, metadata={"n": i}), score=0.5)
        for i, text in enumerate(DOCUMENTS)
    ]


def test_llamaindex_rerank_scores_nodes_best_first_and_keeps_earm_ids_from_the_llm(
    earm: Live,
) -> None:
    nodes = llamaindex_nodes()
    reranker = LlamaIndexRerank(url=earm.url, api_key=KEY, namespace="tour", top_n=3)
    hits = reranker.postprocess_nodes(nodes, query_str=QUERY)
    assert len(hits) == 3 and hits[0].node.metadata["n"] == PEANUTS
    scores = [hit.score for hit in hits]
    assert scores == sorted(scores, reverse=True)
    assert [hit.node.metadata["relevance_score"] for hit in hits] == scores
    llm_view = hits[0].node.get_content(metadata_mode=MetadataMode.LLM)
    assert "memory_id" not in llm_view and "n: 2" in llm_view
    assert [hit.node.metadata for hit in nodes] == [{"n": i} for i in range(len(DOCUMENTS))]
    best = hits[0].node.metadata
    assert feedback_on(earm, best["query_id"], best["memory_id"]) == (1, 1)


def test_llamaindex_rerank_async_answers_as_sync(earm: Live) -> None:
    reranker = LlamaIndexRerank(url=earm.url, api_key=KEY, namespace="tour")
    first = reranker.postprocess_nodes(llamaindex_nodes(), query_str=QUERY)
    again = asyncio.run(reranker.apostprocess_nodes(llamaindex_nodes(), query_str=QUERY))
    assert [(h.node.metadata["n"], h.score) for h in again] == [
        (h.node.metadata["n"], h.score) for h in first
    ]
    assert sum(earm.upstream.sent) == len(DOCUMENTS)


def test_llamaindex_coheres_postprocessor_reranks_through_earm(earm: Live) -> None:
    cohere_rerank = pytest.importorskip("llama_index.postprocessor.cohere_rerank")
    reranker = cohere_rerank.CohereRerank(
        api_key=KEY, base_url=earm.url, model="earm/tour", top_n=2, max_retries=1
    )
    hits = reranker.postprocess_nodes(llamaindex_nodes(), query_str=QUERY)
    assert len(hits) == 2 and hits[0].node.metadata["n"] == PEANUTS
    assert hits[0].score is not None and hits[1].score is not None
    assert hits[0].score >= hits[1].score
    assert earm.upstream.sent == [len(DOCUMENTS)]


# ------------------------------------------------------------------------------------ Mem0

MEM0_RERANK = """
import json, sys
from mem0.utils.factory import RerankerFactory

reranker = RerankerFactory.create(
    "cohere", {"model": "earm/tour", "api_key": sys.argv[1], "top_k": 2}
)
print(json.dumps(reranker.rerank(sys.argv[2], [{"memory": m} for m in json.loads(sys.argv[3])])))
"""


def test_mem0s_cohere_reranker_reranks_through_earm_by_the_cohere_sdks_base_url(
    earm: Live,
) -> None:
    pytest.importorskip("mem0")
    # Mem0's Cohere config has no base URL; the cohere SDK it builds reads CO_API_URL when it
    # is first imported, hence a process of its own.
    env = {**os.environ, "CO_API_URL": earm.url, "MEM0_TELEMETRY": "False"}
    run = subprocess.run(
        [sys.executable, "-c", MEM0_RERANK, KEY, QUERY, json.dumps(DOCUMENTS)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    ranked = json.loads(run.stdout.strip().splitlines()[-1])
    assert [r["memory"] for r in ranked][:1] == [DOCUMENTS[PEANUTS]] and len(ranked) == 2
    # Mem0 falls back to its input order with rerank_score 0.0 when the call fails.
    assert ranked[0]["rerank_score"] > 0 and earm.upstream.sent == [len(DOCUMENTS)]
