"""The ``memories`` rows: idempotent batch insert, lookup, keyset pages, edits, deletion, and
the background indexer's batches. No validation here: callers pass checked values."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import psycopg.sql
from psycopg.types.json import Jsonb
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.codecs import metadata_json
from service.db.engine import driver_connection
from service.db.statements import execute, fetch_all, fetch_one, fetch_value


@dataclass(frozen=True)
class MemoryRow:
    """A stored memory, its columns by name."""

    id: int
    namespace: str
    external_id: str | None
    text: str
    embedding: np.ndarray  # float32
    embedding_model: str
    occurred_at: datetime | None
    created_at: datetime
    metadata: dict[str, Any]

    @classmethod
    def of(cls, row: Sequence[Any]) -> MemoryRow:
        """From a row of :data:`_MEMORY_COLUMNS`."""
        memory_id, namespace, external_id, text, vector, model, occurred_at, created, meta = row
        return cls(
            memory_id, namespace, external_id, text, vector.to_numpy(), model, occurred_at,
            created, meta,
        )


_MEMORY_COLUMNS = (
    "id, namespace, external_id, text, embedding, embedding_model, occurred_at, created_at, "
    "metadata"
)
_IDS_BY_EXTERNAL_ID_SQL = (
    "SELECT external_id, id FROM memories "
    "WHERE namespace = %(namespace)s AND external_id = ANY(%(external_ids)s::text[])"
)
_BY_EXTERNAL_ID_SQL = (
    f"SELECT {_MEMORY_COLUMNS} FROM memories "
    "WHERE namespace = %(namespace)s AND external_id = ANY(%(external_ids)s::text[])"
)
#: The namespace of a memory id: what reaches the one partition that holds it (migration 0017).
#: A statement of its own (as ``traces._NAMESPACE_SQL``), not a subquery of the read: Citus
#: would run the read on every shard, the namespace being known only once it has run.
_LOCATE_SQL = "SELECT namespace FROM memory_locator WHERE id = %(id)s"
_BY_ID_SQL = (
    f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE namespace = %(namespace)s AND id = %(id)s"
)


async def ids_by_external_id(
    session: AsyncSession, namespace: str, external_ids: Sequence[str]
) -> dict[str, int]:
    """The ids of the namespace's memories with these external ids (those that exist)."""
    rows = await fetch_all(
        session, _IDS_BY_EXTERNAL_ID_SQL,
        {"namespace": namespace, "external_ids": list(external_ids)},
    )
    return {external_id: memory_id for external_id, memory_id in rows}


# One index probe per text (ix_memories_namespace_text_md5, migration 0015); the text itself is
# compared too, so a digest collision joins nothing. Of several memories with one text (ingested
# twice through /memories), the oldest is the text's memory. The same statement records the
# sighting of the rerank protocol's documents among them (rerank_documents, migration 0016), at
# most once per ``refresh_s`` each, so most lookups write nothing.
_IDS_BY_TEXT_SQL = """
    WITH found AS MATERIALIZED (
        SELECT t.doc, m.id FROM unnest(%(texts)s::text[]) AS t(doc)
        JOIN LATERAL (
            SELECT id FROM memories
            WHERE namespace = %(namespace)s AND md5(text) = md5(t.doc) AND text = t.doc
            ORDER BY id LIMIT 1
        ) m ON true
    ), seen AS (
        UPDATE rerank_documents d SET last_seen_at = now() FROM found
        WHERE d.namespace = %(namespace)s AND d.memory_id = found.id
          AND d.last_seen_at < now() - make_interval(secs => %(refresh_s)s::float8)
    )
    SELECT doc, id FROM found
"""
# Held until the transaction ends: concurrent first sights of a text in one namespace store it
# once (the lookup is redone under it). A key apart from the refit's session lock.
_LOCK_TEXTS_SQL = "SELECT pg_advisory_xact_lock(hashtextextended('texts:' || %(namespace)s, 0))"


async def ids_by_text(
    session: AsyncSession, namespace: str, texts: Sequence[str], refresh_s: float
) -> dict[str, int]:
    """The id of the namespace's memory with each of these texts (those that exist); those
    the rerank protocol stored are marked seen now unless they were within ``refresh_s``."""
    rows = await fetch_all(
        session,
        _IDS_BY_TEXT_SQL,
        {"namespace": namespace, "texts": list(texts), "refresh_s": refresh_s},
    )
    return {text: memory_id for text, memory_id in rows}


async def lock_texts(session: AsyncSession, namespace: str) -> None:
    """Serialise the storing of new texts as memories of the namespace, until the transaction
    ends."""
    await execute(session, _LOCK_TEXTS_SQL, {"namespace": namespace})


# The vectors go in pgvector's binary format and the rows as a few arrays, with no per-value
# text formatting or parsing. Each new id is located in the same statement.
_INSERT_SQL = """
    WITH inserted AS (
        INSERT INTO memories (namespace, external_id, text, embedding, embedding_model,
                              occurred_at, metadata)
        SELECT %(namespace)s::text, e, t, v, mdl, o, md
        FROM unnest(%(external_ids)s::text[], %(texts)s::text[], %(embeddings)b::vector[],
                    %(models)s::text[], %(occurred_at)s::timestamptz[], %(metadata)s::jsonb[])
            WITH ORDINALITY AS u(e, t, v, mdl, o, md, ord)
        ORDER BY ord
        ON CONFLICT (namespace, external_id) DO NOTHING
        RETURNING id, external_id
    ), located AS (
        INSERT INTO memory_locator (id, namespace) SELECT id, %(namespace)s FROM inserted
    )
    SELECT id, external_id FROM inserted
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


async def get_memory(session: AsyncSession, memory_id: int) -> MemoryRow | None:
    namespace = await fetch_value(session, _LOCATE_SQL, {"id": memory_id})
    if namespace is None:
        return None
    row = await fetch_one(session, _BY_ID_SQL, {"namespace": namespace, "id": memory_id})
    return None if row is None else MemoryRow.of(row)


async def memories_by_external_id(
    session: AsyncSession, namespace: str, external_ids: Sequence[str]
) -> list[MemoryRow]:
    """The namespace's memories stored under these external ids (those that exist)."""
    rows = await fetch_all(
        session, _BY_EXTERNAL_ID_SQL, {"namespace": namespace, "external_ids": list(external_ids)}
    )
    return [MemoryRow.of(row) for row in rows]


# The columns an edit may set, each with its parameter's adaptation.
_SETTABLE_COLUMNS: dict[str, Any] = {
    "text": str,
    "metadata": Jsonb,
    "occurred_at": lambda value: value,
    "embedding": lambda value: np.asarray(value, dtype=np.float32),
    "embedding_model": str,
}
# The SET list is the edit's columns (of _SETTABLE_COLUMNS), composed in as identifiers.
_UPDATE_TEMPLATE = psycopg.sql.SQL(
    "UPDATE memories SET {} WHERE namespace = %(namespace)s AND id = %(id)s"
)


async def update_memory(
    session: AsyncSession,
    namespace: str,
    memory_id: int,
    values: dict[str, Any],
    *,
    content_changed: bool,
) -> bool:
    """Set columns of a memory (``MemoryRow`` attribute names, of those an edit may set);
    False when it does not exist. Run under the namespace's lock. ``content_changed`` (its
    text or vector) stamps ``content_changed_at``. A new embedding leaves the HNSW index
    (``indexed`` false) until the background indexer puts it back, as after an ingest: the
    search scans unindexed rows exactly meanwhile."""
    assignments: list[psycopg.sql.Composable] = [
        psycopg.sql.SQL("{} = {}").format(
            psycopg.sql.Identifier(column), psycopg.sql.Placeholder(column)
        )
        for column in values
    ]
    if "embedding" in values:
        assignments.append(psycopg.sql.SQL("indexed = false"))
    parameters = {column: _SETTABLE_COLUMNS[column](value) for column, value in values.items()}
    conn = await driver_connection(session)
    if content_changed:
        # The time now, under the namespace's lock, which a refit's horizon
        # (model_state.refit_horizon) is ordered against; read in a statement of its own, as
        # the horizon is (Citus runs no volatile function in an UPDATE of a distributed table).
        assignments.append(psycopg.sql.SQL("content_changed_at = %(changed_at)s"))
        parameters["changed_at"] = await fetch_value(session, "SELECT clock_timestamp()")
    cursor = await conn.execute(
        _UPDATE_TEMPLATE.format(psycopg.sql.SQL(", ").join(assignments)),
        parameters | {"namespace": namespace, "id": memory_id},
    )
    return cursor.rowcount != 0


def _page_sql(by_external_id: bool, after_an_id: bool) -> str:
    return (
        f"SELECT {_MEMORY_COLUMNS} FROM memories WHERE namespace = %(namespace)s"
        + (" AND external_id = %(external_id)s" if by_external_id else "")
        + (" AND id > %(after_id)s" if after_an_id else "")
        + " ORDER BY id LIMIT %(limit)s"
    )


# One statement per combination of the page's conditions, each planned for what it asks.
_PAGE_SQL = {
    (by_external_id, after_an_id): _page_sql(by_external_id, after_an_id)
    for by_external_id in (False, True)
    for after_an_id in (False, True)
}


async def memories_after(
    session: AsyncSession,
    namespace: str,
    after_id: int | None,
    limit: int,
    external_id: str | None = None,
) -> list[MemoryRow]:
    """Up to ``limit`` memories of the namespace by id, after ``after_id`` when given; with
    ``external_id``, only the one stored under it (the unique index answers)."""
    rows = await fetch_all(
        session,
        _PAGE_SQL[external_id is not None, after_id is not None],
        {"namespace": namespace, "after_id": after_id, "limit": limit, "external_id": external_id},
    )
    return [MemoryRow.of(row) for row in rows]


# The locator rows go in the same statement (their foreign key would cascade too, but a
# distributed deployment cannot keep that key: docs/operations.md "Partitions"). They are
# also named by the ids given: Citus, whose locators are distributed by id, then deletes in
# those ids' shards only (by the deleted ids alone, in every shard).
_DELETE_SQL = """
    WITH deleted AS (
        DELETE FROM memories WHERE namespace = %(namespace)s AND id = ANY(%(ids)s::bigint[])
        RETURNING id
    ), unlocated AS (
        DELETE FROM memory_locator
        WHERE id = ANY(%(ids)s::bigint[]) AND id IN (SELECT id FROM deleted)
    )
    SELECT count(*) FROM deleted
"""


async def delete_memories(
    session: AsyncSession, namespace: str, memory_ids: Sequence[int]
) -> int:
    """Delete memories of the namespace (their observations, model parameters and
    rerank_documents rows go with them, by FK cascade); returns how many existed. Run under
    the namespace's lock."""
    deleted = await fetch_value(
        session, _DELETE_SQL, {"namespace": namespace, "ids": [int(m) for m in memory_ids]}
    )
    return int(deleted)


async def delete_memory(session: AsyncSession, namespace: str, memory_id: int) -> bool:
    """Delete a memory as :func:`delete_memories` does; False when it does not exist."""
    return await delete_memories(session, namespace, [memory_id]) != 0


#: The namespace's unindexed memories, counted up to ``%(limit)s`` from the partial index
#: ``ix_memories_unindexed`` (namespace, id) WHERE NOT indexed (migration 0006): the cost is the
#: namespace's entries of that index at most, and an index scan stops after ``limit`` of them.
#: Ordered by the index's columns, so that no other plan is cheap: with no order, statistics
#: that overrate the unindexed rows made the planner scan the table (or, ordered by id, the
#: primary key) from its start for the few it expected early, and unindexed rows are the
#: newest, at its end. (The namespace is compared with ``=``: a range would not prune the
#: hash partitions.)
UNINDEXED_BACKLOG_SQL = """
    SELECT count(*) FROM (
        SELECT 1 FROM memories
        WHERE namespace = %(namespace)s AND NOT indexed
        ORDER BY namespace, id LIMIT %(limit)s
    ) AS backlog
"""


async def unindexed_backlog(session: AsyncSession, namespace: str, limit: int) -> int:
    """How many of the namespace's memories are not in the HNSW index yet, up to ``limit``."""
    counted = await fetch_value(
        session, UNINDEXED_BACKLOG_SQL, {"namespace": namespace, "limit": limit}
    )
    return int(counted)


# A batch indexes one namespace's backlog, the first namespace (by name) that has one: the
# rows are locked by a statement that names the namespace, which reads one partition here and
# one shard on Citus (which cannot lock rows of a statement that spans shards). Finding that
# namespace reads every partition's small ix_memories_unindexed: background work, not a
# request's.
_BACKLOG_NAMESPACE_SQL = "SELECT min(namespace) FROM memories WHERE NOT indexed"
_INDEX_BATCH_SQL = """
    UPDATE memories SET indexed = true
    WHERE namespace = %(namespace)s AND id IN (
        SELECT id FROM memories WHERE namespace = %(namespace)s AND NOT indexed
        ORDER BY namespace, id LIMIT %(batch_size)s
        -- NO KEY: the lock an UPDATE of a non-key column takes anyway. A plain FOR UPDATE
        -- would also block the foreign-key checks (FOR KEY SHARE) of concurrent writers of
        -- scores and memory_factors (records, refits) for the whole batch.
        FOR NO KEY UPDATE SKIP LOCKED
    )
"""


async def mark_indexed(session: AsyncSession, batch_size: int) -> int:
    """Flag up to ``batch_size`` unindexed memories of one namespace (the first by name with
    any; oldest first) as indexed, which inserts them into the partial HNSW index; returns how
    many (0 when another indexer holds that namespace's backlog, or there is none)."""
    namespace = await fetch_value(session, _BACKLOG_NAMESPACE_SQL, {})
    if namespace is None:
        return 0
    return await execute(
        session, _INDEX_BATCH_SQL, {"namespace": namespace, "batch_size": batch_size}
    )
