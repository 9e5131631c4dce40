"""SQL of the retrieval pipeline: candidates with their model state, recording, model persistence.

Every function takes an open ``AsyncSession`` and leaves the transaction to the caller, so the
pipeline decides what commits together; the exceptions say so: the read-only :func:`search`
and :func:`memory_embeddings` commit their own reads, and :func:`upsert_memory_factors` can
carry the caller's COMMIT, each in the same round trip as its statements.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
import psycopg.sql
from psycopg.types.json import Jsonb
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.completion.similarity import ContentPrior, QueryParameters
from service.errors import NotFound


@dataclass(frozen=True)
class Candidates:
    """The semantic candidates of one query, most similar first, as parallel arrays.

    Embeddings are not fetched here: only a scorer that reads them needs them, and only for the
    anchors (:func:`memory_embeddings`).
    """

    ids: np.ndarray  # int64 (n,)
    similarities: np.ndarray  # float64 (n,) cosine similarity
    memory_bias: np.ndarray  # float64 (n,), 0 where the memory has no history
    memory_factors: np.ndarray  # float64 (n, rank), 0 where the memory has no history
    observation_count: np.ndarray  # int64 (n,)
    content_scores: np.ndarray  # float64 (n,) e_m·w of the namespace's content prior, or 0
    # id, external_id, text, occurred_at, metadata_json (the metadata as JSON text: only the
    # returned top-k parse it)
    rows: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class NamespaceState:
    next_query_index: int
    mean_score: float  # μ of the completion model
    score_count: int
    queries_since_refit: int
    content_slope: float  # γ of the content prior (0 before the first refit)


async def driver_connection(session: AsyncSession) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection under the session, in the session's transaction.

    Hot paths talk to it directly: vectors travel in pgvector's binary format (the engine
    registers the adapters on every connection, see ``service.db.database``), statements can be
    pipelined into one round trip, and rows skip SQLAlchemy's per-row processing. Values are
    read in the same (text) result format as through SQLAlchemy, so they are bit-identical.
    """
    connection = await session.connection()
    raw = await connection.get_raw_connection()
    return raw.driver_connection  # type: ignore[return-value]


def real_values(values: np.ndarray) -> np.ndarray:
    """Values for a Postgres ``real`` column: float32, with magnitudes below float32's smallest
    normal flushed to zero (Postgres rejects subnormal ``real`` input as out of range, and ALS
    can drive an unused factor arbitrarily close to zero)."""
    single = np.asarray(values, dtype=np.float32)
    return np.where(np.abs(single) < np.finfo(np.float32).tiny, np.float32(0.0), single)


def as_real(values: np.ndarray) -> list[float]:
    """:func:`real_values` as a list of Python floats."""
    return [float(x) for x in real_values(values)]


def real_array_literals(rows: np.ndarray) -> list[str]:
    """Rows of a 2-D array as ``'{...}'`` literals for a ``real[]`` column (Postgres has no
    ragged 2-D arrays, so each row travels as text)."""
    return ["{" + ",".join(repr(x) for x in as_real(row)) + "}" for row in rows]


def factor_matrix(factor_lists: Sequence[Sequence[float] | None], rank: int) -> np.ndarray:
    """Stored factor arrays as an (n, rank) matrix; missing or other-rank rows become zeros
    (a changed EARM_RANK is healed by the next full refit)."""
    matrix = np.zeros((len(factor_lists), rank))
    for row, factors in enumerate(factor_lists):
        if factors is not None and len(factors) == rank:
            matrix[row] = factors
    return matrix


# What _namespace_state reads, in its order; one list for the SQLAlchemy and psycopg readers.
_STATE_COLUMNS = (
    "next_query_index, score_sum, score_count, queries_since_refit, coalesce(content_slope, 0)"
)


async def namespace_state(
    session: AsyncSession, namespace: str, for_update: bool = False
) -> NamespaceState:
    """The namespace's counters; ``for_update`` locks its row first, which every writer of
    model state does, so writers of one namespace queue instead of deadlocking. The lock is
    FOR NO KEY UPDATE (what the record's UPDATE of the counters takes): it queues those writers
    but not an ingest, whose new memories only check that the namespace exists (FOR KEY
    SHARE), so a refit writing its model does not hold up ingests."""
    row = (
        await session.execute(
            text(
                f"SELECT {_STATE_COLUMNS} FROM namespaces WHERE name = :namespace"
                + (" FOR NO KEY UPDATE" if for_update else "")
            ),
            {"namespace": namespace},
        )
    ).first()
    return _namespace_state(row, namespace)


_STATE_SQL = f"SELECT {_STATE_COLUMNS} FROM namespaces WHERE name = %(namespace)s"


def _namespace_state(row: Sequence[Any] | None, namespace: str) -> NamespaceState:
    if row is None:
        raise NotFound(f"namespace {namespace!r} has no memories")
    next_index, score_sum, score_count, since_refit, content_slope = row
    mean = float(score_sum) / score_count if score_count else 0.0
    return NamespaceState(
        int(next_index), mean, int(score_count), int(since_refit), float(content_slope)
    )


def _content_sql(embedding: str, weights: str) -> str:
    """The content prior's e_m·w in SQL, e_m the unit embedding (<#> is the negated inner
    product); NULL while the namespace has no weights (before its first refit), and for an
    embedding of zero length, which has no unit vector (ingest refuses them, but rows stored
    before it checked vectors as float32 may have one; dividing by its norm failed every
    search of the namespace)."""
    return f"-({embedding} <#> {weights}) / nullif(vector_norm({embedding}), 0)"


def cosine_similarities(distances: Sequence[float]) -> np.ndarray:
    """1 - pgvector's cosine distances, 0 (orthogonal) where a distance is NaN: pgvector's
    answer for a vector of zero length (or one whose float32 squared length overflows), which
    ingest refuses but older rows may have."""
    similarities = 1.0 - np.asarray(distances, dtype=np.float64)
    return np.where(np.isnan(similarities), 0.0, similarities)


_CANDIDATE_COLUMNS = f"""
    id, external_id, text, occurred_at, metadata::text AS metadata_json,
    embedding <=> %(query)b AS distance,
    -- the weights are read once per statement (an InitPlan)
    coalesce({_content_sql(
        "embedding", "(SELECT content_weights FROM namespaces WHERE name = %(namespace)s)"
    )}, 0) AS content_score
"""


def _candidate_sql(exact: bool, filtered: bool) -> str:
    """The top-``limit`` candidates with their model parameters; ``from_index`` on every row
    counts the rows the HNSW index yielded (before the final LIMIT), which tells the caller
    whether the index could fill the list.

    The HNSW index is partial (``WHERE indexed``, see ``service.indexing``): the index scan
    covers the indexed rows and an exact scan the rows not indexed yet (none, once the
    background indexer has caught up). ``exact``: one exact scan of the whole namespace."""
    where = "namespace = %(namespace)s" + (" AND metadata @> %(filters)s" if filtered else "")
    if exact:
        # `+ 0` hides the operator from the planner, forcing an exact scan.
        scan = f"""
            SELECT {_CANDIDATE_COLUMNS}, 0 AS from_index FROM memories
            WHERE {where} ORDER BY (embedding <=> %(query)b) + 0, id LIMIT %(limit)s"""
    else:
        scan = f"""
            SELECT *, count(*) FILTER (WHERE indexed) OVER () AS from_index FROM (
                (SELECT {_CANDIDATE_COLUMNS}, true AS indexed FROM memories
                 WHERE {where} AND indexed ORDER BY embedding <=> %(query)b LIMIT %(limit)s)
                UNION ALL
                (SELECT {_CANDIDATE_COLUMNS}, false AS indexed FROM memories
                 WHERE {where} AND NOT indexed ORDER BY embedding <=> %(query)b LIMIT %(limit)s)
            ) u
            ORDER BY distance, id LIMIT %(limit)s"""
    return f"""
        WITH c AS MATERIALIZED ({scan})
        -- One primary-key probe per candidate. A plain join (or a LATERAL subquery the
        -- planner can pull up into one) let it hash the whole memory_factors table, a cost
        -- that grew with the namespace's history; LIMIT 1 keeps the subquery a subquery.
        SELECT c.id, c.external_id, c.text, c.occurred_at, c.metadata_json, c.distance,
               c.content_score, c.from_index, f.bias, f.factors, f.observation_count
        FROM c LEFT JOIN LATERAL (
            SELECT bias, factors, observation_count FROM memory_factors
            WHERE memory_id = c.id LIMIT 1
        ) f ON true
        ORDER BY c.distance, c.id
    """


# plan_cache_mode: the candidate query is prepared (psycopg prepares a statement from its
# 5th execution on a connection), and Postgres may then switch to a generic plan, which does
# not know the query vector or the limit and is slower (measured 18 vs 10 ms at 100k
# memories). A custom plan costs ~0.2 ms of planning.
_SEARCH_SETTINGS_SQL = (
    "SELECT set_config('hnsw.ef_search', %(ef)s, true), "
    "set_config('hnsw.iterative_scan', 'relaxed_order', true), "
    "set_config('plan_cache_mode', 'force_custom_plan', true)"
)


async def search(
    session: AsyncSession,
    namespace: str,
    query_embedding: np.ndarray,
    limit: int,
    rank: int,
    filters: dict[str, Any] | None = None,
) -> tuple[NamespaceState, Candidates]:
    """The namespace's counters and its top-``limit`` memories by cosine similarity, with
    their completion-model parameters, in one round trip: the settings, both reads and the
    COMMIT that ends this read-only transaction are pipelined. (The session's own commit is
    then a no-op: psycopg skips COMMIT on an idle connection.)

    pgvector's HNSW scan yields at most ``hnsw.ef_search`` rows, and a namespace filter can
    leave fewer, so ef_search is raised to ``limit`` and iterative scanning is enabled for this
    transaction; if the index still yields too few (or the namespace has fewer indexed
    memories than ``limit``), an exact scan of the namespace answers.
    """
    conn = await driver_connection(session)
    params: dict[str, Any] = {
        "namespace": namespace,
        "query": np.asarray(query_embedding, dtype=np.float32),
        "limit": limit,
        "ef": str(min(1000, max(40, limit))),
    }
    filtered = filters is not None
    if filtered:
        params["filters"] = Jsonb(filters)
    async with conn.pipeline():
        await conn.execute(_SEARCH_SETTINGS_SQL, params)
        state_cursor = await conn.execute(_STATE_SQL, params)
        candidates_cursor = await conn.execute(_candidate_sql(False, filtered), params)
        await conn.commit()
    state = _namespace_state(await state_cursor.fetchone(), namespace)
    rows = await candidates_cursor.fetchall()
    if not rows or rows[0][7] < limit:  # row[7]: from_index, rows the HNSW index yielded
        async with conn.pipeline():
            exact_cursor = await conn.execute(_candidate_sql(True, filtered), params)
            await conn.commit()
        rows = await exact_cursor.fetchall()
    return state, _candidates(rows, rank)


def _candidates(rows: Sequence[Sequence[Any]], rank: int) -> Candidates:
    # Row layout: id, external_id, text, occurred_at, metadata_json, distance, content_score,
    # from_index, bias, factors, observation_count.
    return Candidates(
        ids=np.array([r[0] for r in rows], dtype=np.int64),
        similarities=cosine_similarities([r[5] for r in rows]),
        memory_bias=np.array([r[8] or 0.0 for r in rows], dtype=np.float64),
        memory_factors=factor_matrix([r[9] for r in rows], rank),
        observation_count=np.array([r[10] or 0 for r in rows], dtype=np.int64),
        content_scores=np.array([r[6] for r in rows], dtype=np.float64),
        rows=[
            {
                "id": r[0],
                "external_id": r[1],
                "text": r[2],
                "occurred_at": r[3],
                "metadata_json": r[4],
            }
            for r in rows
        ],
    )


async def memory_embeddings(
    session: AsyncSession, memory_ids: np.ndarray, dim: int
) -> np.ndarray:
    """Embeddings (float32, in the order of ``memory_ids``), fetched in binary format, in a
    read-only transaction of their own (committed in the same round trip)."""
    if len(memory_ids) == 0:
        return np.zeros((0, dim), dtype=np.float32)
    conn = await driver_connection(session)
    async with conn.pipeline():
        cursor = await conn.execute(
            "SELECT m.embedding FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS t(id, ord) "
            "LEFT JOIN memories m ON m.id = t.id ORDER BY t.ord",
            {"ids": [int(m) for m in memory_ids]},
            binary=True,
        )
        await conn.commit()
    embeddings = np.zeros((len(memory_ids), dim), dtype=np.float32)
    for i, (vector,) in enumerate(await cursor.fetchall()):
        if vector is not None:  # None: deleted since the search, by a concurrent request
            embeddings[i] = vector.to_numpy()
    return embeddings


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
            full_rerank_calls = full_rerank_calls + %(n_candidates)s,
            score_sum = score_sum + (SELECT coalesce(sum(s), 0) FROM live),
            score_count = score_count + (SELECT count(*) FROM live),
            queries_since_refit = queries_since_refit + 1
        WHERE name = %(namespace)s
        RETURNING next_query_index - 1 AS query_index, queries_since_refit
    ), q AS (
        INSERT INTO queries (namespace, query_index, text, embedding, policy, candidates,
                             budget, scorer_calls, bias, slope, factors, prequential_abs_error,
                             prequential_count, returned_count, returned_estimated)
        SELECT %(namespace)s::text, n.query_index, %(text)s::text, %(embedding)b,
               %(policy)s::text, %(n_candidates)s::int, %(budget)s::int, %(calls)s::int,
               %(bias)s::float8, %(slope)s::float8, %(factors)s::real[],
               %(prequential_error)s::float8, %(prequential_count)s::int,
               %(returned_count)s::int, %(returned_estimated)s::int
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
_LOCK_SQL = _STATE_SQL + " FOR NO KEY UPDATE"


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
    query: QueryParameters | None,
    prequential_errors: np.ndarray,
    returned_count: int,
    returned_estimated: int,
    observed_ids: np.ndarray,
    observed_similarities: np.ndarray,
    observed_scores: np.ndarray,
    rank: int,
) -> tuple[RecordedQuery, RowObservations]:
    """Record a query and its observations in the caller's transaction, and read the full
    observation history of the observed memories (this query's cells included) for their
    online re-solve: one round trip for all (pipelined).

    The namespace row is locked first, so concurrent requests get consecutive indexes and a
    rolled-back request leaves no gap; and in a statement of its own, so the record's snapshot,
    taken once the lock is held, sees every delete of the namespace's memories (a delete takes
    the same lock, :func:`service.memories.delete_memory`): observations of memories deleted
    since the search are left out, the query is recorded all the same.
    """
    conn = await driver_connection(session)
    async with conn.pipeline():
        await conn.execute(_LOCK_SQL, {"namespace": namespace})
        cursor = await conn.execute(
            _RECORD_SQL,
            {
                "namespace": namespace,
                "calls": scorer_calls,
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


async def add_feedback_to_mean(
    session: AsyncSession, namespace: str, scores: np.ndarray
) -> None:
    await session.execute(
        text(
            "UPDATE namespaces SET score_sum = score_sum + :total, score_count = score_count + :n "
            "WHERE name = :namespace"
        ),
        {"namespace": namespace, "total": float(np.sum(scores)), "n": len(scores)},
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
_MEMORY_CONTENT_SQL = _content_sql("m.embedding", "n.content_weights")
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
    session: AsyncSession, memory_ids: Sequence[int], rank: int
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


_UPSERT_FACTORS_SQL = """
    INSERT INTO memory_factors (memory_id, namespace, bias, factors, observation_count)
    SELECT m, %(namespace)s::text, b, f::real[], n
    FROM unnest(%(ids)s::bigint[], %(bias)s::float8[], %(factors)s::text[], %(counts)s::int[])
        AS t(m, b, f, n)
    ON CONFLICT (memory_id) DO UPDATE SET
        bias = EXCLUDED.bias, factors = EXCLUDED.factors,
        observation_count = EXCLUDED.observation_count
"""


async def upsert_memory_factors(
    session: AsyncSession,
    namespace: str,
    memory_ids: np.ndarray,
    bias: np.ndarray,
    factors: np.ndarray,
    observation_count: np.ndarray,
    *,
    commit: bool = False,
) -> None:
    """The online update of a few memory rows (a full refit writes with :func:`replace_model`).
    ``commit``: also commit the transaction, in the same round trip."""
    conn = await driver_connection(session)
    async with conn.pipeline():
        if len(memory_ids):
            await conn.execute(
                _UPSERT_FACTORS_SQL,
                {
                    "namespace": namespace,
                    "ids": [int(m) for m in memory_ids],
                    "bias": [float(b) for b in bias],
                    "factors": real_array_literals(factors),
                    "counts": [int(n) for n in observation_count],
                },
            )
        if commit:
            await conn.commit()


async def update_query_factors(
    session: AsyncSession,
    query_ids: np.ndarray,
    bias: np.ndarray,
    slope: np.ndarray,
    factors: np.ndarray,
) -> None:
    if len(query_ids) == 0:
        return
    await session.execute(
        text(
            """
            UPDATE queries q SET bias = t.b, slope = t.s, factors = CAST(t.f AS real[])
            FROM unnest(CAST(:ids AS bigint[]), CAST(:bias AS float8[]), CAST(:slope AS float8[]),
                        CAST(:factors AS text[])) AS t(id, b, s, f)
            WHERE q.id = t.id
            """
        ),
        {
            "ids": [int(q) for q in query_ids],
            "bias": [float(b) for b in bias],
            "slope": [float(s) for s in slope],
            "factors": real_array_literals(factors),
        },
    )


@dataclass(frozen=True)
class NamespaceObservations:
    memory_ids: np.ndarray
    query_ids: np.ndarray
    similarities: np.ndarray
    scores: np.ndarray


# Binary COPY framing (https://www.postgresql.org/docs/current/sql-copy.html#id-1.9.3.55.9.4).
_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_COPY_HEADER = _COPY_SIGNATURE + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
_FLOAT4_OID = 700

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
    async with conn.cursor() as cursor:
        async with cursor.copy(statement) as copy:
            async for chunk in copy:
                data += chunk
    rows = _parse_binary_copy(bytes(data), _OBSERVATION_ROW)
    return NamespaceObservations(
        memory_ids=rows["memory_id"].astype(np.int64),
        query_ids=rows["query_id"].astype(np.int64),
        similarities=rows["similarity"].astype(np.float64),
        scores=rows["score"].astype(np.float64),
    )


def _parse_binary_copy(data: bytes, row: np.dtype) -> np.ndarray:
    """Rows of a binary COPY whose every field is fixed-size and non-NULL."""
    if not data.startswith(_COPY_SIGNATURE):
        raise ValueError("not a binary COPY stream")
    extension = struct.unpack_from(">i", data, len(_COPY_SIGNATURE) + 4)[0]
    start = len(_COPY_SIGNATURE) + 8 + extension
    body = data[start : len(data) - len(_COPY_TRAILER)]
    rows = np.frombuffer(body, dtype=row)
    sizes = [row.fields[name][0].itemsize for name in row.names[2::2]]
    lengths = [row.names[i] for i in range(1, len(row.names), 2)]
    if len(body) % row.itemsize or np.any(rows["fields"] != len(sizes)) or any(
        np.any(rows[name] != size) for name, size in zip(lengths, sizes)
    ):
        raise ValueError("unexpected row layout in a binary COPY stream")
    return rows


def _binary_copy(columns: Sequence[tuple[str, Any]], n_rows: int) -> bytes:
    """A binary COPY stream of ``n_rows`` rows, built in numpy (no per-row Python).

    Columns are (kind, values): ``int8``, ``int4``, ``float8`` (arrays of ``n_rows``), ``text``
    (one ``str`` for every row) or ``real[]`` (an (n_rows, r) array, written as float32).
    """
    fields: list[tuple[Any, ...]] = [("fields", ">i2")]
    for i, (kind, values) in enumerate(columns):
        fields.append((f"l{i}", ">i4"))
        if kind == "int8":
            fields.append((f"v{i}", ">i8"))
        elif kind == "int4":
            fields.append((f"v{i}", ">i4"))
        elif kind == "float8":
            fields.append((f"v{i}", ">f8"))
        elif kind == "text":
            fields.append((f"v{i}", f"S{len(values.encode())}"))
        elif kind == "real[]":
            rank = values.shape[1]
            fields.append((f"h{i}", ">i4", (5,)))  # ndim, has-nulls, element oid, size, lbound
            fields.append((f"v{i}", [("length", ">i4"), ("value", ">f4")], (rank,)))
        else:  # pragma: no cover - programming error
            raise ValueError(f"unknown column kind {kind!r}")
    rows = np.zeros(n_rows, dtype=np.dtype(fields))
    rows["fields"] = len(columns)
    for i, (kind, values) in enumerate(columns):
        if kind == "text":
            encoded = values.encode()
            rows[f"l{i}"] = len(encoded)
            rows[f"v{i}"] = encoded
        elif kind == "real[]":
            rank = values.shape[1]
            rows[f"l{i}"] = 20 + 8 * rank
            rows[f"h{i}"] = (1, 0, _FLOAT4_OID, rank, 1)
            rows[f"v{i}"]["length"] = 4
            rows[f"v{i}"]["value"] = real_values(values)
        else:
            rows[f"l{i}"] = rows.dtype[f"v{i}"].itemsize
            rows[f"v{i}"] = values
    return _COPY_HEADER + rows.tobytes() + _COPY_TRAILER


async def _copy_in(conn: psycopg.AsyncConnection[Any], statement: str, data: bytes) -> None:
    async with conn.cursor() as cursor:
        async with cursor.copy(statement) as copy:
            await copy.write(data)


async def try_lock_namespace_refit(session: AsyncSession, namespace: str) -> bool:
    """Only one process refits a namespace at a time; the others skip. A session-level lock,
    held across the read, the fit and the write transactions; release with
    :func:`unlock_namespace_refit`."""
    return bool(
        await session.scalar(
            text("SELECT pg_try_advisory_lock(hashtextextended(:key, 0))"),
            {"key": f"earm-refit:{namespace}"},
        )
    )


async def unlock_namespace_refit(session: AsyncSession, namespace: str) -> None:
    await session.execute(
        text("SELECT pg_advisory_unlock(hashtextextended(:key, 0))"),
        {"key": f"earm-refit:{namespace}"},
    )


async def _still_existing(
    conn: psycopg.AsyncConnection[Any], memory_ids: np.ndarray
) -> np.ndarray:
    """A mask of the ``memory_ids`` not deleted. Run under the namespace's lock, which a
    delete takes too: no delete is under way, and this statement sees every one committed."""
    cursor = await conn.execute(
        "SELECT t.id FROM unnest(%(ids)s::bigint[]) AS t(id) "
        "WHERE NOT EXISTS (SELECT FROM memories m WHERE m.id = t.id)",
        {"ids": [int(m) for m in memory_ids]},
    )
    deleted = [row[0] for row in await cursor.fetchall()]
    return np.isin(memory_ids, deleted, invert=True)


async def replace_model(
    session: AsyncSession,
    namespace: str,
    memory_ids: np.ndarray,
    memory_bias: np.ndarray,
    memory_factors: np.ndarray,
    observation_count: np.ndarray,
    query_ids: np.ndarray,
    query_bias: np.ndarray,
    query_slope: np.ndarray,
    query_factors: np.ndarray,
    prior: ContentPrior,
    refitted_at: datetime,
) -> None:
    """Write a full refit: every memory row and query column of the namespace, and reset the
    counter. Rows travel by binary COPY (the memory side straight into ``memory_factors``,
    emptied for the namespace first; the query side through a temporary table). Memories
    deleted since the observations were read get no row."""
    await namespace_state(session, namespace, for_update=True)
    conn = await driver_connection(session)
    existing = await _still_existing(conn, memory_ids)
    memory_ids, memory_bias, memory_factors, observation_count = (
        np.asarray(values)[existing]
        for values in (memory_ids, memory_bias, memory_factors, observation_count)
    )
    await conn.execute("DELETE FROM memory_factors WHERE namespace = %s", (namespace,))
    if len(memory_ids):
        await _copy_in(
            conn,
            "COPY memory_factors (memory_id, namespace, bias, factors, observation_count) "
            "FROM STDIN (FORMAT BINARY)",
            _binary_copy(
                [("int8", memory_ids), ("text", namespace), ("float8", memory_bias),
                 ("real[]", np.asarray(memory_factors)), ("int4", observation_count)],
                len(memory_ids),
            ),
        )
    if len(query_ids):
        await conn.execute(
            "CREATE TEMPORARY TABLE earm_refit_queries "
            "(id bigint, bias float8, slope float8, factors real[]) ON COMMIT DROP"
        )
        await _copy_in(
            conn,
            "COPY earm_refit_queries (id, bias, slope, factors) FROM STDIN (FORMAT BINARY)",
            _binary_copy(
                [("int8", query_ids), ("float8", query_bias), ("float8", query_slope),
                 ("real[]", np.asarray(query_factors))],
                len(query_ids),
            ),
        )
        await conn.execute(
            "UPDATE queries q SET bias = t.bias, slope = t.slope, factors = t.factors "
            "FROM earm_refit_queries t WHERE q.id = t.id"
        )
        await conn.execute("DROP TABLE earm_refit_queries")
    await session.execute(
        text(
            """
            UPDATE namespaces SET queries_since_refit = 0, last_refit_at = :at,
                content_slope = :content_slope,
                content_weights = CAST(:content_weights AS vector),
                score_sum = (SELECT coalesce(sum(score::text::float8), 0) FROM scores
                             WHERE namespace = :namespace),
                score_count = (SELECT count(*) FROM scores WHERE namespace = :namespace)
            WHERE name = :namespace
            """
        ),
        # The running mean is recomputed from the data under the namespace lock: it heals drift
        # from deleted memories and counts observations recorded while the fit ran. The sum is
        # of the numbers the fit reads (see namespace_observations), in double precision: sum()
        # of `real` adds in float32, whose rounding depends on the rows' physical order, so a
        # replay of the same requests could get another mean.
        {
            "namespace": namespace,
            "at": refitted_at,
            "content_slope": prior.slope if len(prior.weights) else None,
            "content_weights": (
                "[" + ",".join(repr(float(x)) for x in prior.weights) + "]"
                if len(prior.weights)
                else None
            ),
        },
    )
