"""Write transactions of a namespace, and the read-your-writes that follows each.

Every transaction of this process that writes a namespace's rows runs here
(:meth:`Writes.transaction`), named with its namespace and with whether it touches the namespace's
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

A transaction the server rolled back for a conflict that a new attempt does not meet is run
again (:func:`retry_may_succeed`; :data:`TRANSACTION_ATTEMPTS` attempts within
:data:`TRANSACTION_RETRY_S`, with jittered backoff): a serialization failure or a deadlock,
and on Citus a statement planned for a shard that a split replaced while the statement waited
for its lock (a tenant isolated or split to another worker: ``docs/sharding.md``). Nothing of
such a transaction was committed, and its block is a function of the session alone, so the
client sees a wait instead of a 503. The retries are tenacity's; the classification is
earm's, the servers' messages being all there is to go on.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from tenacity import (
    AsyncRetrying,
    before_sleep_log,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from service.db.replicas import Replicas

T = TypeVar("T")

log = logging.getLogger(__name__)

#: The key of ``AsyncSession.info`` that holds the namespaces a write session writes.
_NAMESPACES = "earm.writes.namespaces"
#: Citus (SQLSTATE XX000): the shard a statement was planned for was dropped while it waited
#: for the shard's lock, by a split that blocked writes. Tried again, the statement is planned
#: for the shards that replaced it.
CITUS_SHARD_REPLACED = "could not find valid entry for shard"
#: How often, and for how long, a rolled-back transaction is tried: a split's switch to its
#: new shards blocks writes for well under a second; a conflict that outlasts this is the
#: client's to retry (503 + Retry-After).
TRANSACTION_ATTEMPTS = 5
TRANSACTION_RETRY_S = 2.0


class Writes:
    """The primary's sessions (``sessions``, for transactions that need no note too), and the
    replicas whose reads wait for the namespaces written through :meth:`transaction` (None:
    no replicas, nothing to note)."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], replicas: Replicas | None = None
    ) -> None:
        self.sessions = sessions
        self._replicas = replicas if replicas is not None and replicas.configured else None

    async def transaction(
        self,
        namespace: str | None,
        work: Callable[[AsyncSession], Awaitable[T]],
        *,
        memories: bool,
    ) -> T:
        """``work(session)``: a write of ``namespace`` (its memories too, if ``memories``);
        None: a write that finds its namespace in a row (by id) names it with
        :func:`writes_to` before it writes. ``work`` commits; whatever it did not commit is
        rolled back when the session closes. Run again, in a new session, when the server
        rolled it back for a conflict another attempt may not meet (:func:`retry_may_succeed`);
        the namespaces it wrote are noted once it succeeded (a failed one notes nothing)."""
        retrying = AsyncRetrying(
            retry=retry_if_exception(retry_may_succeed),
            stop=stop_after_attempt(TRANSACTION_ATTEMPTS) | stop_after_delay(TRANSACTION_RETRY_S),
            wait=wait_random_exponential(multiplier=0.05, max=0.5),
            before_sleep=before_sleep_log(log, logging.INFO),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                async with self.sessions() as session:
                    if namespace is not None:
                        writes_to(session, namespace)
                    result = await work(session)
        for written in session.info.get(_NAMESPACES, ()):
            await self.noted(written, memories)
        return result

    async def noted(self, namespace: str, memories: bool) -> None:
        """Note the primary's position after a write of ``namespace`` committed elsewhere
        (by another process, for this one): one round trip with replicas, nothing without."""
        if self._replicas is not None:
            await self._replicas.note_commit(namespace, memories=memories)


def retry_may_succeed(exc: BaseException) -> bool:
    """Whether the server rolled the transaction back for a conflict with another one that a
    new attempt does not meet: a serialization failure (Citus's "shard for the given value
    does not exist … Retry the query" is one), a deadlock, or Citus's
    :data:`CITUS_SHARD_REPLACED`."""
    error = exc.orig if isinstance(exc, DBAPIError) else exc
    if isinstance(error, (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)):
        return True
    return isinstance(error, psycopg.errors.InternalError) and CITUS_SHARD_REPLACED in str(error)


def writes_to(session: AsyncSession, namespace: str) -> None:
    """Name a namespace the write ``session`` (of :meth:`Writes.transaction`) writes."""
    session.info.setdefault(_NAMESPACES, set()).add(namespace)
