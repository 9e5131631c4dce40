"""SQL behind the dashboard's namespace and experience-matrix pages (``service.http.dashboard``).

Each page is a few statements whose cost is bounded whatever the namespace holds:

- the namespace's history is read from ``queries`` grouped into at most ``buckets`` consecutive
  ranges of query indexes (``uq_queries_namespace_query_index``), so a chart has a bounded
  number of points;
- the mix of sources and the recent queries read the last queries only (the same index,
  backwards);
- the experience matrix reads the observations of its last ``rows`` queries (the ``scores``
  primary key) and their stored traces, with memories grouped into at most ``columns`` equal
  ranges of ids (min/max/count through ``ix_memories_namespace_id``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.db.statements import fetch_all, fetch_record, fetch_records


@dataclass(frozen=True)
class HistoryBucket:
    """Consecutive queries of a namespace, ``first_index`` to ``last_index``."""

    first_index: int
    last_index: int
    scorer_calls: int
    full_rerank_calls: int
    stage: int | None  # the highest recorded stage (None: recorded before traces were kept)
    budget_share: float  # anchors / candidates over the bucket
    # The prequential error of the queries that reused no earlier asking's scores (new to the
    # namespace), and of those that did (asked before, verbatim or rephrased): None where the
    # bucket has none with a prediction. Apart, because a stream's error mixes the two and its
    # budget stages (a smaller budget scores only the hardest anchors).
    prequential_error_new: float | None
    prequential_error_again: float | None


_HISTORY_SQL = """
SELECT min(query_index) AS first_index, max(query_index) AS last_index,
       sum(scorer_calls) AS scorer_calls, sum(candidates) AS full_rerank_calls,
       max(stage) AS stage,
       sum(budget)::float8 / nullif(sum(candidates), 0) AS budget_share,
       sum(prequential_abs_error * prequential_count) FILTER (WHERE NOT asked_before)
           / nullif(sum(prequential_count) FILTER (WHERE NOT asked_before), 0)
           AS prequential_error_new,
       sum(prequential_abs_error * prequential_count) FILTER (WHERE asked_before)
           / nullif(sum(prequential_count) FILTER (WHERE asked_before), 0)
           AS prequential_error_again
FROM queries, LATERAL (SELECT cardinality(reused_memory_ids) > 0 AS asked_before) AS reuse
WHERE namespace = %(namespace)s
GROUP BY query_index * %(buckets)s / greatest(%(queries)s, 1)
ORDER BY first_index
"""


async def namespace_history(
    session: AsyncSession, namespace: str, queries: int, buckets: int
) -> list[HistoryBucket]:
    """The namespace's query stream in at most ``buckets`` groups of consecutive queries
    (``queries``: how many it has recorded, which sizes the groups)."""
    rows = await fetch_records(
        session, _HISTORY_SQL, {"namespace": namespace, "queries": queries, "buckets": buckets}
    )
    return [
        HistoryBucket(
            first_index=int(r["first_index"]),
            last_index=int(r["last_index"]),
            scorer_calls=int(r["scorer_calls"]),
            full_rerank_calls=int(r["full_rerank_calls"]),
            stage=_optional_int(r["stage"]),
            budget_share=float(r["budget_share"] or 0.0),
            prequential_error_new=_optional_float(r["prequential_error_new"]),
            prequential_error_again=_optional_float(r["prequential_error_again"]),
        )
        for r in rows
    ]


_RETURNED_SOURCES_SQL = """
SELECT source, count(*) AS n
FROM (
    SELECT trace_sources[1:returned_count] AS returned FROM queries
    WHERE namespace = %(namespace)s AND trace_sources IS NOT NULL
    ORDER BY query_index DESC LIMIT %(last)s
) r, unnest(r.returned) AS source
GROUP BY source
"""


async def returned_sources(session: AsyncSession, namespace: str, last: int) -> dict[str, int]:
    """How many memories returned by the last ``last`` queries came from each source."""
    rows = await fetch_all(session, _RETURNED_SOURCES_SQL, {"namespace": namespace, "last": last})
    return {str(source): int(n) for source, n in rows}


@dataclass(frozen=True)
class RecentQuery:
    query_id: int
    query_index: int
    text: str
    policy: str
    budget: int
    scorer_calls: int
    returned_estimated: int
    returned_count: int
    created_at: datetime


# The columns of RecentQuery, in its order.
_RECENT_QUERIES_SQL = """
SELECT id, query_index, text, policy, budget, scorer_calls, returned_estimated, returned_count,
       created_at
FROM queries WHERE namespace = %(namespace)s
ORDER BY query_index DESC LIMIT %(last)s
"""


async def recent_queries(session: AsyncSession, namespace: str, last: int) -> list[RecentQuery]:
    rows = await fetch_all(session, _RECENT_QUERIES_SQL, {"namespace": namespace, "last": last})
    return [RecentQuery(*row) for row in rows]


@dataclass(frozen=True)
class MatrixTile:
    row: int  # 0 = the oldest query shown
    column: int  # 0 = the lowest memory ids
    observed_mean: float | None  # of the observed cells in the tile (None: none)
    estimated_mean: float | None  # of the estimated candidates in the tile (None: none)


@dataclass(frozen=True)
class ExperienceMatrix:
    """The last queries (one row each, oldest first) × memories grouped into ranges of ids."""

    query_ids: list[int]
    query_indexes: list[int]
    memories: int
    lowest_memory_id: int
    ids_per_column: float
    columns: int
    tiles: list[MatrixTile]


_MATRIX_SQL = """
WITH q AS MATERIALIZED (
    SELECT id, query_index, trace_memory_ids, trace_estimates, trace_sources FROM queries
    WHERE namespace = %(namespace)s AND query_index < %(before)s
    ORDER BY query_index DESC LIMIT %(rows)s
), cell AS (
    -- Retired cells judged a memory's old content: the model no longer learns from them.
    SELECT s.query_id, s.memory_id, s.score AS value, true AS observed
    FROM scores s JOIN q ON s.query_id = q.id
    WHERE s.namespace = %(namespace)s AND s.retired_at IS NULL
    UNION ALL
    SELECT q.id, t.memory_id, t.estimate, false
    FROM q, unnest(q.trace_memory_ids, q.trace_estimates, q.trace_sources)
        AS t(memory_id, estimate, source)
    WHERE t.source <> 'observed'
)
SELECT cell.query_id,
       least(floor((cell.memory_id - %(lowest)s) / %(ids_per_column)s), %(columns)s - 1)::int
           AS column,
       avg(value) FILTER (WHERE observed) AS observed_mean,
       avg(value) FILTER (WHERE NOT observed) AS estimated_mean
FROM cell
WHERE cell.memory_id >= %(lowest)s
GROUP BY 1, 2
"""


@dataclass(frozen=True)
class _Columns:
    lowest_memory_id: int
    ids_per_column: float
    columns: int
    memories: int


_ID_RANGE_SQL = (
    "SELECT min(id) AS lowest, max(id) AS highest, count(*) AS n "
    "FROM memories WHERE namespace = %(namespace)s"
)


async def _columns(session: AsyncSession, namespace: str, columns: int) -> _Columns:
    """The namespace's memory ids cut into at most ``columns`` equal ranges."""
    bounds = await fetch_record(session, _ID_RANGE_SQL, {"namespace": namespace})
    assert bounds is not None, "an aggregate returns one row"
    lowest = int(bounds["lowest"] or 1)
    n_columns = max(1, min(columns, int(bounds["n"])))
    id_span = int(bounds["highest"] or lowest) - lowest + 1
    return _Columns(lowest, id_span / n_columns, n_columns, int(bounds["n"]))


_SHOWN_QUERIES_SQL = (
    "SELECT id, query_index FROM queries WHERE namespace = %(namespace)s "
    "AND query_index < %(before)s ORDER BY query_index DESC LIMIT %(rows)s"
)


async def experience_matrix(
    session: AsyncSession, namespace: str, rows: int, columns: int, before: int | None = None
) -> ExperienceMatrix:
    """The last ``rows`` queries before query index ``before`` (None: the latest), their
    observed cells and estimated candidates, with the namespace's memories grouped into at most
    ``columns`` equal ranges of ids (a memory's column: its id's range)."""
    grid = await _columns(session, namespace, columns)
    window = {"namespace": namespace, "before": _before(before), "rows": rows}
    shown = await fetch_all(session, _SHOWN_QUERIES_SQL, window)
    query_ids = [int(query_id) for query_id, _ in reversed(shown)]
    row_of = {query_id: row for row, query_id in enumerate(query_ids)}
    cells = await fetch_records(
        session,
        _MATRIX_SQL,
        window
        | {
            "lowest": grid.lowest_memory_id,
            "ids_per_column": grid.ids_per_column,
            "columns": grid.columns,
        },
    )
    return ExperienceMatrix(
        query_ids=query_ids,
        query_indexes=[int(query_index) for _, query_index in reversed(shown)],
        memories=grid.memories,
        lowest_memory_id=grid.lowest_memory_id,
        ids_per_column=grid.ids_per_column,
        columns=grid.columns,
        tiles=[
            _tile(row_of[int(c["query_id"])], c) for c in cells if int(c["query_id"]) in row_of
        ],
    )


def _tile(row: int, cell: dict[str, Any]) -> MatrixTile:
    return MatrixTile(
        row=row,
        column=int(cell["column"]),
        observed_mean=_optional_float(cell["observed_mean"]),
        estimated_mean=_optional_float(cell["estimated_mean"]),
    )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _before(before: int | None) -> int:
    return 2**62 if before is None else before
