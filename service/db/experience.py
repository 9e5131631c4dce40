"""The experience matrix beyond the per-retrieve record (``service.db.record``): client
feedback on a recorded query, observations retired by an edit of their memory, and the reads of
feedback and the full refit (docs/design.md "The experience matrix").

The namespace-wide read of the refit is a binary COPY into numpy arrays, without per-row Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import psycopg.sql
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.codecs import (
    array_literal,
    cosine_similarities,
    factor_matrix,
    parse_binary_copy,
    real_values,
)
from service.db.engine import driver_connection
from service.db.model_state import content_sql
from service.db.scales import ScaleUpdate, common_score_sql, scales_json
from service.db.statements import execute, fetch_all, fetch_value
from service.errors import NotFound


@dataclass(frozen=True)
class FeedbackWrite:
    """What recording feedback did: the pairs written, and how many replaced an observation."""

    memory_ids: np.ndarray
    replaced: int


# One statement: the cells' previous values go to score_history, the feedback becomes each
# cell's value (a retired cell is live again: the client judged the current content), and the
# namespace's running mean swaps the old live values for the new ones. Every CTE reads the
# same snapshot, so `old` holds the values before the upsert.
# Stamped with clock_timestamp(), taken after the namespace lock (not now(), the transaction's
# start): a refit whose read began before it sees the stamp is later than its horizon
# (model_state._still_current) and leaves the memory's row to be rebuilt.
_RECORD_FEEDBACK_SQL = """
    WITH t AS (
        SELECT m, s, c FROM unnest(%(memory_ids)s::bigint[], %(scores)s::float8[],
                                   %(similarities)s::real[]) AS t(m, s, c)
    ), old AS (
        SELECT s.memory_id, s.score, s.source, s.scored_by, s.raw_score, s.created_at,
               s.retired_at FROM scores s
        WHERE s.namespace = %(namespace)s AND s.query_id = %(query_id)s
          AND s.memory_id IN (SELECT m FROM t)
    ), history AS (
        INSERT INTO score_history (query_id, memory_id, namespace, score, source, scored_by,
                                   raw_score, observed_at, retired_at)
        SELECT %(query_id)s, memory_id, %(namespace)s, score, source, scored_by, raw_score,
               created_at, retired_at
        FROM old
        ORDER BY memory_id  -- history ids in a stable order, not in scan order
    ), upsert AS (
        -- Feedback is on the common scale by definition: its raw score is its score.
        INSERT INTO scores (query_id, memory_id, namespace, score, similarity, source,
                            scored_by, raw_score, created_at)
        SELECT %(query_id)s, m, %(namespace)s, s, c, 'feedback', 'feedback', s,
               clock_timestamp() FROM t
        ON CONFLICT (namespace, query_id, memory_id) DO UPDATE SET
            score = EXCLUDED.score, similarity = EXCLUDED.similarity, source = 'feedback',
            scored_by = 'feedback', raw_score = EXCLUDED.raw_score,
            created_at = EXCLUDED.created_at, retired_at = NULL
    ), live_old AS (
        SELECT score FROM old WHERE retired_at IS NULL
    ), mean AS (
        UPDATE namespaces SET
            score_sum = score_sum + (SELECT sum(s) FROM t)
                - (SELECT coalesce(sum(score), 0) FROM live_old),
            score_count = score_count + (SELECT count(*) FROM t)
                - (SELECT count(*) FROM live_old)
        WHERE name = %(namespace)s
    )
    SELECT count(*) FROM old
"""


async def record_feedback(
    session: AsyncSession,
    namespace: str,
    query_id: int,
    memory_ids: np.ndarray,
    similarities: np.ndarray,
    scores: np.ndarray,
) -> FeedbackWrite:
    """Make client scores the effective observations of their cells (latest feedback wins),
    keeping each replaced value in ``score_history``. Run under the namespace's lock."""
    replaced = await fetch_value(
        session,
        _RECORD_FEEDBACK_SQL,
        {
            "query_id": query_id,
            "namespace": namespace,
            "memory_ids": [int(m) for m in memory_ids],
            # Bound for real columns: a score such as 5e-324 is valid feedback, but a non-zero
            # float8 that rounds to zero in float32 is an underflow error in Postgres.
            "scores": real_values(scores).tolist(),
            "similarities": real_values(similarities).tolist(),
        },
    )
    await memory_observations_changed(session, namespace, memory_ids)
    return FeedbackWrite(np.asarray(memory_ids, dtype=np.int64), int(replaced or 0))


# Late scores (the answer deadline) join their query as the scorer's observations, stamped
# after the namespace lock like feedback. A pair observed already keeps its observation: only
# client feedback can have come first, and feedback is authoritative. A memory deleted, or
# edited since the query (the score judged its old content), gets none.
_RECORD_LATE_SQL = """
    WITH q AS (
        SELECT id, created_at FROM queries
        WHERE id = %(query_id)s AND namespace = %(namespace)s
    ), t AS (
        -- On the namespace's common scale as it is now, under the lock (as the record).
        SELECT t.m, COMMON_SCORE AS s, t.r, t.c, t.k
        FROM unnest(%(memory_ids)s::bigint[], %(raw_scores)s::float8[],
                    %(similarities)s::float8[]::real[], %(anchor_kinds)s::smallint[])
            AS t(m, r, c, k), q,
             (SELECT score_scales -> %(scored_by)s::text AS scale FROM namespaces
              WHERE name = %(namespace)s) AS current
        WHERE EXISTS (SELECT FROM memories m WHERE m.namespace = %(namespace)s AND m.id = t.m
                      AND (m.content_changed_at IS NULL OR m.content_changed_at < q.created_at))
    ), added AS (
        INSERT INTO scores (query_id, memory_id, namespace, score, similarity, source,
                            anchor_kind, raw_score, scored_by, created_at)
        SELECT q.id, t.m, %(namespace)s::text, t.s, t.c, 'scorer', t.k, t.r,
               %(scored_by)s::text, clock_timestamp()
        FROM q, t
        ON CONFLICT (namespace, query_id, memory_id) DO NOTHING
        RETURNING memory_id, score
    ), mean AS (
        UPDATE namespaces SET
            score_sum = score_sum + (SELECT coalesce(sum(score), 0) FROM added),
            score_count = score_count + (SELECT count(*) FROM added),
            scorer_requests = scorer_requests + %(requests)s
        WHERE name = %(namespace)s
    )
    SELECT memory_id FROM added ORDER BY memory_id
""".replace("COMMON_SCORE", common_score_sql("t.r", "current.scale"))


async def record_late_scores(
    session: AsyncSession,
    namespace: str,
    query_id: int,
    memory_ids: np.ndarray,
    cells: tuple[np.ndarray, np.ndarray, np.ndarray],
    scorer: tuple[str, int],
) -> np.ndarray:
    """Record a query's late scores (``cells``: similarities, scores as the scorer gave them,
    anchor kinds per memory) where the pair has no observation yet, and count the scorer
    call's requests (``scorer``: its source and the requests); the memories recorded. Run
    under the namespace's lock."""
    similarities, scores, anchor_kinds = cells
    scored_by, requests = scorer
    rows = await fetch_all(
        session,
        _RECORD_LATE_SQL,
        {
            "query_id": query_id,
            "namespace": namespace,
            "memory_ids": array_literal(memory_ids),
            "raw_scores": array_literal(real_values(scores)),
            "scored_by": scored_by,
            "similarities": array_literal(real_values(similarities)),
            "anchor_kinds": array_literal(anchor_kinds),
            "requests": requests,
        },
    )
    return np.array([r[0] for r in rows], dtype=np.int64)


_RETIRE_SQL = """
    WITH retired AS (
        UPDATE scores SET retired_at = now()
        WHERE namespace = %(namespace)s AND memory_id = ANY(%(memory_ids)s::bigint[])
          AND retired_at IS NULL
        RETURNING score
    ), mean AS (
        UPDATE namespaces SET
            score_sum = score_sum - (SELECT coalesce(sum(score), 0) FROM retired),
            score_count = score_count - (SELECT count(*) FROM retired)
        WHERE name = %(namespace)s
    )
    SELECT count(*) FROM retired
"""


async def retire_observations(
    session: AsyncSession, namespace: str, memory_ids: Sequence[int]
) -> int:
    """Retire the live observations of memories whose content changed (they judged the old
    text or embedding), take them out of the namespace's running mean, and reset what was
    learned from them. Returns how many were retired. Run under the namespace's lock."""
    retired = await fetch_value(
        session, _RETIRE_SQL, {"namespace": namespace, "memory_ids": [int(m) for m in memory_ids]}
    )
    await memory_observations_changed(session, namespace, memory_ids)
    return int(retired or 0)


_FORGET_ROWS_SQL = (
    "DELETE FROM memory_factors "
    "WHERE namespace = %(namespace)s AND memory_id = ANY(%(ids)s::bigint[])"
)


async def memory_observations_changed(
    session: AsyncSession, namespace: str, memory_ids: Sequence[int] | np.ndarray
) -> None:
    """The observations of these memories changed other than by being appended (feedback
    replaced one, an edit retired them): drop what was derived from them per memory, so
    nothing keeps the old values. Their model rows go, sufficient statistics included (a
    retired memory starts over from the content prior; after feedback the learner rebuilds the
    row from its live observations, ``service.retrieve.online.feedback_rows``).
    The one place to rebuild any other per-memory state derived from observations."""
    await execute(
        session, _FORGET_ROWS_SQL, {"namespace": namespace, "ids": [int(m) for m in memory_ids]}
    )


_QUERY_MEMORIES_SQL = (
    "SELECT memory_id FROM scores WHERE namespace = %(namespace)s AND query_id = %(query_id)s"
)


async def query_memory_ids(session: AsyncSession, namespace: str, query_id: int) -> np.ndarray:
    """The memories a query of the namespace observed."""
    rows = await fetch_all(
        session, _QUERY_MEMORIES_SQL, {"namespace": namespace, "query_id": query_id}
    )
    return np.array([r[0] for r in rows], dtype=np.int64)


# A cell's memory offset: its memory bias plus its content-prior offset γ·cos + e_m·w (0 before
# the namespace's first refit).
_QUERY_OBSERVATIONS_SQL = f"""
    SELECT s.score, s.similarity,
           coalesce(f.bias, 0)
           + coalesce(n.content_slope * s.similarity
                      + {content_sql("m.embedding", "n.content_weights")}, 0),
           f.factors
    FROM scores s
    LEFT JOIN memory_factors f ON f.namespace = s.namespace AND f.memory_id = s.memory_id
    JOIN memories m ON m.namespace = s.namespace AND m.id = s.memory_id
    JOIN namespaces n ON n.name = s.namespace
    WHERE s.namespace = %(namespace)s AND s.query_id = %(query_id)s AND s.retired_at IS NULL
    ORDER BY s.memory_id
"""


async def query_observations(
    session: AsyncSession, namespace: str, query_id: int, rank: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(scores, similarities, memory_offsets, memory_factors) of every observed cell of one
    query of the namespace; a cell's memory offset is its memory bias plus its content-prior
    offset."""
    rows = await fetch_all(
        session, _QUERY_OBSERVATIONS_SQL, {"namespace": namespace, "query_id": query_id}
    )
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

# A COPY takes no parameters: the namespace is composed in as a literal. In key order, whatever
# plan reads them: the fit sums the cells in the order it gets them, so the order decides the
# last bits of the model, and the primary key's order (the plan's, through it) and the heap's
# (a sequential or bitmap scan's) differ; key order is also what an imported namespace keeps.
_NAMESPACE_OBSERVATIONS_COPY = psycopg.sql.SQL(
    "COPY (SELECT memory_id, query_id, similarity::text::float8, {}::text::float8 "
    "FROM scores WHERE namespace = {} AND retired_at IS NULL ORDER BY query_id, memory_id) "
    "TO STDOUT (FORMAT BINARY)"
)
# The score of a source whose scale the refit moved, as the refit's write will store it.
_RESCALED_SCORE = (
    "(CASE WHEN source = 'scorer' AND scored_by = ANY({sources}::text[]) THEN ("
    + common_score_sql("raw_score::float8", "{scales}::jsonb -> scored_by")
    + ")::real ELSE score END)"
)


async def namespace_observations(
    session: AsyncSession, namespace: str, rescaled: ScaleUpdate | None = None
) -> NamespaceObservations:
    """Every live (not retired) observation of the namespace, read with a binary COPY into
    numpy arrays; the scores of the sources ``rescaled`` moves under their new scales.

    ``real`` values are sent as ``real::text::float8``: the same float64 a text-format read
    parses (the shortest decimal of the float32), so a refit fits exactly the same numbers.
    """
    conn = await driver_connection(session)
    data = bytearray()
    score: psycopg.sql.Composable = psycopg.sql.SQL("score")
    if rescaled is not None and rescaled.moved:
        score = psycopg.sql.SQL(_RESCALED_SCORE).format(
            sources=psycopg.sql.Literal(list(rescaled.moved)),
            scales=psycopg.sql.Literal(scales_json(rescaled.scales)),
        )
    statement = _NAMESPACE_OBSERVATIONS_COPY.format(score, psycopg.sql.Literal(namespace))
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


_QUERY_EXISTS_SQL = (
    "SELECT 1 FROM queries WHERE namespace = %(namespace)s AND id = %(query_id)s"
)
_FEEDBACK_DISTANCES_SQL = """
    SELECT m.id, m.embedding <=> q.embedding
    FROM memories m JOIN queries q ON q.namespace = m.namespace AND q.id = %(query_id)s
    WHERE m.namespace = %(namespace)s AND m.id = ANY(%(ids)s::bigint[])
"""


async def feedback_similarities(
    session: AsyncSession, namespace: str, query_id: int, memory_ids: np.ndarray
) -> np.ndarray:
    """The cosine similarity of a recorded query to each memory, or NotFound for a query or
    memory outside the namespace."""
    found = await fetch_value(
        session, _QUERY_EXISTS_SQL, {"namespace": namespace, "query_id": query_id}
    )
    if found is None:
        raise NotFound(f"query {query_id} does not exist in namespace {namespace!r}")
    ids = [int(m) for m in memory_ids]
    rows = await fetch_all(
        session,
        _FEEDBACK_DISTANCES_SQL,
        {"query_id": query_id, "namespace": namespace, "ids": ids},
    )
    distances: dict[int, float] = {int(memory_id): distance for memory_id, distance in rows}
    missing = sorted(set(ids) - set(distances))
    if missing:
        raise NotFound(f"memories {missing[:10]} do not exist in namespace {namespace!r}")
    return cosine_similarities([distances[m] for m in ids])
