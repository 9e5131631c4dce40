"""Fixtures of both test trees (tests/ and bench/tests/): one real embedded Postgres per test
session, the product's schema on a database of it, and empty databases on demand."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from service.db import migrate
from service.db.engine import EmbeddedPostgres

# The suite starts many Python processes (its xdist workers, `earm` commands, services, refit
# children), and where PYTHONDONTWRITEBYTECODE is set (containers, CI) each would compile every
# module it imports, seconds apiece. Writing the bytecode once is cheaper than compiling every
# installed package at install time (uv's --compile-bytecode: ~30 s, most of it for packages
# no test imports). Set before xdist starts its workers, which inherit the environment.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

#: The markers of the slow tiers (registered in pyproject.toml).
SLOW_TIERS = frozenset(
    {"browser", "pooler", "replica", "fuzz", "bench", "processes", "citus"}
)
#: A benchmark's test that needs a database (every database fixture below starts from
#: `postgres_server`) is a smoke run of the benchmark; the others test its parts and stay in
#: the fast tier.
BENCH_TESTS = Path(__file__).parent / "bench" / "tests"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the benchmarks' smoke runs `bench`, and every test of a slow tier `slow`, so that
    `-m "not slow"` leaves them all out."""
    for item in items:
        if item.path.is_relative_to(BENCH_TESTS) and "postgres_server" in getattr(
            item, "fixturenames", ()
        ):
            item.add_marker(pytest.mark.bench)
        if any(item.get_closest_marker(tier) for tier in SLOW_TIERS):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of the maintenance database of a throwaway embedded server."""
    server = EmbeddedPostgres(tmp_path_factory.mktemp("pg") / "data")
    url = server.start()
    _without_fsync(url)
    yield url
    server.stop()


def _without_fsync(server_url: str) -> None:
    """A throwaway test server need not wait for its disk: with fsync off every commit still
    writes its WAL to the operating system before it is acknowledged, so a killed postmaster
    loses nothing acknowledged (what the durability tests kill); only the machine crashing
    would, and the data is thrown away with the test session."""
    engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("ALTER SYSTEM SET fsync = off"))
        conn.execute(text("SELECT pg_reload_conf()"))
    engine.dispose()


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
