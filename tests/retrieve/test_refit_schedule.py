"""When a namespace's full refit is due (service.retrieve.learning.refit_due), that the
worker's SQL form of the rule (service.db.namespaces.namespaces_due_for_refit) agrees with it
on the real database, and which queries count towards it."""

from __future__ import annotations

import asyncio
import math

import numpy as np
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import async_sessionmaker

from service.db.engine import create_engine as create_async_engine
from service.db.engine import open_database
from service.db.namespaces import namespaces_due_for_refit
from service.ingest.memories import NewMemory, ingest
from service.providers.scorers import LocalScorer
from service.retrieve.learning import refit_due
from service.retrieve.pipeline import RetrievalPipeline, RetrieveRequest
from service.settings import Settings

EVERY, GROWTH = 50, 0.25


def refit_sizes(queries: int, every: int, growth: float) -> list[int]:
    """The query counts at which a namespace that records ``queries`` queries is refitted."""
    sizes: list[int] = []
    since = 0
    for recorded in range(1, queries + 1):
        since += 1
        if refit_due(since, recorded, every, growth):
            sizes.append(recorded)
            since = 0
    return sizes


def test_refits_are_as_frequent_as_every_refit_every_queries_until_the_growth_rule_is_wider() -> (
    None
):
    with_growth = refit_sizes(1000, EVERY, GROWTH)
    periodic = refit_sizes(1000, EVERY, 0.0)
    assert [s for s in with_growth if s <= 250] == [s for s in periodic if s <= 250]
    assert periodic[:8] == [1, 2, 3, 5, 9, 17, 33, 65]  # young: each time the count doubles
    assert all(b - a == EVERY for a, b in zip(periodic[-5:], periodic[-4:], strict=False))


def test_past_the_periodic_range_each_refit_waits_for_the_growth_share() -> None:
    sizes = refit_sizes(20_000, EVERY, GROWTH)
    late = [(a, b) for a, b in zip(sizes, sizes[1:], strict=False) if a >= 200]
    assert late, "no refit past 200 queries"
    assert all(b - a == max(EVERY, math.ceil(GROWTH * a)) for a, b in late)
    assert late[-1][1] - late[-1][0] > 50 * EVERY / 10  # thousands of queries apart by then


def test_total_refit_work_stays_linear_in_the_history() -> None:
    """A refit's work is linear in the queries (their observations) it refits over: their sum
    over a namespace's life, per query, is bounded at any size with the growth rule and grows
    with the size without it."""
    for queries in (1_000, 10_000, 100_000):
        work_per_query = sum(refit_sizes(queries, EVERY, GROWTH)) / queries
        assert work_per_query <= (1 + GROWTH) / GROWTH + 1
    periodic = sum(refit_sizes(100_000, EVERY, 0.0)) / 100_000
    assert periodic > 100 * (1 + GROWTH) / GROWTH


def test_the_workers_sql_picks_exactly_the_namespaces_the_rule_makes_due(
    clean_database: str,
) -> None:
    cases = [
        (since, recorded)
        for recorded in (1, 2, 7, 60, 199, 200, 201, 260, 400, 1000, 4000)
        for since in sorted({1, recorded // 5, recorded // 4, recorded // 3, 49, 50, 51})
        if 0 < since <= recorded
    ]
    engine = create_engine(clean_database)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO namespaces (name, next_query_index, queries_since_refit) "
                "VALUES (:name, :recorded, :since)"
            ),
            [
                {"name": f"ns-{since}-{recorded}", "since": since, "recorded": recorded}
                for since, recorded in cases
            ],
        )
    engine.dispose()

    async def due() -> list[str]:
        async_engine = create_async_engine(clean_database, 1)
        try:
            async with async_sessionmaker(async_engine)() as session:
                return await namespaces_due_for_refit(session, EVERY, GROWTH)
        finally:
            await async_engine.dispose()

    expected = {
        f"ns-{since}-{recorded}"
        for since, recorded in cases
        if refit_due(since, recorded, EVERY, GROWTH)
    }
    assert set(asyncio.run(due())) == expected
    assert 0 < len(expected) < len(cases)


def test_only_queries_that_observed_something_count_towards_the_next_refit(
    clean_database: str,
) -> None:
    """A semantic retrieve observes nothing, so it teaches the model nothing: it is recorded
    (its index, its trace) but does not bring the namespace's refit closer."""

    async def scenario() -> list[tuple[int, int]]:
        settings = Settings(database_url=clean_database, embedder="none", scorer="local",
                            background_work=False, _env_file=None)
        rng = np.random.default_rng(0)
        async with open_database(settings.database) as db:
            async with db.sessions() as session:
                await ingest(session, None, 384, "ns", [
                    NewMemory(text=f"m{i}", embedding=rng.normal(size=384).tolist())
                    for i in range(30)])
                await session.commit()
            pipeline = RetrievalPipeline(db.sessions, None, LocalScorer(), settings)
            counters = []
            for policy in ("semantic", "semantic", "earm", "semantic", "earm"):
                await pipeline.retrieve(RetrieveRequest(
                    namespace="ns", query="q", policy=policy, candidates=20, budget=5,
                    query_embedding=rng.normal(size=384).tolist()))
                async with db.engine.connect() as conn:
                    row = (await conn.execute(text(
                        "SELECT next_query_index, queries_since_refit FROM namespaces"))).one()
                counters.append((row[0], row[1]))
            return counters

    assert asyncio.run(scenario()) == [(1, 0), (2, 0), (3, 1), (4, 1), (5, 2)]
