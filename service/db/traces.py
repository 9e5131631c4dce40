"""The trace of one recorded retrieve (``GET /queries/{id}``, the dashboard's query page).

Read from the query's row, where the retrieve stored its candidates in rank order (migration
0012), joined with the memories (their text now) and the query's observations (their score and
origin now: a client's feedback may have come after the retrieve). Three statements, by primary
keys: the query's namespace (``query_locator``), its row, then its candidates unnested.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from pydantic import Field
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.statements import fetch_record, fetch_records, fetch_value
from service.errors import NotFound


@dataclass(frozen=True)
class TracedCandidate:
    """One candidate of a retrieve, as it was ranked."""

    rank: Annotated[int, Field(description="1 = best; the first `returned` were returned.")]
    memory_id: int
    external_id: str | None
    text: Annotated[str | None, Field(description="The memory's text now (null: deleted).")]
    similarity: Annotated[float, Field(description="Cosine similarity to the query.")]
    anchor: Annotated[bool, Field(description="Sampled for the scorer (the query's budget).")]
    anchor_reason: Annotated[
        str | None,
        Field(
            description="Why an anchor was scored: head (among the most similar), estimate (the "
            "completion estimated it highest after the head was scored), explore (drawn at "
            "random from the rest); null for the other candidates and for queries recorded "
            "by a version that did not keep it."
        ),
    ]
    returned: bool
    observed_score: Annotated[
        float | None,
        Field(description="The pair's observed score (its current value: feedback replaces it)."),
    ]
    origin: Annotated[
        str | None,
        Field(description="Where the observation came from: scorer, feedback, reused (null: none)"),
    ]
    estimate: Annotated[
        float,
        Field(
            description="The policy's estimate when the query ranked (earm: the completion model "
            "with this query folded in); an unobserved candidate was ranked by it."
        ),
    ]
    score: Annotated[float, Field(description="The final score it was ranked by.")]
    source: Annotated[
        str, Field(description="observed | estimated | semantic, as returned.")
    ]


@dataclass(frozen=True)
class QueryTraceResult:
    """What one retrieve did: enough to answer "why was this returned, and what did it cost"."""

    query_id: int
    namespace: str
    query_index: int
    text: str
    policy: str
    stage: Annotated[int | None, Field(
        description="Budget stage (null: recorded by a version that kept no trace)."
    )]
    budget: int
    scorer_calls: int
    candidate_count: Annotated[int, Field(description="Semantic candidates (N).")]
    returned: int
    created_at: datetime
    timings: Annotated[
        dict[str, float] | None,
        Field(
            description="Milliseconds per phase up to recording (embed, search, score, "
            "complete); the record phase ends after the row is written, so it is not kept."
        ),
    ]
    prequential_error: float | None
    exploration_share: Annotated[
        float | None,
        Field(
            description="The share of the anchors after the head that were drawn to explore "
            "(null: there was no choice of anchors, or recorded by a version that did not "
            "keep it)."
        ),
    ]
    scorer_rounds: Annotated[
        int | None,
        Field(
            description="The scorer rounds the anchors went out in, one after the other, as "
            "the retrieve response's scorer_rounds (null: recorded by a version that did not "
            "keep it)."
        ),
    ]
    candidates: Annotated[
        list[TracedCandidate],
        Field(
            description="Every candidate, best first (empty for queries recorded with "
            "EARM_QUERY_TRACES=false or by a version that kept no trace)."
        ),
    ]


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
