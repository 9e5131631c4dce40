"""Cost accounting: ``scorer_calls`` counts scored pairs, ``scorer_requests`` the HTTP requests
the scorer made for them, per retrieve, per namespace in /stats and by backend in /metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.http.app import create_app
from service.settings import Settings
from service.testing import (
    HTTPFault,
    LoopbackServer,
    chat_completions_app,
    rerank_app,
)

MEMORIES = 35


def ingest(client: TestClient, namespace: str = "agent-1") -> None:
    memories = [{"text": f"memory number {i} about topic {i % 5}"} for i in range(MEMORIES)]
    response = client.post("/memories", json={"namespace": namespace, "memories": memories})
    assert response.status_code in (200, 201), response.text


def retrieve_all(
    client: TestClient, namespace: str = "agent-1", query: str = "topic 3"
) -> dict[str, Any]:
    response = client.post(
        "/retrieve",
        json={"namespace": namespace, "query": query, "candidates": MEMORIES, "policy": "full"},
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def retrieve_requests_metric(client: TestClient, scorer: str) -> float:
    exposition = client.get("/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "earm_retrieve_scorer_requests_total"
        and sample.labels == {"scorer": scorer}
    )


def test_a_reranker_scores_all_anchors_of_a_retrieve_in_one_request_per_batch(
    judge_settings: Callable[..., Settings],
) -> None:
    app = rerank_app(lambda query, documents: [0.5] * len(documents))
    with LoopbackServer(app) as reranker:
        settings = judge_settings(
            reranker.url, scorer="rerank", scorer_base_url=f"{reranker.url}/v1"
        )
        with TestClient(create_app(settings)) as client:
            ingest(client)
            first = retrieve_all(client)
            assert (first["scorer_calls"], first["scorer_requests"]) == (MEMORIES, 1)
            assert first["degraded"] is False
        smaller = settings.model_copy(update={"scorer_batch_size": 10})
        with TestClient(create_app(smaller)) as client:
            # Another question: a repeat would reuse the first one's scores (test_reuse_api.py).
            second = retrieve_all(client, query="topic 4")
            assert (second["scorer_calls"], second["scorer_requests"]) == (MEMORIES, 4)
            stats = client.get("/stats", params={"namespace": "agent-1"}).json()
            assert (stats["scorer_calls"], stats["scorer_requests"]) == (2 * MEMORIES, 5)
            assert retrieve_requests_metric(client, "rerank") == 4  # this process's retrieves
    assert app.state.calls == 5


def test_the_chat_scorer_makes_one_request_per_pair_plus_its_retries(
    judge_settings: Callable[..., Settings],
) -> None:
    limited: list[str] = []

    def reply(prompt: str) -> str:
        if not limited:  # the first prompt answered (requests arrive concurrently)
            limited.append(prompt)
            raise HTTPFault(429, "slow down", headers={"Retry-After": "0"})
        return "0.5"

    with LoopbackServer(chat_completions_app(reply)) as judge:
        settings = judge_settings(judge.url, scorer_max_retries=1)
        with TestClient(create_app(settings)) as client:
            ingest(client)
            result = retrieve_all(client)
            assert (result["scorer_calls"], result["scorer_requests"]) == (MEMORIES, MEMORIES + 1)
            assert retrieve_requests_metric(client, "openai") == MEMORIES + 1


def test_the_local_scorer_makes_no_requests(client: TestClient) -> None:
    ingest(client)
    result = retrieve_all(client)
    assert (result["scorer_calls"], result["scorer_requests"]) == (MEMORIES, 0)
    stats = client.get("/stats", params={"namespace": "agent-1"}).json()
    assert stats["scorer_requests"] == 0
