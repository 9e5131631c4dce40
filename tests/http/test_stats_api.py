"""GET /stats against the real database, with a loopback LLM judge doing the scoring."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.http.app import create_app
from service.settings import Settings
from service.testing import LoopbackServer, chat_completions_app

DIM = 384
N_MEMORIES = 40
CANDIDATES = 20


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


def judge_reply(prompt: str) -> str:
    """Memories whose text ends in 'relevant' score high, the rest low."""
    memory = prompt.split("Memory:\n", 1)[1].split("\n", 1)[0]
    return "0.9" if memory.endswith("relevant") else "0.1"


@pytest.fixture
def judged_client(judge_settings: Callable[..., Settings]) -> Iterator[TestClient]:
    with LoopbackServer(chat_completions_app(judge_reply)) as judge:
        settings = judge_settings(
            judge.url, embedder="local", budget_schedule="0:1.0,3:0.25", refit_every=3, rank=2
        )
        with TestClient(create_app(settings)) as client:
            yield client


def ingest(client: TestClient, namespace: str, n: int, center: np.ndarray, rng) -> None:
    memories = [
        {
            "text": f"note {i} " + ("relevant" if i % 4 == 0 else "other"),
            "embedding": unit(center + 0.8 * unit(rng.normal(size=DIM))).tolist(),
        }
        for i in range(n)
    ]
    response = client.post("/memories", json={"namespace": namespace, "memories": memories})
    assert response.status_code == 201, response.text


def run_queries(
    client: TestClient, namespace: str, n: int, center: np.ndarray, rng, **options
) -> list[dict]:
    results = []
    for i in range(n):
        response = client.post(
            "/retrieve",
            json={
                "namespace": namespace,
                "query": f"question {i}",
                "query_embedding": unit(center + 0.3 * unit(rng.normal(size=DIM))).tolist(),
                "candidates": CANDIDATES,
                "k": 5,
                **options,
            },
        )
        assert response.status_code == 200, response.text
        results.append(response.json())
    return results


def test_stats_after_retrieves_report_counts_savings_and_completion_quality(
    judged_client: TestClient,
) -> None:
    rng = np.random.default_rng(3)
    center = unit(rng.normal(size=DIM))
    ingest(judged_client, "agent-1", N_MEMORIES, center, rng)
    # k above the later budgets: the answers then hold unscored, estimated memories too.
    results = run_queries(judged_client, "agent-1", 8, center, rng, k=10)

    response = judged_client.get("/stats", params={"namespace": "agent-1"})
    assert response.status_code == 200, response.text
    stats = response.json()

    calls = sum(r["scorer_calls"] for r in results)
    assert calls == 3 * CANDIDATES + 5 * 5  # schedule: full budget for 3 queries, then 25%
    assert stats["namespace"] == "agent-1"
    assert stats["memories"] == N_MEMORIES
    assert stats["queries"] == 8
    assert stats["observations"] == calls  # every judge call succeeded
    assert stats["density"] == pytest.approx(calls / (N_MEMORIES * 8))
    assert stats["scorer_calls"] == calls
    assert stats["full_rerank_calls"] == 8 * CANDIDATES
    assert stats["calls_saved"] == pytest.approx(1 - calls / (8 * CANDIDATES))
    assert stats["stage"] == 1
    assert stats["next_budget_ratio"] == 0.25
    assert stats["next_budget"] == 10  # 25% of min(default candidates 200, 40 memories)
    returned = [m for r in results for m in r["memories"]]
    estimated = sum(m["source"] == "estimated" for m in returned)
    assert estimated > 0
    assert stats["estimated_share"] == pytest.approx(estimated / len(returned))
    assert stats["prequential_anchors"] > 0
    assert 0.0 <= stats["prequential_error"] <= 1.0
    # The refits the queries made due run in the refit process after their responses.
    for _ in range(600):
        stats = judged_client.get("/stats", params={"namespace": "agent-1"}).json()
        if stats["last_refit_at"] is not None:
            break
        time.sleep(0.1)
    assert datetime.fromisoformat(stats["last_refit_at"])


def test_stats_of_a_namespace_without_queries_has_no_ratios(client: TestClient) -> None:
    rng = np.random.default_rng(0)
    ingest(client, "quiet", 3, unit(rng.normal(size=DIM)), rng)
    stats = client.get("/stats", params={"namespace": "quiet"}).json()
    assert (stats["memories"], stats["queries"], stats["observations"]) == (3, 0, 0)
    assert 0 <= stats["memories_unindexed"] <= 3  # the background indexer may have run
    assert stats["density"] == 0.0
    assert stats["stage"] == 0 and stats["next_budget"] == 3
    for ratio in ("calls_saved", "estimated_share", "prequential_error", "last_refit_at"):
        assert stats[ratio] is None
    assert stats["prequential_anchors"] == 0


def test_stats_without_namespace_lists_every_namespace(client: TestClient) -> None:
    rng = np.random.default_rng(1)
    center = unit(rng.normal(size=DIM))
    ingest(client, "beta", 4, center, rng)
    ingest(client, "alpha", 2, center, rng)
    run_queries(client, "beta", 1, center, rng, policy="semantic")

    response = client.get("/stats")
    assert response.status_code == 200, response.text
    listed = response.json()["namespaces"]
    assert [s["namespace"] for s in listed] == ["alpha", "beta"]
    assert [(s["memories"], s["queries"]) for s in listed] == [(2, 0), (4, 1)]


def test_stats_of_an_unknown_namespace_is_not_found(client: TestClient) -> None:
    response = client.get("/stats", params={"namespace": "nobody"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_stats_of_a_malformed_namespace_is_a_validation_error(client: TestClient) -> None:
    response = client.get("/stats", params={"namespace": "no spaces allowed"})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "validation_error"


ADMIN_KEY = "admin-key-0123456789abcdef"
TEAM_KEY = "team-key-0123456789abcdef"


def test_stats_show_only_the_namespaces_an_api_key_may_use(clean_database: str) -> None:
    settings = Settings(
        database_url=clean_database,
        api_keys=f"{ADMIN_KEY}=*;{TEAM_KEY}=team-*",
        _env_file=None,
    )
    rng = np.random.default_rng(2)
    center = unit(rng.normal(size=DIM))
    with TestClient(create_app(settings)) as client:
        client.headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        ingest(client, "team-a", 2, center, rng)
        ingest(client, "other", 2, center, rng)
        client.headers["Authorization"] = f"Bearer {TEAM_KEY}"
        listed = client.get("/stats").json()["namespaces"]
        forbidden = client.get("/stats", params={"namespace": "other"})
    assert [s["namespace"] for s in listed] == ["team-a"]
    assert forbidden.status_code == 403
