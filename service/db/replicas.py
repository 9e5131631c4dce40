"""Read replicas: which server a read runs on, and read-your-writes for sequential clients.

A read that may run on a replica names the namespace whose writes it must see (None: every
namespace, for a read by id that finds its namespace only in the row) and what it depends on
(:data:`MEMORIES`: memory content only; :data:`EVERYTHING`: the queries and counters too). After
every write transaction of a namespace, background ones included, the primary's WAL insert
position is noted (:meth:`Replicas.note_commit`, called by :mod:`service.db.writes`, where
every such transaction begins), kept in this process's memory per namespace and kind. Before a
replica read for that namespace, the replica must have replayed past it: its
``pg_last_wal_replay_lsn()`` is polled for up to ``EARM_REPLICA_MAX_WAIT_MS``, then the read
goes to the primary. A replica that errors is marked down for :data:`DOWN_FOR_S` and the read
(and those meanwhile) runs on the primary: a dead replica costs latency, never a failed
request. Each outcome is counted (``earm_replica_reads_total``).

The positions are per process: a write through another process (another API worker, the CLI)
is seen by this one's replica reads once the replica has replayed it, which is usually within
milliseconds but not promised.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

T = TypeVar("T")

log = logging.getLogger(__name__)

#: What a read depends on: memory content, or everything of the namespace (queries, counters).
Depends = Literal["memories", "everything"]
MEMORIES: Depends = "memories"
EVERYTHING: Depends = "everything"

#: Where a read went, as ``earm_replica_reads_total{outcome=...}`` counts it: the replica; the
#: primary because the replica had not replayed the namespace's last commit in time, because
#: it failed, or because it is marked down after a failure.
Outcome = Literal["replica", "primary_lag", "primary_error", "primary_down"]
ReadObserver = Callable[[Outcome], None]

#: A target no replica reaches: the read goes to the primary.
UNKNOWN = 2**63 - 1
#: A replica that failed serves no read for this long; then it is tried again.
DOWN_FOR_S = 5.0
#: A replay position seen this recently vouches for a read without a round trip of its own
#: (a restarted standby takes longer to answer again; a failed read forgets it at once).
TRUST_REPLAYED_S = 1.0
#: How often a lagging replica's replay position is polled while a read waits for it.
POLL_S = 0.002

# The WAL position after the caller's commit: the commit record ends before it. (The insert
# position, not the flushed one, so a commit without synchronous_commit is covered too.)
_INSERT_LSN_SQL = "SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint"
# How far a standby has replayed: NULL on a server that is not in recovery.
_REPLAY_LSN_SQL = "SELECT (pg_last_wal_replay_lsn() - '0/0')::bigint"

#: Failures of the server or the connection (mark the replica down), as opposed to a statement
#: the replica refused, e.g. cancelled by a recovery conflict (retried on the primary only).
_CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, OSError, TimeoutError)


@dataclass
class _Replica:
    name: str  # the URL without its password, for logs
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    replayed: int = 0  # the highest replay position seen, while it is trusted (below)
    replayed_seen_at: float = 0.0
    down_until: float = 0.0

    def known_replayed(self) -> int:
        """The replay position seen last, if seen within :data:`TRUST_REPLAYED_S`: it only
        grows while the standby runs, but a standby that crashed and restarted may serve reads
        from an earlier point until it has replayed forward again."""
        recent = time.monotonic() - self.replayed_seen_at < TRUST_REPLAYED_S
        return self.replayed if recent else 0

    def saw_replayed(self, lsn: int) -> None:
        self.replayed, self.replayed_seen_at = lsn, time.monotonic()


@dataclass
class _Written:
    """The primary's position after the last commit of this process that touched a namespace,
    by kind of write; ``latest`` over every namespace. A namespace whose position could not be
    read after a commit is ``unknown`` (its reads go to the primary) until a position read
    that began after that failure, which is past the commit, stands in for it."""

    by_namespace: dict[str, int] = field(default_factory=dict)
    latest: int = 0
    unknown: dict[str, float] = field(default_factory=dict)  # namespace -> when it failed

    def note(self, namespace: str, lsn: int, read_began: float) -> None:
        self.by_namespace[namespace] = max(lsn, self.by_namespace.get(namespace, 0))
        self.latest = max(lsn, self.latest)
        for stale, failed_at in list(self.unknown.items()):
            if failed_at < read_began:
                del self.unknown[stale]
                self.by_namespace[stale] = max(lsn, self.by_namespace.get(stale, 0))

    def target(self, namespace: str | None) -> int:
        if self.unknown and (namespace is None or namespace in self.unknown):
            return UNKNOWN
        return self.latest if namespace is None else self.by_namespace.get(namespace, 0)


class Replicas:
    """The primary's sessions and the replicas' (none: every read runs on the primary)."""

    def __init__(
        self,
        primary: async_sessionmaker[AsyncSession],
        primary_engine: AsyncEngine,
        replicas: Sequence[tuple[str, AsyncEngine]],
        max_wait_s: float,
        observe: ReadObserver | None = None,
    ) -> None:
        self.primary = primary
        self._primary_engine = primary_engine
        self._replicas = [
            _Replica(name, engine, async_sessionmaker(engine, expire_on_commit=False))
            for name, engine in replicas
        ]
        self._turn = itertools.cycle(range(max(1, len(self._replicas))))
        self.max_wait_s = max_wait_s
        self._observe = observe or (lambda outcome: None)
        self._memories = _Written()
        self._everything = _Written()

    @property
    def configured(self) -> bool:
        return bool(self._replicas)

    async def dispose(self) -> None:
        for replica in self._replicas:
            await replica.engine.dispose()

    # ---------------------------------------------------------------------------- writes

    async def note_commit(self, namespace: str, memories: bool) -> None:
        """After a commit that touched ``namespace`` (its memories, if ``memories``): note the
        primary's position, which this process's replica reads of the namespace then wait
        for. One round trip on a primary connection; nothing without replicas. Called by
        :class:`service.db.writes.Writes`, not by its callers."""
        if not self._replicas:
            return
        kinds = (self._everything, self._memories) if memories else (self._everything,)
        began = time.monotonic()
        try:
            async with self._primary_engine.connect() as connection:
                # Autocommit: the one statement, without a BEGIN and a COMMIT of its own.
                autocommit = await connection.execution_options(isolation_level="AUTOCOMMIT")
                lsn = int(await _value(autocommit, _INSERT_LSN_SQL))
        except (DBAPIError, psycopg.Error, OSError) as exc:
            # The write is committed: its request must not fail now. Its namespace is read
            # from the primary until a later position covers the commit.
            log.warning("could not read the primary's WAL position after a commit: %s", exc)
            for written in kinds:
                written.unknown[namespace] = time.monotonic()
            return
        for written in kinds:
            written.note(namespace, lsn, began)

    # ----------------------------------------------------------------------------- reads

    async def read(
        self,
        namespace: str | None,
        work: Callable[[AsyncSession], Awaitable[T]],
        depends: Depends = EVERYTHING,
    ) -> T:
        """``work`` on a session of a replica that has replayed this process's last commit of
        ``namespace`` (None: of any namespace) of the kind the read ``depends`` on; on the
        primary when there is none, it lags past ``max_wait_s`` or it fails. ``work`` may run
        twice (on a replica that fails midway, then on the primary): it must only read."""
        replica = self._pick()
        if replica is None:
            if self._replicas:
                self._observe("primary_down")
            return await self._on_primary(work)
        written = self._memories if depends == MEMORIES else self._everything
        target = written.target(namespace)
        try:
            async with replica.sessions() as session:
                if await self._caught_up(replica, session, target):
                    result = await work(session)
                    self._observe("replica")
                    return result
        except (DBAPIError, psycopg.Error, *_CONNECTION_ERRORS) as exc:
            self._failed(replica, exc)
            return await self._on_primary(work)
        self._observe("primary_lag")
        return await self._on_primary(work)

    async def _on_primary(self, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
        async with self.primary() as session:
            return await work(session)

    def _pick(self) -> _Replica | None:
        """The next replica that is not marked down, round robin."""
        now = time.monotonic()
        for _ in self._replicas:
            replica = self._replicas[next(self._turn) % len(self._replicas)]
            if replica.down_until <= now:
                return replica
        return None

    async def _caught_up(self, replica: _Replica, session: AsyncSession, target: int) -> bool:
        """Whether the replica has replayed past ``target``, polled for up to ``max_wait_s``.
        A server not in recovery (no replay position) never has: it is not a standby."""
        if replica.known_replayed() >= target:
            return True  # seen a moment ago: no round trip
        if target == UNKNOWN:
            return False
        deadline = time.monotonic() + self.max_wait_s
        while True:
            replayed = await _value(await session.connection(), _REPLAY_LSN_SQL)
            if replayed is None:
                return False
            replica.saw_replayed(int(replayed))
            if replica.replayed >= target:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(POLL_S)

    def _failed(self, replica: _Replica, exc: BaseException) -> None:
        """Count the failure; a failure of the server or the connection marks it down."""
        self._observe("primary_error")
        replica.replayed_seen_at = 0.0
        original = exc.orig if isinstance(exc, DBAPIError) else exc
        if isinstance(original, _CONNECTION_ERRORS):
            replica.down_until = time.monotonic() + DOWN_FOR_S
            log.warning(
                "read replica %s failed (%s); reading from the primary for %.0f s",
                replica.name, type(original).__name__, DOWN_FOR_S,
            )
        else:
            log.warning(
                "read replica %s refused a read (%s); read from the primary",
                replica.name, type(original).__name__,
            )


async def _value(connection: AsyncConnection, statement: str) -> Any:
    """The one value of a statement without parameters, run on the driver connection (the
    package's style; ``service.db.statements`` needs the engine module, which needs this one)."""
    driver = (await connection.get_raw_connection()).driver_connection
    assert driver is not None, "only a closed or invalidated connection has none"
    cursor = await driver.execute(statement)
    row = await cursor.fetchone()
    return None if row is None else row[0]
