"""The database's share of an ``earm`` retrieve against the floor (docs/performance.md, round
11): how long Postgres takes for the two round trips no retrieve that records before answering
can skip, the search's candidate statement and the record's transaction, next to the raw top-N
query that ``earm bench load`` calls the floor. No pipeline, no HTTP, no scorer.

Each round, interleaved, in one process:

- the floor (``service.bench.load.floor``'s query) on a fresh query vector of the bench's world;
- the service's candidate statement (``service.db.search``: HNSW top-N with every candidate's
  texts, content-prior score and model row) on another fresh vector;
- ``service.db.record.record_query``, the service's record, replaying one of the
  namespace's latest traced retrieves as a new query: its text, embedding, parameters, trace and
  observations as stored, and the online update of the memory rows it observed, computed by the
  service's own ``update_memory_rows`` from their current rows (read beforehand, untimed, as a
  retrieve reads them while its scorer works).

It writes: every round records one more query in the namespace. Point it at a scratch world,
e.g. the one ``earm bench load --database-url URL`` leaves behind (its namespace is the JSON
report's ``namespace``)::

    earm bench load --memories 100000 --observations 10000 --concurrency 1 --policies earm \\
        --requests 48 --embed-memories 0 --copy-memories 0 --database-url URL --out world.json
    python docs/perf/record_bound.py --database-url URL \\
        --namespace "$(python -c 'import json; print(json.load(open("world.json"))["namespace"])')"
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.bench.load.config import LoadConfig
from service.bench.load.floor import _TOP_N_SQL
from service.bench.load.world import World
from service.completion import QueryParameters
from service.db import memory_rows
from service.db.engine import create_engine, driver_connection, sqlalchemy_url
from service.db.namespaces import namespace_state
from service.db.record import (
    ObservedCells,
    QueryTrace,
    RecordedRetrieve,
    ReusedCells,
    Spending,
    record_query,
)
from service.db.search import _SEARCH_SETTINGS_SQL, _candidate_sql
from service.retrieve.online import new_cells, update_memory_rows
from service.settings import Settings

CANDIDATES = 200
_CANDIDATE_SQL = _candidate_sql(exact=False, filtered=False)

_RECORDED_SQL = text(
    """
    SELECT id, text, embedding::text, policy, candidates, budget, scorer_calls, bias, slope,
           factors, prequential_abs_error, prequential_count, returned_count,
           returned_estimated, family_key, reused_memory_ids, stage, timings, trace_memory_ids,
           trace_similarities, trace_estimates, trace_scores, trace_sources, trace_origins,
           trace_anchors
    FROM queries WHERE namespace = :namespace AND trace_memory_ids IS NOT NULL
      AND cardinality(trace_memory_ids) > 0 AND bias IS NOT NULL
    ORDER BY query_index DESC LIMIT :n
    """
)
_OBSERVED_SQL = text(
    "SELECT memory_id, similarity, score FROM scores WHERE query_id = :id ORDER BY memory_id"
)


async def recorded_retrieves(
    sessions: async_sessionmaker[AsyncSession], namespace: str, n: int
) -> list[RecordedRetrieve]:
    """The namespace's latest ``n`` traced retrieves, each as ``record_query`` takes it."""
    async with sessions() as session:
        rows = (await session.execute(_RECORDED_SQL, {"namespace": namespace, "n": n})).all()
        retrieves = []
        for r in rows:
            observed = (await session.execute(_OBSERVED_SQL, {"id": r.id})).all()
            retrieves.append(RecordedRetrieve(
                namespace=namespace,
                text=r.text,
                embedding=np.array(r.embedding.strip("[]").split(","), np.float32),
                policy=r.policy,
                family_key=r.family_key,
                query=QueryParameters(r.bias, r.slope or 0.0, np.array(r.factors, float)),
                prequential_errors=np.full(r.prequential_count, r.prequential_abs_error or 0.0),
                spending=Spending(r.candidates, r.budget, r.scorer_calls, 1),
                observed=ObservedCells(
                    np.array([o.memory_id for o in observed], np.int64),
                    np.array([o.similarity for o in observed], float),
                    np.array([o.score for o in observed], float),
                    np.zeros(len(observed)),
                ),
                reused=ReusedCells(np.array(r.reused_memory_ids, np.int64), 0),
                returned=r.returned_count,
                returned_estimated=r.returned_estimated,
                trace=QueryTrace(
                    r.stage, r.timings, np.array(r.trace_memory_ids, np.int64),
                    np.array(r.trace_similarities, float), np.array(r.trace_estimates, float),
                    np.array(r.trace_scores, float), r.trace_sources, r.trace_origins,
                    np.array(r.trace_anchors, bool),
                ),
            ))
        await session.commit()
    return retrieves


async def online_update(
    sessions: async_sessionmaker[AsyncSession], namespace: str, retrieve: RecordedRetrieve,
    settings: Settings,
) -> Any:
    """The update of the observed rows a retrieve would record now (untimed: a retrieve reads
    the rows while its scorer works)."""
    assert retrieve.query is not None, "the replayed retrieves have parameters"
    async with sessions() as session:
        state = await namespace_state(session, namespace)
        stored = await memory_rows.read_rows(session, retrieve.observed.memory_ids, settings.rank)
        await session.commit()
    cells = new_cells(retrieve.query, retrieve.observed)
    return update_memory_rows(state, stored, cells, settings.memory_reg, settings.rank)


async def timed_query(sessions: async_sessionmaker[AsyncSession], sql: str,
                      params: dict[str, Any], settings_sql: str | None = None) -> float:
    """Milliseconds of one read-only round trip (settings and COMMIT pipelined, as the search
    sends them)."""
    async with sessions() as session:
        conn = await driver_connection(session)
        started = time.perf_counter()
        async with conn.pipeline():
            if settings_sql:
                await conn.execute(settings_sql, params)
            cursor = await conn.execute(sql, params, binary=True)
            await conn.commit()
        await cursor.fetchall()
        return (time.perf_counter() - started) * 1000


async def main(args: argparse.Namespace) -> None:
    settings = Settings(database_url=args.database_url, _env_file=None)
    engine = create_engine(sqlalchemy_url(args.database_url), pool_size=4)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    world = World(LoadConfig(memories=args.memories, observations=(10_000,)))
    retrieves = await recorded_retrieves(sessions, args.namespace, args.rounds)
    if not retrieves:
        raise SystemExit(f"namespace {args.namespace!r} has no traced retrieves to replay")
    times: dict[str, list[float]] = {"floor": [], "candidates": [], "record": []}
    for i in range(args.rounds):
        floor_query, search_query = (world.query(args.first_query + 2 * i + k)[1] for k in (0, 1))
        times["floor"].append(await timed_query(
            sessions, _TOP_N_SQL,
            {"q": floor_query, "ns": args.namespace, "n": CANDIDATES, "ef": "200"},
            _SEARCH_SETTINGS_SQL))
        times["candidates"].append(await timed_query(
            sessions, _CANDIDATE_SQL,
            {"query": search_query, "namespace": args.namespace, "limit": CANDIDATES, "ef": "200"},
            _SEARCH_SETTINGS_SQL))
        retrieve = retrieves[i % len(retrieves)]
        update = await online_update(sessions, args.namespace, retrieve, settings)
        async with sessions() as session:
            started = time.perf_counter()
            await record_query(session, retrieve, update)
            times["record"].append((time.perf_counter() - started) * 1000)
    await engine.dispose()
    p50 = {name: statistics.median(values) for name, values in times.items()}
    print(f"{args.rounds} rounds, p50 ms: floor {p50['floor']:.2f}, candidate statement "
          f"{p50['candidates']:.2f} ({p50['candidates'] / p50['floor']:.2f} x the floor), "
          f"record {p50['record']:.2f} ({p50['record'] / p50['floor']:.2f} x); candidate "
          f"statement + record = {(p50['candidates'] + p50['record']) / p50['floor']:.2f} x "
          "the floor")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--namespace", required=True, help="a namespace of `earm bench load`")
    parser.add_argument("--memories", type=int, default=100_000, help="the world's size")
    parser.add_argument("--rounds", type=int, default=48)
    parser.add_argument("--first-query", type=int, default=10_000_000,
                        help="first query number of the world drawn (fresh vectors)")
    asyncio.run(main(parser.parse_args()))
