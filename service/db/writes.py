"""Write transactions of a namespace, and the read-your-writes that follows each.

Every transaction of this process that writes a namespace's rows begins here
(:meth:`Writes.session`), named with its namespace and with whether it touches the namespace's
memories (their content, which the reads that depend on :data:`~service.db.replicas.MEMORIES`
wait for) or only what the namespace learned (queries, observations, counters, the model).
When the block ends without an error, its commits made (the session's, or one on the driver
connection in the statements' round trip, as :func:`service.db.record.record_query` does),
the primary's WAL position is noted for the namespace (:meth:`Replicas.note_commit`): this
process's replica reads of the namespace then wait for it. Requests and background writers
alike: the late anchors recorded after an answer, feedback, the records and their online
updates, the rerank protocol's new documents. A write another process makes on this one's
behalf (a full refit in the child process, ``service.retrieve.refit_process``) is noted with
:meth:`Writes.noted` once it has returned. Without read replicas nothing is noted: the block
is the plain session.

Not noted: writes no client of this process has to read back. The indexer's ``indexed`` flag
(a row not indexed yet is found by the exact scan, on a replica too) and a rerank document's
sighting (read by the expiry alone, on the primary); the expiry of unseen documents (no client
wrote it: a lagging replica shows it late as it shows any write it has not replayed); API keys
(read on the primary); and the writes of other processes (``earm worker``, the CLI), whose
positions this process cannot know (:mod:`service.db.replicas`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.db.replicas import Replicas

#: The key of ``AsyncSession.info`` that holds the namespaces a write session writes.
_NAMESPACES = "earm.writes.namespaces"


class Writes:
    """The primary's sessions (``sessions``, for transactions that need no note too), and the
    replicas whose reads wait for the namespaces written through :meth:`session` (None: no
    replicas, nothing to note)."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], replicas: Replicas | None = None
    ) -> None:
        self.sessions = sessions
        self._replicas = replicas if replicas is not None and replicas.configured else None

    @asynccontextmanager
    async def session(self, namespace: str | None, memories: bool) -> AsyncIterator[AsyncSession]:
        """A session for a write of ``namespace`` (its memories too, if ``memories``); None:
        a write that finds its namespace in a row (by id) names it with :func:`writes_to`
        before it writes. The session is closed (what was not committed rolled back) before
        the note; a block that raises notes nothing, so its last statement is its commit."""
        async with self.sessions() as session:
            if namespace is not None:
                writes_to(session, namespace)
            yield session
        for written in session.info.get(_NAMESPACES, ()):
            await self.noted(written, memories)

    async def noted(self, namespace: str, memories: bool) -> None:
        """Note the primary's position after a write of ``namespace`` committed elsewhere
        (by another process, for this one): one round trip with replicas, nothing without."""
        if self._replicas is not None:
            await self._replicas.note_commit(namespace, memories=memories)


def writes_to(session: AsyncSession, namespace: str) -> None:
    """Name a namespace the write ``session`` (of :meth:`Writes.session`) writes."""
    session.info.setdefault(_NAMESPACES, set()).add(namespace)
