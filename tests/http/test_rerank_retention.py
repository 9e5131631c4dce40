"""The retention rule of the rerank protocol's documents (service.ingest.retention), against the
real database and a live earm whose upstream is a loopback reranker: a document no call has
named for the TTL and that was never observed expires; observed documents, documents named
again, and memories ingested through /memories stay. The clock is set by writing the sightings
(``rerank_documents.last_seen_at``) back in time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import async_sessionmaker

from service.db.engine import create_engine as create_async_engine
from service.http.app import create_app
from service.ingest.retention import expire_documents
from service.settings import Settings
from service.testing import LoopbackServer, rerank_app

TTL_S = 30 * 86400.0
SCORED = ["Alice moved to Porto in 2021.", "Alice runs a half marathon every spring."]
UNSCORED = [
    "Alice is allergic to peanuts.",  # feedback makes it observed
    "Alice loves the sushi bar by the river.",  # seen within the TTL
    "Alice prefers meetings before noon.",  # the one that expires
]
INGESTED = "Alice's sister lives in Lisbon."  # through /memories, then named by a call


@pytest.fixture(scope="module")
def upstream_url() -> Iterator[str]:
    with LoopbackServer(rerank_app(lambda query, documents: [0.5] * len(documents))) as server:
        yield server.url


def start_earm(database_url: str, upstream_url: str, **overrides: Any) -> TestClient:
    """An in-process earm (settings overridable): the first query of a namespace scores all its
    documents, later ones none, so which documents are observed is known."""
    options: dict[str, Any] = {
        "database_url": database_url,
        "embedder": "local",
        "scorer": "rerank",
        "scorer_base_url": upstream_url,
        "scorer_max_retries": 0,
        "budget_schedule": "0:1.0,1:0.0",
        "rerank_document_ttl_s": 0,  # never sweeps: the test does
    }
    return TestClient(create_app(Settings(**(options | overrides), _env_file=None),
                                 refit_in_request=True))


@pytest.fixture(scope="module")
def database_url(migrated_database: Callable[[str], str]) -> str:
    """A database of this module's own: the shared one is emptied per test, which a
    module-scoped earm would outlive (an API key another test left would lock it out), and a
    sweep must see only this module's documents."""
    return migrated_database("earm_rerank_retention")


@pytest.fixture(scope="module")
def client(database_url: str, upstream_url: str) -> Iterator[TestClient]:
    """One earm for the tests that sweep themselves, each in a namespace of its own."""
    with start_earm(database_url, upstream_url) as earm:
        yield earm


def rerank(client: TestClient, namespace: str, documents: list[str]) -> dict[str, int]:
    """Each document's memory id (and the call's ``query_id``), from one call."""
    response = client.post(
        "/v1/rerank",
        json={"model": f"earm/{namespace}", "query": "What about Alice?", "documents": documents},
    )
    assert response.status_code == 200, response.text
    meta = response.json()["meta"]["earm"]
    indexes = [r["index"] for r in response.json()["results"]]
    return {documents[i]: m for i, m in zip(indexes, meta["memory_ids"], strict=True)} | {
        "query_id": meta["query_id"]
    }


def age_documents(database_url: str, memory_ids: list[int], days: float) -> None:
    """Write the documents' last sighting ``days`` ago."""
    engine = create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE rerank_documents SET last_seen_at = now() - make_interval(days => :days)"
                " WHERE memory_id = ANY(:ids)"
            ),
            {"days": days, "ids": memory_ids},
        )
    engine.dispose()


def memory_ids(database_url: str, namespace: str) -> set[int]:
    engine = create_engine(database_url)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id FROM memories WHERE namespace = :namespace"), {"namespace": namespace}
        )
        ids = {row[0] for row in rows}
    engine.dispose()
    return ids


def sweep(database_url: str, ttl_s: float = TTL_S) -> int:
    async def main() -> int:
        engine = create_async_engine(database_url, 2)
        try:
            return await expire_documents(async_sessionmaker(engine), ttl_s)
        finally:
            await engine.dispose()

    return asyncio.run(main())


def test_only_documents_unseen_for_the_ttl_and_never_observed_expire(
    client: TestClient, database_url: str
) -> None:
    namespace = "expiry"
    ingested = client.post(
        "/memories", json={"namespace": namespace, "memories": [{"text": INGESTED}]}
    ).json()["ids"][0]
    scored = rerank(client, namespace, SCORED)  # the namespace's first query: all scored
    later = rerank(client, namespace, UNSCORED + [INGESTED])  # scores nothing
    assert later[INGESTED] == ingested
    feedback = client.post(
        "/feedback",
        json={"namespace": namespace, "query_id": later["query_id"],
              "scores": [{"memory_id": later[UNSCORED[0]], "score": 1.0}]},
    )
    assert feedback.status_code == 200, feedback.text
    documents = [scored[t] for t in SCORED] + [later[t] for t in UNSCORED]
    age_documents(database_url, documents + [ingested], days=31)
    age_documents(database_url, [later[UNSCORED[1]]], days=29)

    assert sweep(database_url) == 1
    kept = set(documents + [ingested]) - {later[UNSCORED[2]]}
    assert memory_ids(database_url, namespace) == kept
    assert sweep(database_url) == 0
    # The expired text is a new memory the next time a call names it.
    again = rerank(client, namespace, [UNSCORED[2]])
    assert again[UNSCORED[2]] not in documents


def test_a_call_naming_a_document_renews_it(client: TestClient, database_url: str) -> None:
    namespace = "renewal"
    rerank(client, namespace, SCORED)
    named = rerank(client, namespace, UNSCORED)
    age_documents(database_url, [named[t] for t in UNSCORED], days=31)
    renewed = rerank(client, namespace, UNSCORED[:1])
    assert renewed[UNSCORED[0]] == named[UNSCORED[0]]
    assert sweep(database_url) == 2
    assert named[UNSCORED[0]] in memory_ids(database_url, namespace)


def test_the_serving_process_sweeps_in_its_background_maintenance(
    database_url: str, upstream_url: str
) -> None:
    """With a TTL of 10 s the sweep is due every second; the indexer's loop runs it."""
    namespace = "sweeping"
    with start_earm(
        database_url, upstream_url, rerank_document_ttl_s=10.0, index_poll_interval_s=0.1
    ) as earm:
        rerank(earm, namespace, SCORED)
        named = {rerank(earm, namespace, UNSCORED)[t] for t in UNSCORED}
        age_documents(database_url, list(named), days=1)
        deadline = time.monotonic() + 30
        while named & memory_ids(database_url, namespace) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not named & memory_ids(database_url, namespace)
        assert len(memory_ids(database_url, namespace)) == len(SCORED)
