"""GET /queries/{id}: the trace of one retrieve, against the real database, the local embedder
and the local scorer (the embedding cosine, deterministic)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
import sqlalchemy
from fastapi.testclient import TestClient

from service.http.app import create_app
from service.settings import Settings

NAMESPACE = "agent-trace"
TOPICS = ("hiking", "cooking", "music", "travel", "books", "gardening")


@pytest.fixture
def app_client(clean_database: str) -> Iterator[TestClient]:
    settings = Settings(
        database_url=clean_database,
        embedder="local",
        scorer="local",
        refit_every=4,
        auth_cache_ttl_s=0,
        _env_file=None,
    )
    with TestClient(create_app(settings, refit_in_request=True)) as client:
        yield client


def fill(client: TestClient, namespace: str = NAMESPACE, headers: dict | None = None) -> None:
    texts = [f"Note {i} about {TOPICS[i % len(TOPICS)]}, item {i // 6}" for i in range(36)]
    response = client.post(
        "/memories",
        json={"namespace": namespace, "memories": [{"text": t} for t in texts]},
        headers=headers or {},
    )
    assert response.status_code == 201, response.text


def retrieve(client: TestClient, query: str, budget: int, **options) -> dict:
    body = {"namespace": NAMESPACE, "query": query, "k": 5, "candidates": 20, "budget": budget}
    response = client.post("/retrieve", json=body | options)
    assert response.status_code == 200, response.text
    return response.json()


def trace(client: TestClient, query_id: int, headers: dict | None = None) -> dict:
    response = client.get(f"/queries/{query_id}", headers=headers or {})
    assert response.status_code == 200, response.text
    return response.json()


def test_the_trace_lists_every_candidate_as_the_retrieve_ranked_and_returned_it(
    app_client: TestClient,
) -> None:
    fill(app_client)
    result = retrieve(app_client, "What do I know about hiking?", budget=6, order="relevance")
    found = trace(app_client, result["query_id"])

    assert found["query_id"] == result["query_id"] and found["namespace"] == NAMESPACE
    assert found["text"] == "What do I know about hiking?" and found["policy"] == "earm"
    assert (found["budget"], found["scorer_calls"], found["stage"]) == (
        6, result["scorer_calls"], result["stage"]
    )
    assert found["candidate_count"] == 20 and found["returned"] == 5
    assert set(found["timings"]) == {"embed_ms", "search_ms", "score_ms", "complete_ms"}
    assert found["timings"]["search_ms"] == result["timings"]["search_ms"]
    candidates = found["candidates"]
    assert [c["rank"] for c in candidates] == list(range(1, 21))
    assert sum(c["anchor"] for c in candidates) == 6
    # Each anchor was observed by the scorer, and its final score is that observation.
    for c in candidates:
        assert (c["origin"] == "scorer") == c["anchor"] == (c["source"] == "observed")
        if c["anchor"]:
            assert c["observed_score"] == pytest.approx(c["score"], abs=1e-6)
        else:
            assert c["observed_score"] is None and c["score"] == c["estimate"]
    # Ranked by final score, best first; the first five are what the retrieve returned.
    scores = [c["score"] for c in candidates]
    assert scores == sorted(scores, reverse=True)
    returned = [c for c in candidates if c["returned"]]
    assert [c["memory_id"] for c in returned] == [m["id"] for m in result["memories"]]
    for c, memory in zip(returned, result["memories"], strict=True):
        assert (c["text"], c["source"]) == (memory["text"], memory["source"])
        assert c["similarity"] == np.float32(memory["similarity"])


def test_the_trace_estimates_are_what_the_retrieve_ranked_with(app_client: TestClient) -> None:
    fill(app_client)
    # Full budgets first, so memories gain history and later queries estimate them.
    for topic in TOPICS:
        retrieve(app_client, f"Tell me about {topic}", budget=20)
    result = retrieve(app_client, "Anything on hiking or travel?", budget=3, order="relevance")
    estimated = [m for m in result["memories"] if m["source"] == "estimated"]
    assert estimated, "the model should estimate some returned memories by now"
    by_id = {c["memory_id"]: c for c in trace(app_client, result["query_id"])["candidates"]}
    for memory in estimated:
        # Stored as float32: the very float32 of the score the retrieve ranked the memory by.
        assert by_id[memory["id"]]["estimate"] == np.float32(memory["score"])
        assert by_id[memory["id"]]["source"] == "estimated"


def test_feedback_after_the_retrieve_shows_as_an_observation_of_origin_feedback(
    app_client: TestClient,
) -> None:
    fill(app_client)
    result = retrieve(app_client, "What do I know about cooking?", budget=2)
    unobserved = next(
        c for c in trace(app_client, result["query_id"])["candidates"] if not c["anchor"]
    )
    response = app_client.post(
        "/feedback",
        json={
            "namespace": NAMESPACE,
            "query_id": result["query_id"],
            "scores": [{"memory_id": unobserved["memory_id"], "score": 0.9}],
        },
    )
    assert response.status_code == 200, response.text
    after = {c["memory_id"]: c for c in trace(app_client, result["query_id"])["candidates"]}
    cell = after[unobserved["memory_id"]]
    assert (cell["origin"], cell["observed_score"]) == ("feedback", pytest.approx(0.9))
    # What it was ranked with at the time is kept.
    assert (cell["source"], cell["score"]) == (unobserved["source"], unobserved["score"])


def test_with_query_traces_off_a_query_keeps_its_stage_and_timings_but_no_candidates(
    clean_database: str,
) -> None:
    settings = Settings(database_url=clean_database, embedder="local", scorer="local",
                        query_traces=False, _env_file=None)
    with TestClient(create_app(settings)) as client:
        fill(client)
        result = retrieve(client, "Which notes are about music?", budget=4)
        traced = trace(client, result["query_id"])
    assert traced["candidates"] == []
    assert traced["stage"] == 0 and set(traced["timings"]) >= {"search_ms", "score_ms"}
    assert (traced["candidate_count"], traced["scorer_calls"]) == (20, 4)


def test_an_unknown_query_is_404(app_client: TestClient) -> None:
    response = app_client.get("/queries/424242")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert app_client.get("/queries/0").status_code == 422


def test_a_query_outside_the_key_namespaces_is_403(
    app_client: TestClient, create_api_key: Callable[[str], str]
) -> None:
    admin, scoped = create_api_key("*"), create_api_key("team-*")
    admin_headers = {"Authorization": f"Bearer {admin}"}
    fill(app_client, headers=admin_headers)
    response = app_client.post(
        "/retrieve",
        json={"namespace": NAMESPACE, "query": "hiking", "budget": 2},
        headers=admin_headers,
    )
    query_id = response.json()["query_id"]
    assert trace(app_client, query_id, admin_headers)["namespace"] == NAMESPACE
    forbidden = app_client.get(
        f"/queries/{query_id}", headers={"Authorization": f"Bearer {scoped}"}
    )
    assert forbidden.status_code == 403
    assert forbidden.json()["error"]["code"] == "forbidden"
    assert app_client.get(f"/queries/{query_id}").status_code == 401


def test_a_query_with_a_full_trace_keeps_its_embedding_in_its_row(clean_database: str) -> None:
    """The paraphrase scan reads the embeddings of the namespace's latest queries: they must
    not be moved out of line to make room for the trace (migration 0013), which would cost a
    TOAST fetch per query scanned."""
    settings = Settings(
        database_url=clean_database, embedder="local", scorer="local", _env_file=None
    )
    texts = [f"Note {i} about {TOPICS[i % len(TOPICS)]}, item {i // 6}" for i in range(220)]
    with TestClient(create_app(settings)) as client:
        stored = client.post("/memories", json={
            "namespace": NAMESPACE, "memories": [{"text": t} for t in texts]
        })
        assert stored.status_code == 201, stored.text
        result = retrieve(client, "What do I know about hiking?", budget=35, candidates=200)
    engine = sqlalchemy.create_engine(clean_database)
    try:
        with engine.connect() as conn:
            embedding_out_of_line, trace_bytes = conn.execute(
                sqlalchemy.text(
                    "SELECT pg_column_toast_chunk_id(embedding) IS NOT NULL, "
                    "pg_column_size(trace_memory_ids) + pg_column_size(trace_similarities) "
                    "+ pg_column_size(trace_estimates) + pg_column_size(trace_scores) "
                    "+ pg_column_size(trace_sources) + pg_column_size(trace_origins) "
                    "FROM queries WHERE id = :id"
                ),
                {"id": result["query_id"]},
            ).one()
    finally:
        engine.dispose()
    assert trace_bytes > 2000  # a trace that makes the row too large to stay whole
    assert not embedding_out_of_line
