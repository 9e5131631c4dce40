"""Growing a namespace of ``earm bench load`` to an observation tier: synthetic scored queries,
bulk-inserted the way the service records them, and one retrieve that makes the service refit."""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

import numpy as np

from earm_bench.load.database import make_refit_due
from earm_bench.load.session import LoadRun, Samples, retrieve


class _BulkQueries(NamedTuple):
    ids: list[int]
    topics: np.ndarray
    embeddings: np.ndarray
    latents: np.ndarray


async def _insert_queries(run: LoadRun, conn: Any, base: int, numbers: list[int]) -> _BulkQueries:
    """COPY the queries rows from ``query_index`` ``base`` on."""
    topics, embeddings, latents = run.world.queries(numbers)
    per_query, candidates = run.config.obs_per_query, run.config.candidates
    async with conn.cursor() as cur, cur.copy(
        "COPY queries (namespace, query_index, text, embedding, policy, candidates, "
        "budget, scorer_calls) FROM STDIN WITH (FORMAT BINARY)"
    ) as copy:
        copy.set_types(["text", "int8", "text", "vector", "text", "int4", "int4", "int4"])
        for j, number in enumerate(numbers):
            await copy.write_row((
                run.namespace, base + j, run.world.query_text(number, int(topics[j])),
                embeddings[j], "earm", candidates, per_query, per_query,
            ))
    # Located as the service's record locates a query (GET /queries/{id} reads the locator).
    cursor = await conn.execute(
        "WITH loaded AS (SELECT id FROM queries WHERE namespace = %(ns)s "
        "AND query_index >= %(base)s), located AS (INSERT INTO query_locator (id, namespace) "
        "SELECT id, %(ns)s FROM loaded) SELECT id FROM queries WHERE namespace = %(ns)s "
        "AND query_index >= %(base)s ORDER BY query_index",
        {"ns": run.namespace, "base": base},
    )
    query_ids = [r[0] for r in await cursor.fetchall()]
    return _BulkQueries(query_ids, topics, embeddings, latents)


async def _insert_scores(
    run: LoadRun, conn: Any, base: int, queries: _BulkQueries
) -> tuple[float, int]:
    """COPY ``obs_per_query`` scored cells of each query's topic, scores from the world's
    truth; their sum and count."""
    world, per_query = run.world, run.config.obs_per_query
    query_ids, topics, embeddings, latents = queries
    rng = np.random.default_rng([run.config.seed, 7, base])
    total, added = 0.0, 0
    async with conn.cursor() as cur, cur.copy(
        "COPY scores (query_id, memory_id, namespace, score, similarity, source) "
        "FROM STDIN WITH (FORMAT BINARY)"
    ) as copy:
        copy.set_types(["int8", "int8", "text", "float4", "float4", "text"])
        for j, query_id in enumerate(query_ids):
            chosen = rng.choice(world.by_topic[int(topics[j])], size=per_query, replace=False)
            scores = np.round(world.relevance(latents[j], chosen), 3)
            similarities = world.memory_embeddings[chosen] @ embeddings[j]
            for m, s, c in zip(chosen, scores, similarities, strict=True):
                await copy.write_row((query_id, int(run.memory_ids[m]), run.namespace,
                                      float(s), float(c), "scorer"))
            total += float(scores.sum())
            added += per_query
    return total, added


async def add_observations(run: LoadRun, target: int, current: int) -> dict[str, Any]:
    """Bulk-insert synthetic scored queries until the namespace holds ``target``
    observations: queries rows (COPY), then their scores (COPY), then the counters."""
    n_queries = math.ceil((target - current) / run.config.obs_per_query)
    if n_queries <= 0:
        return {"queries_added": 0, "observations_added": 0, "seconds": 0.0}
    began = time.perf_counter()
    conn = await run.connect()
    try:
        async with conn.transaction():
            cursor = await conn.execute(
                "SELECT next_query_index FROM namespaces WHERE name = %s FOR UPDATE",
                (run.namespace,),
            )
            base = int((await cursor.fetchone())[0])
            numbers = list(range(10**9 + base, 10**9 + base + n_queries))
            queries = await _insert_queries(run, conn, base, numbers)
            total, added = await _insert_scores(run, conn, base, queries)
            await conn.execute(
                "UPDATE namespaces SET next_query_index = next_query_index + %(n)s, "
                "scorer_calls = scorer_calls + %(calls)s, "
                "full_rerank_calls = full_rerank_calls + %(full)s, "
                "score_sum = score_sum + %(sum)s, score_count = score_count + %(calls)s "
                "WHERE name = %(ns)s",
                {"n": n_queries, "calls": added, "full": n_queries * run.config.candidates,
                 "sum": total, "ns": run.namespace},
            )
    finally:
        await conn.close()
    return {"queries_added": n_queries, "observations_added": added,
            "seconds": round(time.perf_counter() - began, 2)}


async def trigger_service_refit(run: LoadRun) -> dict[str, Any]:
    """One retrieve that makes the service itself run a full refit (the counter is set so
    that this query is due), timed like any other; the service's memory afterwards, and its
    peak during that retrieve (the peak is reset before it)."""
    await make_refit_due(run)
    run.service.reset_peak_rss()
    samples = Samples()
    await retrieve(run, run.query_numbers(1)[0], "earm", samples)
    return {
        "total_ms": samples.timings[0]["total_ms"] if samples.timings else None,
        "record_ms": samples.timings[0]["record_ms"] if samples.timings else None,
        **run.service.rss_mb(),
    }
