"""Scratch databases for the benchmarks that work on the database directly."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL (``postgresql+psycopg://…``) as a libpq conninfo URI for psycopg."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def migrated_database(
    database_url: str | None, dim: int, tmp: Path, partitions: int | None = None
) -> Iterator[str]:
    """URL of a database at the schema head: ``database_url``, or a temporary embedded one
    in ``tmp`` (stopped on exit), migrated with ``partitions`` per table (None: the schema's
    16; an existing database keeps its own)."""
    from service.db import migrate
    from service.db.engine import EmbeddedPostgres
    from service.db.urls import sqlalchemy_url

    if database_url:
        url = sqlalchemy_url(database_url)
        migrate.upgrade_to_head(url, dim)
        yield url
        return
    server = EmbeddedPostgres(tmp / "pgdata")
    url = server.start()
    try:
        migrate.upgrade_to_head(url, dim, partitions)
        yield url
    finally:
        server.stop()
