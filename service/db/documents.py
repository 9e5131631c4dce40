"""The ``rerank_documents`` rows: which memories the rerank protocol stored and when a call last
named them (migration 0016), and the documents its retention rule expires. A lookup records the
sightings (``memories.ids_by_text``); the deletion itself is ``memories.delete_memories``."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from service.db.statements import execute, fetch_all

_RECORD_SQL = (
    "INSERT INTO rerank_documents (namespace, memory_id) "
    "SELECT %(namespace)s, unnest(%(ids)s::bigint[]) ON CONFLICT (namespace, memory_id) DO NOTHING"
)

# Expired: no call named it for the TTL, and never observed (no cell, by the scorer or by
# feedback: a replaced or retired cell stays a row), so nothing learnt about it goes with it.
_EXPIRED_CONDITION = """
    d.last_seen_at < now() - make_interval(secs => %(ttl_s)s::float8)
    AND NOT EXISTS (
        SELECT FROM scores s WHERE s.namespace = d.namespace AND s.memory_id = d.memory_id
    )
"""
# Oldest sightings first, through ix_rerank_documents_last_seen_at: of every partition (the
# sweep is background work, across namespaces).
_EXPIRED_SQL = f"""
    SELECT d.namespace, d.memory_id FROM rerank_documents d
    WHERE {_EXPIRED_CONDITION}
    ORDER BY d.last_seen_at LIMIT %(limit)s
"""
# Under the namespace's lock, which a record of scores takes too: of the rows found expired,
# those still expired. FOR UPDATE waits for a lookup refreshing a row's sighting, then reads the
# row anew, so a document a call has just named is not deleted under it.
_STILL_EXPIRED_SQL = f"""
    SELECT d.memory_id FROM rerank_documents d
    WHERE d.namespace = %(namespace)s AND d.memory_id = ANY(%(ids)s::bigint[])
      AND {_EXPIRED_CONDITION}
    ORDER BY d.memory_id FOR UPDATE OF d
"""


async def record_documents(
    session: AsyncSession, namespace: str, memory_ids: Sequence[int]
) -> None:
    """Mark new memories of the namespace as the rerank protocol's documents, seen now."""
    await execute(
        session, _RECORD_SQL, {"namespace": namespace, "ids": [int(m) for m in memory_ids]}
    )


async def expired_documents(
    session: AsyncSession, ttl_s: float, limit: int
) -> dict[str, list[int]]:
    """Up to ``limit`` expired documents (longest unseen first), by namespace."""
    rows = await fetch_all(session, _EXPIRED_SQL, {"ttl_s": ttl_s, "limit": limit})
    by_namespace: dict[str, list[int]] = {}
    for namespace, memory_id in rows:
        by_namespace.setdefault(namespace, []).append(int(memory_id))
    return by_namespace


async def still_expired(
    session: AsyncSession, namespace: str, memory_ids: Sequence[int], ttl_s: float
) -> list[int]:
    """Those of the namespace's ``memory_ids`` that are expired now, locked until the
    transaction ends."""
    rows = await fetch_all(
        session,
        _STILL_EXPIRED_SQL,
        {"namespace": namespace, "ids": [int(m) for m in memory_ids], "ttl_s": ttl_s},
    )
    return [int(memory_id) for (memory_id,) in rows]
