"""`earm worker`: the background work of a deployment, apart from the processes that answer
requests, so refits and indexing neither compete with requests for a process's CPU nor scale
with the number of API processes. A worker runs the HNSW indexer (and, in its loop, the expiry
of the rerank protocol's unused documents) and the full refits, nothing else, against the same
database as the API processes (`earm serve --no-background-work`):

- the indexer drains the unindexed backlog; its batches take rows ``FOR NO KEY UPDATE SKIP
  LOCKED``, so several workers share the backlog;
- every ``EARM_WORKER_POLL_INTERVAL_S`` it refits the namespaces whose query count made a
  refit due (the API processes only count); a namespace's refit holds its refit lock, so
  with several workers one refits it and the others skip it.

Nothing here is the only copy of anything: a killed worker leaves unindexed rows (searchable by
the exact scan) and due counters, which the next worker picks up.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from contextlib import suppress

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.cpu import one_blas_thread
from service.db.engine import open_database
from service.db.namespaces import namespaces_due_for_refit
from service.errors import ConfigurationError
from service.ingest.indexer import BackgroundIndexer
from service.providers.factory import scorer_source
from service.retrieve.learning import Learner
from service.retrieve.refit_process import Refits, refits_for
from service.settings import Settings

log = logging.getLogger(__name__)


class Worker:
    """The indexer and the refit loop of one worker process."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        settings: Settings,
        refits: Refits | None = None,
    ) -> None:
        self.sessions = sessions
        self.settings = settings.learning
        self.learner = Learner(sessions, self.settings, scorer_source(settings.scoring), refits)
        self.indexer = BackgroundIndexer.from_settings(sessions, settings.indexing)

    async def refit_due_namespaces(self) -> int:
        """Refit every namespace due now (skipping those another worker is refitting);
        returns how many this worker refitted."""
        async with self.sessions() as session:
            due = await namespaces_due_for_refit(
                session, self.settings.every, self.settings.growth
            )
            await session.commit()
        refitted = 0
        for namespace in due:
            # A failed refit leaves its counter as it was: the next round tries again.
            refitted += await self.learner.refit_logged(namespace)
        return refitted

    async def run(self, stop: asyncio.Event) -> None:
        """Index and refit until ``stop`` is set; a refit in flight finishes first."""
        self.indexer.start()
        try:
            while not stop.is_set():
                try:
                    await self.refit_due_namespaces()
                except Exception:  # the database is down: try again after the interval
                    log.warning("looking for due refits failed; retrying", exc_info=True)
                with suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.settings.worker_poll_interval_s)
        finally:
            await self.indexer.stop()


async def run_worker(settings: Settings) -> None:
    """`earm worker` until SIGINT or SIGTERM. Needs an external database: an embedded one
    belongs to the one `earm serve` that starts it."""
    if not settings.database_url:
        raise ConfigurationError("earm worker needs EARM_DATABASE_URL (the API's Postgres)")
    one_blas_thread()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with open_database(settings.database) as database:
        log.info("earm worker started: refits and indexing")
        # Refits in a child process here too: the indexer's batches do not wait behind one.
        refits = refits_for(settings.learning, database.url, database.sessions)
        try:
            await Worker(database.sessions, settings, refits).run(stop)
        finally:
            refits.close()
    log.info("earm worker stopped")
