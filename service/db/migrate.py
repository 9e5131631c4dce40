"""Alembic, driven from code: the CLI's ``earm migrate``, the embedded start-up and the tests."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

from service.db import citus
from service.db.urls import sqlalchemy_url

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ALEMBIC_INI = PROJECT_ROOT / "alembic.ini"


def alembic_config(
    url: str | None = None, embedding_dim: int | None = None, partitions: int | None = None
) -> Config:
    """Config for ``migrations/``; url, dimension and partition count travel as attributes,
    not globals. ``partitions``: per table (migration 0017; None: its 16). Only the benchmarks
    ask for another count, to compare with one partition (one HNSW graph for all)."""
    config = Config(str(ALEMBIC_INI))
    config.set_main_option("script_location", str(PROJECT_ROOT / "migrations"))
    if url is not None:
        config.attributes["url"] = url
    if embedding_dim is not None:
        config.attributes["embedding_dim"] = embedding_dim
    if partitions is not None:
        config.attributes["partitions"] = partitions
    return config


def upgrade_to_head(url: str, embedding_dim: int, partitions: int | None = None) -> None:
    """Migrate the schema to head; on a Citus database, then distribute it
    (:mod:`service.db.citus`)."""
    command.upgrade(alembic_config(url, embedding_dim, partitions), "head")
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            if citus.is_citus(connection):
                citus.distribute(connection)
    finally:
        engine.dispose()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()
