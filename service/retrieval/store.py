"""SQL of the retrieval pipeline: candidates with their model state, recording, model persistence.

Every function takes an open ``AsyncSession`` and leaves the transaction to the caller, so the
pipeline decides what commits together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from pgvector.sqlalchemy import VECTOR
from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.types import REAL

from service.completion.similarity import QueryParameters
from service.errors import NotFound


@dataclass(frozen=True)
class Candidates:
    """The semantic candidates of one query, most similar first, as parallel arrays."""

    ids: np.ndarray  # int64 (n,)
    similarities: np.ndarray  # float64 (n,) cosine similarity
    embeddings: np.ndarray  # float32 (n, dim)
    memory_bias: np.ndarray  # float64 (n,), 0 where the memory has no history
    memory_factors: np.ndarray  # float64 (n, rank), 0 where the memory has no history
    observation_count: np.ndarray  # int64 (n,)
    rows: list[dict[str, Any]]  # id, external_id, text, occurred_at, created_at, metadata

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class NamespaceState:
    next_query_index: int
    mean_score: float  # μ of the completion model
    score_count: int
    queries_since_refit: int


def as_real(values: np.ndarray) -> list[float]:
    """Values for a Postgres ``real`` column: float32, with magnitudes below float32's smallest
    normal flushed to zero (Postgres rejects subnormal ``real`` input as out of range, and ALS
    can drive an unused factor arbitrarily close to zero)."""
    single = np.asarray(values, dtype=np.float32)
    single = np.where(np.abs(single) < np.finfo(np.float32).tiny, np.float32(0.0), single)
    return [float(x) for x in single]


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


async def namespace_state(
    session: AsyncSession, namespace: str, for_update: bool = False
) -> NamespaceState:
    """The namespace's counters; ``for_update`` locks its row first, which every writer of
    model state does, so writers of one namespace queue instead of deadlocking."""
    row = (
        await session.execute(
            text(
                "SELECT next_query_index, score_sum, score_count, queries_since_refit "
                "FROM namespaces WHERE name = :namespace" + (" FOR UPDATE" if for_update else "")
            ),
            {"namespace": namespace},
        )
    ).first()
    if row is None:
        raise NotFound(f"namespace {namespace!r} has no memories")
    next_index, score_sum, score_count, since_refit = row
    mean = float(score_sum) / score_count if score_count else 0.0
    return NamespaceState(int(next_index), mean, int(score_count), int(since_refit))


_CANDIDATE_COLUMNS = (
    "id, external_id, text, occurred_at, created_at, metadata, embedding, "
    "embedding <=> :query AS distance"
)


def _candidate_sql(exact: bool, filtered: bool) -> str:
    # `+ 0` hides the operator from the planner, forcing an exact scan for the fallback.
    order = "(embedding <=> :query) + 0" if exact else "embedding <=> :query"
    where = "namespace = :namespace" + (" AND metadata @> :filters" if filtered else "")
    return f"""
        WITH c AS MATERIALIZED (
            SELECT {_CANDIDATE_COLUMNS} FROM memories
            WHERE {where} ORDER BY {order} LIMIT :limit
        )
        SELECT c.*, f.bias, f.factors, f.observation_count
        FROM c LEFT JOIN memory_factors f ON f.memory_id = c.id
        ORDER BY c.distance, c.id
    """


async def fetch_candidates(
    session: AsyncSession,
    namespace: str,
    query_embedding: np.ndarray,
    limit: int,
    rank: int,
    filters: dict[str, Any] | None = None,
) -> Candidates:
    """Top-``limit`` memories by cosine similarity, with their completion-model parameters.

    pgvector's HNSW scan yields at most ``hnsw.ef_search`` rows, and a namespace filter can
    leave fewer, so ef_search is raised to ``limit`` and iterative scanning is enabled for this
    transaction; if the index still returns too few, an exact scan of the namespace answers.
    """
    await session.execute(
        text(
            "SELECT set_config('hnsw.ef_search', :ef, true), "
            "set_config('hnsw.iterative_scan', 'relaxed_order', true)"
        ),
        {"ef": str(min(1000, max(40, limit)))},
    )
    params = {
        "namespace": namespace,
        "query": query_embedding,
        "limit": limit,
        "filters": filters,
    }
    rows = await _candidate_rows(session, params, exact=False, filtered=filters is not None)
    if len(rows) < limit:
        rows = await _candidate_rows(session, params, exact=True, filtered=filters is not None)
    return Candidates(
        ids=np.array([r.id for r in rows], dtype=np.int64),
        similarities=np.array([1.0 - r.distance for r in rows], dtype=np.float64),
        embeddings=(
            np.array([r.embedding for r in rows], dtype=np.float32)
            if rows
            else np.zeros((0, len(query_embedding)), dtype=np.float32)
        ),
        memory_bias=np.array([r.bias or 0.0 for r in rows], dtype=np.float64),
        memory_factors=factor_matrix([r.factors for r in rows], rank),
        observation_count=np.array([r.observation_count or 0 for r in rows], dtype=np.int64),
        rows=[
            {
                "id": r.id,
                "external_id": r.external_id,
                "text": r.text,
                "occurred_at": r.occurred_at,
                "created_at": r.created_at,
                "metadata": r.metadata,
            }
            for r in rows
        ],
    )


async def _candidate_rows(
    session: AsyncSession, params: dict[str, Any], exact: bool, filtered: bool
) -> list[Any]:
    statement = (
        text(_candidate_sql(exact, filtered))
        .bindparams(
            bindparam("query", type_=VECTOR()),
            *([bindparam("filters", type_=JSONB())] if filtered else []),
        )
        .columns(embedding=VECTOR())
    )
    if not filtered:
        params = {k: v for k, v in params.items() if k != "filters"}
    return list((await session.execute(statement, params)).all())


@dataclass(frozen=True)
class RecordedQuery:
    query_id: int
    query_index: int
    queries_since_refit: int


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
) -> RecordedQuery:
    """Record a query and its observations in the caller's transaction.

    The namespace row's UPDATE takes its lock, so concurrent requests get consecutive indexes
    and a rolled-back request leaves no gap.
    """
    index_row = (
        await session.execute(
            text(
                """
                UPDATE namespaces SET
                    next_query_index = next_query_index + 1,
                    scorer_calls = scorer_calls + :calls,
                    full_rerank_calls = full_rerank_calls + :n_candidates,
                    score_sum = score_sum + :score_sum,
                    score_count = score_count + :score_count,
                    queries_since_refit = queries_since_refit + 1
                WHERE name = :namespace
                RETURNING next_query_index - 1, queries_since_refit
                """
            ),
            {
                "namespace": namespace,
                "calls": scorer_calls,
                "n_candidates": n_candidates,
                "score_sum": float(np.sum(observed_scores)),
                "score_count": len(observed_scores),
            },
        )
    ).one()
    query_index, since_refit = int(index_row[0]), int(index_row[1])
    query_id = (
        await session.execute(
            text(
                """
                INSERT INTO queries (namespace, query_index, text, embedding, policy, candidates,
                                     budget, scorer_calls, bias, slope, factors, prequential_abs_error,
                                     prequential_count, returned_count, returned_estimated)
                VALUES (:namespace, :query_index, :text, :embedding, :policy, :candidates,
                        :budget, :calls, :bias, :slope, :factors, :prequential_error,
                        :prequential_count, :returned_count, :returned_estimated)
                RETURNING id
                """
            ).bindparams(
                bindparam("embedding", type_=VECTOR()), bindparam("factors", type_=ARRAY(REAL))
            ),
            {
                "namespace": namespace,
                "query_index": query_index,
                "text": query_text,
                "embedding": query_embedding,
                "policy": policy,
                "candidates": n_candidates,
                "budget": budget,
                "calls": scorer_calls,
                "bias": None if query is None else query.bias,
                "slope": None if query is None else query.slope,
                "factors": None if query is None else as_real(query.factors),
                "prequential_error": (
                    float(np.mean(prequential_errors)) if len(prequential_errors) else None
                ),
                "prequential_count": len(prequential_errors),
                "returned_count": returned_count,
                "returned_estimated": returned_estimated,
            },
        )
    ).scalar_one()
    if len(observed_ids):
        await insert_scores(
            session,
            namespace,
            query_id,
            observed_ids,
            observed_similarities,
            observed_scores,
            "scorer",
        )
    return RecordedQuery(int(query_id), query_index, since_refit)


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


async def memory_row_observations(
    session: AsyncSession, memory_ids: Sequence[int], rank: int
) -> RowObservations:
    rows = (
        await session.execute(
            text(
                """
                SELECT s.memory_id, s.similarity, s.score, q.bias, q.slope, q.factors
                FROM scores s JOIN queries q ON q.id = s.query_id
                WHERE s.memory_id = ANY(CAST(:ids AS bigint[])) AND q.bias IS NOT NULL
                ORDER BY s.memory_id, s.query_id
                """
            ),
            {"ids": [int(m) for m in memory_ids]},
        )
    ).all()
    return RowObservations(
        memory_ids=np.array([r[0] for r in rows], dtype=np.int64),
        similarities=np.array([r[1] for r in rows], dtype=np.float64),
        scores=np.array([r[2] for r in rows], dtype=np.float64),
        query_bias=np.array([r[3] for r in rows], dtype=np.float64),
        query_slope=np.array([r[4] or 0.0 for r in rows], dtype=np.float64),
        query_factors=factor_matrix([r[5] for r in rows], rank),
    )


async def query_observations(
    session: AsyncSession, query_id: int, rank: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(scores, similarities, memory_bias, memory_factors) of every observed cell of one query."""
    rows = (
        await session.execute(
            text(
                """
                SELECT s.score, s.similarity, coalesce(f.bias, 0), f.factors
                FROM scores s LEFT JOIN memory_factors f ON f.memory_id = s.memory_id
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


async def upsert_memory_factors(
    session: AsyncSession,
    namespace: str,
    memory_ids: np.ndarray,
    bias: np.ndarray,
    factors: np.ndarray,
    observation_count: np.ndarray,
) -> None:
    if len(memory_ids) == 0:
        return
    await session.execute(
        text(
            """
            INSERT INTO memory_factors (memory_id, namespace, bias, factors, observation_count)
            SELECT m, :namespace, b, CAST(f AS real[]), n
            FROM unnest(CAST(:ids AS bigint[]), CAST(:bias AS float8[]),
                        CAST(:factors AS text[]), CAST(:counts AS int[])) AS t(m, b, f, n)
            ON CONFLICT (memory_id) DO UPDATE SET
                bias = EXCLUDED.bias, factors = EXCLUDED.factors,
                observation_count = EXCLUDED.observation_count
            """
        ),
        {
            "namespace": namespace,
            "ids": [int(m) for m in memory_ids],
            "bias": [float(b) for b in bias],
            "factors": real_array_literals(factors),
            "counts": [int(n) for n in observation_count],
        },
    )


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


async def namespace_observations(session: AsyncSession, namespace: str) -> NamespaceObservations:
    rows = (
        await session.execute(
            text(
                "SELECT memory_id, query_id, similarity, score FROM scores "
                "WHERE namespace = :namespace"
            ),
            {"namespace": namespace},
        )
    ).all()
    return NamespaceObservations(
        memory_ids=np.array([r[0] for r in rows], dtype=np.int64),
        query_ids=np.array([r[1] for r in rows], dtype=np.int64),
        similarities=np.array([r[2] for r in rows], dtype=np.float64),
        scores=np.array([r[3] for r in rows], dtype=np.float64),
    )


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
    refitted_at: datetime,
) -> None:
    """Write a full refit: every memory row and query column of the namespace, and reset the counter."""
    await namespace_state(session, namespace, for_update=True)
    await session.execute(
        text("DELETE FROM memory_factors WHERE namespace = :namespace"), {"namespace": namespace}
    )
    await upsert_memory_factors(
        session, namespace, memory_ids, memory_bias, memory_factors, observation_count
    )
    await update_query_factors(session, query_ids, query_bias, query_slope, query_factors)
    await session.execute(
        text(
            """
            UPDATE namespaces SET queries_since_refit = 0, last_refit_at = :at,
                score_sum = (SELECT coalesce(sum(score), 0) FROM scores WHERE namespace = :namespace),
                score_count = (SELECT count(*) FROM scores WHERE namespace = :namespace)
            WHERE name = :namespace
            """
        ),
        # The running mean is recomputed from the data under the namespace lock: it heals drift
        # from deleted memories and counts observations recorded while the fit ran.
        {"namespace": namespace, "at": refitted_at},
    )
