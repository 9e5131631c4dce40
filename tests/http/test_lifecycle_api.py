"""Corrections and the memory lifecycle through HTTP, against the real
database: authoritative feedback (by id or external_id, history kept, latest wins), PATCH
/memories/{id} and ingest with on_conflict "update" retiring observations, DELETE
/namespaces/{namespace}, and retrieves on namespaces without memories."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.http.app import create_app
from service.settings import Settings

DIM = 384
N = 6
# Every table that holds a namespace's data, and how its rows name the namespace.
NAMESPACE_TABLES = {
    "namespaces": "name",
    "memories": "namespace",
    "queries": "namespace",
    "scores": "namespace",
    "score_history": "namespace",
    "memory_factors": "namespace",
}


def unit(seed: int) -> list[float]:
    vector = np.random.default_rng(seed).normal(size=DIM)
    return (vector / np.linalg.norm(vector)).tolist()


@pytest.fixture
def learning_settings(clean_database: str) -> Settings:
    """The local scorer (cosine mapped to [0, 1]); a full refit inside every request, so each
    test sees the model its requests made."""
    return Settings(
        database_url=clean_database,
        embedder="local",
        scorer="local",
        refit_every=1,
        _env_file=None,
    )


@pytest.fixture
def api(learning_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(learning_settings, refit_in_request=True)) as test_client:
        yield test_client


def sql(settings: Settings, statement: str, **params: Any) -> list[Any]:
    engine = create_engine(settings.database_url)
    with engine.connect() as conn:
        rows = list(conn.execute(text(statement), params).all())
    engine.dispose()
    return rows


def stock(api: TestClient, namespace: str = "agent-1") -> list[int]:
    memories = [
        {"text": f"memory {i} of {namespace}", "embedding": unit(i), "external_id": f"m{i}"}
        for i in range(N)
    ]
    response = api.post("/memories", json={"namespace": namespace, "memories": memories})
    assert response.status_code == 201, response.text
    return response.json()["ids"]


def retrieve(api: TestClient, query: str, namespace: str = "agent-1", **body: Any) -> dict:
    """A retrieve with a client vector of its own per text: a repeated vector would make
    distinct questions one query family (reuse)."""
    vector = unit(100 + zlib.crc32(query.encode()) % 10_000)
    request = {"namespace": namespace, "query": query, "query_embedding": vector} | body
    response = api.post("/retrieve", json=request)
    assert response.status_code == 200, response.text
    return response.json()


def feedback(api: TestClient, query_id: int, *scores: dict, namespace: str = "agent-1"):
    return api.post(
        "/feedback", json={"namespace": namespace, "query_id": query_id, "scores": list(scores)}
    )


def by_id(result: dict) -> dict[int, dict]:
    return {m["id"]: m for m in result["memories"]}


def running_mean_matches_live_scores(settings: Settings, namespace: str = "agent-1") -> None:
    (kept,) = sql(settings, "SELECT score_sum, score_count FROM namespaces WHERE name = :n",
                  n=namespace)
    (live,) = sql(
        settings,
        "SELECT coalesce(sum(score::text::float8), 0), count(*) FROM scores "
        "WHERE namespace = :n AND retired_at IS NULL",
        n=namespace,
    )
    assert kept[1] == live[1]
    assert kept[0] == pytest.approx(live[0], abs=1e-5)


# ----------------------------------------------------------------------------- corrections


def test_feedback_replaces_the_scorers_observation_keeps_history_and_latest_wins(
    api: TestClient, learning_settings: Settings
) -> None:
    ids = stock(api)
    first = retrieve(api, "where is it?", policy="full", k=N)
    target = ids[2]
    scorer_score = by_id(first)[target]["score"]

    corrected = feedback(api, first["query_id"], {"memory_id": target, "score": 0.0})
    assert corrected.status_code == 200, corrected.text
    assert corrected.json() == {"recorded": 1, "replaced": 1}
    again = feedback(api, first["query_id"], {"memory_id": target, "score": 0.75})
    assert again.json() == {"recorded": 1, "replaced": 1}

    (cell,) = sql(learning_settings,
                  "SELECT score, source FROM scores WHERE query_id = :q AND memory_id = :m",
                  q=first["query_id"], m=target)
    assert (cell.score, cell.source) == (0.75, "feedback")
    history = sql(
        learning_settings,
        "SELECT score, source FROM score_history WHERE query_id = :q AND memory_id = :m "
        "ORDER BY id",
        q=first["query_id"], m=target,
    )
    assert [h.source for h in history] == ["scorer", "feedback"]
    assert history[0].score == pytest.approx(scorer_score, abs=1e-6)
    assert history[1].score == 0.0
    running_mean_matches_live_scores(learning_settings)
    stats = api.get("/stats", params={"namespace": "agent-1"}).json()
    assert stats["observations"] == N  # replaced in place, not added


@pytest.mark.parametrize(("reuse", "calls_on_repeat"), [(True, 0), (False, N - 1)])
def test_the_next_retrieve_of_a_corrected_query_shows_the_feedback_without_scoring_it(
    learning_settings: Settings, reuse: bool, calls_on_repeat: int
) -> None:
    """With reuse the repeat takes every cell of its first asking, the feedback winning over the
    scorer's value; without it, it still takes the feedback (authoritative) and scores the
    rest afresh."""
    settings = learning_settings.model_copy(update={"reuse_observations": reuse})
    with TestClient(create_app(settings, refit_in_request=True)) as api:
        ids = stock(api)
        first = retrieve(api, "where is it?", policy="full", k=N)
        target = ids[4]
        assert by_id(first)[target]["score"] != pytest.approx(0.05)
        assert feedback(
            api, first["query_id"], {"memory_id": target, "score": 0.05}
        ).status_code == 200

        repeated = retrieve(api, "where is it?", policy="full", k=N)
        shown = by_id(repeated)[target]
        assert (shown["source"], shown["score"]) == ("observed", pytest.approx(0.05))
        assert repeated["scorer_calls"] == calls_on_repeat
        assert repeated["reused"] == N - calls_on_repeat
        other_text = retrieve(api, "something else", policy="full", k=N)
        assert other_text["scorer_calls"] == N
        assert by_id(other_text)[target]["score"] != pytest.approx(0.05)


def test_feedback_names_memories_by_external_id(api: TestClient, learning_settings) -> None:
    ids = stock(api)
    query_id = retrieve(api, "q", policy="semantic")["query_id"]
    response = feedback(api, query_id, {"external_id": "m3", "score": 1.0},
                        {"memory_id": ids[1], "score": 0.5})
    assert response.json() == {"recorded": 2, "replaced": 0}
    cells = sql(learning_settings, "SELECT memory_id, score FROM scores WHERE source = 'feedback' "
                "ORDER BY memory_id")
    assert [(c.memory_id, c.score) for c in cells] == [(ids[1], 0.5), (ids[3], 1.0)]


@pytest.mark.parametrize(
    ("item", "status", "code"),
    [
        ({"external_id": "nope", "score": 1.0}, 404, "not_found"),
        ({"external_id": "m0", "memory_id": 1, "score": 1.0}, 422, "validation_error"),
        ({"score": 1.0}, 422, "validation_error"),
        ({"memory_id": 999999, "score": 1.0}, 404, "not_found"),
    ],
    ids=["unknown-external-id", "both-id-forms", "neither-id-form", "unknown-memory"],
)
def test_feedback_with_a_bad_memory_reference_is_a_precise_4xx(
    api: TestClient, item: dict, status: int, code: str
) -> None:
    stock(api)
    query_id = retrieve(api, "q", policy="semantic")["query_id"]
    response = feedback(api, query_id, item)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


def test_feedback_naming_one_memory_by_id_and_by_external_id_is_refused(api: TestClient) -> None:
    ids = stock(api)
    query_id = retrieve(api, "q", policy="semantic")["query_id"]
    response = feedback(api, query_id, {"memory_id": ids[0], "score": 1.0},
                        {"external_id": "m0", "score": 0.0})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_input"


# ------------------------------------------------------------------------------- lifecycle


def observations_of(settings: Settings, memory_id: int) -> list[Any]:
    return sql(settings, "SELECT query_id, retired_at FROM scores WHERE memory_id = :m "
               "ORDER BY query_id", m=memory_id)


def model_row(settings: Settings, memory_id: int) -> list[Any]:
    return sql(settings, "SELECT observation_count FROM memory_factors WHERE memory_id = :m",
               m=memory_id)


def test_patching_a_memorys_text_retires_its_observations_and_resets_its_model_row(
    api: TestClient, learning_settings: Settings
) -> None:
    ids = stock(api)
    for i in range(2):
        retrieve(api, f"question {i}", policy="full")
    target = ids[0]
    assert model_row(learning_settings, target) == [(2,)]
    (before,) = sql(learning_settings, "SELECT embedding::text FROM memories WHERE id = :m",
                    m=target)

    response = api.patch(f"/memories/{target}", json={"text": "memory 0, rewritten"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["retired_observations"] == 2
    assert body["memory"]["text"] == "memory 0, rewritten"
    assert body["memory"]["embedding_model"] != "client"  # re-embedded by the local embedder
    (after,) = sql(learning_settings, "SELECT embedding::text FROM memories WHERE id = :m",
                   m=target)
    assert after != before
    assert all(o.retired_at is not None for o in observations_of(learning_settings, target))
    assert model_row(learning_settings, target) == []
    running_mean_matches_live_scores(learning_settings)
    stats = api.get("/stats", params={"namespace": "agent-1"}).json()
    assert stats["observations"] == 2 * N - 2

    # The next query (and the refit it makes due) learns from the new observation only.
    retrieve(api, "question 2", policy="full")
    assert model_row(learning_settings, target) == [(1,)]
    assert [o.retired_at is None for o in observations_of(learning_settings, target)] == [
        False, False, True
    ]


def test_patching_metadata_or_time_keeps_observations(
    api: TestClient, learning_settings: Settings
) -> None:
    ids = stock(api)
    retrieve(api, "question", policy="full")
    response = api.patch(
        f"/memories/{ids[1]}",
        json={"metadata": {"topic": "x"}, "occurred_at": "2024-01-02T03:04:05Z"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["retired_observations"] == 0
    assert response.json()["memory"]["metadata"] == {"topic": "x"}
    cleared = api.patch(f"/memories/{ids[1]}", json={"occurred_at": None}).json()
    assert cleared["memory"]["occurred_at"] is None
    assert cleared["memory"]["metadata"] == {"topic": "x"}
    assert [o.retired_at for o in observations_of(learning_settings, ids[1])] == [None]
    assert model_row(learning_settings, ids[1]) == [(1,)]


def test_patching_the_same_embedding_retires_nothing(
    api: TestClient, learning_settings: Settings
) -> None:
    ids = stock(api)
    retrieve(api, "question", policy="full")
    response = api.patch(f"/memories/{ids[1]}", json={"embedding": unit(1)})
    assert response.json()["retired_observations"] == 0
    changed = api.patch(f"/memories/{ids[1]}", json={"embedding": unit(42)})
    assert changed.json()["retired_observations"] == 1
    assert changed.json()["memory"]["embedding_model"] == "client"


def test_a_new_text_with_the_stored_vector_still_retires_observations(
    api: TestClient, learning_settings: Settings
) -> None:
    """The scorer judged the text: a new text makes its judgements stale, whatever vector."""
    ids = stock(api)
    retrieve(api, "question", policy="full")
    response = api.patch(f"/memories/{ids[1]}", json={"text": "other words", "embedding": unit(1)})
    assert response.json()["retired_observations"] == 1
    assert response.json()["memory"]["embedding_model"] == "client"
    assert model_row(learning_settings, ids[1]) == []


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/memories/999999", {"text": "x"}, 404, "not_found"),
        (None, {}, 422, "validation_error"),
        (None, {"text": None}, 422, "validation_error"),
        (None, {"text": "  "}, 422, "validation_error"),
        (None, {"external_id": "new"}, 422, "validation_error"),
        (None, {"embedding": [0.1, 0.2]}, 422, "dimension_mismatch"),
        (None, {"text": "x" * 8001}, 413, "limit_exceeded"),
    ],
    ids=["unknown", "empty", "null-text", "blank-text", "external-id", "bad-dimension", "long"],
)
def test_bad_patch_is_a_precise_4xx_and_changes_nothing(
    api: TestClient, learning_settings: Settings, path, body: dict, status: int, code: str
) -> None:
    ids = stock(api)
    response = api.patch(path or f"/memories/{ids[0]}", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert api.get(f"/memories/{ids[0]}").json()["text"] == "memory 0 of agent-1"


def test_ingest_on_conflict_keep_is_idempotent_and_update_replaces_changed_content(
    api: TestClient, learning_settings: Settings
) -> None:
    ids = stock(api)
    retrieve(api, "question", policy="full")
    changed = [{"text": "m0 changed", "embedding": unit(50), "external_id": "m0",
                "metadata": {"v": 2}}]
    unchanged = [{"text": "memory 1 of agent-1", "embedding": unit(1), "external_id": "m1"}]

    kept = api.post("/memories", json={"namespace": "agent-1", "memories": changed})
    assert kept.json() == {"ids": [ids[0]], "created": 0, "existing": 1, "updated": 0}
    assert api.get(f"/memories/{ids[0]}").json()["text"] == "memory 0 of agent-1"

    updated = api.post(
        "/memories",
        json={"namespace": "agent-1", "memories": changed + unchanged, "on_conflict": "update"},
    )
    assert updated.status_code == 201, updated.text
    assert updated.json() == {"ids": [ids[0], ids[1]], "created": 0, "existing": 2, "updated": 1}
    stored = api.get(f"/memories/{ids[0]}").json()
    assert (stored["text"], stored["metadata"]) == ("m0 changed", {"v": 2})
    assert [o.retired_at is not None for o in observations_of(learning_settings, ids[0])] == [True]
    assert [o.retired_at for o in observations_of(learning_settings, ids[1])] == [None]
    running_mean_matches_live_scores(learning_settings)


def test_a_time_without_offset_is_utc_so_reingesting_it_changes_nothing(api: TestClient) -> None:
    memory = {"text": "dated", "embedding": unit(60), "external_id": "dated",
              "occurred_at": "2023-05-08T13:56:00"}
    created = api.post("/memories", json={"namespace": "agent-1", "memories": [memory]})
    assert created.status_code == 201, created.text
    again = api.post("/memories", json={"namespace": "agent-1", "memories": [memory],
                                        "on_conflict": "update"})
    assert again.json()["updated"] == 0, again.text  # was 1: naive != aware in Python
    stored = api.get(f"/memories/{created.json()['ids'][0]}").json()
    assert stored["occurred_at"] in ("2023-05-08T13:56:00Z", "2023-05-08T13:56:00+00:00")


# ------------------------------------------------------------------------------ namespaces


def namespace_rows(settings: Settings, namespace: str) -> dict[str, int]:
    return {
        table: sql(settings, f"SELECT count(*) FROM {table} WHERE {column} = :n",
                   n=namespace)[0][0]
        for table, column in NAMESPACE_TABLES.items()
    }


def test_erasing_a_namespace_leaves_no_row_behind_and_spares_the_others(
    api: TestClient, learning_settings: Settings
) -> None:
    for namespace in ("agent-1", "agent-2"):
        ids = stock(api, namespace)
        result = retrieve(api, "question", namespace, policy="full")
        feedback(api, result["query_id"], {"memory_id": ids[0], "score": 1.0},
                 namespace=namespace)
        retrieve(api, "question 2", namespace)
    before = namespace_rows(learning_settings, "agent-1")
    assert all(before.values()), before  # every table holds something of it
    spared = namespace_rows(learning_settings, "agent-2")

    response = api.delete("/namespaces/agent-1")
    assert response.status_code == 200, response.text
    assert response.json() == {
        "namespace": "agent-1",
        "memories": before["memories"],
        "queries": before["queries"],
        "observations": before["scores"],
        "score_history": before["score_history"],
        "model_rows": before["memory_factors"],
    }
    assert set(namespace_rows(learning_settings, "agent-1").values()) == {0}
    assert namespace_rows(learning_settings, "agent-2") == spared

    assert api.delete("/namespaces/agent-1").status_code == 404
    assert retrieve(api, "question", "agent-1")["memories"] == []
    assert api.delete("/namespaces/not a namespace").status_code == 422


def test_retrieve_on_a_namespace_without_memories_answers_200_and_records_nothing(
    api: TestClient, learning_settings: Settings
) -> None:
    unknown = retrieve(api, "anything", "nobody-yet")
    assert (unknown["memories"], unknown["query_id"], unknown["scorer_calls"]) == ([], None, 0)
    assert namespace_rows(learning_settings, "nobody-yet") == dict.fromkeys(NAMESPACE_TABLES, 0)

    ids = stock(api)
    for memory_id in ids:
        assert api.delete(f"/memories/{memory_id}").status_code == 204
    emptied = retrieve(api, "anything")
    assert (emptied["memories"], emptied["query_id"]) == ([], None)
    assert namespace_rows(learning_settings, "agent-1")["queries"] == 0
