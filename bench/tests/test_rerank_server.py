"""The load bench's lean ``/rerank`` backend: the rerank protocol over real HTTP/1.1, answered
its latency after each request arrives, its own work included."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

from earm_bench.common.rerank_server import RerankServer
from service.providers.rerank_scorer import RerankScorer
from service.providers.scorers import Scores


def by_number(query: str, documents: list[str]) -> list[float | None]:
    """Document "m<i>" scores i / 100; "skip" is left out."""
    return [None if d == "skip" else int(d.removeprefix("m")) / 100 for d in documents]


async def score(url: str, memories: list[str], calls: int = 1) -> list[Scores]:
    scorer = RerankScorer(url + "/v1", "reranker", timeout_s=5.0)
    try:
        return [
            await scorer.score("q", np.zeros(4), memories, np.zeros((len(memories), 4)))
            for _ in range(calls)
        ]
    finally:
        await scorer.aclose()


def test_rerank_server_answers_the_scorer_in_one_request_mapped_back_by_index() -> None:
    with RerankServer(by_number, lambda: 0.0) as server:
        first, second = asyncio.run(score(server.url, ["m30", "skip", "m7", "m99"], calls=2))
    for scores in (first, second):
        assert scores.values == [pytest.approx(0.3), None, pytest.approx(0.07),
                                 pytest.approx(0.99)]
        assert scores.requests == 1


def test_rerank_server_keeps_the_connection_alive_between_requests() -> None:
    body = {"model": "m", "query": "q", "documents": ["m1"], "top_n": 1}
    with RerankServer(by_number, lambda: 0.0) as server, httpx.Client() as client:
        first, second = (client.post(server.url + "/rerank", json=body) for _ in range(2))
    assert first.status_code == second.status_code == 200
    assert first.json()["results"] == [
        {"index": 0, "relevance_score": 0.01, "document": {"text": "m1"}}
    ]
    assert first.extensions["network_stream"] is second.extensions["network_stream"]


def test_rerank_server_answers_its_latency_after_arrival_with_its_work_inside_it() -> None:
    work_s: list[float] = []

    def slow_scores(query: str, documents: list[str]) -> list[float | None]:
        started = time.perf_counter()
        time.sleep(0.4)  # the backend's own work, inside the latency
        work_s.append(time.perf_counter() - started)
        return by_number(query, documents)

    # The work is a large share of the latency, so that latency + work (the defect) stands
    # clear of latency + a loaded machine's overhead (up to ~0.2 s seen beside other suites).
    latency_s = 0.5
    with RerankServer(slow_scores, lambda: latency_s) as server:
        started = time.perf_counter()
        (scores,) = asyncio.run(score(server.url, ["m1"]))
        elapsed = time.perf_counter() - started
    assert scores.values == [pytest.approx(0.01)]
    assert latency_s <= elapsed < latency_s + work_s[0]  # not latency + work


def test_rerank_server_refuses_a_malformed_body_and_an_unknown_path() -> None:
    with RerankServer(by_number, lambda: 0.0) as server:
        bad = httpx.post(server.url + "/rerank", content=b"{not json")
        no_documents = httpx.post(server.url + "/v2/rerank", json={"query": "q"})
        elsewhere = httpx.post(server.url + "/v1/embeddings", json={"input": "x"})
    assert bad.status_code == 400
    assert no_documents.status_code == 400
    assert "'documents' must be a list of strings" in no_documents.json()["error"]["message"]
    assert elsewhere.status_code == 404
