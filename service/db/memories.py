"""The ``memories`` rows: idempotent batch insert, lookup, keyset pages, deletion, and the
background indexer's batches. No validation here: callers pass checked values."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np
from psycopg.types.json import Jsonb
from sqlalchemy import delete, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.codecs import metadata_json
from service.db.engine import affected_rows, driver_connection
from service.db.models import Memory


async def ids_by_external_id(
    session: AsyncSession, namespace: str, external_ids: Sequence[str]
) -> dict[str, int]:
    """The ids of the namespace's memories with these external ids (those that exist)."""
    rows = await session.execute(
        select(Memory.external_id, Memory.id).where(
            Memory.namespace == namespace, Memory.external_id.in_(external_ids)
        )
    )
    # `is not None` never drops a row (IN matches no NULL); it tells mypy the keys are str.
    return {external_id: memory_id for external_id, memory_id in rows if external_id is not None}


# Raw SQL on the psycopg connection rather than an ORM insert: the vectors go in pgvector's
# binary format and the rows as a few arrays, with no per-value text formatting or parsing.
_INSERT_SQL = """
    INSERT INTO memories (namespace, external_id, text, embedding, embedding_model, occurred_at,
                          metadata)
    SELECT %(namespace)s::text, e, t, v, mdl, o, md
    FROM unnest(%(external_ids)s::text[], %(texts)s::text[], %(embeddings)b::vector[],
                %(models)s::text[], %(occurred_at)s::timestamptz[], %(metadata)s::jsonb[])
        WITH ORDINALITY AS u(e, t, v, mdl, o, md, ord)
    ORDER BY ord
    ON CONFLICT (namespace, external_id) DO NOTHING
    RETURNING id, external_id
"""


async def insert_memories(
    session: AsyncSession,
    namespace: str,
    external_ids: Sequence[str | None],
    texts: Sequence[str],
    vectors: Sequence[np.ndarray],
    model_ids: Sequence[str],
    occurred_at: Sequence[datetime | None],
    metadata: Sequence[dict[str, Any]],
) -> list[tuple[int, str | None]]:
    """One multi-row INSERT, identity values drawn in the given order; an external id that
    already exists is skipped. Returns the (id, external_id) of the rows inserted."""
    conn = await driver_connection(session)
    cursor = await conn.execute(
        _INSERT_SQL,
        {
            "namespace": namespace,
            "external_ids": list(external_ids),
            "texts": list(texts),
            "embeddings": [np.asarray(v, dtype=np.float32) for v in vectors],
            "models": list(model_ids),
            "occurred_at": list(occurred_at),
            "metadata": [Jsonb(m, dumps=metadata_json) for m in metadata],
        },
    )
    return [(int(mid), ext) for mid, ext in await cursor.fetchall()]


async def get_memory(session: AsyncSession, memory_id: int) -> Memory | None:
    return await session.get(Memory, memory_id)


async def memories_by_external_id(
    session: AsyncSession, namespace: str, external_ids: Sequence[str]
) -> list[Memory]:
    """The namespace's memories stored under these external ids (those that exist)."""
    statement = select(Memory).where(
        Memory.namespace == namespace, Memory.external_id.in_(external_ids)
    )
    return list((await session.scalars(statement)).all())


async def update_memory(
    session: AsyncSession, memory_id: int, values: dict[str, Any], *, content_changed: bool
) -> bool:
    """Set columns of a memory (``Memory`` attribute names); False when it does not exist.
    Run under the namespace's lock. ``content_changed`` (its text or vector) stamps
    ``content_changed_at``. A new embedding leaves the HNSW index (``indexed`` false) until
    the background indexer puts it back, as after an ingest: the search scans unindexed rows
    exactly meanwhile."""
    if "embedding" in values:
        values = values | {"indexed": False}
    if content_changed:
        # clock_timestamp(), not now(): the time of this statement, under the namespace's
        # lock, which a refit's horizon (model_state.refit_horizon) is ordered against.
        values = values | {"content_changed_at": func.clock_timestamp()}
    result = await session.execute(
        update(Memory)
        .where(Memory.id == memory_id)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return affected_rows(result) != 0


async def memories_after(
    session: AsyncSession,
    namespace: str,
    after_id: int | None,
    limit: int,
    external_id: str | None = None,
) -> list[Memory]:
    """Up to ``limit`` memories of the namespace by id, after ``after_id`` when given; with
    ``external_id``, only the one stored under it (the unique index answers)."""
    statement = select(Memory).where(Memory.namespace == namespace)
    if external_id is not None:
        statement = statement.where(Memory.external_id == external_id)
    if after_id is not None:
        statement = statement.where(Memory.id > after_id)
    return list((await session.scalars(statement.order_by(Memory.id).limit(limit))).all())


async def delete_memory(session: AsyncSession, memory_id: int) -> bool:
    """Delete a memory (its observations and model parameters go with it, by FK cascade);
    False when it does not exist."""
    result = await session.execute(delete(Memory).where(Memory.id == memory_id))
    return affected_rows(result) != 0


#: The namespace's unindexed memories, counted up to ``:limit`` from the partial index
#: ``ix_memories_unindexed`` (namespace, id) WHERE NOT indexed (migration 0006): the cost is the
#: namespace's entries of that index at most, and an index scan stops after ``:limit`` of them.
#: Ordered by the index's columns, with the namespace as a range rather than ``=``, so that no
#: other plan is cheap: with ``=`` and no order, statistics that overrate the unindexed rows
#: made the planner scan the table (or, ordered by id, the primary key) from its start for the
#: few it expected early, and unindexed rows are the newest, at its end.
UNINDEXED_BACKLOG_SQL = text(
    """
    SELECT count(*) FROM (
        SELECT 1 FROM memories
        WHERE namespace >= :namespace AND namespace <= :namespace AND NOT indexed
        ORDER BY namespace, id LIMIT :limit
    ) AS backlog
    """
)


async def unindexed_backlog(session: AsyncSession, namespace: str, limit: int) -> int:
    """How many of the namespace's memories are not in the HNSW index yet, up to ``limit``."""
    result = await session.execute(UNINDEXED_BACKLOG_SQL, {"namespace": namespace, "limit": limit})
    return int(result.scalar_one())


_INDEX_BATCH_SQL = text(
    """
    UPDATE memories SET indexed = true
    WHERE id IN (
        SELECT id FROM memories WHERE NOT indexed
        ORDER BY namespace, id LIMIT :batch_size
        -- NO KEY: the lock an UPDATE of a non-key column takes anyway. A plain FOR UPDATE
        -- would also block the foreign-key checks (FOR KEY SHARE) of concurrent writers of
        -- scores and memory_factors (records, refits) for the whole batch.
        FOR NO KEY UPDATE SKIP LOCKED
    )
    """
)


async def mark_indexed(session: AsyncSession, batch_size: int) -> int:
    """Flag up to ``batch_size`` unindexed memories (by namespace, oldest first) as indexed,
    which inserts them into the partial HNSW index; returns how many."""
    result = await session.execute(_INDEX_BATCH_SQL, {"batch_size": batch_size})
    return affected_rows(result)
