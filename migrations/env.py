"""Alembic environment: the URL and embedding dimension come from the caller or EARM_* settings."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool

from service.db.models import Base
from service.db.urls import sqlalchemy_url
from service.settings import Settings

config = context.config

if "url" not in config.attributes and config.config_file_name is not None:
    # Run from the `alembic` command line: configure its logging, but never clobber the
    # logging of a process (earm serve, tests) that calls us in-process.
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("url") or Settings().database_url
    if not url:
        raise RuntimeError(
            "no database URL: set EARM_DATABASE_URL, or use `earm migrate`, which also "
            "handles the embedded Postgres"
        )
    return sqlalchemy_url(url)


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection, target_metadata=target_metadata, compare_type=True
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
