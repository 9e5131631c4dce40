"""SQL behind ``GET /stats`` and the database gauges of ``GET /metrics``.

Both read the per-namespace counters the pipeline keeps (``namespaces``: queries recorded,
scorer calls, calls full reranking would have made, last refit), so they cost little:

- ``/stats`` adds exact counts through the namespace indexes (memories by
  ``ix_memories_namespace_id``, observations by ``ix_scores_namespace``), the returned-memory
  sums over the namespace's queries, and the completion error over its last
  :data:`PREQUENTIAL_WINDOW` queries (``uq_queries_namespace_query_index``, read backwards).
- ``/metrics`` reads the ``namespaces`` table only (one row per namespace): never memories,
  queries or scores, so a scrape costs the same however much has been learned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.api.stats import PREQUENTIAL_WINDOW, NamespaceStats
from service.budget import BudgetSchedule
from service.db.statements import fetch_record, fetch_records
from service.errors import NotFound


def _stats_sql(name: str) -> str:
    """The statistics of the namespaces, each of ``name``: ``n.name`` (every namespace) or the
    parameter ``%(namespace)s`` (one). One namespace's subqueries name the parameter, not the
    outer row: Citus routes a statement to one shard when each table is filtered on its
    distribution column by a value, and correlation with the outer row is not such a filter
    (it ran one task on every shard)."""
    return f"""
SELECT n.name, n.next_query_index, n.scorer_calls, n.scorer_requests, n.full_rerank_calls,
       n.reused_cells, n.reuse_saved_calls, n.last_refit_at,
       (SELECT count(*) FROM memories m WHERE m.namespace = {name}) AS memories,
       (SELECT count(*) FROM memories m WHERE m.namespace = {name} AND NOT m.indexed)
           AS memories_unindexed,
       -- live cells only: retired ones judged content that no longer exists
       (SELECT count(*) FROM scores s WHERE s.namespace = {name} AND s.retired_at IS NULL)
           AS observations,
       r.returned, r.estimated, p.error, p.anchors
FROM namespaces n
CROSS JOIN LATERAL (
    SELECT coalesce(sum(q.returned_count), 0) AS returned,
           coalesce(sum(q.returned_estimated), 0) AS estimated
    FROM queries q WHERE q.namespace = {name}
) r
CROSS JOIN LATERAL (
    SELECT sum(w.prequential_abs_error * w.prequential_count)
               / nullif(sum(w.prequential_count), 0) AS error,
           coalesce(sum(w.prequential_count), 0) AS anchors
    FROM (
        SELECT q.prequential_abs_error, q.prequential_count FROM queries q
        WHERE q.namespace = {name} ORDER BY q.query_index DESC LIMIT {PREQUENTIAL_WINDOW}
    ) w
    WHERE w.prequential_count > 0
) p
"""


_ONE_NAMESPACE_STATS_SQL = _stats_sql("%(namespace)s") + " WHERE n.name = %(namespace)s"
_ALL_NAMESPACE_STATS_SQL = _stats_sql("n.name") + " ORDER BY n.name"


def _ratio(numerator: float, denominator: float) -> float | None:
    return float(numerator) / float(denominator) if denominator else None


def _namespace_stats(
    row: dict[str, Any], schedule: BudgetSchedule, default_candidates: int
) -> NamespaceStats:
    queries, memories, observations = (
        int(row["next_query_index"]),
        int(row["memories"]),
        int(row["observations"]),
    )
    stage = schedule.stage_for(queries)
    saved = _ratio(row["scorer_calls"], row["full_rerank_calls"])
    return NamespaceStats(
        namespace=row["name"],
        memories=memories,
        memories_unindexed=int(row["memories_unindexed"]),
        queries=queries,
        observations=observations,
        density=observations / (memories * queries) if memories and queries else 0.0,
        stage=stage,
        # What the next default request would score: the namespace may hold fewer memories
        # than the default number of candidates.
        next_budget=schedule.budget_for_query(queries, min(default_candidates, memories)),
        next_budget_ratio=schedule.stages[stage][1],
        scorer_calls=int(row["scorer_calls"]),
        scorer_requests=int(row["scorer_requests"]),
        full_rerank_calls=int(row["full_rerank_calls"]),
        reused_cells=int(row["reused_cells"]),
        reuse_saved_calls=int(row["reuse_saved_calls"]),
        calls_saved=None if saved is None else 1.0 - saved,
        estimated_share=_ratio(row["estimated"], row["returned"]),
        prequential_error=None if row["error"] is None else float(row["error"]),
        prequential_anchors=int(row["anchors"]),
        last_refit_at=row["last_refit_at"],
    )


async def namespace_stats(
    session: AsyncSession, namespace: str, schedule: BudgetSchedule, default_candidates: int
) -> NamespaceStats:
    row = await fetch_record(session, _ONE_NAMESPACE_STATS_SQL, {"namespace": namespace})
    if row is None:
        raise NotFound(f"namespace {namespace!r} does not exist")
    return _namespace_stats(row, schedule, default_candidates)


async def all_namespace_stats(
    session: AsyncSession, schedule: BudgetSchedule, default_candidates: int
) -> list[NamespaceStats]:
    """Every namespace, by name. Its cost grows with the data (it counts every namespace's
    memories and observations through the indexes); poll ``/metrics`` for monitoring."""
    rows = await fetch_records(session, _ALL_NAMESPACE_STATS_SQL)
    return [_namespace_stats(row, schedule, default_candidates) for row in rows]


# ------------------------------------------------------------------------- /metrics gauges


@dataclass(frozen=True)
class NamespaceCounters:
    namespace: str
    queries: int
    observations: int  # the running count kept for the model's mean (healed at each refit)
    scorer_calls: int
    full_rerank_calls: int
    reused_cells: int
    reuse_saved_calls: int
    last_refit_at: datetime | None


@dataclass(frozen=True)
class CounterSnapshot:
    namespaces: int
    queries: int
    observations: int
    scorer_calls: int
    full_rerank_calls: int
    reused_cells: int
    reuse_saved_calls: int
    busiest: Sequence[NamespaceCounters]  # at most `limit`, most queries first


_COUNTERS_SQL = """
SELECT name, next_query_index, score_count, scorer_calls, full_rerank_calls, reused_cells,
       reuse_saved_calls, last_refit_at,
       count(*) OVER () AS total_namespaces,
       sum(next_query_index) OVER () AS total_queries,
       sum(score_count) OVER () AS total_observations,
       sum(scorer_calls) OVER () AS total_scorer_calls,
       sum(full_rerank_calls) OVER () AS total_full_rerank_calls,
       sum(reused_cells) OVER () AS total_reused_cells,
       sum(reuse_saved_calls) OVER () AS total_reuse_saved_calls
FROM namespaces
ORDER BY next_query_index DESC, name
LIMIT %(limit)s
"""


async def counter_snapshot(session: AsyncSession, limit: int) -> CounterSnapshot:
    """Totals over every namespace plus the ``limit`` namespaces with the most queries, in one
    statement over the ``namespaces`` table (window sums are taken before the LIMIT)."""
    rows = await fetch_records(session, _COUNTERS_SQL, {"limit": limit})
    if not rows:
        return CounterSnapshot(0, 0, 0, 0, 0, 0, 0, [])
    first = rows[0]
    return CounterSnapshot(
        namespaces=int(first["total_namespaces"]),
        queries=int(first["total_queries"]),
        observations=int(first["total_observations"]),
        scorer_calls=int(first["total_scorer_calls"]),
        full_rerank_calls=int(first["total_full_rerank_calls"]),
        reused_cells=int(first["total_reused_cells"]),
        reuse_saved_calls=int(first["total_reuse_saved_calls"]),
        busiest=[
            NamespaceCounters(
                namespace=r["name"],
                queries=int(r["next_query_index"]),
                observations=int(r["score_count"]),
                scorer_calls=int(r["scorer_calls"]),
                full_rerank_calls=int(r["full_rerank_calls"]),
                reused_cells=int(r["reused_cells"]),
                reuse_saved_calls=int(r["reuse_saved_calls"]),
                last_refit_at=r["last_refit_at"],
            )
            for r in rows
        ],
    )
