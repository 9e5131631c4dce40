"""Deferred HNSW indexing (service.ingest.indexer): an ingest commits its memories unindexed, the
background indexer moves them into the partial HNSW index, and the search finds a memory
whether it is indexed yet or not."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.api.stats import NamespaceStats
from service.budget import BudgetSchedule
from service.db import search
from service.db.engine import create_engine
from service.db.stats import namespace_stats
from service.ingest.indexer import BackgroundIndexer, index_all, index_batch
from service.ingest.memories import NewMemory, ingest

DIM = 384
Sessions = async_sessionmaker[AsyncSession]


def unit_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    rows = rng.normal(size=(n, DIM))
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


async def add_memories(
    sessions: Sessions, namespace: str, vectors: np.ndarray, first: int
) -> list[int]:
    async with sessions() as session:
        result = await ingest(
            session,
            None,
            DIM,
            namespace,
            [
                NewMemory(
                    text=f"memory {first + i}", embedding=v.tolist(), external_id=f"m{first + i}"
                )
                for i, v in enumerate(vectors)
            ],
        )
        await session.commit()
    return result.ids


async def unindexed_count(sessions: Sessions) -> int:
    async with sessions() as session:
        return int(
            (
                await session.execute(text("SELECT count(*) FROM memories WHERE NOT indexed"))
            ).scalar_one()
        )


async def stats_of(sessions: Sessions, namespace: str) -> NamespaceStats:
    async with sessions() as session:
        return await namespace_stats(session, namespace, BudgetSchedule.parse("0:1.0"), 200)


async def search_ids(
    sessions: Sessions, namespace: str, query: np.ndarray, limit: int
) -> list[int]:
    async with sessions() as session:
        _, candidates, _ = await search.search(
            session, search.CandidateSearch(namespace, query, limit, rank=8)
        )
        await session.commit()
    return [int(i) for i in candidates.ids]


def with_sessions(url: str, scenario: Callable[[Sessions], Awaitable[None]]) -> None:
    """Run ``scenario`` on its own event loop with sessions of the test's clean database."""

    async def main() -> None:
        engine = create_engine(url, 4)
        try:
            await scenario(async_sessionmaker(engine, expire_on_commit=False))
        finally:
            await engine.dispose()

    asyncio.run(main())


def test_search_finds_memories_before_and_after_they_are_indexed(clean_database: str) -> None:
    with_sessions(clean_database, search_before_and_after_indexing)


async def search_before_and_after_indexing(sessions: Sessions) -> None:
    rng = np.random.default_rng(0)
    query = unit_rows(rng, 1)[0]
    old = unit_rows(rng, 400)
    # The newest memories include the query's nearest neighbours.
    new = np.vstack([query + 0.05 * unit_rows(rng, 10), unit_rows(rng, 40)])
    new /= np.linalg.norm(new, axis=1, keepdims=True)
    ids = await add_memories(sessions, "a", old, 0)
    assert await index_all(sessions, batch_size=150) == 400
    ids += await add_memories(sessions, "a", new, 400)
    assert await unindexed_count(sessions) == 50
    assert (await stats_of(sessions, "a")).memories_unindexed == 50

    vectors = np.vstack([old, new])
    exact_top = [ids[i] for i in np.argsort(-(vectors @ query), kind="stable")[:100]]
    before = await search_ids(sessions, "a", query, 100)
    assert set(ids[400:410]) <= set(before)
    assert before == exact_top

    assert await index_all(sessions, batch_size=150) == 50
    assert await unindexed_count(sessions) == 0
    assert (await stats_of(sessions, "a")).memories_unindexed == 0
    after = await search_ids(sessions, "a", query, 100)
    # The index is approximate, but at this size its top 100 is the exact one.
    assert after == exact_top


def test_index_batch_takes_at_most_its_size_and_concurrent_batches_share_the_backlog(
    clean_database: str,
) -> None:
    with_sessions(clean_database, batches_share_the_backlog)


async def batches_share_the_backlog(sessions: Sessions) -> None:
    await add_memories(sessions, "a", unit_rows(np.random.default_rng(1), 120), 0)
    assert await index_batch(sessions, batch_size=50) == 50
    assert await unindexed_count(sessions) == 70
    # Two indexers at once (two worker processes): SKIP LOCKED hands each its own rows.
    done = await asyncio.gather(index_all(sessions, 10), index_all(sessions, 10))
    assert sum(done) == 70
    assert await unindexed_count(sessions) == 0
    assert await index_batch(sessions, batch_size=50) == 0


def test_background_indexer_survives_an_unreachable_database_and_stops_cleanly() -> None:
    asyncio.run(indexer_against_an_unreachable_database())


async def indexer_against_an_unreachable_database() -> None:
    engine = create_engine("postgresql+psycopg://earm@127.0.0.1:1/none?connect_timeout=1", 1)
    indexer = BackgroundIndexer(async_sessionmaker(engine), batch_size=10, poll_interval_s=0.05)
    indexer.start()
    await asyncio.sleep(0.3)  # several failed attempts, each logged, none fatal
    assert indexer.running
    await indexer.stop()
    await engine.dispose()


def test_the_service_indexes_what_it_ingests_in_the_background(client: TestClient) -> None:
    rng = np.random.default_rng(2)
    vectors = unit_rows(rng, 30)
    response = client.post(
        "/memories",
        json={
            "namespace": "a",
            "memories": [{"text": f"m{i}", "embedding": v.tolist()} for i, v in enumerate(vectors)],
        },
    )
    assert response.status_code == 201, response.text
    components = client.app.state.components  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while client.portal.call(unindexed_count, components.database.sessions):  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the background indexer did not catch up"
        time.sleep(0.05)
    found = client.post(
        "/retrieve",
        json={"namespace": "a", "query": "x", "query_embedding": vectors[7].tolist(),
              "k": 1, "candidates": 10, "policy": "semantic"},
    )
    assert found.status_code == 200, found.text
    assert found.json()["memories"][0]["text"] == "m7"
