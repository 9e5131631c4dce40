"""``earm bench load-mix`` from start to end: the service, the load, the audits."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service.bench.load_mix.audit import audit_database, audit_http
from service.bench.load_mix.config import LoadMixConfig
from service.bench.load_mix.driver import Driver
from service.bench.load_mix.report import LoadMixReport


def drive(base_url: str, config: LoadMixConfig, database_url: str | None = None) -> LoadMixReport:
    """Run the mix against ``base_url``; audit the database too when ``database_url`` is given."""
    driver = Driver(base_url.rstrip("/"), config, uuid.uuid4().hex[:8])
    duration = asyncio.run(driver.run())
    audits: dict[str, bool] = {}
    problems = list(driver.problems)
    audits["http: gap-free query indexes"], found = audit_http(driver.ledgers)
    problems += found
    if database_url:
        found_audits, found = audit_database(driver.ledgers, database_url)
        audits.update(found_audits)
        problems += found
    return LoadMixReport(config, duration, driver.stats, audits, problems)


@contextmanager
def in_process_service(settings: Any | None = None) -> Iterator[tuple[str, str]]:
    """(base URL, database URL) of the service on a loopback port; without ``settings``, over a
    temporary embedded Postgres with the local scorer and no embedder (clients send vectors)."""
    from service.api.app import create_app
    from service.bench.loopback import LoopbackServer
    from service.settings import Settings

    with tempfile.TemporaryDirectory(prefix="earm-load-mix-") as tmp:
        if settings is None:
            settings = Settings(data_dir=Path(tmp) / "pgdata", embedder="none", scorer="local")
        app = create_app(settings)
        with LoopbackServer(app) as server:
            yield server.url, app.state.components.database.url


def run_load_mix(
    config: LoadMixConfig,
    *,
    url: str | None = None,
    database_url: str | None = None,
    settings: Any | None = None,
) -> LoadMixReport:
    if url:
        return drive(url, config, database_url)
    with in_process_service(settings) as (base_url, service_database_url):
        return drive(base_url, config, database_url or service_database_url)
