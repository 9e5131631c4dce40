"""What the online update of memory rows reads, and where a rebuild of their statistics goes:
each row's stored sufficient statistics and version, and the history of the rows without
statistics (docs/design.md "Causal completion and online learning"). The update itself is
computed in ``service.retrieve.online``; its write is ``model_state.online_update_statement``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import psycopg
from numpy.typing import NDArray
from sqlalchemy.ext.asyncio import AsyncSession

from service.completion.statistics import RowObservations, RowStatistics
from service.db.codecs import (
    array_literal,
    double_array_literals,
    factor_matrix,
    float8_arrays_as_numpy,
)
from service.db.engine import driver_connection
from service.db.model_state import ROW_VERSION_SQL, content_sql
from service.db.statements import execute, fetch_all, pipeline

# e_m·w of the content prior per memory, once per memory rather than once per observation:
# with 100 observations per memory, fetching and multiplying the embedding for each was most of
# the read.
_MEMORY_CONTENT_SQL = content_sql("m.embedding", "n.content_weights")


def _row_observations_sql(which_memories: str = "", which_scores: str = "") -> str:
    """Every observation of the namespace's memories ``%(ids)s`` (narrowed by the SQL conditions
    on ``m`` in ``which_memories`` and on ``s`` in ``which_scores``), each with its query's
    parameters and its content-prior offset (0 before the namespace's first refit)."""
    return f"""
    WITH m AS MATERIALIZED (
        SELECT m.id, {_MEMORY_CONTENT_SQL} AS content
        FROM memories m JOIN namespaces n ON n.name = m.namespace
        WHERE m.namespace = %(namespace)s AND m.id = ANY(%(ids)s::bigint[]) {which_memories}
    )
    SELECT s.memory_id, s.similarity, s.score, q.bias, q.slope, q.factors,
           coalesce(n.content_slope * s.similarity + m.content, 0)
    FROM scores s JOIN query_factors q ON q.namespace = s.namespace AND q.query_id = s.query_id
    JOIN m ON m.id = s.memory_id JOIN namespaces n ON n.name = s.namespace
    WHERE s.namespace = %(namespace)s AND s.memory_id = ANY(ARRAY(SELECT id FROM m))
      AND s.retired_at IS NULL {which_scores}
    ORDER BY s.memory_id, s.query_id
"""


_ROW_OBSERVATIONS_SQL = _row_observations_sql()
# Only memories with no usable statistics: the rare ones the online update rebuilds from their
# history (first observed, written before migration 0010, or invalidated by a refit).
_HISTORY_WITHOUT_STATISTICS_SQL = _row_observations_sql(
    "AND NOT EXISTS (SELECT FROM memory_factors f "
    "WHERE f.namespace = %(namespace)s AND f.memory_id = m.id AND f.statistics IS NOT NULL)"
)
# Only the observations (%(query_ids)s[i], %(memory_ids)s[i]), recorded since %(since)s: what a
# refit's write adds to the statistics it fitted, of observations recorded while it ran
# (model_state.replace_model). The time leads the plan to the index of the scores by time (as
# many as the refit's duration let in); by the memories' ids it read their whole histories
# (1.5 s under the lock at 1M observations, docs/perf/refit_lock.py).
_PAIR_OBSERVATIONS_SQL = _row_observations_sql(
    which_scores="AND s.created_at >= %(since)s AND (s.query_id, s.memory_id) IN "
    "(SELECT * FROM unnest(%(query_ids)s::bigint[], %(memory_ids)s::bigint[]))"
)
# The memories that still exist, each with its stored statistics (or NULL) and its row's version.
_ROW_STATISTICS_SQL = f"""
    SELECT m.id, f.statistics, {ROW_VERSION_SQL}
    FROM memories m
    LEFT JOIN memory_factors f ON f.namespace = m.namespace AND f.memory_id = m.id
    WHERE m.namespace = %(namespace)s AND m.id = ANY(%(ids)s::bigint[]) ORDER BY m.id
"""

# The text literals are cast in a CTE, not in the SET list: Citus runs an UPDATE on the shard
# only when its SET list calls no function on a column (a cast from text is one), and it runs
# a CTE first and sends its rows along.
_STORE_STATISTICS_SQL = """
    WITH t AS MATERIALIZED (
        SELECT id, p::float8[] AS p, n
        FROM unnest(%(ids)s::bigint[], %(packed)s::text[], %(counts)s::int[]) AS u(id, p, n)
    )
    UPDATE memory_factors f SET statistics = t.p, observation_count = t.n
    FROM t WHERE f.namespace = %(namespace)s AND f.memory_id = t.id
"""


@dataclass(frozen=True)
class StoredRows:
    """What the online update of some memory rows starts from: the live memories among those
    asked for (ids ascending), each one's stored packed statistics or None and its row's
    version (``ROW_VERSION_SQL``), and ``history``, every observation of the memories with
    None."""

    memory_ids: np.ndarray
    statistics: list[np.ndarray | None]
    versions: list[str]
    history: RowObservations

    def join(self, other: StoredRows) -> StoredRows:
        """These rows and ``other``'s (rows of other memories), ids ascending."""
        ids = np.concatenate([self.memory_ids, other.memory_ids])
        order = np.argsort(ids, kind="stable")
        statistics, versions = self.statistics + other.statistics, self.versions + other.versions
        return StoredRows(
            ids[order],
            [statistics[i] for i in order],
            [versions[i] for i in order],
            self.history.join(other.history),
        )

    def subset(self, memory_ids: np.ndarray) -> StoredRows:
        """The rows of those of ``memory_ids`` read here."""
        keep = np.isin(self.memory_ids, memory_ids)
        return StoredRows(
            self.memory_ids[keep],
            [p for p, kept in zip(self.statistics, keep, strict=True) if kept],
            [v for v, kept in zip(self.versions, keep, strict=True) if kept],
            self.history.subset(np.isin(self.history.memory_ids, memory_ids)),
        )


async def read_rows(
    session: AsyncSession, namespace: str, memory_ids: np.ndarray, rank: int
) -> StoredRows:
    """The stored rows of the namespace's ``memory_ids`` for an online update, read without
    the namespace lock (a retrieve reads those of its anchors while the scorer works); the
    versions tell the update which rows changed before it took the lock. One round trip, the
    COMMIT ending the read-only transaction included (none for no memories)."""
    if len(memory_ids) == 0:
        return StoredRows(np.zeros(0, dtype=np.int64), [], [], _row_observations([], rank))
    conn = await driver_connection(session)
    ids = {"namespace": namespace, "ids": array_literal(memory_ids)}
    statistics = float8_arrays_as_numpy(conn.cursor(binary=True))
    statements = [(_ROW_STATISTICS_SQL, ids), (_HISTORY_WITHOUT_STATISTICS_SQL, ids)]
    async with pipeline(conn, statements):
        await statistics.execute(_ROW_STATISTICS_SQL, ids)
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
    session: AsyncSession, namespace: str, memory_ids: NDArray[np.integer[Any]], rank: int
) -> RowObservations:
    """Every live observation of these memories of the namespace: what their statistics are
    rebuilt from. O(the memories' history): a rare path."""
    rows = await fetch_all(
        session,
        _ROW_OBSERVATIONS_SQL,
        {"namespace": namespace, "ids": [int(m) for m in memory_ids]},
    )
    return _row_observations(rows, rank)


async def pair_observations(
    conn: psycopg.AsyncConnection[Any],
    namespace: str,
    query_ids: np.ndarray,
    memory_ids: np.ndarray,
    since: datetime,
    rank: int,
) -> RowObservations:
    """The live observations (``query_ids[i]``, ``memory_ids[i]``), recorded ``since`` then,
    whose query has parameters, read as :func:`memory_row_observations` reads a memory's
    history: with the parameters and the content prior stored now, in the caller's
    transaction. O(the scores recorded since)."""
    cursor = await conn.execute(
        _PAIR_OBSERVATIONS_SQL,
        {
            "namespace": namespace,
            "since": since,
            "ids": array_literal(np.unique(memory_ids)),
            "query_ids": array_literal(query_ids),
            "memory_ids": array_literal(memory_ids),
        },
    )
    return _row_observations(await cursor.fetchall(), rank)


async def store_row_statistics(
    session: AsyncSession, namespace: str, memory_ids: np.ndarray, statistics: RowStatistics
) -> None:
    """Store rebuilt statistics (with their observation counts) of memory rows in the caller's
    transaction; memories without a model row get none here (the next retrieve that observes
    them builds theirs)."""
    await execute(
        session,
        _STORE_STATISTICS_SQL,
        {
            "namespace": namespace,
            "ids": [int(m) for m in memory_ids],
            "packed": double_array_literals(statistics.packed()),
            "counts": [int(n) for n in statistics.counts],
        },
    )


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
