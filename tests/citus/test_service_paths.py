"""The service's core paths on Citus: every request the API serves, against the coordinator of
a Citus database that `earm migrate` distributed (this folder's conftest makes the product's
fixtures Citus's), with the outcomes the single-node tests pin: ingests and their conflicts,
edits, deletions and feedback found by id through the locators, retrieves of every policy by
the exact scan and by the index branch, the rerank protocol, a namespace erased from every
table, /stats and the dashboard; and the search's settings in effect on the worker that runs
its candidate statement."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg.types.json import Jsonb

from service.db import citus
from service.db.candidate_sql import CANDIDATES_SQL, search_settings
from service.db.engine import driver_connection, open_database
from service.http.app import create_app
from service.settings import Settings
from service.testing import text_vector
from service.testing.citus import CitusCluster
from service.testing.standby import libpq
from tests.app_work import index_everything
from tests.cli.transfer import comparable

DIM = 384
NAMESPACE = "agent-1"
OTHER = "agent-2"
MEMORIES = 24
#: Every table that holds a namespace's rows, and the column that names the namespace.
NAMESPACE_COLUMNS = {"namespaces": "name"} | dict.fromkeys(
    (*citus.NAMESPACE_TABLES, *citus.LOCATOR_TABLES), "namespace"
)


def rows(url: str, statement: str, **params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(libpq(url)) as conn:
        return conn.execute(statement, params).fetchall()


def serve(url: str, **overrides: Any) -> TestClient:
    """The service on ``url``: refits inside the requests that make them due (in this process:
    the child process has a test of its own), no background work (the test indexes)."""
    settings = Settings(**({
        "database_url": url, "embedder": "local", "scorer": "local", "refit_every": 2,
        "refit_process": "thread", "background_work": False,
    } | overrides), _env_file=None)
    return TestClient(create_app(settings, refit_in_request=True))


@pytest.fixture
def api(clean_database: str) -> Iterator[TestClient]:
    with serve(clean_database) as client:
        yield client


def stock(client: TestClient, namespace: str = NAMESPACE, count: int = MEMORIES) -> list[int]:
    """``count`` memories with external ids, client vectors and metadata a filter can select."""
    memories = [
        {"text": f"memory {i}", "external_id": f"m{i}",
         "embedding": text_vector(f"memory {i}", DIM), "metadata": {"parity": i % 2}}
        for i in range(count)
    ]
    stored = client.post("/memories", json={"namespace": namespace, "memories": memories})
    assert stored.status_code == 201, stored.text
    assert stored.json()["created"] == count
    ids: list[int] = stored.json()["ids"]
    return ids


def retrieve(client: TestClient, query: str, namespace: str = NAMESPACE,
             **options: Any) -> dict[str, Any]:
    body = {"namespace": namespace, "query": query, "query_embedding": text_vector(query, DIM),
            "candidates": 12, "k": 6, "budget": 4, "order": "relevance"} | options
    response = client.post("/retrieve", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def observations(url: str, memory_id: int) -> list[tuple[Any, ...]]:
    """The memory's observations: (source, score, retired)."""
    return rows(url, "SELECT source, score::float8, retired_at IS NOT NULL FROM scores "
                     "WHERE memory_id = %(id)s ORDER BY created_at", id=memory_id)


def test_ingest_conflicts_edits_feedback_deletion_and_traces_reach_their_rows_by_id(
    api: TestClient, clean_database: str
) -> None:
    url = clean_database
    ids = stock(api)
    again = api.post("/memories", json={"namespace": NAMESPACE, "memories": [
        {"text": "memory 0", "external_id": "m0",
         "embedding": text_vector("memory 0", DIM), "metadata": {"parity": 0}}]})
    assert again.json() == {"ids": [ids[0]], "created": 0, "existing": 1, "updated": 0}

    scored = retrieve(api, "what about memory 1", policy="full", candidates=MEMORIES)
    assert scored["scorer_calls"] == MEMORIES
    trace = api.get(f"/queries/{scored['query_id']}").json()
    assert (trace["namespace"], trace["candidate_count"]) == (NAMESPACE, MEMORIES)
    assert {c["origin"] for c in trace["candidates"]} == {"scorer"}

    feedback = api.post("/feedback", json={"namespace": NAMESPACE, "query_id": scored["query_id"],
                                           "scores": [{"external_id": "m0", "score": 1.0}]})
    assert feedback.json() == {"recorded": 1, "replaced": 1}, feedback.text
    cells = {c["memory_id"]: c for c in api.get(f"/queries/{scored['query_id']}").json()
             ["candidates"]}
    assert (cells[ids[0]]["origin"], cells[ids[0]]["observed_score"]) == ("feedback", 1.0)

    updated = api.post("/memories", json={"namespace": NAMESPACE, "on_conflict": "update",
                                          "memories": [{"text": "memory 1, rewritten",
                                                        "external_id": "m1"}]})
    assert updated.json() == {"ids": [ids[1]], "created": 0, "existing": 1, "updated": 1}
    assert api.get(f"/memories/{ids[1]}").json()["text"] == "memory 1, rewritten"
    assert [retired for *_, retired in observations(url, ids[1])] == [True]

    patched = api.patch(f"/memories/{ids[2]}", json={"text": "memory 2, edited",
                                                     "metadata": {"edited": True}})
    assert patched.status_code == 200, patched.text
    assert patched.json()["retired_observations"] == 1
    assert patched.json()["memory"]["metadata"] == {"edited": True}
    assert [retired for *_, retired in observations(url, ids[2])] == [True]

    assert api.delete(f"/memories/{ids[3]}").status_code == 204
    assert api.get(f"/memories/{ids[3]}").status_code == 404
    assert api.delete(f"/memories/{ids[3]}").status_code == 404
    assert observations(url, ids[3]) == []
    assert rows(url, "SELECT count(*) FROM memory_locator WHERE id = %(id)s", id=ids[3]) == [(0,)]
    listed = api.get("/memories", params={"namespace": NAMESPACE, "limit": 100}).json()
    assert sorted(m["id"] for m in listed["memories"]) == sorted(set(ids) - {ids[3]})
    # The feedback stands as the latest observation of its cell in the next retrieve.
    repeat = retrieve(api, "what about memory 1", policy="full", candidates=MEMORIES, k=MEMORIES)
    assert repeat["reused"] > 0
    assert {m["id"]: m["score"] for m in repeat["memories"]}[ids[0]] == 1.0
    assert api.get("/queries/999999").status_code == 404


def test_every_policy_answers_alike_through_the_exact_scan_and_through_the_hnsw_index(
    clean_database: str,
) -> None:
    """Two namespaces of the same memories asked the same questions, one by the exact scan and
    one, its memories indexed, by the index branch of the candidate statement
    (EARM_EXACT_SCAN_BELOW=1): every policy, filtered or not, answers the same memories with
    the same scores. (At this size the worker's planner answers the index branch with a sort
    of the namespace's rows; the HNSW scan itself is the settings test's, below.)"""
    answers: dict[str, list[dict[str, Any]]] = {}
    for namespace, exact_below in (("exact-scan", 20_000), ("hnsw-index", 1)):
        with serve(clean_database, exact_scan_below=exact_below,
                   exact_scan_below_filtered=exact_below) as client:
            stock(client, namespace)
            assert index_everything(client) == MEMORIES
            answers[namespace] = [
                comparable(retrieve(client, query, namespace, **options))
                for query, options in (
                    ("first question", {}), ("second question", {"policy": "semantic"}),
                    ("third question", {"policy": "full"}), ("first question", {}),
                    ("fourth question", {"policy": "observed"}),
                    ("fifth question", {"filters": {"parity": 1}}),
                    ("sixth question", {"policy": "semantic", "filters": {"parity": 0}}),
                )
            ]
    assert answers["hnsw-index"] == answers["exact-scan"]
    first, semantic, full, repeat, observed, filtered, semantic_filtered = answers["exact-scan"]
    assert first["scorer_calls"] == 4 and len(first["memories"]) == 6
    assert {m["source"] for m in semantic["memories"]} == {"semantic"}
    assert full["scorer_calls"] == 12
    assert repeat["reused"] == 4  # the first question's observations
    assert observed["policy"] == "observed" and observed["memories"]
    assert all(m["metadata"] == {"parity": 1} for m in filtered["memories"])
    assert all(m["metadata"] == {"parity": 0} for m in semantic_filtered["memories"])


def test_the_rerank_protocol_learns_documents_as_memories_of_the_models_namespace(
    api: TestClient, clean_database: str
) -> None:
    documents = ["Alice moved to Porto.", "Alice runs every spring.", "Alice avoids peanuts.",
                 "Alice loves sushi."]
    body = {"model": "earm/tour", "query": "Is Alice allergic to peanuts?",
            "documents": documents}
    first = api.post("/v1/rerank", json=body)
    assert first.status_code == 200, first.text
    results = first.json()["results"]
    assert sorted(r["index"] for r in results) == list(range(len(documents)))
    meta = first.json()["meta"]["earm"]
    assert meta["namespace"] == "tour" and meta["scorer_calls"] == len(documents)
    stored = api.get("/memories", params={"namespace": "tour"}).json()["memories"]
    assert sorted(m["text"] for m in stored) == sorted(documents)
    # The same documents again: the same memories, their observations reused.
    second = api.post("/v1/rerank", json=body).json()["meta"]["earm"]
    assert sorted(second["memory_ids"]) == sorted(meta["memory_ids"])
    assert (second["reused"], second["scorer_calls"]) == (len(documents), 0)
    assert rows(clean_database, "SELECT count(*) FROM rerank_documents "
                                "WHERE namespace = 'tour'") == [(len(documents),)]


def namespace_rows(url: str, namespace: str) -> dict[str, int]:
    return {table: rows(url, f"SELECT count(*) FROM {table} WHERE {column} = %(n)s",
                        n=namespace)[0][0]
            for table, column in NAMESPACE_COLUMNS.items()}


def test_erasing_a_namespace_leaves_no_row_in_any_table_and_spares_the_other(
    api: TestClient, clean_database: str
) -> None:
    for namespace in (NAMESPACE, OTHER):
        ids = stock(api, namespace)
        for query in ("a question", "another question"):
            retrieve(api, query, namespace)
        asked = retrieve(api, "a third one", namespace, policy="full", candidates=MEMORIES)
        api.post("/feedback", json={"namespace": namespace, "query_id": asked["query_id"],
                                    "scores": [{"memory_id": ids[0], "score": 0.9}]})
        api.patch(f"/memories/{ids[1]}", json={"text": "rewritten"})  # history
        reranked = api.post("/v1/rerank", json={"model": f"earm/{namespace}", "query": "q",
                                                "documents": ["one", "two"]})
        assert reranked.status_code == 200, reranked.text
    before = namespace_rows(clean_database, NAMESPACE)
    assert all(before.values()), before  # every table holds rows of it
    spared = namespace_rows(clean_database, OTHER)

    erased = api.delete(f"/namespaces/{NAMESPACE}")
    assert erased.status_code == 200, erased.text
    assert erased.json() == {
        "namespace": NAMESPACE, "memories": before["memories"], "queries": before["queries"],
        "observations": before["scores"], "score_history": before["score_history"],
        "model_rows": before["memory_factors"],
    }
    assert namespace_rows(clean_database, NAMESPACE) == dict.fromkeys(NAMESPACE_COLUMNS, 0)
    assert namespace_rows(clean_database, OTHER) == spared
    assert api.delete(f"/namespaces/{NAMESPACE}").status_code == 404
    assert retrieve(api, "a question")["memories"] == []


def test_stats_and_the_dashboard_pages_show_each_namespace(api: TestClient) -> None:
    for namespace in (NAMESPACE, OTHER):
        stock(api, namespace)
    asked = retrieve(api, "a question", policy="full")
    one = api.get("/stats", params={"namespace": NAMESPACE}).json()
    assert (one["namespace"], one["memories"], one["queries"], one["observations"]) == (
        NAMESPACE, MEMORIES, 1, 12
    )
    assert one["memories_unindexed"] == MEMORIES  # no background work here
    every = {s["namespace"]: s for s in api.get("/stats").json()["namespaces"]}
    assert every.keys() == {NAMESPACE, OTHER}
    assert (every[OTHER]["memories"], every[OTHER]["queries"]) == (MEMORIES, 0)
    assert api.get("/stats", params={"namespace": "nobody"}).status_code == 404

    listing = api.get("/dashboard/")
    assert listing.status_code == 200 and NAMESPACE in listing.text and OTHER in listing.text
    page = api.get(f"/dashboard/namespaces/{NAMESPACE}")
    assert page.status_code == 200 and NAMESPACE in page.text
    matrix = api.get(f"/dashboard/namespaces/{NAMESPACE}/matrix")
    assert matrix.status_code == 200 and "observed, mean score" in matrix.text
    query = api.get(f"/dashboard/queries/{asked['query_id']}")
    assert query.status_code == 200 and "a question</blockquote>" in query.text
    assert "of 12 candidates" in query.text
    assert api.get("/dashboard/namespaces/nobody").status_code == 404


# --------------------------------------------------------------- the search's settings


def co_sharded_name(url: str, namespace: str) -> str:
    """A namespace name whose rows share the shard of ``namespace``'s."""
    for i in range(100):
        name = f"small-{i}"
        same = rows(url, "SELECT get_shard_id_for_distribution_column('namespaces', %(a)s::text) "
                         "= get_shard_id_for_distribution_column('namespaces', %(b)s::text)",
                    a=name, b=namespace)
        if same[0][0]:
            return name
    raise AssertionError(f"no name shares the shard of {namespace!r}")


#: Steers the planner of the worker onto the HNSW index, which it would not take for a shard
#: this small (a sort of the namespace's rows is cheaper there). SET LOCAL as the search's own
#: settings, so they reach the worker by the same propagation.
TO_THE_INDEX = ("SET LOCAL enable_seqscan = off", "SET LOCAL enable_bitmapscan = off",
                "SET LOCAL enable_sort = off")


def test_the_searchs_settings_are_in_effect_on_the_worker_that_runs_its_candidate_statement(
    api: TestClient, clean_database: str, citus_cluster: CitusCluster
) -> None:
    """A small namespace beside a large one in one shard, whose memories lie away from the
    query, searched through the shared HNSW index: at the worker's defaults (ef_search 40, no
    iterative scan) the index yields the large namespace's 40 nearest and none of the small
    one's (the search would fall back to an exact scan). With the search's SET LOCALs in
    effect on the worker (propagated by citus.propagate_set_commands = 'local', which `earm
    migrate` sets), the iterative scan walks on until it has ``limit`` of the small
    namespace's rows: complete, no fallback."""
    rng = np.random.default_rng(0)
    query = rng.normal(size=DIM)
    small = co_sharded_name(clean_database, "large")
    for namespace, count, spread in (("large", 400, 0.5), (small, 40, 20.0)):
        vectors = query + spread * rng.normal(size=(count, DIM))
        stored = api.post("/memories", json={"namespace": namespace, "memories": [
            {"text": f"{namespace} {i}", "embedding": vector.tolist(), "metadata": {"n": i}}
            for i, vector in enumerate(vectors)]})
        assert stored.status_code == 201, stored.text
    assert index_everything(api) == 440
    limit = 20
    params = {"namespace": small, "query": query.astype(np.float32), "limit": limit,
              "exact_below": 0, "filters": Jsonb({})}

    async def search(settings: tuple[str, ...]) -> tuple[list[tuple[Any, ...]], tuple[Any, ...]]:
        """The filtered candidate statement after ``settings``, and what the worker of the
        namespace's shard says of its port and settings in the same transaction."""
        database = Settings(database_url=clean_database, embedder="none", _env_file=None)
        async with open_database(database.database) as db, db.sessions() as session:
            conn = await driver_connection(session)
            for setting in settings:
                await conn.execute(setting)
            cursor = await conn.execute(
                "SELECT inet_server_port(), current_setting('hnsw.ef_search', true), "
                "current_setting('hnsw.iterative_scan', true) "
                "FROM memories WHERE namespace = %(namespace)s LIMIT 1", params)
            on_worker = await cursor.fetchone()
            candidates = await (await conn.execute(CANDIDATES_SQL[True], params)).fetchall()
            await conn.rollback()
        assert on_worker is not None
        return candidates, on_worker

    at_defaults, _ = asyncio.run(search(TO_THE_INDEX))
    assert len(at_defaults) < limit  # the index alone falls short: the case the settings fix
    candidates, (port, ef_search, iterative_scan) = asyncio.run(
        search(TO_THE_INDEX + search_settings(64))
    )
    assert port in {worker.port for worker in citus_cluster.workers}
    assert (ef_search, iterative_scan) == ("64", "relaxed_order")
    assert len(candidates) == limit
    assert all(row[7] for row in candidates), "the index yielded too few: an exact fallback"
