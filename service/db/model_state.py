"""The completion model's state: per-memory rows (``memory_factors``), per-query parameters
(``query_factors``) and the namespace's content prior and running mean, written online
after each query or feedback and replaced wholesale by a full refit (binary COPY).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import numpy as np
import psycopg
from sqlalchemy.ext.asyncio import AsyncSession

from service.completion import ContentPrior
from service.completion.statistics import RowStatistics
from service.db.codecs import (
    Float8Rows,
    array_literal,
    binary_copy,
    copy_in,
    real_array_literals,
    real_values,
)
from service.db.engine import driver_connection
from service.db.namespaces import namespace_state
from service.db.scales import ScaleUpdate, store_scales
from service.db.statements import execute, fetch_value


def content_sql(embedding: str, weights: str) -> str:
    """The content prior's e_m·w in SQL, e_m the unit embedding (<#> is the negated inner
    product); NULL while the namespace has no weights (before its first refit), and for an
    embedding of zero length, which has no unit vector (ingest refuses them, but rows stored
    before it checked vectors as float32 may have one; dividing by its norm failed every
    search of the namespace)."""
    return f"-({embedding} <#> {weights}) / nullif(vector_norm({embedding}), 0)"


_FACTOR_ROWS = "memory_factors (memory_id, namespace, bias, factors, observation_count, statistics)"
_REPLACE_ON_CONFLICT = """ON CONFLICT (namespace, memory_id) DO UPDATE SET
        bias = EXCLUDED.bias, factors = EXCLUDED.factors,
        observation_count = EXCLUDED.observation_count, statistics = EXCLUDED.statistics"""


def _row_of(parameter: str) -> str:
    """Row ``i`` of the :class:`Float8Rows` parameter named ``parameter`` (``%(width)s`` wide)."""
    return f"%({parameter})b[(i - 1) * %(width)s + 1 : i * %(width)s]"


_UPSERT_FACTORS_SQL = f"""
    INSERT INTO {_FACTOR_ROWS}
    SELECT m, %(namespace)s::text, b, f::real[], n, {_row_of("statistics")}
    FROM unnest(%(ids)s::bigint[], %(bias)s::float8[], %(factors)s::text[], %(counts)s::int[])
        WITH ORDINALITY AS t(m, b, f, n, i)
    {_REPLACE_ON_CONFLICT}
"""

#: The version of memory ``m``'s model row ``f`` (LEFT JOINed: '-' without one): every write of
#: the row makes a new row version with the writing transaction's id in ``xmin``, and an edit of
#: the memory's content stamps ``content_changed_at``. Equal versions: nothing changed between
#: two reads.
ROW_VERSION_SQL = (
    "coalesce(f.xmin::text, '-') || '/' || coalesce(m.content_changed_at::text, '-')"
)

# The online update of rows read before the namespace lock was taken (OnlineUpdate): a row still
# at the version it was read at gets its re-solved values; one that changed since (another query
# observed the memory, feedback rewrote it) gets this query's terms added to the statistics it
# holds now (sufficient statistics add up), and keeps its factors until its next update; one
# without statistics now is left to be rebuilt from its history, as the next query observing it
# does. After a refit since the query searched, the update was computed against the old model
# (content prior, the queries' parameters): every row keeps the refit's factors and drops its
# statistics, to be rebuilt. Memories deleted meanwhile are skipped (the lock orders deletes
# before).
_UPDATE_READ_ROWS_SQL = f"""
    WITH same_model AS (
        SELECT last_refit_at IS NOT DISTINCT FROM %(refitted_at)s::timestamptz AS same
        FROM namespaces WHERE name = %(namespace)s
    ), t AS (
        SELECT t.*, {_row_of("statistics")} AS p, {_row_of("added")} AS added
        FROM unnest(%(ids)s::bigint[], %(bias)s::float8[], %(factors)s::text[],
                    %(counts)s::int[], %(added_counts)s::int[], %(versions)s::text[])
            WITH ORDINALITY AS t(id, b, fs, n, added_n, version, i)
    ), read AS (
        SELECT t.*, same_model.same, same_model.same AND {ROW_VERSION_SQL} = t.version AS unchanged
        FROM t JOIN memories m ON m.namespace = %(namespace)s AND m.id = t.id
        LEFT JOIN memory_factors f ON f.namespace = %(namespace)s AND f.memory_id = t.id
        CROSS JOIN same_model
    ), moved AS (
        UPDATE memory_factors f SET
            statistics = CASE WHEN r.same THEN (
                SELECT array_agg(held + more ORDER BY k)
                FROM unnest(f.statistics, r.added) WITH ORDINALITY AS x(held, more, k)
            ) END,
            observation_count = f.observation_count + r.added_n
        FROM read r
        WHERE f.namespace = %(namespace)s AND f.memory_id = r.id AND NOT r.unchanged
          AND (NOT r.same OR cardinality(f.statistics) = cardinality(r.added))
    )
    INSERT INTO {_FACTOR_ROWS}
    SELECT id, %(namespace)s::text, b, fs::real[], n, p FROM read WHERE unchanged
    {_REPLACE_ON_CONFLICT}
"""


@dataclass(frozen=True)
class MemoryRowUpdate:
    """Re-solved memory rows (ids ascending) with their packed sufficient statistics."""

    memory_ids: np.ndarray
    bias: np.ndarray
    factors: np.ndarray
    observation_count: np.ndarray
    statistics: np.ndarray  # packed, one row per memory


@dataclass(frozen=True)
class OnlineUpdate(MemoryRowUpdate):
    """A query's update of the rows it observed, computed from rows read before its record
    took the namespace lock: their versions then (``ROW_VERSION_SQL``), what this query's cells
    add to each (``added``, packed, and ``added_counts``), for a row that changed since, and
    the namespace's last refit when the query searched (``refitted_at``: the model the update
    was computed against)."""

    versions: Sequence[str]
    added: np.ndarray
    added_counts: np.ndarray
    refitted_at: datetime | None


def online_update_statement(namespace: str, update: OnlineUpdate) -> tuple[str, dict[str, Any]]:
    """The statement (and its parameters) that writes ``update`` under the namespace lock, for
    the caller's pipeline."""
    return _UPDATE_READ_ROWS_SQL, {
        **_row_parameters(namespace, update),
        "added": Float8Rows.of(update.added),
        "added_counts": array_literal(update.added_counts),
        "versions": list(update.versions),
        "refitted_at": update.refitted_at,
    }


def _row_parameters(namespace: str, update: MemoryRowUpdate) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "ids": array_literal(update.memory_ids),
        "bias": array_literal(update.bias),
        "factors": real_array_literals(update.factors),
        "counts": array_literal(update.observation_count),
        "statistics": Float8Rows.of(update.statistics),
        "width": update.statistics.shape[1],
    }


async def upsert_memory_factors(
    session: AsyncSession, namespace: str, update: MemoryRowUpdate
) -> None:
    """Write re-solved memory rows read under the namespace lock (a full refit writes with
    :func:`replace_model`; a query's update goes through :func:`online_update_statement`)."""
    if len(update.memory_ids):
        conn = await driver_connection(session)
        await conn.execute(_UPSERT_FACTORS_SQL, _row_parameters(namespace, update))


_QUERY_ROWS = "query_factors (namespace, query_id, bias, slope, factors)"
_REPLACE_QUERY_ROW = """ON CONFLICT (namespace, query_id) DO UPDATE SET
        bias = EXCLUDED.bias, slope = EXCLUDED.slope, factors = EXCLUDED.factors"""

_UPDATE_QUERY_FACTORS_SQL = f"""
    INSERT INTO {_QUERY_ROWS}
    SELECT %(namespace)s::text, t.id, t.b, t.s, t.f::real[]
    FROM unnest(%(ids)s::bigint[], %(bias)s::float8[], %(slope)s::float8[],
                %(factors)s::text[]) AS t(id, b, s, f)
    {_REPLACE_QUERY_ROW}
"""


async def update_query_factors(
    session: AsyncSession,
    namespace: str,
    query_ids: np.ndarray,
    bias: np.ndarray,
    slope: np.ndarray,
    factors: np.ndarray,
) -> None:
    if len(query_ids) == 0:
        return
    await execute(
        session,
        _UPDATE_QUERY_FACTORS_SQL,
        {
            "namespace": namespace,
            "ids": [int(q) for q in query_ids],
            "bias": [float(b) for b in bias],
            "slope": [float(s) for s in slope],
            "factors": real_array_literals(factors),
        },
    )


async def refit_horizon(session: AsyncSession, namespace: str) -> datetime:
    """The time a refit's read of the observations starts from: taken under the namespace's
    lock, so every edit that retired observations before it has committed (the read sees its
    retirement) and every later one is stamped later (``memories.content_changed_at``).
    Read in a statement of its own after the lock's, as every stamp is: on Citus such a
    statement runs on the coordinator, so stamps and horizons read one clock.
    The caller commits before reading."""
    await namespace_state(session, namespace, for_update=True)
    return cast(datetime, await fetch_value(session, "SELECT clock_timestamp()"))


_DELETED_OR_EDITED_SQL = """
    SELECT t.id FROM unnest(%(ids)s::bigint[]) AS t(id)
    WHERE NOT EXISTS (SELECT FROM memories m WHERE m.namespace = %(namespace)s AND m.id = t.id
                      AND (m.content_changed_at IS NULL OR m.content_changed_at < %(read_from)s))
"""


async def _deleted_or_edited(
    conn: psycopg.AsyncConnection[Any],
    namespace: str,
    memory_ids: np.ndarray,
    read_from: datetime,
) -> np.ndarray:
    """The ``memory_ids`` deleted or edited since ``read_from`` (their observations were
    deleted or retired since). Run under the namespace's lock, which deletes and edits take
    too: none is under way, and this statement sees every one committed. One probe of the
    primary key per memory."""
    cursor = await conn.execute(
        _DELETED_OR_EDITED_SQL,
        {"namespace": namespace, "ids": array_literal(memory_ids), "read_from": read_from},
    )
    return np.array([row[0] for row in await cursor.fetchall()], dtype=np.int64)


@dataclass(frozen=True)
class RefitRead:
    """What a refit read (``experience.namespace_observations``), as its write needs it: the
    horizon it read from (:func:`refit_horizon`), and its cells in key order (query, memory)
    with the scores it fitted (those of a rescaled source under its new scale, as the write
    stores them)."""

    horizon: datetime
    query_ids: np.ndarray
    memory_ids: np.ndarray
    scores: np.ndarray

    def keys(self) -> _ReadKeys:
        """The cells' keys and their sum, computed before the lock (a million cells take
        a tenth of a second)."""
        queries, query_rank = np.unique(self.query_ids, return_inverse=True)
        memories, memory_rank = np.unique(self.memory_ids, return_inverse=True)
        # Ascending, as the cells are in key order.
        cells = query_rank.astype(np.int64) * len(memories) + memory_rank
        return _ReadKeys(queries, memories, cells, key_order_sum(self.scores))


@dataclass(frozen=True)
class _ReadKeys:
    queries: np.ndarray  # the distinct query ids read, ascending
    memories: np.ndarray  # the distinct memory ids read, ascending
    cells: np.ndarray  # each cell as query rank * len(memories) + memory rank, ascending
    score_sum: float

    def contains(self, query_ids: np.ndarray, memory_ids: np.ndarray) -> np.ndarray:
        """A mask of the cells (query, memory) that were read."""
        if not len(self.cells):
            return np.zeros(len(query_ids), dtype=bool)
        q = np.minimum(np.searchsorted(self.queries, query_ids), len(self.queries) - 1)
        m = np.minimum(np.searchsorted(self.memories, memory_ids), len(self.memories) - 1)
        cell = q.astype(np.int64) * len(self.memories) + m
        at = np.minimum(np.searchsorted(self.cells, cell), len(self.cells) - 1)
        found: np.ndarray = (
            (self.queries[q] == query_ids) & (self.memories[m] == memory_ids)
            & (self.cells[at] == cell)
        )
        return found


def key_order_sum(scores: np.ndarray) -> float:
    """The scores added one after the other in double precision, in the order given: what
    Postgres's ``sum(float8 ORDER BY …)`` computes, to the last bit."""
    return float(np.add.accumulate(scores)[-1]) if len(scores) else 0.0


@dataclass(frozen=True)
class RefittedModel:
    """A namespace's model from a full refit, as :func:`replace_model` writes it: one entry per
    observed memory (ids ascending) and one per observed query (ids ascending)."""

    memory_ids: np.ndarray
    memory_bias: np.ndarray
    memory_factors: np.ndarray
    observation_count: np.ndarray  # observations per memory
    statistics: np.ndarray  # packed sufficient statistics per memory, given the refit's queries
    query_ids: np.ndarray
    query_bias: np.ndarray
    query_slope: np.ndarray
    query_factors: np.ndarray
    prior: ContentPrior
    factor_reg: float | None  # the factors' weight the refit chose (None: unbalanced)


async def replace_model(
    session: AsyncSession,
    namespace: str,
    model: RefittedModel,
    refitted_at: datetime,
    read: RefitRead,
    rescaled: ScaleUpdate | None = None,
) -> None:
    """Write a full refit: every memory row and query row of the namespace, the score
    scales it ``rescaled`` (with the stored scores of the sources they moved), and reset the
    counter. Rows travel by binary COPY (the memory side straight into ``memory_factors``,
    emptied for the namespace first; the query side through a temporary table). Memories
    deleted, edited or given feedback since the horizon of the ``read`` get no row.

    Under the namespace's lock, what changed since the read is read from the scores recorded
    since its horizon (an index scan: as many as the refit's duration let in), never from all
    the namespace's observations, so the lock's hold does not grow with them. The rows of
    memories observed since the read hold those observations too: their terms, read with the
    parameters and the content prior this write stores, are added to the refit's statistics,
    so every row written holds what a rebuild from its history would."""
    keys = await asyncio.to_thread(read.keys)
    conn = await driver_connection(session)
    if len(model.query_ids):
        await _stage_query_rows(conn, model)
    await namespace_state(session, namespace, for_update=True)  # the lock, from here
    if rescaled is not None:
        # First: the scores recorded since are read below as they are stored.
        await store_scales(conn, namespace, rescaled)
    since = await _since_horizon(conn, namespace, read.horizon, keys, model.query_ids)
    deleted_or_edited = await _deleted_or_edited(conn, namespace, model.memory_ids, read.horizon)
    changed = np.union1d(deleted_or_edited, since.memory_ids[since.feedback])
    # The query rows and the content prior first: the observations recorded since the read are
    # then read below with the parameters and the prior they have after this write.
    if len(model.query_ids):
        await _replace_query_rows(conn, namespace)
    score_sum, score_count = await _live_scores(conn, namespace, read, keys, since, changed)
    await _reset_after_refit(session, namespace, model, refitted_at, score_sum, score_count)
    added = await _added_since(conn, namespace, model, since, read.horizon, changed)
    await _replace_memory_rows(conn, namespace, model, changed, added)


async def _added_since(
    conn: psycopg.AsyncConnection[Any],
    namespace: str,
    model: RefittedModel,
    since: _SinceHorizon,
    horizon: datetime,
    changed: np.ndarray,
) -> _AddedSince:
    """What the observations recorded since the read (while the refit ran) add to the
    statistics and counts of the refit's rows: read as a rebuild from history reads them, with
    the queries' parameters and the content prior as this write stores them, so each row's
    statistics are its rebuild's. A query without parameters before the refit (observations
    loaded in bulk) has none after it either: a rebuild leaves its observations out, and so
    do the rows' statistics here, until a refit gives it some. Run even when nothing was
    recorded since (no pairs, nothing read), so every refit's write plans this statement."""
    # Imported here: memory_rows builds its statements from this module's.
    from service.db import memory_rows

    pairs = ~since.read & since.has_parameters & np.isin(since.memory_ids, model.memory_ids)
    pairs &= ~np.isin(since.memory_ids, changed)  # those get no row
    rank = np.asarray(model.memory_factors).shape[1]
    observations = await memory_rows.pair_observations(
        conn, namespace, since.query_ids[pairs], since.memory_ids[pairs], horizon, rank
    )
    memory_ids = np.unique(observations.memory_ids)
    return _AddedSince(memory_ids, observations.statistics(memory_ids))


@dataclass(frozen=True)
class _AddedSince:
    """The statistics of the observations recorded since a refit's read, per memory (ids
    ascending)."""

    memory_ids: np.ndarray
    statistics: RowStatistics


@dataclass(frozen=True)
class _SinceHorizon:
    """The live scores recorded since a refit's horizon (key order), each with whether the
    refit read it, whether it is feedback, and whether its query has parameters after the
    refit."""

    query_ids: np.ndarray
    memory_ids: np.ndarray
    scores: np.ndarray
    read: np.ndarray
    feedback: np.ndarray
    has_parameters: np.ndarray


# Record, late scores and feedback stamp their scores with clock_timestamp() after the lock,
# so a score stamped before the horizon was committed before the refit's read began. The
# subquery names the namespace by the parameter: Citus runs a subquery correlated on the
# namespace on every shard.
_SINCE_HORIZON_SQL = """
    SELECT s.query_id, s.memory_id, s.score::text::float8, s.source = 'feedback',
           EXISTS (SELECT FROM query_factors q
                   WHERE q.namespace = %(namespace)s AND q.query_id = s.query_id)
    FROM scores s
    WHERE s.namespace = %(namespace)s AND s.created_at >= %(since)s AND s.retired_at IS NULL
    ORDER BY s.query_id, s.memory_id
"""


async def _since_horizon(
    conn: psycopg.AsyncConnection[Any],
    namespace: str,
    horizon: datetime,
    keys: _ReadKeys,
    refit_queries: np.ndarray,
) -> _SinceHorizon:
    cursor = await conn.execute(_SINCE_HORIZON_SQL, {"namespace": namespace, "since": horizon})
    rows = await cursor.fetchall()
    query_ids = np.array([r[0] for r in rows], dtype=np.int64)
    memory_ids = np.array([r[1] for r in rows], dtype=np.int64)
    return _SinceHorizon(
        query_ids=query_ids,
        memory_ids=memory_ids,
        scores=np.array([r[2] for r in rows], dtype=np.float64),
        read=keys.contains(query_ids, memory_ids),
        feedback=np.array([r[3] for r in rows], dtype=bool),
        has_parameters=np.array([r[4] for r in rows], dtype=bool)
        | np.isin(query_ids, refit_queries),
    )


_CHANGED_LIVE_SQL = """
    SELECT coalesce(sum(score::text::float8 ORDER BY query_id, memory_id), 0), count(*)
    FROM scores WHERE namespace = %(namespace)s AND memory_id = ANY(%(ids)s::bigint[])
      AND retired_at IS NULL
"""


async def _live_scores(
    conn: psycopg.AsyncConnection[Any],
    namespace: str,
    read: RefitRead,
    keys: _ReadKeys,
    since: _SinceHorizon,
    changed: np.ndarray,
) -> tuple[float, int]:
    """The sum and count of the namespace's live scores now, for its running mean (which this
    heals of the drift deleted memories leave): the read's, plus the scores recorded since
    it, with the memories whose scores changed otherwise (deleted, edited, given feedback)
    counted as they are now. With nothing recorded since the read (a sequential replay), the
    sum is the read's in key order, to the last bit, as a sum of every live score in key order
    gives; otherwise the same up to the order of the additions."""
    added = ~since.read & ~np.isin(since.memory_ids, changed)
    if not len(changed) and not added.any():
        return keys.score_sum, len(read.scores)
    kept = ~np.isin(read.memory_ids, changed)
    score_sum = key_order_sum(read.scores[kept]) + key_order_sum(since.scores[added])
    score_count = int(kept.sum() + added.sum())
    if len(changed):
        cursor = await conn.execute(
            _CHANGED_LIVE_SQL, {"namespace": namespace, "ids": array_literal(changed)}
        )
        changed_sum, changed_count = await cursor.fetchone() or (0.0, 0)
        score_sum += float(changed_sum)
        score_count += int(changed_count)
    return score_sum, score_count


_EMPTY_NAMESPACE_ROWS_SQL = "DELETE FROM memory_factors WHERE namespace = %(namespace)s"
_COPY_MEMORY_ROWS = f"COPY {_FACTOR_ROWS} FROM STDIN (FORMAT BINARY)"


async def _replace_memory_rows(
    conn: psycopg.AsyncConnection[Any],
    namespace: str,
    model: RefittedModel,
    changed: np.ndarray,
    added: _AddedSince,
) -> None:
    """Every row of the namespace replaced by the refit's, but for the ``changed`` memories'
    (their rows would be fitted on observations deleted, retired or replaced since); with what
    the observations recorded since the read ``added`` to the statistics and counts."""
    await conn.execute(_EMPTY_NAMESPACE_ROWS_SQL, {"namespace": namespace})
    rows = np.isin(model.memory_ids, changed, invert=True)
    if not rows.any():
        return
    statistics = np.array(model.statistics, dtype=np.float64)
    counts = np.array(model.observation_count, dtype=np.int64)
    if len(added.memory_ids):
        at = np.searchsorted(model.memory_ids, added.memory_ids)  # all among the refit's
        statistics[at] += added.statistics.packed()
        counts[at] += added.statistics.counts
    columns = [
        ("int8", model.memory_ids[rows]), ("text", namespace),
        ("float8", model.memory_bias[rows]),
        ("real[]", np.asarray(model.memory_factors)[rows]),
        ("int4", counts[rows]),
        ("float8[]", statistics[rows]),
    ]
    await copy_in(conn, _COPY_MEMORY_ROWS, binary_copy(columns, int(rows.sum())))


# The query side of a refit goes through a temporary table, filled before the lock (a table of
# the refit's session alone: nothing waits for it), then an UPDATE of the rows there are and an
# INSERT of the others under it (an upsert checks each row on its own, several times slower);
# the queries the refit did not read keep theirs.
_CREATE_REFIT_QUERIES_SQL = (
    "CREATE TEMPORARY TABLE earm_refit_queries "
    "(id bigint PRIMARY KEY, bias float8, slope float8, factors real[]) ON COMMIT DROP"
)
_COPY_REFIT_QUERIES = (
    "COPY earm_refit_queries (id, bias, slope, factors) FROM STDIN (FORMAT BINARY)"
)
# The temporary table is read in a CTE, never joined to query_factors directly: Citus
# cannot join a distributed table with a local one in one modification, but it runs the CTE
# first and sends its rows with the statement to the namespace's shard.
_UPDATE_FROM_REFIT_QUERIES_SQL = """
    WITH t AS MATERIALIZED (SELECT * FROM earm_refit_queries)
    UPDATE query_factors f SET bias = t.bias, slope = t.slope, factors = t.factors
    FROM t WHERE f.namespace = %(namespace)s AND f.query_id = t.id
"""
_INSERT_FROM_REFIT_QUERIES_SQL = f"""
    WITH present AS MATERIALIZED (
        SELECT query_id FROM query_factors WHERE namespace = %(namespace)s
    )
    INSERT INTO {_QUERY_ROWS}
    SELECT %(namespace)s::text, id, bias, slope, factors FROM earm_refit_queries t
    WHERE NOT EXISTS (SELECT FROM present p WHERE p.query_id = t.id)
"""


async def _stage_query_rows(conn: psycopg.AsyncConnection[Any], model: RefittedModel) -> None:
    await conn.execute(_CREATE_REFIT_QUERIES_SQL)
    await copy_in(
        conn,
        _COPY_REFIT_QUERIES,
        binary_copy(
            [("int8", model.query_ids), ("float8", model.query_bias),
             ("float8", model.query_slope), ("real[]", np.asarray(model.query_factors))],
            len(model.query_ids),
        ),
    )
    await conn.execute("ANALYZE earm_refit_queries")  # for the joins' plans


async def _replace_query_rows(conn: psycopg.AsyncConnection[Any], namespace: str) -> None:
    await conn.execute(_UPDATE_FROM_REFIT_QUERIES_SQL, {"namespace": namespace})
    await conn.execute(_INSERT_FROM_REFIT_QUERIES_SQL, {"namespace": namespace})


# The running mean is set from the live scores (``_live_scores``): it heals drift from deleted
# memories and counts observations recorded while the fit ran.
_RESET_AFTER_REFIT_SQL = """
    UPDATE namespaces SET queries_since_refit = 0, last_refit_at = %(at)s,
        content_slope = %(content_slope)s,
        content_weights = %(content_weights)s::vector, factor_reg = %(factor_reg)s,
        score_sum = %(score_sum)s, score_count = %(score_count)s
    WHERE name = %(namespace)s
"""


async def _reset_after_refit(
    session: AsyncSession,
    namespace: str,
    model: RefittedModel,
    refitted_at: datetime,
    score_sum: float,
    score_count: int,
) -> None:
    """The namespace row after a refit: its content prior and factor weight, the refit counter
    reset, and the running mean recomputed."""
    prior = model.prior
    await execute(
        session,
        _RESET_AFTER_REFIT_SQL,
        {
            "namespace": namespace,
            "at": refitted_at,
            "factor_reg": model.factor_reg,
            "score_sum": score_sum,
            "score_count": score_count,
            "content_slope": prior.slope if len(prior.weights) else None,
            "content_weights": (
                # float32 values (what the vector stores), as every value bound for it is
                "[" + ",".join(map(repr, real_values(prior.weights).tolist())) + "]"
                if len(prior.weights)
                else None
            ),
        },
    )
