"""The completion model's state: per-memory rows (``memory_factors``), per-query parameters
(columns of ``queries``) and the namespace's content prior and running mean, written online
after each query or feedback and replaced wholesale by a full refit (binary COPY).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import numpy as np
import psycopg
from sqlalchemy.ext.asyncio import AsyncSession

from service.completion import ContentPrior
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
from service.errors import NotFound


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


_UPDATE_QUERY_FACTORS_SQL = """
    UPDATE queries q SET bias = t.b, slope = t.s, factors = t.f::real[]
    FROM unnest(%(ids)s::bigint[], %(bias)s::float8[], %(slope)s::float8[],
                %(factors)s::text[]) AS t(id, b, s, f)
    WHERE q.namespace = %(namespace)s AND q.id = t.id
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


_REFIT_HORIZON_SQL = (
    "SELECT clock_timestamp() FROM namespaces WHERE name = %(namespace)s FOR NO KEY UPDATE"
)


async def refit_horizon(session: AsyncSession, namespace: str) -> datetime:
    """The time a refit's read of the observations starts from: taken under the namespace's
    lock, so every edit that retired observations before it has committed (the read sees its
    retirement) and every later one is stamped later (``memories.content_changed_at``).
    The caller commits before reading."""
    horizon = await fetch_value(session, _REFIT_HORIZON_SQL, {"namespace": namespace})
    if horizon is None:
        raise NotFound(f"namespace {namespace!r} does not exist")
    return cast(datetime, horizon)


_CHANGED_SINCE_SQL = """
    SELECT t.id FROM unnest(%(ids)s::bigint[]) AS t(id)
    WHERE NOT EXISTS (SELECT FROM memories m WHERE m.namespace = %(namespace)s AND m.id = t.id
                      AND (m.content_changed_at IS NULL OR m.content_changed_at < %(read_from)s))
       OR EXISTS (SELECT FROM scores s WHERE s.namespace = %(namespace)s AND s.memory_id = t.id
                  AND s.source = 'feedback' AND s.created_at >= %(read_from)s)
"""


async def _still_current(
    conn: psycopg.AsyncConnection[Any],
    namespace: str,
    memory_ids: np.ndarray,
    read_from: datetime,
) -> np.ndarray:
    """A mask of the ``memory_ids`` neither deleted, edited nor given feedback since
    ``read_from`` (their rows would be fitted on observations deleted, retired or replaced
    since). Run under the namespace's lock, which deletes, edits and feedback take too: none is
    under way, and this statement sees every one committed."""
    cursor = await conn.execute(
        _CHANGED_SINCE_SQL,
        {"namespace": namespace, "ids": [int(m) for m in memory_ids], "read_from": read_from},
    )
    changed = [row[0] for row in await cursor.fetchall()]
    return np.isin(memory_ids, changed, invert=True)


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
    read_from: datetime,
    rescaled: ScaleUpdate | None = None,
) -> None:
    """Write a full refit: every memory row and query column of the namespace, the score
    scales it ``rescaled`` (with the stored scores of the sources they moved), and reset the
    counter. Rows travel by binary COPY (the memory side straight into ``memory_factors``,
    emptied for the namespace first; the query side through a temporary table). Memories
    deleted or edited since the observations were read (from ``read_from``,
    :func:`refit_horizon`) get no row."""
    await namespace_state(session, namespace, for_update=True)
    conn = await driver_connection(session)
    if rescaled is not None:
        # First: the running mean below is recomputed from the scores as they are stored.
        await store_scales(conn, namespace, rescaled)
    await _replace_memory_rows(conn, namespace, model, read_from)
    if len(model.query_ids):
        await _update_query_columns(conn, namespace, model)
    # Once the queries have the parameters the statistics were built with: a query without
    # any before (observations loaded in bulk) counts only from now on.
    await conn.execute(_INVALIDATE_STALE_STATISTICS_SQL, {"namespace": namespace})
    await _reset_after_refit(session, namespace, model, refitted_at)


_EMPTY_NAMESPACE_ROWS_SQL = "DELETE FROM memory_factors WHERE namespace = %(namespace)s"
_COPY_MEMORY_ROWS = f"COPY {_FACTOR_ROWS} FROM STDIN (FORMAT BINARY)"


async def _replace_memory_rows(
    conn: psycopg.AsyncConnection[Any], namespace: str, model: RefittedModel, read_from: datetime
) -> None:
    existing = await _still_current(conn, namespace, model.memory_ids, read_from)
    memory_ids, memory_bias, memory_factors, observation_count, statistics = (
        np.asarray(values)[existing]
        for values in (
            model.memory_ids, model.memory_bias, model.memory_factors, model.observation_count,
            model.statistics,
        )
    )
    await conn.execute(_EMPTY_NAMESPACE_ROWS_SQL, {"namespace": namespace})
    if len(memory_ids):
        await copy_in(
            conn,
            _COPY_MEMORY_ROWS,
            binary_copy(
                [("int8", memory_ids), ("text", namespace), ("float8", memory_bias),
                 ("real[]", np.asarray(memory_factors)), ("int4", observation_count),
                 ("float8[]", np.asarray(statistics))],
                len(memory_ids),
            ),
        )


# Observations recorded while the refit ran are not in its statistics: the rows whose count
# differs from their live observations' (or that lost their row) are left without statistics,
# and the next retrieve observing them rebuilds them from their history. Under the namespace
# lock, so no observation is being added meanwhile.
_INVALIDATE_STALE_STATISTICS_SQL = """
    UPDATE memory_factors f SET statistics = NULL
    FROM (
        SELECT s.memory_id, count(*) AS n
        FROM scores s JOIN queries q ON q.namespace = s.namespace AND q.id = s.query_id
        WHERE s.namespace = %(namespace)s AND s.retired_at IS NULL AND q.bias IS NOT NULL
        GROUP BY s.memory_id
    ) live
    WHERE f.namespace = %(namespace)s AND f.memory_id = live.memory_id
      AND f.observation_count <> live.n
"""


# The query side of a refit goes through a temporary table: COPY in, then one UPDATE.
_CREATE_REFIT_QUERIES_SQL = (
    "CREATE TEMPORARY TABLE earm_refit_queries "
    "(id bigint, bias float8, slope float8, factors real[]) ON COMMIT DROP"
)
_COPY_REFIT_QUERIES = (
    "COPY earm_refit_queries (id, bias, slope, factors) FROM STDIN (FORMAT BINARY)"
)
_UPDATE_FROM_REFIT_QUERIES_SQL = (
    "UPDATE queries q SET bias = t.bias, slope = t.slope, factors = t.factors "
    "FROM earm_refit_queries t WHERE q.namespace = %(namespace)s AND q.id = t.id"
)
_DROP_REFIT_QUERIES_SQL = "DROP TABLE earm_refit_queries"


async def _update_query_columns(
    conn: psycopg.AsyncConnection[Any], namespace: str, model: RefittedModel
) -> None:
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
    await conn.execute(_UPDATE_FROM_REFIT_QUERIES_SQL, {"namespace": namespace})
    await conn.execute(_DROP_REFIT_QUERIES_SQL)


# The running mean is recomputed from the data under the namespace lock: it heals drift from
# deleted memories and counts observations recorded while the fit ran. The sum is of the numbers
# the fit reads (see experience.namespace_observations), in double precision and in the same key
# order: sum() of `real` adds in float32, and any sum's rounding depends on the order it adds
# in, so a replay of the same requests could otherwise get another mean.
_RESET_AFTER_REFIT_SQL = """
    UPDATE namespaces SET queries_since_refit = 0, last_refit_at = %(at)s,
        content_slope = %(content_slope)s,
        content_weights = %(content_weights)s::vector, factor_reg = %(factor_reg)s,
        score_sum = live.score_sum, score_count = live.score_count
    FROM (SELECT coalesce(sum(score::text::float8 ORDER BY query_id, memory_id), 0)
                 AS score_sum, count(*) AS score_count
          FROM scores WHERE namespace = %(namespace)s AND retired_at IS NULL) AS live
    WHERE name = %(namespace)s
"""


async def _reset_after_refit(
    session: AsyncSession, namespace: str, model: RefittedModel, refitted_at: datetime
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
            "content_slope": prior.slope if len(prior.weights) else None,
            "content_weights": (
                # float32 values (what the vector stores), as every value bound for it is
                "[" + ",".join(map(repr, real_values(prior.weights).tolist())) + "]"
                if len(prior.weights)
                else None
            ),
        },
    )
