"""A short `earm bench load-mix`: 10 concurrent clients, mixed ingest/retrieve/feedback for 5 s
against the real service and database; zero errors and consistent counters."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from earm_bench.load_mix import LoadMixConfig, LoadMixReport, run_load_mix
from service.settings import Settings


@pytest.fixture(scope="module")
def report(database_url: str) -> LoadMixReport:
    # The run's namespaces are its own (random prefix), so the shared test database will do;
    # only key enforcement may not be left on (the clients send no key).
    engine = create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE api_keys, auth_settings"))
    engine.dispose()
    settings = Settings(database_url=database_url, embedder="none", scorer="local", _env_file=None)
    return run_load_mix(
        LoadMixConfig(clients=10, seconds=5, namespaces=3, candidates=30), settings=settings
    )


def test_short_load_mix_has_zero_errors(report: LoadMixReport) -> None:
    assert report.errors == 0, report.problems[:5]
    assert report.operations["retrieve"].ok >= 10 and report.operations["ingest"].ok >= 3
    assert report.operations["feedback"].ok >= 1


def test_short_load_mix_leaves_consistent_counters(report: LoadMixReport) -> None:
    assert len(report.audits) == 6
    assert all(report.audits.values()), report.problems[:5]

