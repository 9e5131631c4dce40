"""The experience matrix: recorded queries and their observed scores (``queries``, ``scores``),
written per query and read back for client feedback, the full refit and the rare rebuild of a
memory row's sufficient statistics (the online re-solve reads those statistics, not history).

The hot statements (the per-query record, the stored statistics, the namespace-wide COPY)
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

from service.completion import QueryParameters
from service.completion.statistics import RowObservations, RowStatistics
from service.db.codecs import (
    Float8Rows,
    array_literal,
    as_real,
    cosine_similarities,
    double_array_literals,
    factor_matrix,
    parse_binary_copy,
)
from service.db.engine import driver_connection
from service.db.model_state import (
    ROW_VERSION_SQL,
    OnlineUpdate,
    content_sql,
    online_update_statement,
)
from service.db.models import Memory, Query, Score
from service.db.namespaces import STATE_SQL
from service.errors import NotFound

#: The origin of an observation the scorer made for the query (``scores.source``, as
#: _RECORD_SQL writes it).
SCORER_ORIGIN = "scorer"
#: The origin of a cell taken from an earlier asking of the query's family (no scores row of
#: its own: ``queries.reused_memory_ids``).
REUSED_ORIGIN = "reused"


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
    sources: Sequence[str]  # a service.retrieve.rerank.Source ("observed", "estimated", ...)
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
        -- (similarities: float8 rounded to real, as the column stores them)
        FROM unnest(%(memory_ids)s::bigint[], %(scores)s::float8[],
                    %(similarities)s::float8[]::real[]) AS t(m, s, c)
        WHERE EXISTS (SELECT FROM memories WHERE id = t.m)
    ), n AS (
        UPDATE namespaces SET
            next_query_index = next_query_index + 1,
            scorer_calls = scorer_calls + %(calls)s,
            scorer_requests = scorer_requests + %(requests)s,
            full_rerank_calls = full_rerank_calls + %(n_candidates)s,
            reused_cells = reused_cells + cardinality(%(reused_ids)s::bigint[]),
            reuse_saved_calls = reuse_saved_calls + %(saved_calls)s,
            score_sum = score_sum + (SELECT coalesce(sum(s), 0) FROM live),
            score_count = score_count + (SELECT count(*) FROM live),
            queries_since_refit = queries_since_refit + 1
        WHERE name = %(namespace)s
        RETURNING next_query_index - 1 AS query_index, queries_since_refit
    ), q AS (
        INSERT INTO queries (namespace, query_index, text, embedding, policy, candidates,
                             budget, scorer_calls, bias, slope, factors, prequential_abs_error,
                             prequential_count, returned_count, returned_estimated,
                             family_key, reused_memory_ids, stage, timings,
                             trace_memory_ids, trace_similarities, trace_estimates,
                             trace_scores, trace_sources, trace_origins, trace_anchors)
        SELECT %(namespace)s::text, n.query_index, %(text)s::text, %(embedding)b,
               %(policy)s::text, %(n_candidates)s::int, %(budget)s::int, %(calls)s::int,
               %(bias)s::float8, %(slope)s::float8, %(factors)s::real[],
               %(prequential_error)s::float8, %(prequential_count)s::int,
               %(returned_count)s::int, %(returned_estimated)s::int,
               %(family_key)s::bytea, %(reused_ids)s::bigint[], %(stage)s::smallint,
               %(timings)s::jsonb, %(trace_memory_ids)s::bigint[],
               %(trace_similarities)b::real[], %(trace_estimates)b::real[],
               %(trace_scores)b::real[], %(trace_sources)s::text[],
               %(trace_origins)s::text[], %(trace_anchors)s::boolean[]
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
    family_key: bytes | None,
    reused_ids: np.ndarray,
    reuse_saved_calls: int,
    trace: QueryTrace,
    update: OnlineUpdate | None,
) -> RecordedQuery:
    """Record a query and its observations, write the online ``update`` of the memory rows it
    observed, and commit: one round trip for all (pipelined).

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
                "memory_ids": array_literal(observed_ids),
                "scores": array_literal(observed_scores),
                "similarities": array_literal(observed_similarities),
                "family_key": family_key,
                "reused_ids": array_literal(reused_ids),
                "saved_calls": reuse_saved_calls,
                **_trace_parameters(trace),
            },
        )
        if update is not None and len(update.memory_ids):
            await conn.execute(*online_update_statement(namespace, update))
        await conn.commit()
    row = await cursor.fetchone()
    if row is None:  # DELETE /namespaces erased it since the search
        raise NotFound(f"namespace {namespace!r} was erased while the query ran")
    query_id, query_index, since_refit = row
    return RecordedQuery(int(query_id), int(query_index), int(since_refit))


def _trace_parameters(trace: QueryTrace) -> dict[str, Any]:
    return {
        "stage": trace.stage,
        "timings": json.dumps(trace.timings),
        # Number arrays as one literal (ids) or in binary (floats, sent as float8 and rounded
        # to real by the server, as a float8 parameter's value is): never element by element.
        "trace_memory_ids": array_literal(trace.memory_ids),
        "trace_similarities": Float8Rows.of(trace.similarities),
        "trace_estimates": Float8Rows.of(trace.estimates),
        "trace_scores": Float8Rows.of(trace.scores),
        "trace_sources": list(trace.sources),
        "trace_origins": list(trace.origins),
        "trace_anchors": array_literal(trace.anchors),
    }


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
_RECORD_FEEDBACK_SQL = text(
    """
    WITH t AS (
        SELECT m, s, c FROM unnest(CAST(:memory_ids AS bigint[]), CAST(:scores AS float8[]),
                                   CAST(:similarities AS real[])) AS t(m, s, c)
    ), old AS (
        SELECT s.memory_id, s.score, s.source, s.created_at, s.retired_at FROM scores s
        WHERE s.query_id = :query_id AND s.memory_id IN (SELECT m FROM t)
    ), history AS (
        INSERT INTO score_history (query_id, memory_id, namespace, score, source, observed_at,
                                   retired_at)
        SELECT :query_id, memory_id, :namespace, score, source, created_at, retired_at FROM old
        ORDER BY memory_id  -- history ids in a stable order, not in scan order
    ), upsert AS (
        INSERT INTO scores (query_id, memory_id, namespace, score, similarity, source, created_at)
        SELECT :query_id, m, :namespace, s, c, 'feedback', clock_timestamp() FROM t
        ON CONFLICT (query_id, memory_id) DO UPDATE SET
            score = EXCLUDED.score, similarity = EXCLUDED.similarity, source = 'feedback',
            created_at = EXCLUDED.created_at, retired_at = NULL
    ), live_old AS (
        SELECT score FROM old WHERE retired_at IS NULL
    ), mean AS (
        UPDATE namespaces SET
            score_sum = score_sum + (SELECT sum(s) FROM t)
                - (SELECT coalesce(sum(score), 0) FROM live_old),
            score_count = score_count + (SELECT count(*) FROM t)
                - (SELECT count(*) FROM live_old)
        WHERE name = :namespace
    )
    SELECT count(*) FROM old
    """
)


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
    replaced = await session.scalar(
        _RECORD_FEEDBACK_SQL,
        {
            "query_id": query_id,
            "namespace": namespace,
            "memory_ids": [int(m) for m in memory_ids],
            "scores": [float(s) for s in scores],
            "similarities": [float(c) for c in similarities],
        },
    )
    await memory_observations_changed(session, memory_ids)
    return FeedbackWrite(np.asarray(memory_ids, dtype=np.int64), int(replaced or 0))


_RETIRE_SQL = text(
    """
    WITH retired AS (
        UPDATE scores SET retired_at = now()
        WHERE memory_id = ANY(CAST(:memory_ids AS bigint[])) AND retired_at IS NULL
        RETURNING score
    ), mean AS (
        UPDATE namespaces SET
            score_sum = score_sum - (SELECT coalesce(sum(score), 0) FROM retired),
            score_count = score_count - (SELECT count(*) FROM retired)
        WHERE name = :namespace
    )
    SELECT count(*) FROM retired
    """
)


async def retire_observations(
    session: AsyncSession, namespace: str, memory_ids: Sequence[int]
) -> int:
    """Retire the live observations of memories whose content changed (they judged the old
    text or embedding), take them out of the namespace's running mean, and reset what was
    learned from them. Returns how many were retired. Run under the namespace's lock."""
    retired = await session.scalar(
        _RETIRE_SQL, {"namespace": namespace, "memory_ids": [int(m) for m in memory_ids]}
    )
    await memory_observations_changed(session, memory_ids)
    return int(retired or 0)


async def memory_observations_changed(
    session: AsyncSession, memory_ids: Sequence[int] | np.ndarray
) -> None:
    """The observations of these memories changed other than by being appended (feedback
    replaced one, an edit retired them): drop what was derived from them per memory, so
    nothing keeps the old values. Their model rows go, sufficient statistics included (a
    retired memory starts over from the content prior; after feedback the learner rebuilds the
    row from its live observations, :func:`rebuild_row_statistics`).
    The one place to rebuild any other per-memory state derived from observations."""
    await session.execute(
        text("DELETE FROM memory_factors WHERE memory_id = ANY(CAST(:ids AS bigint[]))"),
        {"ids": [int(m) for m in memory_ids]},
    )


# The content prior's e_m·w of memory m and a cell's whole offset γ·cos + e_m·w, in SQL; the
# offset is 0 before the namespace's first refit.
_MEMORY_CONTENT_SQL = content_sql("m.embedding", "n.content_weights")
_PRIOR_OFFSET_SQL = f"coalesce(n.content_slope * s.similarity + {_MEMORY_CONTENT_SQL}, 0)"

def _row_observations_sql(which_memories: str = "") -> str:
    """Every observation of the memories ``%(ids)s`` (narrowed by the SQL condition on ``m``
    in ``which_memories``), each with its query's parameters and its content-prior offset."""
    return f"""
    WITH m AS MATERIALIZED (
        -- e_m·w once per memory rather than once per observation: with 100 observations per
        -- memory, fetching and multiplying the embedding for each was most of this query
        SELECT m.id, {_MEMORY_CONTENT_SQL} AS content
        FROM memories m JOIN namespaces n ON n.name = m.namespace
        WHERE m.id = ANY(%(ids)s::bigint[]) {which_memories}
    )
    SELECT s.memory_id, s.similarity, s.score, q.bias, q.slope, q.factors,
           coalesce(n.content_slope * s.similarity + m.content, 0)
    FROM scores s JOIN queries q ON q.id = s.query_id
    JOIN m ON m.id = s.memory_id JOIN namespaces n ON n.name = s.namespace
    WHERE s.memory_id = ANY(ARRAY(SELECT id FROM m)) AND q.bias IS NOT NULL
      AND s.retired_at IS NULL
    ORDER BY s.memory_id, s.query_id
"""


_ROW_OBSERVATIONS_SQL = _row_observations_sql()
# Only memories with no usable statistics: the rare ones the online update rebuilds from their
# history (first observed, written before migration 0010, or invalidated by a refit).
_HISTORY_WITHOUT_STATISTICS_SQL = _row_observations_sql(
    "AND NOT EXISTS (SELECT FROM memory_factors f "
    "WHERE f.memory_id = m.id AND f.statistics IS NOT NULL)"
)
# The memories that still exist, each with its stored statistics (or NULL) and its row's version.
_ROW_STATISTICS_SQL = f"""
    SELECT m.id, f.statistics, {ROW_VERSION_SQL}
    FROM memories m LEFT JOIN memory_factors f ON f.memory_id = m.id
    WHERE m.id = ANY(%(ids)s::bigint[]) ORDER BY m.id
"""


@dataclass(frozen=True)
class StoredRows:
    """What the online update of some memory rows starts from: the live memories among those
    asked for (ids ascending), each one's stored packed statistics or None and its row's
    version (``ROW_VERSION_SQL``), and ``history``, every observation of the memories with
    None."""

    memory_ids: np.ndarray
    statistics: list[list[float] | None]
    versions: list[str]
    history: RowObservations

    def subset(self, memory_ids: np.ndarray) -> StoredRows:
        """The rows of those of ``memory_ids`` read here."""
        keep = np.isin(self.memory_ids, memory_ids)
        return StoredRows(
            self.memory_ids[keep],
            [p for p, kept in zip(self.statistics, keep, strict=True) if kept],
            [v for v, kept in zip(self.versions, keep, strict=True) if kept],
            self.history.subset(np.isin(self.history.memory_ids, memory_ids)),
        )


async def read_rows(session: AsyncSession, memory_ids: np.ndarray, rank: int) -> StoredRows:
    """The stored rows of ``memory_ids`` for an online update, read without the namespace lock
    (a retrieve reads those of its anchors while the scorer works); the versions tell the
    update which rows changed before it took the lock. One round trip, the COMMIT ending the
    read-only transaction included (none for no memories)."""
    if len(memory_ids) == 0:
        return StoredRows(np.zeros(0, dtype=np.int64), [], [], _row_observations([], rank))
    conn = await driver_connection(session)
    ids = {"ids": [int(m) for m in memory_ids]}
    async with conn.pipeline():
        statistics = await conn.execute(_ROW_STATISTICS_SQL, ids)
        history = await conn.execute(_HISTORY_WITHOUT_STATISTICS_SQL, ids)
        await conn.commit()
    stored = await statistics.fetchall()
    return StoredRows(
        memory_ids=np.array([r[0] for r in stored], dtype=np.int64),
        statistics=[r[1] for r in stored],
        versions=[r[2] for r in stored],
        history=_row_observations(await history.fetchall(), rank),
    )


async def memory_row_observations(
    session: AsyncSession, memory_ids: NDArray[np.integer[Any]], rank: int
) -> RowObservations:
    conn = await driver_connection(session)
    cursor = await conn.execute(_ROW_OBSERVATIONS_SQL, {"ids": [int(m) for m in memory_ids]})
    return _row_observations(await cursor.fetchall(), rank)


async def rebuild_row_statistics(
    session: AsyncSession, memory_ids: NDArray[np.integer[Any]], rank: int
) -> tuple[np.ndarray, RowStatistics]:
    """Rebuild the sufficient statistics of memory rows from their live observations and store
    them (with their observation counts) in the caller's transaction; returns the memories
    (ascending) and their statistics.

    The one way to bring statistics back in line when a memory's observations change other
    than by a new observation (a score replaced, observations retired, a query's parameters
    moved by feedback). O(the memories' history): a rare path. Memories without a model row
    get none here; the next retrieve that observes them builds theirs.
    """
    ids = np.unique(np.asarray(memory_ids, dtype=np.int64))
    statistics = (await memory_row_observations(session, ids, rank)).statistics(ids)
    await session.execute(
        text(
            """
            UPDATE memory_factors f SET statistics = CAST(t.p AS float8[]), observation_count = t.n
            FROM unnest(CAST(:ids AS bigint[]), CAST(:packed AS text[]), CAST(:counts AS int[]))
                AS t(id, p, n)
            WHERE f.memory_id = t.id
            """
        ),
        {
            "ids": [int(m) for m in ids],
            "packed": double_array_literals(statistics.packed()),
            "counts": [int(n) for n in statistics.counts],
        },
    )
    return ids, statistics


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


async def query_memory_ids(session: AsyncSession, query_id: int) -> np.ndarray:
    """The memories a query observed."""
    rows = await session.scalars(select(Score.memory_id).where(Score.query_id == query_id))
    return np.array(list(rows), dtype=np.int64)


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
                WHERE s.query_id = :query_id AND s.retired_at IS NULL
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
    """Every live (not retired) observation of the namespace, read with a binary COPY into
    numpy arrays.

    ``real`` values are sent as ``real::text::float8``: the same float64 a text-format read
    parses (the shortest decimal of the float32), so a refit fits exactly the same numbers.
    """
    conn = await driver_connection(session)
    data = bytearray()
    statement = psycopg.sql.SQL(
        "COPY (SELECT memory_id, query_id, similarity::text::float8, score::text::float8 "
        "FROM scores WHERE namespace = {} AND retired_at IS NULL) TO STDOUT (FORMAT BINARY)"
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
