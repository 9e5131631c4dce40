"""The experience matrix: recorded queries and their observed scores (``queries``, ``scores``),
written per query and read back for the online re-solve, client feedback and the full refit.

The hot statements (the per-query record, the observation history, the namespace-wide COPY)
run as raw SQL on the psycopg connection: pipelined with each other in one round trip, vectors
in binary, the history read without SQLAlchemy's per-row processing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg.sql
from numpy.typing import NDArray
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from service.completion.similarity import QueryParameters
from service.db.codecs import as_real, cosine_similarities, factor_matrix, parse_binary_copy
from service.db.engine import driver_connection
from service.db.model_state import content_sql
from service.db.models import Memory, Query
from service.db.namespaces import STATE_SQL
from service.errors import NotFound

#: The origin of an observation the scorer made for the query (``scores.source``, as
#: _RECORD_SQL writes it).
SCORER_ORIGIN = "scorer"


@dataclass(frozen=True)
class QueryTrace:
    """What the trace of a retrieve keeps (``GET /queries/{id}``): its stage, the phase timings
    known when it is recorded, and its candidates in rank order (best first)."""

    stage: int
    timings: dict[str, float]
    memory_ids: np.ndarray
    similarities: np.ndarray
    estimates: np.ndarray  # the policy's estimate, what an unobserved candidate ranked by
    scores: np.ndarray  # the final score
    sources: Sequence[str]  # "observed" | "estimated" | "semantic"
    origins: Sequence[str | None]  # the observation's origin ("scorer", ...), None: unobserved
    anchors: np.ndarray  # bool: sampled as an anchor (scored, or failed: degraded)


@dataclass(frozen=True)
class RecordedQuery:
    query_id: int
    query_index: int
    queries_since_refit: int


_RECORD_SQL = """
    WITH live AS (
        -- The observations of memories that still exist: one deleted since the search simply
        -- has none (its row is gone, and the foreign key would refuse the observation).
        SELECT t.m, t.s, t.c
        FROM unnest(%(memory_ids)s::bigint[], %(scores)s::float8[], %(similarities)s::real[])
            AS t(m, s, c)
        WHERE EXISTS (SELECT FROM memories WHERE id = t.m)
    ), n AS (
        UPDATE namespaces SET
            next_query_index = next_query_index + 1,
            scorer_calls = scorer_calls + %(calls)s,
            scorer_requests = scorer_requests + %(requests)s,
            full_rerank_calls = full_rerank_calls + %(n_candidates)s,
            score_sum = score_sum + (SELECT coalesce(sum(s), 0) FROM live),
            score_count = score_count + (SELECT count(*) FROM live),
            queries_since_refit = queries_since_refit + 1
        WHERE name = %(namespace)s
        RETURNING next_query_index - 1 AS query_index, queries_since_refit
    ), q AS (
        INSERT INTO queries (namespace, query_index, text, embedding, policy, candidates,
                             budget, scorer_calls, bias, slope, factors, prequential_abs_error,
                             prequential_count, returned_count, returned_estimated, stage,
                             timings, trace_memory_ids, trace_similarities, trace_estimates,
                             trace_scores, trace_sources, trace_origins, trace_anchors)
        SELECT %(namespace)s::text, n.query_index, %(text)s::text, %(embedding)b,
               %(policy)s::text, %(n_candidates)s::int, %(budget)s::int, %(calls)s::int,
               %(bias)s::float8, %(slope)s::float8, %(factors)s::real[],
               %(prequential_error)s::float8, %(prequential_count)s::int,
               %(returned_count)s::int, %(returned_estimated)s::int, %(stage)s::smallint,
               %(timings)s::jsonb, %(trace_memory_ids)s::bigint[],
               %(trace_similarities)s::real[], %(trace_estimates)s::real[],
               %(trace_scores)s::real[], %(trace_sources)s::text[], %(trace_origins)s::text[],
               %(trace_anchors)s::boolean[]
        FROM n
        RETURNING id, query_index
    ), s AS (
        INSERT INTO scores (query_id, memory_id, namespace, score, similarity, source)
        SELECT q.id, live.m, %(namespace)s::text, live.s, live.c, 'scorer'
        FROM q, live
        ON CONFLICT (query_id, memory_id) DO NOTHING
    )
    SELECT q.id, q.query_index, n.queries_since_refit FROM q, n
"""

# The lock every writer of a namespace's model state takes on its row (namespace_state).
_LOCK_SQL = STATE_SQL + " FOR NO KEY UPDATE"


# Over 60 lines by its parameters (one per recorded column) and its docstring: the body is
# one pipelined round trip, which is clearer whole.
async def record_query(
    session: AsyncSession,
    *,
    namespace: str,
    query_text: str,
    query_embedding: np.ndarray,
    policy: str,
    n_candidates: int,
    budget: int,
    scorer_calls: int,
    scorer_requests: int,
    query: QueryParameters | None,
    prequential_errors: np.ndarray,
    returned_count: int,
    returned_estimated: int,
    observed_ids: np.ndarray,
    observed_similarities: np.ndarray,
    observed_scores: np.ndarray,
    trace: QueryTrace,
    rank: int,
) -> tuple[RecordedQuery, RowObservations]:
    """Record a query and its observations in the caller's transaction, and read the full
    observation history of the observed memories (this query's cells included) for their
    online re-solve: one round trip for all (pipelined).

    The namespace row is locked first, so concurrent requests get consecutive indexes and a
    rolled-back request leaves no gap; and in a statement of its own, so the record's snapshot,
    taken once the lock is held, sees every delete of the namespace's memories (a delete takes
    the same lock, :func:`service.ingest.memories.delete_memory`): observations of memories
    deleted since the search are left out, the query is recorded all the same.
    """
    conn = await driver_connection(session)
    async with conn.pipeline():
        await conn.execute(_LOCK_SQL, {"namespace": namespace})
        cursor = await conn.execute(
            _RECORD_SQL,
            {
                "namespace": namespace,
                "calls": scorer_calls,
                "requests": scorer_requests,
                "n_candidates": n_candidates,
                "text": query_text,
                "embedding": np.asarray(query_embedding, dtype=np.float32),
                "policy": policy,
                "budget": budget,
                "bias": None if query is None else query.bias,
                "slope": None if query is None else query.slope,
                "factors": None if query is None else as_real(query.factors),
                "prequential_error": (
                    float(np.mean(prequential_errors)) if len(prequential_errors) else None
                ),
                "prequential_count": len(prequential_errors),
                "returned_count": returned_count,
                "returned_estimated": returned_estimated,
                "memory_ids": [int(m) for m in observed_ids],
                "scores": [float(x) for x in observed_scores],
                "similarities": [float(c) for c in observed_similarities],
                **_trace_parameters(trace),
            },
        )
        history = (
            await conn.execute(_ROW_OBSERVATIONS_SQL, {"ids": [int(m) for m in observed_ids]})
            if len(observed_ids)
            else None
        )
    row = await cursor.fetchone()
    if row is None:
        raise NotFound(f"namespace {namespace!r} has no memories")
    query_id, query_index, since_refit = row
    return (
        RecordedQuery(int(query_id), int(query_index), int(since_refit)),
        _row_observations(await history.fetchall() if history is not None else [], rank),
    )


def _trace_parameters(trace: QueryTrace) -> dict[str, Any]:
    return {
        "stage": trace.stage,
        "timings": json.dumps(trace.timings),
        "trace_memory_ids": trace.memory_ids.tolist(),
        "trace_similarities": trace.similarities.tolist(),
        "trace_estimates": trace.estimates.tolist(),
        "trace_scores": trace.scores.tolist(),
        "trace_sources": list(trace.sources),
        "trace_origins": list(trace.origins),
        "trace_anchors": trace.anchors.tolist(),
    }


async def insert_scores(
    session: AsyncSession,
    namespace: str,
    query_id: int,
    memory_ids: np.ndarray,
    similarities: np.ndarray,
    scores: np.ndarray,
    source: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Insert observations; a pair already observed keeps its first score (observations are
    never rewritten). Returns the (memory_ids, scores) actually inserted."""
    rows = (
        await session.execute(
            text(
                """
                INSERT INTO scores (query_id, memory_id, namespace, score, similarity, source)
                SELECT :query_id, m, :namespace, s, c, :source
                FROM unnest(CAST(:memory_ids AS bigint[]), CAST(:scores AS real[]),
                            CAST(:similarities AS real[])) AS t(m, s, c)
                ON CONFLICT (query_id, memory_id) DO NOTHING
                RETURNING memory_id, score
                """
            ),
            {
                "query_id": query_id,
                "namespace": namespace,
                "memory_ids": [int(m) for m in memory_ids],
                "scores": [float(s) for s in scores],
                "similarities": [float(c) for c in similarities],
                "source": source,
            },
        )
    ).all()
    return (
        np.array([r[0] for r in rows], dtype=np.int64),
        np.array([r[1] for r in rows], dtype=np.float64),
    )


@dataclass(frozen=True)
class RowObservations:
    """Observations of some memory rows, each with the observing query's parameters."""

    memory_ids: np.ndarray
    similarities: np.ndarray
    scores: np.ndarray
    query_bias: np.ndarray
    query_slope: np.ndarray
    query_factors: np.ndarray
    prior_offsets: np.ndarray  # the content prior's γ·cos + e_m·w of each cell


# The content prior's e_m·w of memory m and a cell's whole offset γ·cos + e_m·w, in SQL; the
# offset is 0 before the namespace's first refit.
_MEMORY_CONTENT_SQL = content_sql("m.embedding", "n.content_weights")
_PRIOR_OFFSET_SQL = f"coalesce(n.content_slope * s.similarity + {_MEMORY_CONTENT_SQL}, 0)"

_ROW_OBSERVATIONS_SQL = f"""
    WITH m AS MATERIALIZED (
        -- e_m·w once per memory rather than once per observation: with 100 observations per
        -- memory, fetching and multiplying the embedding for each was most of this query
        SELECT m.id, {_MEMORY_CONTENT_SQL} AS content
        FROM memories m JOIN namespaces n ON n.name = m.namespace
        WHERE m.id = ANY(%(ids)s::bigint[])
    )
    SELECT s.memory_id, s.similarity, s.score, q.bias, q.slope, q.factors,
           coalesce(n.content_slope * s.similarity + m.content, 0)
    FROM scores s JOIN queries q ON q.id = s.query_id
    JOIN m ON m.id = s.memory_id JOIN namespaces n ON n.name = s.namespace
    WHERE s.memory_id = ANY(%(ids)s::bigint[]) AND q.bias IS NOT NULL
    ORDER BY s.memory_id, s.query_id
"""


async def memory_row_observations(
    session: AsyncSession, memory_ids: NDArray[np.integer[Any]], rank: int
) -> RowObservations:
    conn = await driver_connection(session)
    cursor = await conn.execute(_ROW_OBSERVATIONS_SQL, {"ids": [int(m) for m in memory_ids]})
    return _row_observations(await cursor.fetchall(), rank)


def _row_observations(rows: Sequence[Sequence[Any]], rank: int) -> RowObservations:
    return RowObservations(
        memory_ids=np.array([r[0] for r in rows], dtype=np.int64),
        similarities=np.array([r[1] for r in rows], dtype=np.float64),
        scores=np.array([r[2] for r in rows], dtype=np.float64),
        query_bias=np.array([r[3] for r in rows], dtype=np.float64),
        query_slope=np.array([r[4] or 0.0 for r in rows], dtype=np.float64),
        query_factors=factor_matrix([r[5] for r in rows], rank),
        prior_offsets=np.array([r[6] for r in rows], dtype=np.float64),
    )


async def query_observations(
    session: AsyncSession, query_id: int, rank: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(scores, similarities, memory_offsets, memory_factors) of every observed cell of one
    query; a cell's memory offset is its memory bias plus its content-prior offset."""
    rows = (
        await session.execute(
            text(
                f"""
                SELECT s.score, s.similarity, coalesce(f.bias, 0) + {_PRIOR_OFFSET_SQL},
                       f.factors
                FROM scores s LEFT JOIN memory_factors f ON f.memory_id = s.memory_id
                JOIN memories m ON m.id = s.memory_id JOIN namespaces n ON n.name = s.namespace
                WHERE s.query_id = :query_id
                """
            ),
            {"query_id": query_id},
        )
    ).all()
    return (
        np.array([r[0] for r in rows], dtype=np.float64),
        np.array([r[1] for r in rows], dtype=np.float64),
        np.array([r[2] for r in rows], dtype=np.float64),
        factor_matrix([r[3] for r in rows], rank),
    )


@dataclass(frozen=True)
class NamespaceObservations:
    memory_ids: np.ndarray
    query_ids: np.ndarray
    similarities: np.ndarray
    scores: np.ndarray


# One row of COPY (SELECT memory_id, query_id, float8, float8) in binary: field count, then
# length + value per field.
_OBSERVATION_ROW = np.dtype(
    [("fields", ">i2"), ("l0", ">i4"), ("memory_id", ">i8"), ("l1", ">i4"), ("query_id", ">i8"),
     ("l2", ">i4"), ("similarity", ">f8"), ("l3", ">i4"), ("score", ">f8")]
)


async def namespace_observations(session: AsyncSession, namespace: str) -> NamespaceObservations:
    """Every observation of the namespace, read with a binary COPY into numpy arrays.

    ``real`` values are sent as ``real::text::float8``: the same float64 a text-format read
    parses (the shortest decimal of the float32), so a refit fits exactly the same numbers.
    """
    conn = await driver_connection(session)
    data = bytearray()
    statement = psycopg.sql.SQL(
        "COPY (SELECT memory_id, query_id, similarity::text::float8, score::text::float8 "
        "FROM scores WHERE namespace = {}) TO STDOUT (FORMAT BINARY)"
    ).format(psycopg.sql.Literal(namespace))
    async with conn.cursor() as cursor, cursor.copy(statement) as copy:
        async for chunk in copy:
            data += chunk
    rows = parse_binary_copy(bytes(data), _OBSERVATION_ROW)
    return NamespaceObservations(
        memory_ids=rows["memory_id"].astype(np.int64),
        query_ids=rows["query_id"].astype(np.int64),
        similarities=rows["similarity"].astype(np.float64),
        scores=rows["score"].astype(np.float64),
    )


async def feedback_similarities(
    session: AsyncSession, namespace: str, query_id: int, memory_ids: np.ndarray
) -> np.ndarray:
    """The cosine similarity of a recorded query to each memory, or NotFound for a query or
    memory outside the namespace. (SQLAlchemy expressions: feedback is not a hot path.)"""
    query_namespace = await session.scalar(select(Query.namespace).where(Query.id == query_id))
    if query_namespace != namespace:
        raise NotFound(f"query {query_id} does not exist in namespace {namespace!r}")
    ids = [int(m) for m in memory_ids]
    distances: dict[int, float] = dict(
        (
            await session.execute(
                select(Memory.id, Memory.embedding.cosine_distance(Query.embedding))
                .join(Query, Query.id == query_id)
                .where(Memory.namespace == namespace, Memory.id.in_(ids))
            )
        ).all()
    )
    missing = sorted(set(ids) - set(distances))
    if missing:
        raise NotFound(f"memories {missing[:10]} do not exist in namespace {namespace!r}")
    return cosine_similarities([distances[m] for m in ids])
