"""Fixtures of the product's tests: a clean database per test, settings and a client over it.
The embedded Postgres and its databases are the root conftest.py's (shared with bench/tests/)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.http.app import create_app
from service.settings import Settings
from tests.browser import CHROMIUM, CHROMIUM_ARGS
from tests.worker_processes import Processes

#: Every table of the schema, each after the tables whose rows reference it.
TABLES = (
    "score_history", "scores", "memory_factors", "query_factors", "rerank_documents",
    "memory_locator",
    "query_locator", "queries", "memories", "namespaces", "api_keys", "auth_settings",
)


@pytest.fixture
def clean_database(database_url: str) -> str:
    """Every test starts from empty tables (schema kept) and identities that start at 1.
    DELETE, not TRUNCATE: a test's few rows go in ~20 ms, where TRUNCATE gives each of the
    partitions and their indexes a new file (~100 ms a test at 16 partitions per table)."""
    engine = create_engine(database_url)
    with engine.begin() as conn:
        for table in TABLES:
            conn.execute(text(f"DELETE FROM {table}"))
        conn.execute(text(
            "SELECT setval(format('%I.%I', schemaname, sequencename)::regclass, 1, false)"
            " FROM pg_sequences WHERE schemaname = current_schema()"
        ))
    engine.dispose()
    return database_url


@pytest.fixture
def settings(clean_database: str) -> Settings:
    return Settings(database_url=clean_database, embedder="local", scorer="local", _env_file=None)


@pytest.fixture
def judge_settings(clean_database: str) -> Callable[..., Settings]:
    """Factory of settings whose scorer is the chat-completions judge at ``judge_url`` (a
    loopback stand-in), no retries unless overridden; ``overrides`` are further settings."""

    def make(judge_url: str, **overrides: Any) -> Settings:
        options: dict[str, Any] = {
            "database_url": clean_database,
            "scorer": "openai",
            "scorer_base_url": f"{judge_url}/v1",
            "scorer_max_retries": 0,
        }
        return Settings(**(options | overrides), _env_file=None)

    return make


@pytest.fixture
def processes(clean_database: str, tmp_path: Path) -> Iterator[Processes]:
    """`earm serve` and `earm worker` processes of the test, on its database; stopped after."""
    started = Processes(clean_database, tmp_path)
    try:
        yield started
    finally:
        started.stop_all()


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


#: Each partition (of a table or of an index) and the table or index it is a partition of.
PARTITION_PARENTS_SQL = (
    "SELECT c.relname, p.relname FROM pg_inherits i "
    "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent"
)


@pytest.fixture
def partition_parents(database_url: str) -> dict[str, str]:
    """The name of the partitioned table (or index) of every partition (or partition's index)
    of the schema: what a plan names (``memories_p03``) as the schema does (``memories``)."""
    engine = create_engine(database_url)
    with engine.connect() as conn:
        rows = conn.execute(text(PARTITION_PARENTS_SQL)).all()
    parents = {str(child): str(parent) for child, parent in rows}
    engine.dispose()
    return parents


@pytest.fixture
def plan_nodes() -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
    """Every node of an ``EXPLAIN (FORMAT JSON)`` plan, the root first (depth first)."""

    def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
        return [plan] + [node for child in plan.get("Plans", []) for node in nodes(child)]

    return nodes


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium driven by Playwright, for the browser tests (which skip without
    either)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()
