"""Fixtures of both test trees (tests/ and bench/tests/): one real embedded Postgres per test
session, the product's schema on a database of it, and empty databases on demand."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import create_engine, text

from service.db import migrate
from service.db.engine import EmbeddedPostgres


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of the maintenance database of a throwaway embedded server."""
    server = EmbeddedPostgres(tmp_path_factory.mktemp("pg") / "data")
    url = server.start()
    yield url
    server.stop()


def create_database(server_url: str, name: str) -> str:
    engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return server_url.replace("/postgres?", f"/{name}?")


@pytest.fixture
def new_database(postgres_server: str) -> Callable[[str], str]:
    """Factory of empty databases (no schema) on the session's server, by name."""
    return lambda name: create_database(postgres_server, name)


@pytest.fixture(scope="session")
def database_url(postgres_server: str) -> str:
    """A database migrated to head once per session."""
    url = create_database(postgres_server, "earm_test")
    migrate.upgrade_to_head(url, 384)
    return url


@pytest.fixture(scope="session")
def migrated_database(postgres_server: str) -> Callable[[str], str]:
    """Factory of databases migrated to head, by name, for a module-scoped fixture that needs
    a database of its own (``database_url`` is shared, and emptied before each test)."""

    def create(name: str) -> str:
        url = create_database(postgres_server, name)
        migrate.upgrade_to_head(url, 384)
        return url

    return create
