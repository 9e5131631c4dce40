"""Deferred vector indexing: an ingest commits its memories unindexed; this moves them into the
HNSW index in the background.

Inserting into the HNSW index is most of an ingest's cost (at 100k memories of 384 dimensions,
about 300 rows/s on 2 cores, against thousands of rows/s for the rows themselves), so the ingest
does not wait for it. A new memory has ``indexed = false``; the HNSW index is partial
(``WHERE indexed``), and :class:`BackgroundIndexer` sets the flag in batches, which inserts
those rows into the index. Until then the search finds the memory by an exact scan of its
namespace's unindexed rows (``service.db.search``), so an acknowledged memory is searchable at once
and nothing waits for the index but the index itself.

Each batch is one short transaction that takes its rows ``FOR NO KEY UPDATE SKIP LOCKED``, so
the indexers of several worker processes share the backlog instead of queueing on it, and an
interrupted batch (shutdown, lost connection) just leaves its rows unindexed for the next one.

The same loop is the process's other maintenance of stored memories: when the rerank protocol's
documents expire (``EARM_RERANK_DOCUMENT_TTL_S``), it runs their sweep
(:class:`service.ingest.retention.DocumentSweeper`) when one is due.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.db.memories import mark_indexed
from service.ingest.retention import DocumentSweeper
from service.settings_groups import IndexingSettings

log = logging.getLogger(__name__)


async def index_batch(sessions: async_sessionmaker[AsyncSession], batch_size: int) -> int:
    """Move up to ``batch_size`` unindexed memories (by namespace, oldest first) into the HNSW
    index, in one committed transaction; returns how many."""
    async with sessions() as session:
        indexed = await mark_indexed(session, batch_size)
        await session.commit()
    return indexed


async def index_all(sessions: async_sessionmaker[AsyncSession], batch_size: int) -> int:
    """Index the whole backlog now; returns how many memories were indexed."""
    total = 0
    while (done := await index_batch(sessions, batch_size)) > 0:
        total += done
    return total


class BackgroundIndexer:
    """One task per process that drains the backlog: woken by :meth:`notify` after an ingest
    of this process commits, and every ``poll_interval_s`` for ingests of other processes."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        batch_size: int,
        poll_interval_s: float,
        sweeper: DocumentSweeper | None = None,
    ) -> None:
        self.sessions = sessions
        self.batch_size = batch_size
        self.poll_interval_s = poll_interval_s
        self.sweeper = sweeper
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @classmethod
    def from_settings(
        cls, sessions: async_sessionmaker[AsyncSession], settings: IndexingSettings
    ) -> BackgroundIndexer:
        """The indexer of a serving process or a worker, sweeping expired documents when the
        deployment lets them expire."""
        ttl_s = settings.document_ttl_s
        return cls(
            sessions,
            settings.batch_size,
            settings.poll_interval_s,
            DocumentSweeper(sessions, ttl_s) if ttl_s > 0 else None,
        )

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="earm-indexer")

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def notify(self) -> None:
        """New unindexed memories are committed."""
        self._wake.set()

    async def stop(self) -> None:
        """Cancel the task; a batch in flight rolls back and its rows stay for the next start.

        The loop also ends by the flag, not by the cancellation alone: on Python 3.11
        ``asyncio.wait_for`` can swallow a cancellation that arrives as the wait it wraps
        completes (CPython gh-86296: here, a ``notify()`` just before shutdown), and the loop
        would then run on while ``stop()`` waited for it forever."""
        if self._task is not None:
            self._stopping = True
            self._wake.set()
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            self._stopping = False

    async def _run(self) -> None:
        while not self._stopping:
            self._wake.clear()
            try:
                indexed = await index_all(self.sessions, self.batch_size)
                if indexed:
                    log.info("indexed memories", extra={"memories": indexed})
            except Exception:  # not CancelledError (a BaseException): stop() ends the loop
                # The database is down or the batch failed: the rows stay unindexed (and
                # searchable by the exact scan); try again after the interval.
                log.warning("background indexing failed; retrying", exc_info=True)
            if self.sweeper is not None:
                await self.sweeper.sweep_if_due()
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_interval_s)
