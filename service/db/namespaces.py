"""The ``namespaces`` rows: their counters (the completion model's running mean and the query
index), their creation and erasure, the writers' row lock and the refit's advisory lock."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.api.namespaces import ErasedNamespace
from service.completion.scale import IDENTITY, ScoreScale
from service.db.engine import driver_connection
from service.db.scales import scales_from_json
from service.db.statements import execute, fetch_all, fetch_one, fetch_value
from service.errors import NotFound


@dataclass(frozen=True)
class NamespaceState:
    next_query_index: int
    mean_score: float  # μ of the completion model
    score_count: int
    queries_since_refit: int
    content_slope: float  # γ of the content prior (0 before the first refit)
    # When the namespace's model was last refitted (None before its first refit): what the
    # content prior and every query's parameters are as of.
    refitted_at: datetime | None
    # The weight of the completion's factors the last refit chose (None: weighted as the
    # memory bias, which shrinks them to nothing; service.completion.strength)
    factor_reg: float | None = None
    # Each scorer source's map to the common score scale (service.completion.scale); a source
    # without one is taken as it is.
    score_scales: Mapping[str, ScoreScale] = field(default_factory=dict)

    def scale_of(self, source: str) -> ScoreScale:
        return self.score_scales.get(source, IDENTITY)


#: The namespace's counters, in the order :func:`state_from_row` reads them (pipelined by the
#: search, and by the record with a lock).
STATE_SQL = (
    "SELECT next_query_index, score_sum, score_count, queries_since_refit, "
    "coalesce(content_slope, 0), last_refit_at, factor_reg, score_scales FROM namespaces "
    "WHERE name = %(namespace)s"
)


async def namespace_state(
    session: AsyncSession, namespace: str, for_update: bool = False
) -> NamespaceState:
    """The namespace's counters; ``for_update`` locks its row first, which every writer of
    model state does, so writers of one namespace queue instead of deadlocking. The lock is
    FOR NO KEY UPDATE (what the record's UPDATE of the counters takes): it queues those writers
    but not an ingest, whose new memories only check that the namespace exists (FOR KEY
    SHARE), so a refit writing its model does not hold up ingests."""
    row = await fetch_one(
        session, STATE_SQL + (" FOR NO KEY UPDATE" if for_update else ""), {"namespace": namespace}
    )
    return state_from_row(row, namespace)


def state_from_row(row: Sequence[Any] | None, namespace: str) -> NamespaceState:
    if row is None:
        raise NotFound(f"namespace {namespace!r} has no memories")
    (next_index, score_sum, score_count, since_refit, content_slope, refitted_at, factor_reg,
     score_scales) = row
    mean = float(score_sum) / score_count if score_count else 0.0
    return NamespaceState(
        int(next_index), mean, int(score_count), int(since_refit), float(content_slope),
        refitted_at, None if factor_reg is None else float(factor_reg),
        scales_from_json(score_scales),
    )


_ENSURE_SQL = "INSERT INTO namespaces (name) VALUES (%(namespace)s) ON CONFLICT DO NOTHING"
_HOLD_SQL = "SELECT name FROM namespaces WHERE name = %(namespace)s FOR KEY SHARE"


async def hold_namespace(session: AsyncSession, namespace: str) -> None:
    """Create the namespace if it does not exist, and hold its row until the transaction ends.

    FOR KEY SHARE, what a memory's foreign key takes anyway: it queues an erase (FOR UPDATE)
    behind this transaction, but neither other ingests nor the model-state writers. An erase
    that commits between the two statements deleted the row this one saw (the lock then finds
    none), so the namespace is created again; an erase under way when the INSERT runs makes it
    wait, then insert."""
    parameters = {"namespace": namespace}
    while True:
        await execute(session, _ENSURE_SQL, parameters)
        if await fetch_value(session, _HOLD_SQL, parameters) is not None:
            return


# Transaction-level: a pooler in transaction mode hands each transaction to any server
# connection, where a session-level lock would stay behind when the transaction ends. The
# refit's transaction is idle while the fit runs, which the server must not take for an
# abandoned one: its idle timeout is lifted for this transaction only.
_TRY_LOCK_REFIT_SQL = (
    "SELECT pg_try_advisory_xact_lock(hashtextextended(%(key)s, 0)), "
    "set_config('idle_in_transaction_session_timeout', '0', true)"
)


async def try_lock_namespace_refit(session: AsyncSession, namespace: str) -> bool:
    """Only one process refits a namespace at a time; the others skip. Held until the
    session's transaction ends (commit or rollback): the refit reads, fits and writes in it."""
    locked = await fetch_value(session, _TRY_LOCK_REFIT_SQL, {"key": _refit_lock_key(namespace)})
    return bool(locked)


def _refit_lock_key(namespace: str) -> str:
    return f"earm-refit:{namespace}"


_LOCK_FOR_ERASE_SQL = "SELECT name FROM namespaces WHERE name = %(namespace)s FOR UPDATE"
# Children first, each with its count; the FK cascades would delete them too, without counts.
_ERASE_OBSERVATIONS_SQL = """
    WITH h AS (DELETE FROM score_history WHERE namespace = %(namespace)s RETURNING 1),
         s AS (DELETE FROM scores WHERE namespace = %(namespace)s RETURNING 1),
         f AS (DELETE FROM memory_factors WHERE namespace = %(namespace)s RETURNING 1),
         q AS (DELETE FROM query_factors WHERE namespace = %(namespace)s)
    SELECT (SELECT count(*) FROM h), (SELECT count(*) FROM s), (SELECT count(*) FROM f)
"""
# With their locator rows (memories.delete_memories says why not by the foreign key alone).
_ERASE_QUERIES_SQL = """
    WITH erased AS (DELETE FROM queries WHERE namespace = %(namespace)s RETURNING id),
         unlocated AS (DELETE FROM query_locator WHERE id IN (SELECT id FROM erased))
    SELECT count(*) FROM erased
"""
_ERASE_MEMORIES_SQL = """
    WITH erased AS (DELETE FROM memories WHERE namespace = %(namespace)s RETURNING id),
         unlocated AS (DELETE FROM memory_locator WHERE id IN (SELECT id FROM erased))
    SELECT count(*) FROM erased
"""
_ERASE_ROW_SQL = "DELETE FROM namespaces WHERE name = %(namespace)s"


async def erase_namespace(session: AsyncSession, namespace: str) -> ErasedNamespace:
    """Delete everything of a namespace in the caller's transaction: its memories, queries,
    observations, score history, model rows and its row (counters, content prior).

    The row is locked FOR UPDATE first, the strongest row lock: it waits for every writer
    of the namespace (the model-state writers' FOR NO KEY UPDATE, and the FOR KEY SHARE of an
    ingest's memories, so a batch committing meanwhile is erased too), and later ones wait
    for the erase. An ingest that waited then finds no namespace and creates it afresh.
    NotFound for a namespace that does not exist."""
    parameters = {"namespace": namespace}
    if await fetch_value(session, _LOCK_FOR_ERASE_SQL, parameters) is None:
        raise NotFound(f"namespace {namespace!r} does not exist")
    conn = await driver_connection(session)
    async with conn.pipeline():  # four statements of one short parameter
        counted = await conn.execute(_ERASE_OBSERVATIONS_SQL, parameters)
        queries = await conn.execute(_ERASE_QUERIES_SQL, parameters)
        memories = await conn.execute(_ERASE_MEMORIES_SQL, parameters)
        await conn.execute(_ERASE_ROW_SQL, parameters)
    row, erased_queries, erased_memories = [
        await cursor.fetchone() for cursor in (counted, queries, memories)
    ]
    assert row and erased_queries and erased_memories, "an aggregate returns one row"
    history, observations, model_rows = row
    return ErasedNamespace(
        namespace=namespace,
        memories=int(erased_memories[0]),
        queries=int(erased_queries[0]),
        observations=int(observations),
        score_history=int(history),
        model_rows=int(model_rows),
    )


_DUE_FOR_REFIT_SQL = (
    "SELECT name FROM namespaces WHERE queries_since_refit > 0 AND queries_since_refit "
    ">= greatest(least(%(every)s, greatest(1, next_query_index / 2)), "
    "%(growth)s * (next_query_index - queries_since_refit)) "
    "ORDER BY queries_since_refit DESC, name"
)


async def namespaces_due_for_refit(
    session: AsyncSession, refit_every: int, refit_growth: float
) -> list[str]:
    """Namespaces whose recorded queries make a full refit due, by the rule of
    :func:`service.retrieve.learning.refit_due` (its SQL form, with next_query_index the
    queries recorded), most overdue first: what `earm worker` refits."""
    params = {"every": refit_every, "growth": refit_growth}
    rows = await fetch_all(session, _DUE_FOR_REFIT_SQL, params)
    return [str(row[0]) for row in rows]
