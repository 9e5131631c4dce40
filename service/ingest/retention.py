"""The retention rule of the rerank protocol's documents (docs/api.md "Rerank protocol"): a
memory the protocol stored for a text it had not seen expires once no call has named it for
``EARM_RERANK_DOCUMENT_TTL_S`` and nothing was ever observed about it (no scorer score, no
feedback). Memories ingested through ``/memories`` never expire, nor does an observed document:
what was learnt about it is what earm is for.

A call's lookup of its texts records their sighting (``service.db.memories.ids_by_text``), at
most once per :func:`sighting_refresh_s` per document; the sweep runs in the background
maintenance of a process (:class:`service.ingest.indexer.BackgroundIndexer`, in ``earm serve``
and ``earm worker``) every :func:`sighting_refresh_s`, and deletes the expired documents
through the deletion path of ``DELETE /memories/{id}``, under their namespace's lock."""

from __future__ import annotations

import logging
import math
import time

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.db import documents as document_table
from service.db import memories as memory_table
from service.db.namespaces import namespace_state
from service.errors import NotFound

log = logging.getLogger(__name__)

#: Documents one sweep transaction deletes (its namespace's lock held meanwhile).
SWEEP_BATCH = 500
_HOUR_S = 3600.0


def sighting_refresh_s(ttl_s: float) -> float:
    """How stale a document's recorded sighting may be: an hour, or a tenth of a shorter TTL,
    so a document a call named is never more than a tenth of the TTL closer to expiring than
    it should be, while a document named by every call is written at most once an hour. Also
    the interval between sweeps. ``ttl_s`` 0 (keep forever): an hour, so the sightings are
    current if a TTL is set later."""
    return min(_HOUR_S, ttl_s / 10) if ttl_s > 0 else _HOUR_S


async def expire_documents(sessions: async_sessionmaker[AsyncSession], ttl_s: float) -> int:
    """Delete every expired document now, a namespace's batch per transaction; returns how
    many. ``ttl_s`` must be positive."""
    assert ttl_s > 0, "a TTL of 0 keeps documents forever"
    deleted = 0
    while True:
        async with sessions() as session:
            found = await document_table.expired_documents(session, ttl_s, SWEEP_BATCH)
            await session.commit()
        if not found:
            return deleted
        for namespace, memory_ids in found.items():
            deleted += await _delete_expired(sessions, namespace, memory_ids, ttl_s)


async def _delete_expired(
    sessions: async_sessionmaker[AsyncSession], namespace: str, memory_ids: list[int], ttl_s: float
) -> int:
    async with sessions() as session:
        try:
            # The lock DELETE /memories/{id} takes (service.ingest.memories.delete_memory).
            await namespace_state(session, namespace, for_update=True)
        except NotFound:  # erased meanwhile, its documents with it
            return 0
        expired = await document_table.still_expired(session, namespace, memory_ids, ttl_s)
        deleted = await memory_table.delete_memories(session, namespace, expired)
        await session.commit()
    return deleted


class DocumentSweeper:
    """Runs :func:`expire_documents` when a sweep is due; called from a process's background
    maintenance loop (which wakes far more often)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], ttl_s: float) -> None:
        self.sessions = sessions
        self.ttl_s = ttl_s
        self.interval_s = sighting_refresh_s(ttl_s)
        self._last_sweep = -math.inf  # the first call sweeps: a restart does not postpone it

    async def sweep_if_due(self) -> int:
        """Sweep if the interval has passed since the last one; how many documents went. A
        failed sweep is logged and waits for the next interval (what it left is still
        expired then)."""
        if time.monotonic() - self._last_sweep < self.interval_s:
            return 0
        self._last_sweep = time.monotonic()
        try:
            deleted = await expire_documents(self.sessions, self.ttl_s)
        except Exception:
            log.warning("expiring rerank documents failed; retrying later", exc_info=True)
            return 0
        if deleted:
            log.info("expired rerank documents", extra={"memories": deleted})
        return deleted
