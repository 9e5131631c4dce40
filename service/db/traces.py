"""The trace of one recorded retrieve (``GET /queries/{id}``, the dashboard's query page).

Read from the query's row, where the retrieve stored its candidates in rank order (migration
0012), joined with the memories (their text now) and the query's observations (their score and
origin now: a client's feedback may have come after the retrieve). Three statements, by primary
keys: the query's namespace (``query_locator``), its row, then its candidates unnested.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.api.queries import QueryTraceResult, TracedCandidate
from service.db.statements import fetch_record, fetch_records, fetch_value
from service.errors import NotFound

_QUERY_SQL = """
SELECT id, namespace, query_index, text, policy, stage, budget, scorer_calls, candidates,
       returned_count, created_at, timings, prequential_abs_error, exploration_share,
       scorer_rounds
FROM queries WHERE namespace = %(namespace)s AND id = %(query_id)s
"""

_CANDIDATES_SQL = """
SELECT c.rank, c.memory_id, m.external_id, m.text, c.similarity, c.anchor, c.anchor_reason,
       c.estimate, c.score, c.source, coalesce(s.source, c.origin) AS origin,
       CASE WHEN s.score IS NOT NULL THEN s.score
            WHEN c.origin IS NOT NULL THEN c.score END AS observed_score
FROM queries q
CROSS JOIN LATERAL unnest(q.trace_memory_ids, q.trace_similarities, q.trace_estimates,
                          q.trace_scores, q.trace_sources, q.trace_origins, q.trace_anchors,
                          q.trace_anchor_reasons)
    WITH ORDINALITY AS c(memory_id, similarity, estimate, score, source, origin, anchor,
                         anchor_reason, rank)
LEFT JOIN memories m ON m.namespace = q.namespace AND m.id = c.memory_id
LEFT JOIN scores s ON s.namespace = q.namespace AND s.query_id = q.id
                  AND s.memory_id = c.memory_id
WHERE q.namespace = %(namespace)s AND q.id = %(query_id)s
ORDER BY c.rank
"""


# The query id names no partition: its namespace does (migration 0017).
_NAMESPACE_SQL = "SELECT namespace FROM query_locator WHERE id = %(query_id)s"


async def query_namespace(session: AsyncSession, query_id: int) -> str:
    """The namespace of a recorded query, or NotFound."""
    namespace = await fetch_value(session, _NAMESPACE_SQL, {"query_id": query_id})
    if namespace is None:
        raise NotFound(f"query {query_id} does not exist")
    return str(namespace)


async def query_trace(session: AsyncSession, namespace: str, query_id: int) -> QueryTraceResult:
    """The trace of a recorded query of the namespace (:func:`query_namespace`), or
    NotFound."""
    parameters = {"namespace": namespace, "query_id": query_id}
    row = await fetch_record(session, _QUERY_SQL, parameters)
    if row is None:
        raise NotFound(f"query {query_id} does not exist")
    rows = await fetch_records(session, _CANDIDATES_SQL, parameters)
    return QueryTraceResult(
        query_id=int(row["id"]),
        namespace=row["namespace"],
        query_index=int(row["query_index"]),
        text=row["text"],
        policy=row["policy"],
        stage=row["stage"],
        budget=int(row["budget"]),
        scorer_calls=int(row["scorer_calls"]),
        candidate_count=int(row["candidates"]),
        returned=int(row["returned_count"]),
        created_at=row["created_at"],
        timings=row["timings"],
        prequential_error=row["prequential_abs_error"],
        exploration_share=row["exploration_share"],
        scorer_rounds=row["scorer_rounds"],
        candidates=[_candidate(r, int(row["returned_count"])) for r in rows],
    )


def _candidate(row: dict[str, Any], returned: int) -> TracedCandidate:
    return TracedCandidate(
        rank=int(row["rank"]),
        memory_id=int(row["memory_id"]),
        external_id=row["external_id"],
        text=row["text"],
        similarity=float(row["similarity"]),
        anchor=bool(row["anchor"]),
        anchor_reason=row["anchor_reason"],
        returned=int(row["rank"]) <= returned,
        observed_score=None if row["observed_score"] is None else float(row["observed_score"]),
        origin=row["origin"],
        estimate=float(row["estimate"]),
        score=float(row["score"]),
        source=row["source"],
    )
