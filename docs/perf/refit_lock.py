"""How long a refit's write holds its namespace's lock (docs/performance.md, "Refits and the
namespace lock"), statement by statement, at each observation count given on the command line
(default 100,000 and 1,000,000).

A namespace shaped like `earm bench capacity`'s 'large' (2,000 memories, 35 observations per
query, queries with 384-dimensional embeddings and 200-candidate traces, a refit before) is
built with bulk SQL in an embedded Postgres; then, as a refit does, its horizon is taken and its
observations read, 7,000 observations are recorded (what the serving process records while a
refit fits), and `model_state.replace_model` writes a refitted model of the namespace's shapes
(its values do not change the work), three times.
Every statement the write runs is timed (the median of the three), and the lock's hold: from
the statement that takes it to the end of the commit, Python between the statements included.

    PYTHONPATH=.:bench python docs/perf/refit_lock.py [observations ...]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from sqlalchemy.ext.asyncio import async_sessionmaker

from earm_bench.common.database import libpq_url, migrated_database
from service.completion import ContentPrior
from service.completion.statistics import packed_length
from service.db import experience, model_state
from service.db.engine import create_engine

DIM = 384
RANK = 8
MEMORIES = 2_000
PER_QUERY = 35
TRACE = 200
SINCE_QUERIES = 200  # queries recorded between the horizon and the write (7,000 observations)
REPEATS = 3
#: The write's first statement under the lock (``namespace_state(..., for_update=True)``).
LOCK_STATEMENT = "SELECT next_query_index"
NAMESPACE = "large"

_BUILD = [
    "INSERT INTO namespaces (name) VALUES (%(ns)s)",
    # 2,000 memories, not indexed (no HNSW build)
    """INSERT INTO memories (namespace, text, embedding, embedding_model)
       SELECT %(ns)s, 'memory ' || i, e.v, 'bench' FROM generate_series(1, %(memories)s) i,
           (SELECT array_agg(random()::real)::vector AS v FROM generate_series(1, %(dim)s)) e""",
    # wide rows, as the service records them: an embedding and a 200-candidate trace each
    """INSERT INTO queries (namespace, query_index, text, embedding, policy, candidates, budget,
           scorer_calls, stage, timings, trace_memory_ids, trace_similarities, trace_estimates,
           trace_scores, trace_sources, trace_origins, trace_anchors, trace_anchor_reasons)
       SELECT %(ns)s, i, 'query ' || i,
           (SELECT array_agg(random()::real)::vector FROM generate_series(1, %(dim)s + i * 0)),
           'earm', 200, 35, 35, 3, '{"search_ms": 1.0}'::jsonb,
           t.ids, t.r, t.r, t.r, t.src, t.src, t.b, t.src
       FROM generate_series(0, %(queries)s - 1) i,
           (SELECT array_agg(j::bigint) AS ids, array_agg(random()::real) AS r,
                   array_agg('observed'::text) AS src, array_agg(j %% 5 = 0) AS b
            FROM generate_series(1, %(trace)s) j) t""",
    # the parameters a refit before gave every query
    """INSERT INTO query_factors (namespace, query_id, bias, slope, factors)
       SELECT %(ns)s, q.id, random(), random(), f.f FROM queries q,
           (SELECT array_agg(random()::real) AS f FROM generate_series(1, %(rank)s)) f
       WHERE q.namespace = %(ns)s""",
    """INSERT INTO scores (query_id, memory_id, namespace, score, similarity, source,
           anchor_kind, raw_score, scored_by, created_at)
       SELECT q.id, m.first + (q.query_index * 7919 + j * 53) %% %(memories)s, %(ns)s,
           random(), random(), 'scorer', 1, random(), 'bench:judge', now() - interval '1 day'
       FROM queries q, generate_series(0, %(per_query)s - 1) j,
           (SELECT min(id) AS first FROM memories WHERE namespace = %(ns)s) m
       WHERE q.namespace = %(ns)s""",
    """INSERT INTO memory_factors (memory_id, namespace, bias, factors, observation_count,
           statistics)
       SELECT s.memory_id, %(ns)s, 0, array_fill(0.1::real, ARRAY[%(rank)s]), count(*),
           array_fill(0.5::float8, ARRAY[%(packed)s])
       FROM scores s WHERE s.namespace = %(ns)s GROUP BY s.memory_id""",
    """UPDATE namespaces SET next_query_index = %(queries)s, last_refit_at = now(),
           (score_sum, score_count) = (SELECT sum(score), count(*) FROM scores
                                       WHERE namespace = %(ns)s)
       WHERE name = %(ns)s""",
]

# Queries recorded after the refit's horizon: what the serving process records while it fits.
_RECORD_SINCE = """
    WITH q AS (
        INSERT INTO queries (namespace, query_index, text, embedding, policy, candidates,
                             budget, scorer_calls)
        SELECT %(ns)s, %(base)s + i, 'late ' || i, e.embedding, 'earm', 200, 35, 35
        FROM generate_series(0, %(n)s - 1) i,
             (SELECT embedding FROM queries WHERE namespace = %(ns)s LIMIT 1) e
        RETURNING id, query_index
    ), f AS (
        INSERT INTO query_factors (namespace, query_id, bias, slope, factors)
        SELECT %(ns)s, q.id, 0, 0, array_fill(0.1::real, ARRAY[%(rank)s]) FROM q
    ), s AS (
        INSERT INTO scores (query_id, memory_id, namespace, score, similarity, source,
                            raw_score, scored_by, created_at)
        SELECT q.id, m.first + (q.query_index * 7919 + j * 53) %% %(memories)s, %(ns)s,
               random(), random(), 'scorer', random(), 'bench:judge', statement_timestamp()
        FROM q, generate_series(0, %(per_query)s - 1) j,
             (SELECT min(id) AS first FROM memories WHERE namespace = %(ns)s) m
    )
    UPDATE namespaces SET next_query_index = next_query_index + %(n)s WHERE name = %(ns)s
"""


def build(url: str, observations: int) -> dict[str, float]:
    queries = observations // PER_QUERY
    parameters = {"ns": NAMESPACE, "memories": MEMORIES, "dim": DIM, "queries": queries,
                  "rank": RANK, "trace": TRACE, "per_query": PER_QUERY,
                  "packed": packed_length(RANK)}
    began = time.perf_counter()
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        for statement in _BUILD:
            conn.execute(statement, parameters)
        conn.execute("VACUUM ANALYZE")
    return {"queries": queries, "build_s": round(time.perf_counter() - began, 1)}


def synthetic_model(url: str) -> model_state.RefittedModel:
    """A refitted model of the namespace's shapes: one row per observed memory and query."""
    with psycopg.connect(libpq_url(url)) as conn:
        memory_ids = np.array([r[0] for r in conn.execute(
            "SELECT DISTINCT memory_id FROM scores WHERE namespace = %s ORDER BY 1",
            (NAMESPACE,))], dtype=np.int64)
        query_ids = np.array([r[0] for r in conn.execute(
            "SELECT DISTINCT query_id FROM scores WHERE namespace = %s ORDER BY 1",
            (NAMESPACE,))], dtype=np.int64)
    rng = np.random.default_rng(0)
    m, q = len(memory_ids), len(query_ids)
    return model_state.RefittedModel(
        memory_ids=memory_ids, memory_bias=rng.normal(size=m),
        memory_factors=rng.normal(size=(m, RANK)),
        observation_count=np.full(m, PER_QUERY, dtype=np.int64),
        statistics=rng.normal(size=(m, packed_length(RANK))),
        query_ids=query_ids, query_bias=rng.normal(size=q), query_slope=rng.normal(size=q),
        query_factors=rng.normal(size=(q, RANK)),
        prior=ContentPrior(slope=0.5, weights=rng.normal(size=DIM)), factor_reg=None,
    )


@contextmanager
def timed_statements(times: dict[str, list[float]]) -> Iterator[None]:
    """Every statement and COPY on any psycopg async connection, timed by its first words."""
    execute, copy = psycopg.AsyncConnection.execute, model_state.copy_in

    def label(statement: Any) -> str:
        return " ".join(str(statement).split())[:60]

    async def timed_execute(self: Any, statement: Any, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        if label(statement).startswith(LOCK_STATEMENT):
            times["lock taken"].append(began)
        try:
            return await execute(self, statement, *args, **kwargs)
        finally:
            times[label(statement)].append(time.perf_counter() - began)

    async def timed_copy(conn: Any, statement: str, data: bytes) -> None:
        began = time.perf_counter()
        try:
            await copy(conn, statement, data)
        finally:
            times[label(statement)].append(time.perf_counter() - began)

    psycopg.AsyncConnection.execute = timed_execute  # type: ignore[method-assign]
    model_state.copy_in = timed_copy  # type: ignore[assignment]
    try:
        yield
    finally:
        psycopg.AsyncConnection.execute = execute  # type: ignore[method-assign]
        model_state.copy_in = copy


async def write_once(url: str, model: model_state.RefittedModel, base: int) -> dict[str, Any]:
    engine = create_engine(url, 1)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    times: dict[str, list[float]] = defaultdict(list)
    try:
        async with sessions() as session:
            read_from = await model_state.refit_horizon(session, NAMESPACE)
            await session.commit()
            cells = await experience.namespace_observations(session, NAMESPACE)
            read = model_state.RefitRead(
                read_from, cells.query_ids, cells.memory_ids, cells.scores
            )
            with psycopg.connect(libpq_url(url), autocommit=True) as conn:
                conn.execute(_RECORD_SINCE, {"ns": NAMESPACE, "base": base, "n": SINCE_QUERIES,
                                             "memories": MEMORIES, "per_query": PER_QUERY,
                                             "rank": RANK})
            with timed_statements(times):
                await model_state.replace_model(
                    session, NAMESPACE, model, refitted_at=read_from, read=read,
                )
                await session.commit()
                held = time.perf_counter() - times.pop("lock taken")[0]
    finally:
        await engine.dispose()
    return {"held": held, **{k: sum(v) for k, v in times.items()}}


def main() -> None:
    tiers = [int(a) for a in sys.argv[1:]] or [100_000, 1_000_000]
    for observations in tiers:
        with tempfile.TemporaryDirectory() as tmp, \
                migrated_database(None, DIM, Path(tmp)) as url:
            shape = build(url, observations)
            model = synthetic_model(url)
            runs = [
                asyncio.run(write_once(url, model, shape["queries"] + i * SINCE_QUERIES))
                for i in range(REPEATS)
            ]
        print(f"\n{observations:,} observations ({shape['queries']:,} queries, {MEMORIES:,} "
              f"memories; built in {shape['build_s']} s), {SINCE_QUERIES * PER_QUERY:,} "
              f"recorded since the horizon, median of {REPEATS} writes, ms:\n")
        print("| statement (those before the lock first) | ms |\n|---|---:|")
        for key in runs[0]:
            if key != "held":
                print(f"| `{key}` | {statistics.median(r[key] for r in runs) * 1000:.1f} |")
        print(f"| **lock held (lock to commit)** | "
              f"{statistics.median(r['held'] for r in runs) * 1000:.1f} |", flush=True)


if __name__ == "__main__":
    main()
