"""Back-pressure on the HNSW indexing backlog (EARM_MAX_UNINDEXED): an ingest that would add
memories to a namespace whose unindexed backlog is at the limit is refused, 503
``indexing_backlog``, and stores nothing. Background work is off, so nothing drains the backlog
but the test's own call of the indexer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.db.memories import UNINDEXED_BACKLOG_SQL
from service.http.app import create_app
from service.settings import Settings
from tests.app_work import index_everything

DIM = 384
LIMIT = 5


def memories(first: int, count: int) -> list[dict]:
    """``count`` memories with client vectors (no embedder call) and external ids m<first>…"""
    rng = np.random.default_rng(first)
    return [
        {"text": f"memory {i}", "embedding": rng.normal(size=DIM).tolist(), "external_id": f"m{i}"}
        for i in range(first, first + count)
    ]


def post(client: TestClient, namespace: str, items: list[dict], on_conflict: str = "keep"):
    return client.post(
        "/memories", json={"namespace": namespace, "memories": items, "on_conflict": on_conflict}
    )


def stored_count(client: TestClient, namespace: str) -> int:
    response = client.get("/memories", params={"namespace": namespace, "limit": 500})
    assert response.status_code == 200, response.text
    return len(response.json()["memories"])


def serve(clean_database: str, **overrides: object) -> TestClient:
    return TestClient(
        create_app(
            Settings(
                database_url=clean_database,
                embedder="none",
                background_work=False,
                _env_file=None,
                **overrides,  # type: ignore[arg-type]
            )
        )
    )


@pytest.fixture
def limited(clean_database: str) -> Iterator[TestClient]:
    with serve(clean_database, max_unindexed=LIMIT) as client:
        yield client


def test_an_ingest_into_a_full_backlog_is_refused_whole_and_accepted_once_indexed(
    limited: TestClient,
) -> None:
    assert post(limited, "a", memories(0, LIMIT)).status_code == 201

    refused = post(limited, "a", memories(LIMIT, 1))
    assert refused.status_code == 503, refused.text
    assert refused.headers["Retry-After"].isdigit()
    error = refused.json()["error"]
    assert error["code"] == "indexing_backlog"
    assert f"{LIMIT}" in error["message"] and "EARM_MAX_UNINDEXED" in error["message"]
    assert "earm worker" in error["message"]
    assert stored_count(limited, "a") == LIMIT

    assert index_everything(limited) == LIMIT
    accepted = post(limited, "a", memories(LIMIT, 2))
    assert accepted.status_code == 201, accepted.text
    assert stored_count(limited, "a") == LIMIT + 2


def test_a_batch_with_one_new_memory_is_refused_before_embedding_and_stores_nothing(
    limited: TestClient,
) -> None:
    assert post(limited, "a", memories(0, LIMIT)).status_code == 201
    mixed = post(limited, "a", memories(0, LIMIT + 1))
    assert mixed.status_code == 503, mixed.text
    assert mixed.json()["error"]["code"] == "indexing_backlog"
    # Refused before anything is embedded: with EARM_EMBEDDER=none, embedding this text would
    # have been refused as 422 embedding_required.
    unembedded = post(limited, "a", [{"text": "no vector", "external_id": "x"}])
    assert unembedded.status_code == 503, unembedded.text
    assert unembedded.json()["error"]["code"] == "indexing_backlog"
    assert stored_count(limited, "a") == LIMIT


def test_a_retry_or_an_edit_of_stored_memories_is_accepted_with_a_full_backlog(
    limited: TestClient,
) -> None:
    first = post(limited, "a", memories(0, LIMIT))
    assert first.status_code == 201, first.text
    assert post(limited, "a", memories(LIMIT, 1)).status_code == 503  # the backlog is full

    retry = post(limited, "a", memories(0, LIMIT))
    assert retry.status_code == 201, retry.text
    assert retry.json()["ids"] == first.json()["ids"] and retry.json()["created"] == 0

    edited = [item | {"text": "edited " + item["text"]} for item in memories(0, 2)]
    update = post(limited, "a", edited, on_conflict="update")
    assert update.status_code == 201, update.text
    assert update.json()["updated"] == 2
    patched = limited.patch(
        f"/memories/{first.json()['ids'][4]}",
        json={"text": "patched", "embedding": memories(LIMIT, 1)[0]["embedding"]},
    )
    assert patched.status_code == 200, patched.text
    assert stored_count(limited, "a") == LIMIT


def test_one_namespace_s_backlog_does_not_refuse_another_namespace(limited: TestClient) -> None:
    assert post(limited, "a", memories(0, LIMIT)).status_code == 201
    assert post(limited, "a", memories(LIMIT, 1)).status_code == 503
    other = post(limited, "b", memories(0, LIMIT))
    assert other.status_code == 201, other.text


def test_without_a_limit_ingests_are_never_refused_for_the_backlog(clean_database: str) -> None:
    settings = Settings(database_url=clean_database, _env_file=None)
    assert settings.max_unindexed == 0  # the default: no limit
    with serve(clean_database) as client:
        for first in range(0, 3 * LIMIT, LIMIT):
            response = post(client, "a", memories(first, LIMIT))
            assert response.status_code == 201, response.text
        stats = client.get("/stats", params={"namespace": "a"})
        assert stats.json()["memories_unindexed"] == 3 * LIMIT


def test_the_backlog_count_reads_the_partial_index_even_when_statistics_overrate_the_backlog(
    clean_database: str,
    plan_nodes: Callable[[dict[str, Any]], list[dict[str, Any]]],
    partition_parents: dict[str, str],
) -> None:
    """The count reads ``ix_memories_unindexed`` (migration 0006), never the table: here the
    statistics say a fifth of the rows are unindexed, spread evenly, so a plain ``LIMIT`` query
    was planned as a sequential scan expecting to find them early, while the namespace's
    unindexed rows are the newest, at the table's end."""
    engine = create_engine(clean_database)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO namespaces (name) VALUES ('a'), ('b')"))
            # Zero vectors stay out of the HNSW index (cosine), so `indexed` rows cost little.
            insert = text(
                "INSERT INTO memories (namespace, text, embedding, embedding_model, indexed) "
                "SELECT :namespace, 't', array_fill(0, ARRAY[384])::vector, 'client', :indexed "
                "FROM generate_series(1, :count)"
            )
            conn.execute(insert, {"namespace": "a", "indexed": True, "count": 2000})
            conn.execute(insert, {"namespace": "b", "indexed": False, "count": 500})
            conn.execute(insert, {"namespace": "a", "indexed": False, "count": LIMIT})
            conn.execute(text("ANALYZE memories"))
            parameters = {"namespace": "a", "limit": LIMIT}
            plan = conn.exec_driver_sql(
                "EXPLAIN (FORMAT JSON) " + UNINDEXED_BACKLOG_SQL, parameters
            ).scalar_one()
            backlog = conn.exec_driver_sql(UNINDEXED_BACKLOG_SQL, parameters).scalar_one()
    finally:
        engine.dispose()
    nodes = plan_nodes(plan[0]["Plan"])
    parents = partition_parents  # the plan names a's partition and its index
    on_memories = [n for n in nodes if parents.get(n.get("Relation Name", "")) == "memories"]
    assert [parents[n["Index Name"]] for n in on_memories] == ["ix_memories_unindexed"], plan
    assert backlog == LIMIT
