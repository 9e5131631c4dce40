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


#: Where a ``--citus`` run's cluster lives: the database the benchmark's service is given.
CITUS_DATABASE = "earm_bench"


@contextmanager
def citus_database(dim: int) -> Iterator[str]:
    """The coordinator's URL of a Citus database at the schema head, distributed by ``earm
    migrate``'s code: a coordinator and two workers started on loopback
    (:func:`service.testing.citus.start_cluster`, Citus built into the embedded PostgreSQL
    first when it is not there), stopped and removed on exit."""
    import shutil
    import tempfile

    from service.db import migrate
    from service.testing.citus import ensure_built, start_cluster

    why_not = ensure_built()
    if why_not is not None:
        raise RuntimeError(why_not)
    # Not under a private temporary directory: the nodes run as the embedded server's user
    # when we are root, and must reach their data directories.
    directory = Path(tempfile.mkdtemp(prefix="earm-bench-citus-"))
    cluster = start_cluster(directory)
    try:
        url = cluster.database(CITUS_DATABASE)
        migrate.upgrade_to_head(url, dim)
        yield url
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)
